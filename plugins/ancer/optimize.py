"""ANCER's per-input diagonal scale Θ(x) (Eiras et al., TMLR 2022, §5; arXiv 2107.04570).

Starting from the isotropic data-dependent σ of ``alfarra-opt`` on every axis (θ_0 = σ(x)·1,
as ANCER's scripts initialize from the isotropic stage, ``scripts/run_optimization_dataset.py``),
``iterations`` steps of Adam (lr 0.04) on the relaxed volume objective of §5 (the proxy
radius of §4 plus κ times the ℓ2 radius of the ball inside the ellipsoid), written as the
released code writes it (``ancer/optimization.py``, ``optimize_ancer``):

    φ(Θ) = 1/M Σ_m softmax f(x + Θ ⊙ δ_m),   δ_m ~ N(0, I)   (reparameterization)
    gap  = Φ⁻¹(clamp(φ_A, 0.001, 0.999)) − Φ⁻¹(clamp(φ_B, 0.001, 0.999))
    L(Θ) = −[(∏_i θ_i)^{1/d}·gap + κ·min_i θ_i·gap]
    Θ ← Adam step on L, then Θ ← max(Θ, θ_0) (projection: the ellipsoid contains the
        isotropic certificate's ball, §5's superset constraint)

with fresh δ at every step. The gap is ddsmoothing's ``L2Certificate.compute_proxy_gap``
(its clamp 0.001/0.999; a clamped value passes no gradient, as ``clamp_`` does) on the mean
softmax of the M samples (φ_A, φ_B its two largest). Decisions where paper and code are silent:

- the softmax: ANCER's code averages ``model(...)`` and clamps it to (0.001, 0.999), which
  presumes probabilities (the network files of ddsmoothing it loads are not published with
  it); the harness's base models answer logits, so their softmax is averaged, as
  ``alfarra-opt`` does (Alfarra et al., App. A);
- (∏θ_i)^{1/d} is computed as exp(mean log θ_i) (the same value and gradient; the code's
  ∏θ_i^{1/d} loses precision over thousands of axes); min_i θ_i passes its gradient to the
  first smallest axis (``argmin``'s documented choice; at θ_0 every axis ties);
- Adam is written out (torch's defaults: β = (0.9, 0.999), ε = 1e-8), per input, so that
  an input's steps never depend on the batch it is optimized in;
- the δ of one input at step k is drawn from a ``torch.Generator`` seeded with
  ``noise_seed(seed, STREAM_ANCER, key, k)``, key the 64-bit content hash of the input
  (:func:`plugins.alfarra.optimize_sigma.content_keys`), and every forward pass has one
  shape (inputs padded to ``max(1, max_batch // M)``), so Θ(x) is a function of x and the
  run seed only, whatever its batch;
- the scale is floored at the isotropic stage's ``sigma_min`` (> 0; the projection already
  keeps θ >= θ_0 >= sigma_min) and returned in float32, the precision the harness draws in.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from harness import (
    ModelOutputError,
    Unregularized,
    noise_seeds,
    padded_chunks,
)
from plugins.alfarra.optimize_sigma import FIXED_ROWS, content_keys, proxy_gap

STREAM_ANCER = 104
"""Noise stream of ANCER's optimization (keys: content hash of x)."""

CLAMP_LOW, CLAMP_HIGH = 0.001, 0.999
"""φ_A and φ_B are clamped to this interval (ddsmoothing's ``L2Certificate``)."""

ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8
"""Adam's moment decays and ε: ``torch.optim.Adam``'s defaults, as ANCER's code uses it."""

CACHE_BYTES = 1 << 26
"""Memory for memoized scales (float32, d values each; least recently used dropped first):
21 000 inputs of 784 values, 110 of 3·224·224."""


def objective(theta: torch.Tensor, gap: torch.Tensor, kappa: float) -> torch.Tensor:
    """−[(∏θ_i)^{1/d}·gap + κ·min_i θ_i·gap] per input [B] (``theta`` [B, d] > 0)."""
    volume = torch.exp(torch.log(theta).mean(dim=1))
    smallest = theta.gather(1, theta.argmin(dim=1, keepdim=True)).squeeze(1)
    return -(volume * gap + kappa * smallest * gap)


