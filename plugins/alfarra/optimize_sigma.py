"""OptimizeSigma: the per-input σ of Alfarra et al. (2022), Alg. 1, §3.4 and App. A.

For one input x, starting from σ_0, K steps of stochastic gradient ascent on the soft
certified radius (Zhai et al. 2020) of the smoothed softmax

    φ(σ) = 1/M Σ_m softmax f(x + σ δ_m),   δ_m ~ N(0, I)   (reparameterization, eq. 3)
    E_A = clamp(max_c φ_c, 0.02, 0.98),   E_B = clamp(second largest φ_c, 0.02, 0.98)
    R(σ) = σ/2 · (Φ⁻¹(E_A) − Φ⁻¹(E_B))
    σ_{k+1} = σ_k + β · ∂R/∂σ (σ_k)

with fresh δ at every step. The clamp is the paper's code (App. A): a clamped value
passes no gradient, exactly as ``torch.clamp``. Decisions where the paper is silent:

- σ is floored at ``sigma_min`` > 0 after every step (the ascent can step below 0);
- the δ of one input at step k is drawn from a ``torch.Generator`` seeded with
  ``noise_seed(seed, stream, key, first_step + k)`` (``noise_seeds``: all inputs of a step
  at once), so a batch of inputs gives each input exactly the σ it gets alone. The
  σ-provider uses the stream :data:`STREAM_OPTIMIZE` and as key a 64-bit hash of the
  input's float32 bytes (:func:`content_keys`): σ(x) is then a function of x and the run
  seed only, as a smoothed classifier g(x) needs, whatever the input's id or its batch.
  The trainer uses :data:`STREAM_TRAIN` keyed by the training example's index.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from harness import (
    ModelOutputError,
    SigmaCache,
    Unregularized,
    noise_seeds,
    outputs_for_inputs,
    padded_chunks,
)
from plugins.alfarra import check_optimizer_params

STREAM_OPTIMIZE = 100
"""Noise stream of OptimizeSigma at certification time (keys: content hash of x)."""
STREAM_TRAIN = 101
"""Noise stream of OptimizeSigma inside training, Alg. 2 (keys: training example index)."""

FIXED_ROWS = 64
"""Noisy samples per forward pass of the σ-provider. Every pass is padded to exactly this
many rows, so each input's samples go through matrix products of one shape: a product's
rows depend on how many rows it has (another kernel, another summation order), so σ(x)
is then the same whatever batch x is computed in, up to a BLAS that rounds a row of the
ascent's gradient by its position (:func:`harness.padded_chunks`: 1.8·10⁻⁸ relative after
100 steps on an AVX-512 CPU, within the replay check's tolerance)."""

CLAMP_LOW, CLAMP_HIGH = 0.02, 0.98
"""E_A and E_B are clamped to this interval (the paper's code, App. A)."""


def content_keys(x: torch.Tensor) -> list[int]:
    """A 64-bit BLAKE2b hash of each input's float32 bytes (the noise key of σ(x))."""
    rows = x.detach().to("cpu", torch.float32).contiguous().flatten(1).numpy()
    return [int.from_bytes(hashlib.blake2b(r.tobytes(), digest_size=8).digest()) for r in rows]


def proxy_gap(
    model: torch.nn.Module, x: torch.Tensor, scale: torch.Tensor, delta: torch.Tensor,
    real: int | None = None, clamp: tuple[float, float] = (CLAMP_LOW, CLAMP_HIGH),
) -> torch.Tensor:  # fmt: skip
    """Φ⁻¹(E_A) − Φ⁻¹(E_B) of the mean softmax of f(x + scale·δ_m) per input [B] (float64),
    E_A, E_B the two largest, clamped to ``clamp``; differentiable in ``scale`` ([B], or a
    diagonal scale [B, d] or [B, *shape]: ANCER's, :mod:`plugins.ancer.optimize`).

    ``x`` [B, *shape], ``delta`` [B, M, *shape]; the rows of ``x`` from ``real`` on are
    padding. The model is asked through :func:`harness.outputs_for_inputs`, each noisy
    sample named by its input.
    """
    batch, samples = delta.shape[:2]
    per_axis = scale.dim() > 1
    view = (batch, 1, *x.shape[1:]) if per_axis else (batch, 1) + (1,) * (x.dim() - 1)
    noisy = x.unsqueeze(1) + scale.to(x.dtype).reshape(view) * delta
    owner = torch.arange(batch, device=x.device)
    if real is not None:
        owner[real:] = -1
    logits = outputs_for_inputs(model, noisy.flatten(0, 1), x, owner.repeat_interleave(samples))
    probs = torch.softmax(logits, dim=1).view(batch, samples, -1).double().mean(dim=1)
    top = probs.topk(2, dim=1).values.clamp(*clamp)
    return torch.special.ndtri(top[:, 0]) - torch.special.ndtri(top[:, 1])


