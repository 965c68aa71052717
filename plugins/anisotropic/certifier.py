"""CERTIFY for Gaussian noise N(0, Σ), Σ = diag(σ_1², …, σ_d²): the ball and the ellipsoid.

Eiras et al. (ANCER, TMLR 2022), Thm 1, the anisotropic form of Cohen et al. (2019),
Thm 1: if the smoothed classifier's top class has p_A >= p_A_lower > 1/2 under
x + δ, δ ~ N(0, Σ), it keeps that class on {δ : ‖Σ^{-1/2}δ‖₂ < κ}, κ = Φ⁻¹(p_A_lower)
(with p_B <= 1 − p_A). That ellipsoid, of semi-axes κ·σ_i, is the claim's ``ellipsoid``;
the largest ℓ2 ball inside it, of radius κ·min_i σ_i, is its ``radius`` (Cohen's formula
at σ = σ_min, the σ the harness records for a diagonal scale, so S0 re-derives it with
:data:`harness.COHEN`). At one σ per input the claim is Cohen's, without an ellipsoid.
Around a noise centre μ(x) (:mod:`harness.engine.centre`) the claims are the same, for the
noise drawn at x + μ(x): the theorem for a fixed μ; one that varies with x is S3's to judge.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from scipy.special import ndtri

from harness import ABSTAIN, COHEN, Claim, Evidence, HardSmoothingCertifier, cohen_radius


class AnisotropicCertifier(HardSmoothingCertifier):
    """CERTIFY of Cohen et al. (2019) at σ_min, plus ANCER's ellipsoid at a diagonal scale."""

    radius_formula = COHEN
    diagonal_scale = True
    centred = True  # its claims are about the noise drawn, around x + μ(x) where one is

    def radius(self, p_lower: np.ndarray, sigma: np.ndarray) -> np.ndarray:
        """R = σ_min·Φ⁻¹(p_A_lower): the ℓ2 ball inside the ellipsoid (``sigma`` is the
        smallest axis, :attr:`harness.Evidence.sigma`)."""
        return np.asarray(cohen_radius(p_lower, sigma))

    def certify(self, evidence: Evidence) -> list[Claim]:
        """Cohen's claims at σ_min; drawn at a diagonal scale, each certified one also
        claims the ellipsoid κ = Φ⁻¹(p_A_lower) (ANCER, Thm 1)."""
        claims = super().certify(evidence)
        if evidence.scale is None:
            return claims
        return [
            c if c.prediction == ABSTAIN else replace(c, ellipsoid=float(ndtri(c.p_lower)))
            for c in claims
        ]
