"""Confidence bounds and tests for Monte Carlo estimates (Cohen et al. 2019, §3.2).

Every bound holds with probability at least 1 − alpha over the sampling noise.
"""

from __future__ import annotations

import numpy as np
from scipy.special import bdtr, betaincinv  # the binomial cdf and Beta quantile (ufuncs)

from harness.foundation.protocol import check_alpha


def clopper_pearson_lower(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper–Pearson lower bound on p from k successes in n trials.

    P(p >= bound) >= 1 − alpha: bound = Beta⁻¹(alpha; k, n − k + 1), and 0 when k = 0
    (Clopper & Pearson 1934; used by CERTIFY in Cohen et al. 2019, Alg. "certify").
    """
    return float(clopper_pearson_lower_array(np.asarray(k), np.asarray(n), alpha))


def clopper_pearson_lower_array(k: np.ndarray, n: np.ndarray, alpha: float) -> np.ndarray:
    """Vectorized :func:`clopper_pearson_lower` over arrays of counts and sizes."""
    check_alpha(alpha)
    k, n = _counts(k, n)
    safe_k = np.maximum(k, 1)
    return np.where(k == 0, 0.0, betaincinv(safe_k, n - safe_k + 1, alpha))


def clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper–Pearson upper bound: Beta⁻¹(1 − alpha; k + 1, n − k), 1 when k = n."""
    return float(clopper_pearson_upper_array(np.asarray(k), np.asarray(n), alpha))


def clopper_pearson_upper_array(k: np.ndarray, n: np.ndarray, alpha: float) -> np.ndarray:
    """Vectorized :func:`clopper_pearson_upper` over arrays of counts and sizes."""
    check_alpha(alpha)
    k, n = _counts(k, n)
    return np.where(k >= n, 1.0, betaincinv(k + 1, np.maximum(n - k, 1), 1.0 - alpha))


def _counts(k, n) -> tuple[np.ndarray, np.ndarray]:
    k, n = np.asarray(k, dtype=np.int64), np.asarray(n, dtype=np.int64)
    if np.any(n < 1) or np.any(k < 0) or np.any(k > n):
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    return k, n


def binomial_pvalue(k: int, n: int) -> float:
    """Two-sided exact binomial test of p = 1/2 (PREDICT in Cohen et al. 2019)."""
    return float(binomial_pvalues(np.asarray(k), np.asarray(n)))


def binomial_pvalues(k: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Vectorized :func:`binomial_pvalue`: the probability under Binomial(n, 1/2) of the
    outcomes at most as likely as k. The pmf is symmetric and unimodal, so they are the two
    tails beyond min(k, n − k) and max(k, n − k): p = min(1, 2·F(min(k, n − k))), F the
    binomial cdf (1 when n = 0)."""
    k, n = np.asarray(k, dtype=np.int64), np.asarray(n, dtype=np.int64)
    tail = np.minimum(k, n - k)
    return np.where(n == 0, 1.0, np.minimum(1.0, 2.0 * bdtr(tail, n, 0.5)))


def hoeffding_lower(mean: np.ndarray, n: int, alpha: float, low: float = 0.0, high: float = 1.0):
    """Hoeffding lower bound on E[X] for X in [low, high]: mean − (high − low)·√(ln(1/α)/(2n))."""
    check_alpha(alpha)
    return np.asarray(mean) - (high - low) * np.sqrt(np.log(1.0 / alpha) / (2.0 * n))


def hoeffding_upper(mean: np.ndarray, n: int, alpha: float, low: float = 0.0, high: float = 1.0):
    """Hoeffding upper bound on E[X] for X in [low, high]: mean + (high − low)·√(ln(1/α)/(2n))."""
    check_alpha(alpha)
    return np.asarray(mean) + (high - low) * np.sqrt(np.log(1.0 / alpha) / (2.0 * n))


def holm_rejections(pvalues: list[float], threshold: float) -> list[bool]:
    """Holm's step-down procedure: which of m hypotheses to reject at family-wise level
    ``threshold`` (the i-th smallest p-value is compared with threshold / (m − i + 1),
    stopping at the first that is not below it; Holm 1979)."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    rejected = [False] * len(pvalues)
    for rank, i in enumerate(order):
        if pvalues[i] >= threshold / (len(pvalues) - rank):
            break
        rejected[i] = True
    return rejected


def replication_z(
    stored: np.ndarray, fresh: np.ndarray, n_stored: int, n_fresh: int, u: np.ndarray
) -> np.ndarray:
    """Exactly N(0, 1) scores of stored counts against fresh counts of the same smoothing.

    Under the null (stored count k_s ~ Binomial(n_s, p) and fresh k_f ~ Binomial(n_f, p),
    independent, with the same unknown p), k_s given the total t = k_s + k_f is
    hypergeometric, X ~ Hypergeom(population n_s + n_f, t successes, n_s draws), whatever
    p is. The randomized probability-integral transform U = P(X < k_s) + V·P(X = k_s),
    V ~ U(0, 1) (``u``) independent of the counts, is then exactly U(0, 1), so
    z = Φ⁻¹(U) is exactly N(0, 1) (Brockwell 2007, "Universal residuals"). Computed in
    log space from whichever tail is smaller, so extreme counts give large finite z.
    """
    from scipy import stats
    from scipy.special import ndtri_exp

    k = np.asarray(stored, dtype=np.int64)
    total = k + np.asarray(fresh, dtype=np.int64)
    population, u = int(n_stored) + int(n_fresh), np.asarray(u, dtype=np.float64)
    law = stats.hypergeom(population, total, int(n_stored))
    at = law.logpmf(k)
    with np.errstate(divide="ignore"):
        below = np.logaddexp(law.logcdf(k - 1), np.log(u) + at)  # log U
        above = np.logaddexp(law.logsf(k), np.log1p(-u) + at)  # log (1 − U)
    return np.where(below < above, ndtri_exp(below), -ndtri_exp(above))


def mean_difference_z(
    mean_stored: np.ndarray, sq_stored: np.ndarray, mean_fresh: np.ndarray,
    sq_fresh: np.ndarray, n: int,
) -> np.ndarray:  # fmt: skip
    """Welch scores (m_s − m_f) / √((s_s² + s_f²)/n) of two means of n bounded samples each
    (mean outputs of soft smoothing), from their means and means of squares; N(0, 1) in
    the limit (central limit theorem), not exactly. Two equal means with no spread
    score 0; different ones with no spread ±∞."""
    mean_s, mean_f = np.asarray(mean_stored, float), np.asarray(mean_fresh, float)
    correction = n / max(n - 1, 1)
    var_s = np.maximum(np.asarray(sq_stored, float) - mean_s**2, 0.0) * correction
    var_f = np.maximum(np.asarray(sq_fresh, float) - mean_f**2, 0.0) * correction
    scale = np.sqrt((var_s + var_f) / n)
    diff = mean_s - mean_f
    with np.errstate(divide="ignore", invalid="ignore"):
        z = diff / scale
    return np.where(scale > 0, z, np.where(diff == 0, 0.0, np.copysign(np.inf, diff)))


def replication_test(z: np.ndarray, threshold: float) -> dict[str, object]:
    """Bias and dispersion tests of m scores that are N(0, 1) under the null, Holm-corrected.

    Bias: Σz/√m ~ N(0, 1), two-sided. Dispersion: Σz² ~ χ²_m, two-sided (too large: the
    counts vary more than sampling allows, e.g. drawn at other σ; too small: less, e.g.
    counts set near their expectation). The two p-values go through Holm's procedure at
    family-wise level ``threshold`` (:func:`holm_rejections`).
    """
    from scipy import stats

    z = np.asarray(z, dtype=np.float64)
    m = len(z)
    if m == 0:
        return {"m": 0, "bias": 0.0, "p_bias": 1.0, "dispersion": 0.0, "p_dispersion": 1.0,
                "rejected": []}  # fmt: skip
    bias = float(np.sum(z) / np.sqrt(m)) if np.all(np.isfinite(z)) else float(np.sum(z))
    dispersion = float(np.sum(z**2))
    p_bias = float(2 * stats.norm.sf(abs(bias))) if np.isfinite(bias) else 0.0
    p_dispersion = (
        float(min(1.0, 2 * min(stats.chi2.cdf(dispersion, m), stats.chi2.sf(dispersion, m))))
        if np.isfinite(dispersion)
        else 0.0
    )
    rejected = holm_rejections([p_bias, p_dispersion], threshold)
    names = [n for n, r in zip(("bias", "dispersion"), rejected, strict=True) if r]
    return {"m": m, "bias": bias, "p_bias": p_bias, "dispersion": dispersion,
            "p_dispersion": p_dispersion, "rejected": names}  # fmt: skip


def false_certificates_pvalue(false: int, trials: int, alpha: float) -> float:
    """P(Binomial(trials, α) >= false).

    The guarantee of a certificate procedure is per trial (per input asked about,
    abstentions included): P(a false certificate is issued) <= α. Counting only the
    certified inputs would flag sound methods near a boundary, where certificates are
    issued mostly on α-events.
    """
    from scipy import stats

    return float(stats.binom.sf(false - 1, trials, alpha)) if trials and false else 1.0
