"""A fixed diagonal scale: the same σ_1 … σ_d at every input, the sound anisotropic baseline.

σ_i = σ·ratio^{i/(d−1)} for the input dimensions i = 0 … d−1 in their flattened order (a
geometric ramp from σ to ratio·σ; σ alone for d = 1). Constant in x, it smooths a fixed
classifier, so the ellipsoid of Eiras et al. (ANCER, TMLR 2022, Thm 1) and the ℓ2 ball of
its smallest axis σ hold as Cohen et al.'s radius holds for a constant σ: the anisotropic
form of Cohen et al.'s method, against which input-dependent scales (ANCER, UCAN) compare.
"""

from __future__ import annotations

import torch

from harness import Constant, ParameterError, check_sigma


def ramp(sigma: float, ratio: float, dims: int) -> torch.Tensor:
    """σ·ratio^{i/(d−1)}, i = 0 … d−1 (float32, the precision a scale is held in)."""
    exponent = torch.arange(dims, dtype=torch.float64) / max(dims - 1, 1)
    return (sigma * ratio**exponent).to(torch.float32)


class FixedScale:
    """σ(x) = the ramp of :func:`ramp` for every x; its smallest axis is ``sigma``."""

    def __init__(self, sigma: float, ratio: float) -> None:
        self.sigma = check_sigma(sigma)
        if not (isinstance(ratio, int | float) and 1.0 <= ratio < float("inf")):
            raise ParameterError(f"ratio (largest over smallest axis) must be >= 1, got {ratio!r}")
        self.ratio = float(ratio)
        self.regularity = Constant(self.sigma)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        axes = ramp(self.sigma, self.ratio, x[0].numel()).to(x.device)
        return axes.expand(len(x), -1).reshape(x.shape).contiguous()


class ShiftedScale(FixedScale):
    """The fixed scale with the constant noise centre μ(x) = offset in every dimension
    (:mod:`harness.engine.centre`): every input is smoothed at x + offset·1, so the
    smoothed classifier is Cohen's anisotropic one of the shifted base classifier
    f(· + offset·1), and every certificate holds as the fixed scale's do."""

    def __init__(self, sigma: float, ratio: float, offset: float) -> None:
        super().__init__(sigma, ratio)
        real = isinstance(offset, int | float) and not isinstance(offset, bool)
        if not (real and abs(offset) < float("inf")):
            raise ParameterError(f"offset (the constant centre) must be a finite number, got "
                                 f"{offset!r}")  # fmt: skip
        self.offset = float(offset)

    def centre(self, x: torch.Tensor) -> torch.Tensor:
        return torch.full_like(x, self.offset, dtype=torch.float32)
