"""Sequential CERTIFY that tests each input's place on the radius grid directly (issue 60).

The rule ``grid-place-v1`` draws the estimation samples in rounds on the same stream as a
fixed run (the first n_k samples at look k are a fixed run's first n_k), like
:mod:`harness.mathematics.sequential`, but instead of a confidence sequence for p_A it
tests the grid places themselves.

**The tests.** With the thresholds t_1 < … < t_G of the grid's positive radii at the
input's σ (:func:`~harness.mathematics.radius.grid_thresholds`) and t_0 just above 1/2,
the rule tests H_j: p_A <= τ_j in the order j = 0, 1, …, G, where τ_0 = t_0 and
τ_j = 1 − (1 − t_j)(1 − :data:`NUDGE`) sits a relative 10⁻⁶ of the gap above t_j (so the
certifier's formula at τ_j is at least r_j despite rounding). For each j the e-process

    E_j(n) = ∫_{q > τ_j} (q/τ_j)^C (1 − q)^{n−C} / (1 − τ_j)^{n−C} dπ(q) / π(q > τ_j)

(C the count of ĉ_A among the first n samples) mixes likelihood ratios of alternatives
q > τ_j under the prior π truncated there (:func:`log_evidence`, in closed form with the
regularized incomplete beta function). For every p <= τ_j each ratio's factor has mean
p q/τ_j + (1 − p)(1 − q)/(1 − τ_j) <= 1, so E_j is a nonnegative supermartingale with
E_j(0) = 1 and, by Ville's inequality, P(∃n: E_j(n) >= 1/α') <= α' with
α' = α (1 − :data:`FINAL_SHARE`). H_j is rejected once E_j has reached 1/α' at some
look, or at the last look n_max when the exact binomial test of H_j at level
α · :data:`FINAL_SHARE` rejects (Clopper & Pearson 1934); so P(H_j rejected) <= α for
every true H_j. The input's place is the number of leading rejected hypotheses
(H_0 … H_{P−1} rejected, H_P not). The hypotheses are nested (H_j true implies H_{j+1}
true), so the place is too high only if the *first* true hypothesis is rejected: one
event of probability <= α, whatever the stopping time and whatever the data-dependent
number of looks (fixed-sequence testing; no α is split between the places). The
certificate's bound is τ_{P−1} (0 at place 0): p_A > τ_{P−1} with probability >= 1 − α,
and the certifier's formula gives the grid radius r_{P−1} (a hair above it). It is the
grid place it decided, not a continuous radius.

**The prior** π is fixed before any estimation sample: the Beta(1, 1/16) law of
:mod:`harness.mathematics.sequential` updated by ĉ_A's count k₀ among the n0 selection
samples (independent of the estimation stream): Beta(1 + k₀, 1/16 + n0 − k₀). It decides
only how fast a true place is found; any prior fixed before estimation keeps the bound.

**When an input stops** (efficiency only): at the last look; when every hypothesis is
rejected; or when H_P cannot be rejected by n_max even if the remaining samples agreed
with ĉ_A at U_k, p_A's Clopper–Pearson upper bound at level β = :data:`FUTILITY_LEVEL`
(conditional power; U_k = 1 when every sample agreed). Looks at n_1 = 100,
n_{k+1} = ⌈:data:`GROWTH` · n_k⌉, …, n_max: the e-processes cost no α per look, so
looks are frequent (a decision needs at most 2 % more samples than the look it is
reached at). The levers were chosen from the savings they measured against the grid
places they lost on the field board's p_A values (docs/sequential.md).

**PREDICT at the stopping time** (:func:`anytime_predictions`): the top class a of the
stopping look's counts against the runner-up b, on the samples that are a or b, with the
e-process ∫_{1/2}^{1} (2θ)^{N_a} (2(1 − θ))^{N_b} 2 dθ (uniform θ). For the true top
class c and any a ≠ c it is a supermartingale under the null p_a <= p_c, and it falls as
N_b grows, so returning a needs E(N_a, N_c) >= (C − 1)/α at the stop: a wrong class has
probability <= α by Ville's inequality and a union over the C − 1 classes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from scipy.special import betainc, betaln

from harness.mathematics.sequential import RuleSchedule, shaped_looks, stop_problems

RULE_NAME = "grid-place-v1"
FIRST_LOOK = 100
"""Samples at the first look (a single look at n_max when n_max < GROWTH × 100)."""
GROWTH = 1.02
"""n_{k+1} = ⌈GROWTH·n_k⌉: looks cost no α, so only the engine's rounds limit them."""
FINAL_SHARE = 0.1
"""The share of α spent on the exact binomial test at n_max; the e-processes get the rest."""
FUTILITY_LEVEL = 0.2
"""β of the upper bound U_k of the futility test (efficiency, not validity)."""
PRIOR = (1.0, 0.0625)
"""(a, b) of the Beta law that the selection counts update into each input's prior."""
NUDGE = 1e-6
"""τ_j = 1 − (1 − t_j)(1 − NUDGE): the tested value a hair above the grid threshold."""
HALF = float(np.nextafter(0.5, 1.0))
"""τ_0: a bound above it certifies ĉ_A (radius > 0)."""
MARGIN = 1e-6
"""Nats by which log E must pass log(1/α'): log-Beta functions of counts near 10⁶ lose
~10⁻⁹ nats to rounding, and a rejection must hold in exact arithmetic too."""


