"""Sequential CERTIFY: an anytime-valid bound on p_A, and when to stop sampling an input.

This is the rule ``mixture-cs-v2`` of earlier runs (they keep verifying under it); a new
sequential run tests its grid place directly (:mod:`harness.mathematics.gridplace`;
:mod:`harness.mathematics.rules` picks a rule by name).

CERTIFY (Cohen et al. 2019, §3.2) draws a fixed n estimation samples. The sequential rule
draws them in rounds, on the same stream (the first n_k samples at look k are the first
n_k of a fixed run's), and stops an input once its place on the benchmark's radius grid
is decided.

**The bound** (:meth:`SequentialRule.look_bounds`). Looks at a fixed geometric schedule
n_1 < n_2 < … < n_K = n_max (:meth:`SequentialRule.looks`: n_1 = 100,
n_{k+1} = ⌈1.1·n_k⌉ while at most n_max/1.1; a single look at n_max when n_max < 110).
Half of α goes to a confidence sequence valid at every n, half to the last look:

- before n_max, L_k is the lower end of Robbins' beta-binomial mixture confidence
  sequence (Robbins 1970, "Statistical methods related to the law of the iterated
  logarithm"; Waudby-Smith & Ramdas, JRSS-B 2024, §3) at level α/2: with C_k ĉ_A's count
  among the first n_k samples and the mixing law Beta(a, b) (:data:`PRIOR`),

      M_k(t) = B(a + C_k, b + n_k − C_k) / (B(a, b) · t^{C_k} (1 − t)^{n_k − C_k})

  is a nonnegative martingale with mean 1 under p_A = t, so by Ville's inequality
  P(∃k: M_k(p_A) >= 2/α) <= α/2, and L_k = inf{t <= C_k/n_k : M_k(t) < 2/α}
  (:func:`mixture_lower`);
- at n_max, L_K is the larger of that and the Clopper–Pearson bound at level α/2
  (Clopper & Pearson 1934), which is what a fixed-n run at α/2 would give;
- with one look, L_1 is the Clopper–Pearson bound at α.

By the union bound P(∃k: p_A < L_k) <= α, so the running maximum max_{m<=k} L_m is below
p_A at *every* look at once with probability >= 1 − α, and so at any stopping time,
however it depends on the counts: a sequential certificate carries the radius guarantee
of a fixed-n one at the same α, at a data-dependent n. Beta(1, 1/16) puts most of its
mass near p_A = 1, where the samples that count are spent: when every sample agrees,
M_k(t) ≈ n_k^{−1/16} t^{−n_k}, so the bound passes t after about
(log(2/α) + log(n)/16) / (1 − t) samples, against log(1/α) / (1 − t) for the best
level-α test (Neyman–Pearson against p = 1; 218,105 samples for Φ(4), radius 1 at σ = 1/4,
at α = 0.001). ĉ_A comes from the n0 selection samples, independent of these.

**The stopping rule** (efficiency only: the bound holds whatever it does). With the
grid's thresholds t_j (the bound at which the certifier's declared formula reaches
grid radius r_j > 0 at the input's σ, :func:`~harness.mathematics.radius.grid_thresholds`),
an input's *place* for a bound q is [q > 1/2] + #{j : q >= t_j}. At look k it stops
(:meth:`SequentialRule.stops`) when k = K or place(L_k) = place(reach_k), where reach_k
is the bound n_max would give if the remaining samples agreed with ĉ_A at rate U_k, the
Clopper–Pearson upper bound of p_A at level β = 0.01 (a conditional-power futility test;
U_k = 1 when every sample agreed, so then "every remaining sample agrees"): certified at
r_j, and r_{j+1} not reachable by n_max. Stopping depends only on the harness's counts
and this rule, so check S0 re-derives every bound and every decision from the stored
looks (:func:`look_problems`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

import numpy as np
from scipy.special import betaln

from harness.mathematics.stats import clopper_pearson_lower_array, clopper_pearson_upper_array

RULE_NAME = "mixture-cs-v2"
FIRST_LOOK = 100
"""Samples at the first look (a single look at n_max when n_max < 1.1 × 100)."""
GROWTH = 1.1
"""n_{k+1} = ⌈GROWTH·n_k⌉: a decision needs at most 1.1× the samples of the look it is
reached at (the confidence sequence holds at every n, so looks cost no α)."""
FINAL_SHARE = 0.5
"""The share of α spent on the Clopper–Pearson bound at n_max (where inputs near a
threshold end up); the confidence sequence gets the rest."""
PRIOR = (1.0, 0.0625)
"""(a, b) of the Beta mixing law of the confidence sequence: b < 1 weights p_A near 1."""
FUTILITY_LEVEL = 0.01
"""β of the upper bound U_k of the futility test (it decides efficiency, not validity)."""
BISECTIONS = 64
"""Halvings of [0, 1] that locate the confidence sequence's lower end (to double precision)."""
MARGIN = 1e-6
"""Nats by which log M_n must pass log(1/α) to exclude a value: log-Beta functions of
counts near 10⁶ lose ~10⁻⁹ nats to rounding, and the bound must err low."""


