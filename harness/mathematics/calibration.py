"""The statistics of the coverage check (S1): the false-certificate rate a binomial test
flags, the randomized probability-integral transform of a count, and the p-values and
power of the calibration sub-tests on those scores."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats
from scipy.special import ndtr, ndtri

from harness.mathematics.stats import false_certificates_pvalue


def detectable_rate(trials: int, alpha: float, threshold: float, power: float = 0.9) -> float:
    """The smallest false-certificate rate that Binomial(trials, ·) flags with ``power``.

    k_min = least count with P(Binomial(trials, α) >= k_min) < threshold; the rate ρ
    solves P(Binomial(trials, ρ) >= k_min) = power.
    """
    if trials < 1:
        return 1.0
    k_min = int(stats.binom.isf(threshold, trials, alpha)) + 1
    while k_min <= trials and false_certificates_pvalue(k_min, trials, alpha) >= threshold:
        k_min += 1
    if k_min > trials:
        return 1.0
    low, high = alpha, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if stats.binom.sf(k_min - 1, trials, mid) < power else (low, mid)
    return high


def pit_score(k: int, n: int, p: float, v: float) -> float:
    """z = Φ⁻¹(u), u = F(k − 1) + v·P(K = k) for K ~ Binomial(n, p) and v in (0, 1): the
    randomized probability-integral transform, exactly N(0, 1) when k ~ Binomial(n, p)
    and v ~ U(0, 1). Computed from the nearer tail (1 − u = P(K > k) + (1 − v)·P(K = k)),
    so that |z| up to ~37 keeps its precision; a k impossible under p gives ±inf."""
    below = float(stats.binom.cdf(k - 1, n, p))
    mass = float(stats.binom.pmf(k, n, p))
    u = below + v * mass
    if u <= 0.5:
        return float(ndtri(u))
    return -float(ndtri(float(stats.binom.sf(k, n, p)) + (1.0 - v) * mass))


def calibration_pvalues(scores: np.ndarray) -> tuple[float, float]:
    """Two-sided p-values of the bias Σz/√m against N(0, 1) and of the dispersion Σz²
    against χ²_m, for m independent N(0, 1) scores (1.0 each without scores)."""
    m = len(scores)
    if m == 0:
        return 1.0, 1.0
    bias = float(np.sum(scores)) / math.sqrt(m)
    dispersion = float(np.sum(np.square(scores)))
    p_bias = 2.0 * float(ndtr(-abs(bias))) if math.isfinite(bias) else 0.0
    if not math.isfinite(dispersion):
        return p_bias, 0.0
    tail = min(float(stats.chi2.cdf(dispersion, m)), float(stats.chi2.sf(dispersion, m)))
    return p_bias, min(1.0, 2.0 * tail)


def calibration_power(m: int, n: int, threshold: float, power: float = 0.9) -> dict:
    """What the calibration sub-tests flag with probability ``power`` at level ``threshold``
    with m scores of counts of n samples: a shift of the mean score (and of the counts, as
    a fraction of n, at p = 1/2, where a count's sd is largest) and a factor on its variance."""
    if m == 0:
        return {"bias_shift": math.inf, "count_shift": math.inf, "variance_factor": math.inf}
    shift = (float(ndtri(1 - threshold / 2)) + float(ndtri(power))) / math.sqrt(m)
    factor = float(stats.chi2.isf(threshold / 2, m)) / float(stats.chi2.ppf(1 - power, m))
    return {"bias_shift": shift, "count_shift": shift * 0.5 / math.sqrt(n),
            "variance_factor": factor}  # fmt: skip