def tested_values(thresholds) -> np.ndarray:
    """[B, G + 1]: τ_0 = just above 1/2, then τ_j of each grid threshold t_j ([B, G]);
    a threshold >= 1 (a radius the formula never reaches) is never rejected."""
    t = np.atleast_2d(np.asarray(thresholds, dtype=np.float64))
    tau = np.where(t < 1.0, 1.0 - (1.0 - t) * (1.0 - NUDGE), np.inf)
    return np.concatenate([np.full((len(t), 1), HALF), np.maximum(tau, HALF)], axis=1)


def stored_thresholds(thresholds) -> np.ndarray:
    """Grid thresholds as draws record them: a radius never reached (threshold >= 1, or
    inf) is stored as 1 (JSON holds no inf); the rule never rejects either."""
    return np.minimum(np.asarray(thresholds, dtype=np.float64), 1.0)


def log_evidence(count, n, tau, a, b) -> np.ndarray:
    """log E of the truncated Beta(a, b) mixture against H: p <= τ at ``count`` of ``n``
    (elementwise): log B(a + C, b + n − C) − log B(a, b) + log P(Beta(a + C, b + n − C) > τ)
    − log P(Beta(a, b) > τ) − C log τ − (n − C) log(1 − τ); −inf where τ >= 1."""
    count, n, tau, a, b = (np.asarray(v, dtype=np.float64)
                           for v in np.broadcast_arrays(count, n, tau, a, b))  # fmt: skip
    out = np.full(count.shape, -np.inf)
    ok = tau < 1.0
    if not np.any(ok):
        return out
    c, rest, t, a, b = count[ok], n[ok] - count[ok], tau[ok], a[ok], b[ok]
    gap = 1.0 - t  # exact for τ >= 1/2
    mass = betainc(b, a, gap)  # the prior's mass above τ
    with np.errstate(divide="ignore"):
        tail = np.log(betainc(b + rest, a + c, gap)) - np.log(np.where(mass > 0, mass, 1.0))
    value = betaln(a + c, b + rest) - betaln(a, b) + tail - c * np.log(t) - rest * np.log(gap)
    # no prior mass above τ in double precision: the test does not reject (conservative)
    out[ok] = np.where((mass > 0) & np.isfinite(tail), value, -np.inf)
    return out


def pair_log_evidence(top, other) -> np.ndarray:
    """log E of PREDICT's test: ∫_{1/2}^{1} (2θ)^{N_a} (2(1 − θ))^{N_b} 2 dθ =
    2^{N_a + N_b + 1} B(N_a + 1, N_b + 1) P(Beta(N_a + 1, N_b + 1) > 1/2)."""
    k, m = (np.asarray(v, dtype=np.float64) for v in np.broadcast_arrays(top, other))
    with np.errstate(divide="ignore"):
        tail = np.log(betainc(m + 1, k + 1, 0.5))
    return (k + m + 1) * math.log(2.0) + betaln(k + 1, m + 1) + tail