class Adam:
    """Adam on one tensor, element by element (torch's update, its defaults): an element's
    path depends on its own gradients only."""

    def __init__(self, param: torch.Tensor, lr: float) -> None:
        self.lr, self.step = float(lr), 0
        self.first = torch.zeros_like(param)
        self.second = torch.zeros_like(param)

    def update(self, param: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """``param`` after one step along ``grad`` (a new tensor)."""
        (b1, b2), self.step = ADAM_BETAS, self.step + 1
        self.first.mul_(b1).add_(grad, alpha=1 - b1)
        self.second.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        step_size = self.lr / (1 - b1**self.step)
        denom = (self.second.sqrt() / (1 - b2**self.step) ** 0.5).add_(ADAM_EPS)
        return param.addcdiv(self.first, denom, value=-step_size)


def optimize_ancer(
    model: torch.nn.Module,
    x: torch.Tensor,
    theta0: torch.Tensor,
    keys: Sequence[int],
    *,
    seed: int,
    iterations: int,
    lr: float,
    samples: int,
    kappa: float,
    floor: float,
    stream: int = STREAM_ANCER,
    max_batch: int = FIXED_ROWS,
) -> torch.Tensor:
    """Θ of every input after ``iterations`` projected Adam steps: [B, d] (float64, x's device).

    ``theta0`` [B] (the isotropic σ) or [B, d]; ``keys`` name each input's noise (module
    docstring). Inputs go through the model ``max(1, max_batch // samples)`` at a time,
    every chunk padded to that many (zeros, whose Θ is dropped).
    """
    if len(keys) != len(x):
        raise ValueError(f"{len(x)} inputs but {len(keys)} noise keys")
    dims = x[0].numel() if len(x) else 0
    init = torch.as_tensor(theta0, dtype=torch.float64, device=x.device)
    init = (init[:, None] if init.dim() == 1 else init.reshape(len(x), -1)).expand(len(x), dims)
    init = init.clamp_min(floor)
    if iterations == 0 or len(x) == 0:
        return init.clone()
    chunk = max(1, max_batch // samples)
    out = []
    for start, (xs, real) in zip(range(0, len(x), chunk), padded_chunks(x, chunk), strict=True):
        theta = torch.ones((len(xs), dims), dtype=torch.float64, device=x.device)
        theta[:real] = init[start : start + real]
        out.append(_descend(model, xs, theta, keys[start : start + real], seed, stream,
                            iterations, lr, samples, kappa)[:real])  # fmt: skip
    return torch.cat(out).clamp_min(floor)


def _descend(model, x, theta, keys, seed, stream, iterations, lr, samples, kappa) -> torch.Tensor:
    """One chunk's projected Adam descent (the first ``len(keys)`` rows are inputs, the
    rest padding: zero noise, their Θ moves but is dropped)."""
    real = len(keys)
    delta = torch.zeros((len(x), samples, *x.shape[1:]), device=x.device, dtype=x.dtype)
    rows = delta.unbind(0)
    generator = torch.Generator(device=x.device)
    initial = theta.clone()
    adam = Adam(theta, lr)
    finite = torch.ones((), dtype=torch.bool, device=x.device)
    with torch.enable_grad():
        for k in range(iterations):
            for row, block_seed in zip(rows[:real], noise_seeds(seed, stream, keys, k),
                                       strict=True):  # fmt: skip
                generator.manual_seed(block_seed)
                row.normal_(generator=generator)
            t = theta.detach().requires_grad_(True)
            loss = objective(
                t, proxy_gap(model, x, t, delta, real, (CLAMP_LOW, CLAMP_HIGH)), kappa
            )[:real].sum()
            (grad,) = torch.autograd.grad(loss, t)
            finite &= torch.isfinite(grad[:real]).all()
            theta = torch.maximum(adam.update(theta, grad), initial)
    if not bool(finite):
        raise ModelOutputError(
            "ANCER's optimization got a non-finite gradient of its objective; check the base "
            "model's outputs"
        )
    return theta


class ScaleCache:
    """Θ(x) by a digest of x's dtype, shape and bytes (:class:`harness.SigmaCache` for a
    scale): ``compute`` is called on the unseen inputs only, each once, and what it returns
    is kept in float32 (the precision the σ-provider answers in), within :data:`CACHE_BYTES`."""

    def __init__(self, budget: int = CACHE_BYTES) -> None:
        self.budget, self.used = budget, 0
        self._scale: OrderedDict[bytes, torch.Tensor] = OrderedDict()

    def __len__(self) -> int:
        return len(self._scale)

    def get(self, x: torch.Tensor, compute: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The scales [B, d] (float32, on x's device) of the inputs x [B, ...]."""
        if len(x) == 0:
            return torch.empty((0, math.prod(x.shape[1:])), device=x.device)
        digests = [_digest(row) for row in x]
        first: dict[bytes, int] = {}
        for i, d in enumerate(digests):
            if d not in self._scale:
                first.setdefault(d, i)
        fresh: dict[bytes, torch.Tensor] = {}
        if first:
            index = torch.tensor(list(first.values()), device=x.device)
            values = compute(x[index]).detach().to("cpu", torch.float32).reshape(len(index), -1)
            fresh = dict(zip(first, values.unbind(0), strict=True))
        out = []
        for d in digests:
            if d in fresh and d not in self._scale:
                self.used += fresh[d].numel() * 4
            value = fresh.get(d, self._scale.get(d))
            self._scale[d] = value
            self._scale.move_to_end(d)
            out.append(value)
        while self.used > self.budget and len(self._scale) > 1:
            self.used -= self._scale.popitem(last=False)[1].numel() * 4
        return torch.stack(out).to(x.device)


def _digest(row: torch.Tensor) -> bytes:
    data = row.detach().to("cpu").contiguous()
    head = f"{data.dtype}:{tuple(data.shape)}".encode()
    raw = data.flatten().view(torch.uint8).numpy().tobytes()
    return hashlib.blake2b(head + raw, digest_size=16).digest()


class AncerSigma:
    """The σ-provider ``ancer-opt``: Θ(x) = ANCER's optimization from the isotropic σ(x).

    ``isotropic`` is the σ-provider ``alfarra-opt`` built with the method's parameters
    (:class:`plugins.alfarra.optimize_sigma.OptimizedSigma`). Unregularized: Θ(x) may jump
    between nearby inputs, so Thm 1's ellipsoid at Θ(x) is no certificate of a fixed
    smoothed classifier (the same critique as for the isotropic σ, Súkeník et al. 2022,
    App. C.2). Θ(x) depends on x and the seed alone, in any batch; memoized by input in
    ``cache`` (one per run and parameters: :func:`plugins.ancer._ancer_sigma`). Answers
    [B, *input_shape] in float32.
    """

    regularity = Unregularized()

    def __init__(
        self,
        isotropic,
        model: torch.nn.Module,
        iterations: int,
        lr: float,
        samples: int,
        kappa: float,
        seed: int,
        floor: float,
        max_batch: int = FIXED_ROWS,
        cache: ScaleCache | None = None,
    ) -> None:
        self.isotropic = isotropic
        self.model = model
        self.iterations, self.lr = iterations, float(lr)
        self.samples, self.kappa = samples, float(kappa)
        self.seed, self.floor = seed, float(floor)
        self.max_batch = max_batch
        self.cache = ScaleCache() if cache is None else cache

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.cache.get(x, self._optimize).reshape(x.shape)

    def _optimize(self, x: torch.Tensor) -> torch.Tensor:
        return optimize_ancer(
            self.model, x, self.isotropic(x), content_keys(x), seed=self.seed,
            iterations=self.iterations, lr=self.lr, samples=self.samples, kappa=self.kappa,
            floor=self.floor, max_batch=self.max_batch,
        )  # fmt: skip