def soft_radius(
    model: torch.nn.Module, x: torch.Tensor, sigma: torch.Tensor, delta: torch.Tensor,
    real: int | None = None,
) -> torch.Tensor:  # fmt: skip
    """R(σ) = σ/2 (Φ⁻¹(E_A) − Φ⁻¹(E_B)) on the given noise, per input, differentiable in σ
    (``sigma`` [B]; :func:`proxy_gap` with the paper's clamp); returns [B] (float64)."""
    return sigma / 2 * proxy_gap(model, x, sigma, delta, real)


def optimize_sigma(
    model: torch.nn.Module,
    x: torch.Tensor,
    sigma0: torch.Tensor | float,
    keys: Sequence[int],
    *,
    seed: int,
    stream: int,
    steps: int,
    samples: int,
    beta: float,
    sigma_min: float,
    first_step: int = 0,
    max_batch: int = FIXED_ROWS,
    fixed_shape: bool = True,
) -> torch.Tensor:
    """Alg. 1 for a batch: σ_K of every input (shape [B], float64, on x's device).

    Equals ``sigma_path(...)[steps]`` (:func:`sigma_path`): one ascent, read at its end.

    ``sigma0`` is a number or a tensor [B] (warm starts, Alg. 2); ``keys`` name each
    input's noise (see the module docstring); at most ``max_batch`` noisy samples go
    through the model at once, in chunks of ``max_batch // samples`` inputs (at least
    one). With ``fixed_shape`` every chunk is padded to that many inputs (zeros, whose
    σ is discarded), so the result of each input is the same in any batch up to a
    BLAS's rounding by row position (see :data:`FIXED_ROWS`); without it the last chunk
    is smaller, which changes σ in its last bits only (floating-point rounding). The ascents of all chunks run
    together, step by step (:func:`_ascend`): a batch of any size is one ascent of K
    steps, not one per chunk.
    """
    return sigma_path(
        model, x, sigma0, keys, seed=seed, stream=stream, steps=steps, samples=samples, beta=beta,
        sigma_min=sigma_min, first_step=first_step, max_batch=max_batch, fixed_shape=fixed_shape,
    )[steps]  # fmt: skip