def mixture_lower(k, n, alpha, prior: tuple[float, float] = PRIOR) -> np.ndarray:
    """The lower end of the beta-binomial mixture confidence sequence at level ``alpha``,
    inf{t <= k/n : M_n(t) < 1/α} with log M_n(t) = log B(a + k, b + n − k) − log B(a, b)
    − k log t − (n − k) log(1 − t), elementwise: the exclusion {t < k/n : M_n(t) >= 1/α} is
    an interval [0, L) (log M_n decreases on [0, k/n]), located by :data:`BISECTIONS`
    halvings of [0, 1], the same for every count, so the bound never falls as k grows.
    A value is excluded when log M_n passes log(1/α) by :data:`MARGIN`, so the value
    returned is excluded in exact arithmetic too (at or below the exact end)."""
    k, n = np.broadcast_arrays(np.asarray(k, dtype=np.int64), np.asarray(n, dtype=np.int64))
    pairs, where = np.unique(np.stack([k.ravel(), n.ravel()], axis=1), axis=0, return_inverse=True)
    a, b = prior
    gain = betaln(a + pairs[:, 0], b + pairs[:, 1] - pairs[:, 0]) - betaln(a, b)  # log marginal
    level = MARGIN - math.log(float(alpha))
    ends = [_mixture_end(int(count), int(size), float(g), level)
            for (count, size), g in zip(pairs, gain, strict=True)]  # fmt: skip
    return np.asarray(ends, dtype=np.float64)[where.ravel()].reshape(k.shape)


@functools.lru_cache(maxsize=1 << 16)
def _mixture_end(k: int, n: int, gain: float, level: float) -> float:
    """:func:`mixture_lower` of one count, in Python floats (a round of a few inputs asks
    for a handful of bounds, where array calls would cost more than the arithmetic; each
    distinct (count, n) of a call is solved once). Remembered: the inputs of a run meet
    the same (count, n) at the same looks (a confident input has k = n at every look), so
    re-deriving a board's certificates asks each pair many times."""
    if k == 0:
        return 0.0
    phat, rest, lo, hi = k / n, n - k, 0.0, 1.0
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        if mid < phat and gain - k * math.log(mid) - rest * math.log1p(-mid) >= level:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class RuleSchedule:
    """What every sequential rule of the harness is made of: its cap ``n_max``, the radius
    grid ``radii`` it decides (the benchmark's ``radii``), its geometric looks (``first``,
    then ×``growth``, at least one sample apart, and n_max) and the levers stored with each
    certificate's draws (:meth:`record`); a rule's module gives the defaults and the tests."""

    RULE_NAME: ClassVar[str] = ""
    n_max: int
    radii: tuple[float, ...]
    first: int = FIRST_LOOK
    growth: float = GROWTH
    final_share: float = FINAL_SHARE
    prior: tuple[float, float] = PRIOR
    beta: float = FUTILITY_LEVEL
    _looks: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        looks, n = [], self.first
        while n * self.growth <= self.n_max:  # the last step to n_max is >= growth too
            looks.append(n)
            n = max(n + 1, math.ceil(round(n * self.growth, 6)))  # ⌈1.1 · 100⌉ = 110, not 111
        object.__setattr__(self, "_looks", np.array([*looks, self.n_max], dtype=np.int64))

    @property
    def looks(self) -> np.ndarray:
        """n_1 < … < n_K = n_max, the sample counts at which the rule looks."""
        return self._looks

    def record(self) -> dict[str, Any]:
        """The rule as stored with each certificate's draws."""
        return {"name": self.RULE_NAME, "n_max": int(self.n_max),
                "radii": [float(r) for r in self.radii], "first": self.first,
                "growth": self.growth, "final_share": self.final_share,
                "prior": [float(v) for v in self.prior], "beta": self.beta}  # fmt: skip

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Self:
        if record.get("name") != cls.RULE_NAME:
            raise ValueError(f"unknown sequential rule {record.get('name')!r}; known: "
                             f"{cls.RULE_NAME}")  # fmt: skip
        a, b = (float(v) for v in record["prior"])
        return cls(int(record["n_max"]), tuple(float(r) for r in record["radii"]),
                   int(record["first"]), float(record["growth"]), float(record["final_share"]),
                   (a, b), float(record["beta"]))  # fmt: skip


