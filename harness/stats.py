"""Confidence bounds and tests for Monte Carlo estimates (Cohen et al. 2019, §3.2).

Every bound holds with probability at least 1 − alpha over the sampling noise.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from harness.protocol import check_alpha


def clopper_pearson_lower(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper–Pearson lower bound on p from k successes in n trials.

    P(p >= bound) >= 1 − alpha: bound = Beta⁻¹(alpha; k, n − k + 1), and 0 when k = 0
    (Clopper & Pearson 1934; used by CERTIFY in Cohen et al. 2019, Alg. "certify").
    """
    return float(clopper_pearson_lower_array(np.asarray(k), np.asarray(n), alpha))


def clopper_pearson_lower_array(k: np.ndarray, n: np.ndarray, alpha: float) -> np.ndarray:
    """Vectorized :func:`clopper_pearson_lower` over arrays of counts."""
    check_alpha(alpha)
    k = np.asarray(k, dtype=np.int64)
    n = np.asarray(n, dtype=np.int64)
    if np.any(n < 1) or np.any(k < 0) or np.any(k > n):
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    safe_k = np.maximum(k, 1)
    bound = stats.beta.ppf(alpha, safe_k, n - safe_k + 1)
    return np.where(k == 0, 0.0, bound)


def clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper–Pearson upper bound: Beta⁻¹(1 − alpha; k + 1, n − k), 1 when k = n."""
    check_alpha(alpha)
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    return 1.0 if k == n else float(stats.beta.ppf(1 - alpha, k + 1, n - k))


def binomial_pvalue(k: int, n: int) -> float:
    """Two-sided exact binomial test of p = 1/2 (PREDICT in Cohen et al. 2019)."""
    if n == 0:
        return 1.0
    return float(stats.binomtest(k, n, 0.5, alternative="two-sided").pvalue)


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