def sigma_path(
    model: torch.nn.Module,
    x: torch.Tensor,
    sigma0: torch.Tensor | float,
    keys: Sequence[int],
    *,
    seed: int,
    stream: int,
    steps: int,
    samples: int,
    beta: float,
    sigma_min: float,
    read_at: Sequence[int] = (),
    first_step: int = 0,
    max_batch: int = FIXED_ROWS,
    fixed_shape: bool = True,
) -> dict[int, torch.Tensor]:
    """σ_k of every input after each k in ``read_at`` and after ``steps``, by one ascent:
    ``{k: σ_k}`` (each [B], float64). Step k's noise depends on k alone, so σ_k is what
    :func:`optimize_sigma` with K = k returns, bit for bit (the candidates of K of the
    cross-validation, :mod:`plugins.alfarra.cross_validation`, read one ascent)."""
    check_optimizer_params(steps, samples, beta, sigma_min)
    if len(keys) != len(x):
        raise ValueError(f"{len(x)} inputs but {len(keys)} noise keys")
    marks = {int(k) for k in read_at} | {steps}
    if any(k < 0 or k > steps for k in marks):
        raise ValueError(f"σ can be read after 0 … {steps} steps, not {sorted(marks)}")
    device = x.device
    sigma = torch.as_tensor(sigma0, dtype=torch.float64, device=device).expand(len(x)).clone()
    if steps == 0 or len(x) == 0:
        return {k: sigma.clamp_min(sigma_min) for k in marks}
    chunk = max(1, max_batch // samples)
    chunks = []  # (inputs, σ, keys), padded to ``chunk`` inputs (σ of the padding: 1)
    starts = range(0, len(x), chunk)
    for start, (xs, real) in zip(starts, padded_chunks(x, chunk, fixed_shape), strict=True):
        ss = sigma[start : start + real]
        ss = torch.cat([ss, ss.new_ones(len(xs) - real)])
        chunks.append((xs, ss, keys[start : start + real]))
    return _ascend(model, chunks, torch.Generator(device=device), seed, stream, steps, samples,
                   beta, sigma_min, first_step, marks)  # fmt: skip


def _ascend(model, chunks, generator, seed, stream, steps, samples, beta, sigma_min, first, marks):
    """``{k: σ_k}`` for k in ``marks`` of the inputs of every chunk (``(x, σ, keys)``: the
    first ``len(keys)`` rows of ``x`` are inputs, the others padding: zero noise, their σ is
    left as it is and dropped), all chunks in lock-step: step k of every chunk, then step
    k + 1. Each chunk's arithmetic is that of its ascent alone; the gradients are checked
    once, at the end, so that no step waits for the device."""
    finite = torch.ones((), dtype=torch.bool, device=chunks[0][0].device)
    deltas = [torch.zeros((len(x), samples, *x.shape[1:]), device=x.device, dtype=x.dtype)
              for x, _, _ in chunks]  # fmt: skip
    rows = [delta.unbind(0) for delta in deltas]  # each input's noise, a view made once
    sigmas = [sigma for _, sigma, _ in chunks]

    def read() -> torch.Tensor:
        return torch.cat(
            [sigma[: len(keys)] for sigma, (_, _, keys) in zip(sigmas, chunks, strict=True)]
        )

    path = {0: read().clamp_min(sigma_min)} if 0 in marks else {}  # K = 0: σ_0, floored
    with torch.enable_grad():
        for k in range(steps):
            for c, ((x, _, keys), delta) in enumerate(zip(chunks, deltas, strict=True)):
                real = len(keys)
                seeds = noise_seeds(seed, stream, keys, first + k)
                for row, block_seed in zip(rows[c][:real], seeds, strict=True):
                    generator.manual_seed(block_seed)
                    row.normal_(generator=generator)
                s = sigmas[c].detach().requires_grad_(True)
                (grad,) = torch.autograd.grad(soft_radius(model, x, s, delta, real)[:real].sum(), s)
                grad = grad[:real]
                finite &= torch.isfinite(grad).all()
                sigma = s.detach().clone()
                sigma[:real] = (s.detach()[:real] + beta * grad).clamp_min(sigma_min)
                sigmas[c] = sigma
            if k + 1 in marks:
                path[k + 1] = read()
    if not bool(finite):
        raise ModelOutputError(
            "OptimizeSigma got a non-finite gradient of the certified radius; "
            "check the base model's outputs and the step size beta"
        )
    return path


class OptimizedSigma:
    """The σ-provider ``alfarra-opt``: σ(x) = OptimizeSigma(f, x, β, σ_0, M, K) (Alg. 1).

    Unregularized: σ(x) may jump arbitrarily between nearby inputs, so a Cohen radius
    at σ(x) is no certificate of the data-dependent classifier (Súkeník et al. 2022,
    App. C.2); the memory certifier (Alg. 3) restores consistency within one run.

    σ(x) is a function of x and the seed alone (noise keyed by x's content), whatever
    batch x is computed in up to rounding: the model sees chunks of exactly ``max_batch``
    noisy samples (:data:`FIXED_ROWS`, padded), so every input's samples go through
    products of one shape. Memoized (:class:`~harness.foundation.sigmacache.SigmaCache`) for the
    checks' repeated queries.
    """

    regularity = Unregularized()

    def __init__(
        self,
        model: torch.nn.Module,
        sigma0: float,
        steps: int,
        samples: int,
        beta: float,
        sigma_min: float,
        seed: int,
        max_batch: int = FIXED_ROWS,
    ) -> None:
        self.model = model
        self.sigma0 = float(sigma0)
        self.steps, self.samples = steps, samples
        self.beta, self.sigma_min = float(beta), float(sigma_min)
        self.seed = seed
        self.max_batch = max_batch
        self.cache = SigmaCache()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.cache.get(x, self._optimize)

    def _optimize(self, x: torch.Tensor) -> torch.Tensor:
        return optimize_sigma(
            self.model, x, self.sigma0, content_keys(x), seed=self.seed, stream=STREAM_OPTIMIZE,
            steps=self.steps, samples=self.samples, beta=self.beta, sigma_min=self.sigma_min,
            max_batch=self.max_batch,
        )  # fmt: skip