@dataclass(frozen=True)
class SequentialRule(RuleSchedule):
    """The ``mixture-cs-v2`` rule of a run (module docstring)."""

    RULE_NAME: ClassVar[str] = RULE_NAME

    def look_bounds(self, counts, k, alpha: float) -> np.ndarray:
        """L_k of the counts of ĉ_A at look(s) ``k`` (0-based, broadcast with ``counts``):
        the mixture bound at α·(1 − final share), and at the last look the larger of that
        and Clopper–Pearson at α·final share (one look: Clopper–Pearson at α)."""
        counts, k = np.broadcast_arrays(np.asarray(counts, dtype=np.int64), np.asarray(k))
        n, last = self._looks[k], len(self._looks) - 1
        if last == 0:
            return clopper_pearson_lower_array(counts, n, alpha)
        bound = mixture_lower(counts, n, alpha * (1.0 - self.final_share), self.prior)
        final = k == last
        if np.any(final):
            bound = np.where(final, np.maximum(bound, clopper_pearson_lower_array(counts, n, alpha * self.final_share)),
                             bound)  # fmt: skip
        return bound

    def bounds(self, counts: np.ndarray, alpha: float) -> np.ndarray:
        """Running maxima max_{m<=k} L_m [B, k] of the bounds at the first k looks, from
        the cumulative counts [B, k] of the certified class at those looks."""
        counts = np.atleast_2d(np.asarray(counts, dtype=np.int64))
        lower = self.look_bounds(counts, np.arange(counts.shape[1])[None, :], alpha)
        return np.maximum.accumulate(lower, axis=1) if counts.shape[1] else lower

    def stops(self, k, count: np.ndarray, bound: np.ndarray, thresholds: np.ndarray,
              alpha: float) -> np.ndarray:  # fmt: skip
        """Whether each input stops at look ``k`` (0-based; one for all or one per input),
        given its count of ĉ_A there, its running bound and its grid ``thresholds`` [B, G]
        (positive radii)."""
        count = np.asarray(count, dtype=np.int64)
        k = np.broadcast_to(np.asarray(k, dtype=np.int64), count.shape)
        last = len(self._looks) - 1
        more = self.n_max - self._looks[k]
        rate = clopper_pearson_upper_array(count, self._looks[k], self.beta)
        projected = count + np.minimum(more, np.ceil(more * rate).astype(np.int64))
        reach = np.maximum(bound, self.look_bounds(projected, np.full_like(k, last), alpha))
        return (k == last) | (places(bound, thresholds) >= places(reach, thresholds))

    def crossing_counts(self, p: float, alpha: float) -> np.ndarray:
        """[K]: at each look, the least count whose bound L_k exceeds ``p`` (n_k + 1 if
        none does), by bisection over the counts (L_k never falls as the count grows)."""
        every = np.arange(len(self._looks))
        lo, hi = np.full(len(every), -1, dtype=np.int64), self._looks + 1
        while np.any(hi - lo > 1):
            mid = (lo + hi) // 2
            over = self.look_bounds(np.maximum(mid, 0), every, alpha) > p
            lo, hi = np.where(over, lo, mid), np.where(over, mid, hi)
        return hi


