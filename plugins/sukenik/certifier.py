"""CERTIFY of Súkeník et al. (2022), Alg. 3: Cohen's protocol with the radius of Thm 3.2."""

from __future__ import annotations

import numpy as np

from harness import SUKENIK, HardSmoothingCertifier, certified_radius, semi_elastic_rate


class SukenikCertifier(HardSmoothingCertifier):
    """n0 samples select ĉ_A, n samples give p_A_lower at σ0 = σ(x0); abstain if p_A_lower <= 1/2;
    else CR = sup{R : ξ>(R, σ0, σ0 e^(−rR)) < 1/2 and ξ<(R, σ0, σ0 e^(rR)) < 1/2} (Thm 3.2),
    with r the rate the σ-provider declares (``SemiElastic(r)``; ``Constant``: r = 0)."""

    radius_formula = SUKENIK

    def __init__(self, regularity, dim: int) -> None:
        self.rate, self.dim = semi_elastic_rate(regularity), dim

    def radius(self, p_lower: np.ndarray, sigma: np.ndarray) -> np.ndarray:
        return np.asarray(certified_radius(p_lower, sigma, self.rate, self.dim))
