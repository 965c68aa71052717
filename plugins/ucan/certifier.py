"""UCAN's certificate with its geometric measure, claimed as an ℓ2 radius (``ucan-geometric``).

UCAN's ``certification_certification_noise.py`` (Gaussian, ℓ2) reports, for the scale v(x)
of its certification-wise noise, R = λ·Φ⁻¹(p_A_lower)·term with term = min_i v_i
(``IsoMeasure``) or, by default, the geometric mean exp(mean_i log v_i). The first is
Cohen et al.'s (2019) Thm 1 at the smallest axis, the largest ℓ2 ball inside the certified
ellipsoid (Eiras et al., ANCER, TMLR 2022, Thm 1): the ``anisotropic`` certifier. The
second is the ellipsoid's volume-equivalent radius (ANCER's proxy radius), which bounds no
ℓ2 ball once the axes differ: an ℓ2 perturbation of that length along the smallest axis
leaves the ellipsoid.

This certifier claims the second faithfully, as UCAN reports it, for the scale the harness
drew at (σ_i = λ·max(v_i, floor), so R = Φ⁻¹(p_A_lower)·(∏σ_i)^{1/d}), while declaring the
formula its claim must satisfy as an ℓ2 radius: Cohen's at the recorded σ = σ_min
(``radius_formula = COHEN``). S0 therefore re-derives σ_min·Φ⁻¹(p_A_lower) and finds every
radius above it violated: the board shows UCAN's number and that it is not an ℓ2
certificate. The ellipsoid (κ = Φ⁻¹(p_A_lower)) is claimed beside it, as ``anisotropic``,
and as it, around UCAN's noise centre where the σ-provider answers one (``centred``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from scipy.special import ndtri

from harness import ABSTAIN, Claim, Evidence
from plugins.anisotropic.certifier import AnisotropicCertifier


class GeometricCertifier(AnisotropicCertifier):
    """``anisotropic``'s claims with the radius replaced by Φ⁻¹(p_A_lower)·(∏σ_i)^{1/d}
    (UCAN's default measure); declared formula: Cohen's at σ_min (S0 flags the excess)."""

    def certify(self, evidence: Evidence) -> list[Claim]:
        claims = super().certify(evidence)
        if evidence.scale is None:  # one σ per input: the geometric mean is σ itself
            return claims
        scale = np.asarray(evidence.scale, dtype=np.float64)
        geometric = np.exp(np.log(scale).mean(axis=1))
        return [
            c if c.prediction == ABSTAIN
            else replace(c, radius=float(ndtri(c.p_lower) * geometric[k]))
            for k, c in enumerate(claims)
        ]  # fmt: skip
