"""The exact probability that a sequential bound on p_A ever exceeds the true p_A.

A sequential certificate is false when the bound it stops at exceeds p_A (then its
radius exceeds the true one, or it certifies a class that is not g(x)). For the running
maximum of bounds L_k that each depend only on the count at look k, that happens at
*some* stopping time iff some L_k > p_A, so a rule is anytime-valid at level α iff

    P_p(∃k: L_k(C_k) > p) <= α   for every p,

C_k ~ the count among the first n_k samples, a binomial random walk. For a given p this
crossing probability is a sum over paths, computed exactly by dynamic programming over
(look, count): the sub-probability of the counts of paths that have not crossed yet is
convolved with the Binomial(n_{k+1} − n_k, p) law of the next round's count (directly, or
by FFT for long rounds; counts are tracked within 40 standard deviations of their mean,
so a look costs O(√n)) and the mass at counts whose bound exceeds p is moved to the
crossed total. No sampling is involved, so the check flags an invalid rule (e.g. a plain
Clopper–Pearson bound at level α at every look, whose crossing probability is several
times α) with no false alarms: a valid rule's crossing probability is <= α at every p
by Ville's inequality and the union bound (:mod:`harness.mathematics.sequential`). Each
look's bound never falls as the count grows, so the counts where it exceeds p are those
from one count on (:meth:`~harness.mathematics.sequential.SequentialRule.crossing_counts`).

The grid-place rule (:mod:`harness.mathematics.gridplace`) errs only by rejecting its
first true hypothesis H_j: p_A <= τ_j, so its check is the same dynamic programme at
p = τ_j for each tested value and prior (:func:`rejection_probability`): every one must be
<= α.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy import stats
from scipy.signal import fftconvolve

from harness.mathematics.gridplace import GridPlaceRule
from harness.mathematics.sequential import SequentialRule

DIRECT_LIMIT = 2_000_000
"""Largest (counts × round length) convolved directly; longer rounds go through FFT."""
WINDOW_SD, WINDOW_SLACK = 40.0, 50
"""Counts are tracked within mean ± (40 sd + 50) of their binomial law; the mass left out
is below 10⁻³⁰⁰ (a Poisson tail of 50 events at rate < 1, or a normal tail at 40 sd)."""


def _window(n: int, p: float) -> tuple[int, int]:
    """The counts [lo, hi] of Binomial(n, p) outside which the mass is negligible."""
    half = WINDOW_SD * np.sqrt(n * p * (1.0 - p)) + WINDOW_SLACK
    return max(0, int(np.floor(n * p - half))), min(n, int(np.ceil(n * p + half)))


def crossing_probability(rule: SequentialRule, alpha: float, p: float) -> float:
    """P_p(some look's bound exceeds p) under ``rule`` at level ``alpha``, exactly (up to
    the mass outside :data:`WINDOW_SD` standard deviations, below 10⁻³⁰⁰). It depends on
    nothing else, so the settings a process audits under one rule share their values
    (remembered by the rule, α, p and the bound function the rule's class has now)."""
    return _crossing_probability(rule, float(alpha), float(p), type(rule).look_bounds)


@lru_cache(maxsize=4096)
def _crossing_probability(rule: SequentialRule, alpha: float, p: float, _bounds) -> float:
    # at each look, the counts from which L_k > p
    return passage_probability(rule.looks, rule.crossing_counts(p, alpha), p)


def rejection_probability(rule: GridPlaceRule, alpha: float, tau: float, a: float,
                          b: float) -> float:  # fmt: skip
    """P_τ(the grid-place rule ever rejects H: p_A <= ``tau``) with the prior Beta(a, b),
    exactly: the largest chance of a false place through this hypothesis (the e-process
    is a supermartingale for every p <= τ, the exact test's size grows with p, so p = τ
    is the worst). Remembered like :func:`crossing_probability`."""
    return _rejection_probability(rule, float(alpha), float(tau), float(a), float(b),
                                  type(rule).rejects)  # fmt: skip


@lru_cache(maxsize=4096)
def _rejection_probability(rule, alpha: float, tau: float, a: float, b: float, _rejects) -> float:
    if not tau < 1.0:
        return 0.0
    return passage_probability(rule.looks, rule.rejection_counts(tau, a, b, alpha), tau)


def passage_probability(looks: np.ndarray, least: np.ndarray, p: float) -> float:
    """P_p(∃k: C_k >= ``least``[k]) for the count C_k of Binomial(n_k, p) samples at the
    looks n_k (the first n_k samples of one stream), by dynamic programming."""
    alive, offset = np.ones(1), 0  # P(count = offset + i, not crossed yet)
    crossed, before = 0.0, 0
    for n, over_from in zip(np.asarray(looks).tolist(), np.asarray(least).tolist(), strict=True):
        lo, hi = _window(n - before, p)
        step = stats.binom.pmf(np.arange(lo, hi + 1), n - before, p)
        if len(alive) * len(step) > DIRECT_LIMIT:
            alive = np.clip(fftconvolve(alive, step), 0.0, None)
        else:
            alive = np.convolve(alive, step)
        offset += lo
        keep_lo, keep_hi = _window(n, p)
        start, stop = max(keep_lo - offset, 0), min(keep_hi - offset + 1, len(alive))
        alive, offset = alive[start:stop], offset + start
        over = offset + np.arange(len(alive)) >= over_from
        crossed += float(alive[over].sum())
        alive[over] = 0.0
        before = n
    return crossed


def audit_points(rule: SequentialRule, thresholds: np.ndarray | None = None, count: int = 48):
    """Where to evaluate the crossing probability: ``count`` values of p log-spaced in
    1 − p from 1/2 down to 1/n_max, and just below each threshold of the grid (where a
    false certificate at a grid radius is likeliest)."""
    gaps = np.geomspace(0.5, 1.0 / rule.n_max, count)
    points = [1.0 - gaps]
    if thresholds is not None and np.size(thresholds):
        t = np.unique(np.asarray(thresholds, dtype=np.float64).ravel())
        points.append(t[(t > 0.5) & (t < 1.0)] * (1.0 - 1e-9))
    return np.unique(np.concatenate(points))


def worst_rejection(rule: GridPlaceRule, alpha: float, tau: np.ndarray,
                    priors: np.ndarray) -> dict[str, float]:  # fmt: skip
    """The largest :func:`rejection_probability` over the tested values ``tau`` (< 1) and
    the priors ``priors`` [P, 2] ((a, b) rows), and where it is."""
    tau = np.unique(np.asarray(tau, dtype=np.float64)[np.asarray(tau) < 1.0])
    cases = [(float(t), float(a), float(b)) for t in tau for a, b in np.unique(priors, axis=0)]
    values = np.array([rejection_probability(rule, alpha, *case) for case in cases])
    k = int(np.argmax(values))
    return {"points": len(cases), "worst_p": cases[k][0], "prior": list(cases[k][1:]),
            "probability": float(values[k]), "ratio_to_alpha": float(values[k] / alpha)}  # fmt: skip


def worst_crossing(rule: SequentialRule, alpha: float, points: np.ndarray) -> dict[str, float]:
    """The largest crossing probability over ``points`` and where it is."""
    values = np.array([crossing_probability(rule, alpha, float(p)) for p in points])
    k = int(np.argmax(values))
    return {"points": len(points), "worst_p": float(points[k]), "probability": float(values[k]),
            "ratio_to_alpha": float(values[k] / alpha)}  # fmt: skip
