"""Sampling from a base model whose smoothed classifier is known in closed form.

The soundness checks rebuild a method on analytic base models (a half-space or a ball,
one-hot between two classes: :mod:`harness.audit.analytic`), for which the class
probabilities under Gaussian noise, P(f(x + σε) = c), are known exactly. A σ-provider
that estimates something of its base model by Monte Carlo (Chen et al.'s σ search
draws thousands of samples per evaluated σ) sees, through :class:`ExactSampling`, each
sample's class drawn from those probabilities instead of N Gaussian coordinates passed
through the model: the class of every sample has exactly the law it has under the
model, at the cost of one uniform instead of N normals and a forward pass.

**Keys.** Sample j of input i in stream s is u_j = 2⁻⁵³·⌊h / 2¹¹⌋ with h the splitmix64
chain of (seed, s, i, j) (:func:`harness.engine.noise.mix64`), and its class is the
first c with u_j < p_0 + … + p_c. So, as with the Gaussian schemes, a sample depends
on (seed, stream, input id, index) alone: a call from ``start`` continues the stream,
and a batch gives each input what it gets alone. Different σ at the same key are
coupled monotonically (a larger P(c) never loses a sample to another class), where
Gaussian noise couples them through the shared ε; each law on its own is the same.

Hard smoothing returns the class counts; soft smoothing of a one-hot model, whose
softmax is the indicator of its class, returns counts as sums and as sums of squares.
The harness's own draws in the checks (S1's trial certificates, whose calibration S1
tests) never come from here: they pass Gaussian noise through the model
(:meth:`harness.audit.audit.Audit.fresh_engine`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

from harness.engine.accumulators import SoftStats
from harness.engine.noise import mix64, splitmix64_array
from harness.engine.sampling import TALLY, SamplingEngine
from harness.foundation.errors import ModelOutputError
from harness.foundation.protocol import SIGMA_MAX

ClassProbabilities = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``probabilities(x [B, ...], σ [B] or a diagonal scale [B, d]) -> [B, K]``:
P(f(x_i + σ_i ε) = c), float64."""


def keyed_uniforms(seed: int, stream: int, input_id: int, start: int, num: int) -> np.ndarray:
    """Uniforms in [0, 1) of samples ``start`` … ``start + num − 1`` of one input's stream:
    the splitmix64 chain of (seed, stream, input id, j), its top 53 bits."""
    prefix = np.uint64(mix64(seed, stream, input_id))
    index = np.arange(start, start + num, dtype=np.uint64)
    h = splitmix64_array(prefix ^ index)
    return (h >> np.uint64(11)).astype(np.float64) * 2.0**-53


class ExactSampling(SamplingEngine):
    """A :class:`~harness.engine.sampling.SamplingEngine` of a model whose class
    probabilities under noise are ``probabilities`` (closed form): each sample's class is
    drawn from them with a keyed uniform (module docstring). ``model`` stays the model
    (for code that calls it directly); ``one_hot``: its softmax is the indicator of its
    class (soft smoothing is served only then)."""

    serves_model = False  # no forward passes: a model the audit moves is never compiled or captured

    def __init__(
        self, model: torch.nn.Module, probabilities: ClassProbabilities, num_classes: int,
        device: torch.device, batch_size: int = 1024, seed: int = 0, noise: str = "auto",
        pad_batches: bool = False, one_hot: bool = True,
    ) -> None:  # fmt: skip
        super().__init__(model, num_classes, device, batch_size, seed, 1, noise, pad_batches)
        self.probabilities = probabilities
        self.one_hot = one_hot

    def padded(self) -> ExactSampling:
        return ExactSampling(self.model, self.probabilities, self.num_classes, self.device,
                             self.batch_size, self.seed, self.noise, True, self.one_hot)  # fmt: skip

    def run(
        self, x: torch.Tensor, sigma: Sequence[float] | torch.Tensor, input_ids: Sequence[int],
        num: int, stream: int, soft: bool = False, start: int = 0,
    ) -> Iterator[tuple[int, np.ndarray | SoftStats]]:  # fmt: skip
        """Counts (or one-hot soft sums) of samples ``start`` … ``start + num − 1`` of each
        input, in input order (:meth:`SamplingEngine.run`'s contract)."""
        if len(x) != len(input_ids):
            raise ValueError(f"{len(x)} inputs but {len(input_ids)} input ids")
        if isinstance(start, bool) or not isinstance(start, int | np.integer) or start < 0:
            raise ValueError(f"start must be an integer >= 0, got {start!r}")
        if soft and not self.one_hot:
            raise ValueError("exact soft sampling needs a one-hot model (softmax = indicator)")
        sigmas = torch.as_tensor(sigma, dtype=torch.float64).numpy(force=True)
        # one σ per input [B], or a diagonal scale [B, d] (harness.engine.scale) as it is
        sigmas = sigmas.reshape(len(sigmas), -1) if sigmas.ndim > 1 else sigmas.reshape(-1)
        if len(sigmas) != len(input_ids):
            raise ValueError(f"{len(input_ids)} inputs but {len(sigmas)} values of sigma")
        bad = ~(np.isfinite(sigmas) & (sigmas > 0) & (sigmas <= SIGMA_MAX))
        if bad.any():
            k, j = (int(v) for v in np.argwhere(bad.reshape(len(bad), -1))[0])
            value = sigmas.reshape(len(bad), -1)[k, j]
            raise ModelOutputError(
                f"noise of σ = {value:.6g} at input {input_ids[k]} is out of range (0, "
                f"{SIGMA_MAX:g}]; the σ-provider is at fault, not the model"
            )
        TALLY.samples += num * len(input_ids)
        points = x.detach().to("cpu", torch.float64).numpy()
        cumulative = np.cumsum(self.probabilities(points, sigmas), axis=1)
        for i, input_id in enumerate(input_ids):
            u = keyed_uniforms(self.seed, stream, int(input_id), int(start), num)
            classes = np.minimum(np.searchsorted(cumulative[i], u, side="right"),
                                 self.num_classes - 1)  # fmt: skip
            counts = np.bincount(classes, minlength=self.num_classes).astype(np.int64)
            if soft:
                sums = counts.astype(np.float64)
                yield i, SoftStats(num, sums, sums.copy())
            else:
                yield i, counts