def anytime_predictions(counts: np.ndarray, alpha: float) -> np.ndarray:
    """PREDICT valid at a stopping time, per row of ``counts`` [B, C]: the top class when
    its e-process against the runner-up reaches (C − 1)/α, else −1 (abstain)."""
    counts = np.asarray(counts, dtype=np.int64)
    if counts.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(counts, axis=1, kind="stable")[:, ::-1]
    rows = np.arange(len(counts))
    n_a = counts[rows, order[:, 0]]
    n_b = counts[rows, order[:, 1]] if counts.shape[1] > 1 else np.zeros_like(n_a)
    level = math.log(max(counts.shape[1] - 1, 1) / alpha) + MARGIN
    return np.where((n_a > n_b) & (pair_log_evidence(n_a, n_b) >= level), order[:, 0], -1)


@dataclass(frozen=True)
class GridPlaceRule(RuleSchedule):
    """The rule of a run: its cap ``n_max``, the ``radii`` it decides and its levers (the
    schedule and the record: :class:`~harness.mathematics.sequential.RuleSchedule`)."""

    RULE_NAME: ClassVar[str] = RULE_NAME
    growth: float = GROWTH
    final_share: float = FINAL_SHARE
    prior: tuple[float, float] = PRIOR
    beta: float = FUTILITY_LEVEL

    def priors(self, selected, n0) -> tuple[np.ndarray, np.ndarray]:
        """(a, b) of each input's prior from ĉ_A's selection count(s) ``selected`` of n0."""
        selected = np.asarray(selected, dtype=np.float64)
        a0, b0 = self.prior
        return a0 + selected, b0 + np.asarray(n0, dtype=np.float64) - selected

    def rejects(self, count, k, tau, a, b, alpha: float) -> np.ndarray:
        """Whether H: p_A <= ``tau`` is rejected at look(s) ``k`` (0-based) with ``count``
        of ĉ_A (elementwise): the e-process at α(1 − final share), or at the last look the
        exact binomial test at α · final share too (one look: the exact test at α)."""
        count, k, tau, a, b = np.broadcast_arrays(np.asarray(count, dtype=np.int64),
                                                  np.asarray(k), tau, a, b)  # fmt: skip
        n, last = self._looks[k], len(self._looks) - 1
        if last == 0:
            return _exact_rejects(count, n, tau, alpha)
        level = MARGIN - math.log(alpha * (1.0 - self.final_share))
        out = log_evidence(count, n, tau, a, b) >= level
        final = k == last
        if np.any(final):
            out = out | (final & _exact_rejects(count, n, tau, alpha * self.final_share))
        return out

    def places(self, counts, tau, a, b, alpha: float) -> np.ndarray:
        """[B, k]: each input's place after each of its first k looks, from ĉ_A's
        cumulative counts [B, k], its tested values ``tau`` [B, G + 1] and prior (a, b) [B]:
        the number of leading hypotheses rejected at some look so far."""
        counts = np.atleast_2d(np.asarray(counts, dtype=np.int64))
        tau = np.atleast_2d(tau)
        looks = np.arange(counts.shape[1])
        hit = self.rejects(counts[:, :, None], looks[None, :, None], tau[:, None, :],
                           np.asarray(a)[:, None, None], np.asarray(b)[:, None, None], alpha)  # fmt: skip
        ever = np.logical_or.accumulate(hit, axis=1) if counts.shape[1] else hit
        return np.cumprod(ever, axis=2).sum(axis=2)

    def advance(self, ever, count, k: int, tau, a, b, alpha: float):
        """One look ``k`` of the rounds: ``ever`` [B, G + 1] (hypotheses rejected at some
        look so far) updated with ĉ_A's ``count`` [B] there, and the places [B]."""
        tau = np.atleast_2d(tau)
        hit = self.rejects(np.asarray(count)[:, None], k, tau, np.asarray(a)[:, None],
                           np.asarray(b)[:, None], alpha)  # fmt: skip
        ever = np.asarray(ever, dtype=bool) | hit
        return ever, np.cumprod(ever, axis=1).sum(axis=1)

    def stops(self, k, count, place, tau, a, b, alpha: float) -> np.ndarray:
        """Whether each input stops at look ``k`` (0-based; one for all or one per input)
        at ``count`` of ĉ_A and its ``place`` there: at the last look, at the top place,
        or when the next hypothesis cannot be rejected by n_max (futility)."""
        count, place = np.asarray(count, dtype=np.int64), np.asarray(place, dtype=np.int64)
        k = np.broadcast_to(np.asarray(k, dtype=np.int64), count.shape)
        tau = np.atleast_2d(tau)
        last, top = len(self._looks) - 1, tau.shape[1]
        nxt = tau[np.arange(len(tau)), np.minimum(place, top - 1)]
        more = self.n_max - self._looks[k]
        rate = _cp_upper(count, self._looks[k], self.beta)
        projected = count + np.minimum(more, np.ceil(more * rate).astype(np.int64))
        reach = self.rejects(projected, np.full_like(k, last), nxt, a, b, alpha)
        return (k == last) | (place >= top) | ~reach

    def bound(self, place, tau) -> np.ndarray:
        """The certificate's bound: τ of the last hypothesis rejected (0 at place 0)."""
        place = np.asarray(place, dtype=np.int64)
        tau = np.atleast_2d(tau)
        below = tau[np.arange(len(tau)), np.maximum(place - 1, 0)]
        return np.where(place > 0, below, 0.0)

    def stopped_bounds(self, counts, stops, thresholds, selected, n0, alpha: float) -> np.ndarray:
        """The bound of each input at its last look ``stops`` [B] from ĉ_A's (or another
        class's) counts at every look [B, K], its grid ``thresholds`` [B, G] and selection
        count ``selected`` [B] (the prior)."""
        counts = np.atleast_2d(np.asarray(counts, dtype=np.int64))
        stops = np.asarray(stops, dtype=np.int64)
        tau = tested_values(thresholds)
        a, b = self.priors(selected, n0)
        depth = int(stops.max()) + 1 if len(stops) else 0
        places = self.places(counts[:, :depth], tau, a, b, alpha)
        return self.bound(places[np.arange(len(stops)), stops], tau)

    def rejection_counts(self, tau: float, a: float, b: float, alpha: float) -> np.ndarray:
        """[K]: at each look, the least count at which H: p <= ``tau`` is rejected (n_k + 1
        if none), by bisection (rejection never stops as the count grows)."""
        every = np.arange(len(self._looks))
        lo, hi = np.full(len(every), -1, dtype=np.int64), self._looks + 1
        while np.any(hi - lo > 1):
            mid = (lo + hi) // 2
            over = self.rejects(np.maximum(mid, 0), every, tau, a, b, alpha)
            lo, hi = np.where(over, lo, mid), np.where(over, mid, hi)
        return hi