def places(bound: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """Place on the grid of each bound: [bound > 1/2] + #{j : bound >= thresholds_j}."""
    bound = np.asarray(bound, dtype=np.float64)
    above = (bound[:, None] >= np.asarray(thresholds, dtype=np.float64)).sum(axis=1)
    return (bound > 0.5) * (1 + above)


def look_problems(
    rule: SequentialRule, looks: Sequence[Sequence[Mapping[str, Any]]], top: np.ndarray,
    estimation: np.ndarray, thresholds: np.ndarray, alpha: float,
) -> list[str | None]:  # fmt: skip
    """Per certificate, the first way its stored ``looks`` (``[{"n", "counts"}, ...]``)
    depart from ``rule``, or None: the n of its looks must be the schedule's first ones;
    the counts cumulative (each class's count never falls, and rises by at most the
    samples added) and summing to n; the last look's counts its ``estimation``; and the
    rule must continue after every look but the last and stop there (with the class
    ``top``, the ``thresholds`` of its grid and the level ``alpha``; every decision of
    every certificate in one evaluation of the rule)."""
    out, rows, depth, padded = shaped_looks(rule.looks, looks, top, estimation)
    if not len(rows):
        return out
    bounds = rule.bounds(padded, alpha)
    row, k = np.nonzero(np.arange(padded.shape[1])[None, :] < depth[:, None])
    stop = rule.stops(k, padded[row, k], bounds[row, k], thresholds[rows[row]], alpha)
    return stop_problems(out, rule.looks, rows, depth, row, k, stop)


def shaped_looks(
    schedule: np.ndarray, looks: Sequence[Sequence[Mapping[str, Any]]], top: np.ndarray,
    estimation: Sequence,
) -> tuple[list[str | None], np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """What every rule's S0 checks first: per certificate the first way its looks depart
    from the ``schedule`` or hold no cumulative counts ending at its ``estimation`` (None
    when well formed), then of the well-formed ones (``rows``) their number of looks
    (``depth``) and ĉ_A's count at each look, zero-padded after the last ([rows, K])."""
    out: list[str | None] = []
    tops: dict[int, np.ndarray] = {}  # well-formed certificates: ĉ_A's count at each look
    for i, record in enumerate(looks):
        sizes = [int(look.get("n", -1)) for look in record]
        counts = np.array([look.get("counts", []) for look in record], dtype=np.int64)
        out.append(_shape_problem(schedule, sizes, counts, estimation[i]))
        if out[-1] is None:
            tops[i] = counts[:, int(top[i])]
    rows = np.array(list(tops), dtype=np.int64)
    depth = np.array([len(tops[i]) for i in rows], dtype=np.int64)
    padded = np.zeros((len(rows), int(depth.max(initial=0))), dtype=np.int64)  # 0 after a stop
    for r, i in enumerate(rows):
        padded[r, : depth[r]] = tops[i]
    return out, rows, depth, padded


def stop_problems(
    out: list[str | None], schedule: np.ndarray, rows: np.ndarray, depth: np.ndarray,
    row: np.ndarray, k: np.ndarray, stop: np.ndarray,
) -> list[str | None]:  # fmt: skip
    """``out`` with, for each well-formed certificate whose rule's decision ``stop`` at its
    looks ``k`` (flattened over ``row``) is not "continue, then stop at the last", where the
    rule and its draws part."""
    wrong = stop != (k == depth[row] - 1)
    for r in np.unique(row[wrong]):
        first = int(k[(row == r) & wrong].min())
        verb = "stops" if stop[(row == r) & (k == first)][0] else "continues"
        out[int(rows[r])] = (f"the rule {verb} at look {first + 1} (n = {schedule[first]}), its "
                             f"draws end at n = {schedule[depth[r] - 1]}")  # fmt: skip
    return out


def _shape_problem(schedule, sizes, counts, estimation) -> str | None:
    if not sizes or sizes != schedule[: len(sizes)].tolist():
        return f"its looks at n = {sizes} are not the rule's schedule {schedule.tolist()[: len(sizes) + 1]}…"
    if counts.ndim != 2 or counts.shape[1] != len(estimation):
        return "its looks do not hold one count per class"
    steps = np.diff(np.vstack([np.zeros(counts.shape[1], dtype=np.int64), counts]), axis=0)
    added = np.diff([0, *sizes])
    if np.any(steps < 0) or np.any(steps.sum(axis=1) != added):
        return "its look counts are not cumulative counts of the samples added at each look"
    if not np.array_equal(counts[-1], np.asarray(estimation, dtype=np.int64)):
        return "its last look's counts are not its estimation counts"
    return None


def best_bound(rule: SequentialRule, alpha: float) -> float:
    """The largest bound the rule can give: every sample agreeing, at the best look."""
    looks = np.arange(len(rule.looks))
    return float(np.max(rule.look_bounds(rule.looks, looks, alpha)))
