"""Worst-case probabilities and certified radii for input-dependent randomized smoothing.

Reference: M. Súkeník, A. Kuvshinov, S. Günnemann, "Intriguing Properties of
Input-Dependent Randomized Smoothing", ICML 2022 (arXiv:2110.05365).  Section,
theorem and appendix numbers below refer to that paper.

Setting (§2).  ``x0`` is smoothed with ``N(x0, σ0² I)``, a potential adversary
``x1`` at distance ``a = ‖x1 − x0‖`` with ``N(x1, σ1² I)``, both in ``R^N``
(``N = dim``).  By Lemma 2.1 the worst-case classifier predicts class B on a
likelihood-ratio region ``B`` with ``P0(B) = p_B``; by Thm 2.2 ``B`` is a ball
when ``σ0 > σ1`` and the complement of a ball when ``σ0 < σ1``.  Thm 2.3 writes
``ξ = P1(B)`` with non-central χ² CDFs and quantiles whose non-centrality
``σ0² a² / (σ0² − σ1²)²`` explodes as ``σ1 → σ0``; evaluating those CDFs
directly fails there (App. D), and the paper falls back on hand-tuned
thresholds.  This package uses none of that.

The computation is split by concept:

- :mod:`~harness.mathematics.worstcase.ballmass`: ``G(τ, h)``, the mass of a ball under
  ``N(0, I_N)``, by quadrature, and its quantile in ``h``;
- :mod:`~harness.mathematics.worstcase.xi`: ξ> and ξ< (Thm 2.3) through ``G``, and the
  curse-of-dimensionality thresholds (Thm 2.4, Cor. 2.5);
- :mod:`~harness.mathematics.worstcase.radius_solvers`: Cohen's radius, the certification rule (App. B.5)
  the certified radius of Thm 3.2 and the least p_A certifying a given radius;
- :mod:`~harness.mathematics.worstcase.anisotropic`: the worst case between two
  different diagonal Gaussians (Thm 2.3's likelihood-ratio set, a generalized χ²),
  by inverting its characteristic function (Imhof 1961), with an error bound.
"""

from harness.mathematics.worstcase.radius_solvers import (
    certified_radius,
    cohen_radius,
    is_certified,
    semi_elastic_threshold,
)
from harness.mathematics.worstcase.xi import (
    max_sigma_ratio,
    min_sigma_ratio,
    min_sigma_ratio_simple,
    practical_sigma_ratio_threshold,
    practical_sigma_ratio_threshold_upper,
    xi,
    xi_greater,
    xi_less,
)

__all__ = [
    "certified_radius",
    "cohen_radius",
    "is_certified",
    "max_sigma_ratio",
    "min_sigma_ratio",
    "min_sigma_ratio_simple",
    "practical_sigma_ratio_threshold",
    "practical_sigma_ratio_threshold_upper",
    "semi_elastic_threshold",
    "xi",
    "xi_greater",
    "xi_less",
]
