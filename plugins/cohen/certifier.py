"""Constant σ and Cohen's radius R = σ·Φ⁻¹(p_A_lower) (Cohen et al. 2019, Thm 1)."""

from __future__ import annotations

import numpy as np
import torch

from harness import COHEN, Constant, HardSmoothingCertifier, check_sigma, cohen_radius


class ConstantSigma:
    """σ(x) = sigma for every input."""

    def __init__(self, sigma: float) -> None:
        self.sigma = check_sigma(sigma)
        self.regularity = Constant(self.sigma)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.full((len(x),), self.sigma, device=x.device, dtype=torch.float64)


class CohenCertifier(HardSmoothingCertifier):
    """CERTIFY of Cohen et al. (2019) at σ(x0)."""

    radius_formula = COHEN

    def radius(self, p_lower: np.ndarray, sigma: np.ndarray) -> np.ndarray:
        """R = σ·Φ⁻¹(p_A_lower) with p_B = 1 − p_A (Cohen et al. 2019, Thm 1 and CERTIFY)."""
        return np.asarray(cohen_radius(p_lower, sigma))