def _exact_rejects(count, n, tau, alpha: float) -> np.ndarray:
    """The exact binomial test of H: p <= τ at level α: P_τ(X >= count) <= α (the
    Clopper–Pearson bound at α reaches τ), with a relative 10⁻⁹ to spare."""
    count, n, tau = np.broadcast_arrays(np.asarray(count, np.float64), np.asarray(n, np.float64),
                                        np.asarray(tau, np.float64))  # fmt: skip
    ok = (tau < 1.0) & (count >= 1)
    tail = np.ones(count.shape)
    tail[ok] = betainc(count[ok], n[ok] - count[ok] + 1.0, tau[ok])
    return ok & (tail <= alpha * (1.0 - 1e-9))


def _cp_upper(count, n, beta: float) -> np.ndarray:
    from harness.mathematics.stats import clopper_pearson_upper_array

    return clopper_pearson_upper_array(count, n, beta)


def look_problems(
    rule: GridPlaceRule, looks: Sequence[Sequence[Mapping[str, Any]]], top: np.ndarray,
    estimation: Sequence, selection: np.ndarray, n0: int, thresholds: np.ndarray, alpha: float,
) -> list[str | None]:  # fmt: skip
    """Per certificate, the first way its stored ``looks`` depart from ``rule``, or None:
    the schedule, cumulative counts and last counts of
    :func:`harness.mathematics.sequential.look_problems`, and the rule continuing after
    every look but the last and stopping there, re-derived with the ``thresholds`` [B, G]
    and the prior of ĉ_A's (``top``) count in ``selection`` [B, C]."""
    out, rows, depth, padded = shaped_looks(rule.looks, looks, top, estimation)
    if not len(rows):
        return out
    tau = tested_values(thresholds[rows])
    a, b = rule.priors(np.asarray(selection)[rows, np.asarray(top)[rows]], n0)
    places = rule.places(padded, tau, a, b, alpha)
    row, k = np.nonzero(np.arange(padded.shape[1])[None, :] < depth[:, None])
    stop = rule.stops(k, padded[row, k], places[row, k], tau[row], a[row], b[row], alpha)
    return stop_problems(out, rule.looks, rows, depth, row, k, stop)
