"""Sequential CERTIFY: an anytime-valid bound on p_A, and when to stop sampling an input.

CERTIFY (Cohen et al. 2019, §3.2) draws a fixed n estimation samples. The sequential rule
draws them in rounds, on the same stream (the first n_k samples at look k are the first
n_k of a fixed run's), and stops an input once its place on the benchmark's radius grid
is decided.

**The bound** (a confidence sequence by α-spending). Looks at a fixed geometric
schedule n_1 < n_2 < … < n_K = n_max (:meth:`SequentialRule.looks`: n_1 = 100,
n_{k+1} = ⌈1.5·n_k⌉ while at most n_max/1.5; a single look at n_max when n_max < 150). Look k spends α_k = α·w_k of the level, with w_K = 1/2 and the other
half shared equally by the earlier looks (:func:`spending`; one look: w_1 = 1), and
L_k = Clopper–Pearson lower bound of the count of ĉ_A among the first n_k samples at
level α_k (Clopper & Pearson 1934). By the union bound (Bonferroni), P(∃k: p_A < L_k)
<= Σ_k α_k = α, so the running maximum max_{m<=k} L_m is below p_A at *every* look at
once with probability >= 1 − α, and so at any stopping time, however it depends on the
counts: a sequential certificate carries the radius guarantee of a fixed-n one at the
same α, at a data-dependent n. This is α-spending over a fixed schedule of looks (the
group-sequential design of Pocock 1977 with the spending of Lan & DeMets 1983, here
with exact binomial bounds); confidence sequences valid at every n (Robbins' beta-binomial
mixture; the betting sequences of Waudby-Smith & Ramdas, JRSS-B 2024) would allow more
looks, at the price of a bound that is harder to re-derive. ĉ_A comes from the n0
selection samples, independent of these.

**The stopping rule** (efficiency only: the bound holds whatever it does). With the
grid's thresholds t_j (the bound at which the certifier's declared formula reaches
grid radius r_j > 0 at the input's σ, :func:`~harness.mathematics.radius.grid_thresholds`),
an input's *place* for a bound q is [q > 1/2] + #{j : q >= t_j}. At look k it stops
(:meth:`SequentialRule.stops`) when k = K or place(L_k) = place(reach_k), where reach_k
is the largest bound any later look could give if the remaining samples agreed with
ĉ_A at rate U_k, the Clopper–Pearson upper bound of p_A at level β = 0.01 (a
conditional-power futility test; U_k = 1 when every sample agreed, so then "every
remaining sample agrees"): certified at r_j, and r_{j+1} not reachable by n_max.
Stopping depends only on the harness's counts and this rule, so check S0 re-derives
every bound and every decision from the stored looks (:func:`look_problems`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import betaincinv  # the Beta quantile (scipy.stats's, without its overhead)

RULE_NAME = "alpha-spending-cp-v1"
FIRST_LOOK = 100
"""Samples at the first look (a single look at n_max when n_max < 1.5 × 100)."""
GROWTH = 1.5
"""n_{k+1} = ⌈GROWTH·n_k⌉: a geometric schedule, so a decision needs at most 1.5× the
samples it would need at its own n, and the looks number ~log(n_max/100)/log 1.5 (18
for n_max = 100,000)."""
FINAL_SHARE = 0.5
"""The share of α spent at the last look n_max (where inputs near a threshold end up)."""
FUTILITY_LEVEL = 0.01
"""β of the upper bound U_k of the futility test (it decides efficiency, not validity)."""


def spending(looks: int, final_share: float = FINAL_SHARE) -> np.ndarray:
    """The shares w_k of α spent at each of ``looks`` looks: ``final_share`` at the last,
    the rest equally before it (Σ w_k = 1; one look spends all of α)."""
    if looks == 1:
        return np.ones(1)
    shares = np.full(looks, (1.0 - final_share) / (looks - 1))
    shares[-1] = final_share
    return shares


def cp_lower(k, n, alpha) -> np.ndarray:
    """Clopper–Pearson lower bounds Beta⁻¹(α; k, n − k + 1) (0 at k = 0), elementwise over
    arrays of counts, sizes and levels (Clopper & Pearson 1934)."""
    k, n = np.asarray(k, dtype=np.int64), np.asarray(n, dtype=np.int64)
    safe = np.maximum(k, 1)
    return np.where(k == 0, 0.0, betaincinv(safe, n - safe + 1, alpha))


def cp_upper(k, n, alpha) -> np.ndarray:
    """Clopper–Pearson upper bounds Beta⁻¹(1 − α; k + 1, n − k) (1 at k = n), elementwise."""
    k, n = np.asarray(k, dtype=np.int64), np.asarray(n, dtype=np.int64)
    return np.where(k >= n, 1.0, betaincinv(k + 1, np.maximum(n - k, 1), 1.0 - alpha))


@dataclass(frozen=True)
class SequentialRule:
    """The sequential rule of a run: its cap ``n_max`` and the radius grid ``radii`` it
    decides (the benchmark's ``radii``); the schedule and spending are this module's."""

    n_max: int
    radii: tuple[float, ...]
    first: int = FIRST_LOOK
    growth: float = GROWTH
    final_share: float = FINAL_SHARE
    beta: float = FUTILITY_LEVEL
    _looks: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        looks, n = [], self.first
        while n * self.growth <= self.n_max:  # the last step to n_max is >= growth too
            looks.append(n)
            n = math.ceil(n * self.growth)
        object.__setattr__(self, "_looks", np.array([*looks, self.n_max], dtype=np.int64))

    @property
    def looks(self) -> np.ndarray:
        """n_1 < … < n_K = n_max, the sample counts at which the bound is computed."""
        return self._looks

    def levels(self, alpha: float) -> np.ndarray:
        """α_k = α·w_k of each look (:func:`spending`)."""
        return alpha * spending(len(self._looks), self.final_share)

    def record(self) -> dict[str, Any]:
        """The rule as stored with each certificate's draws."""
        return {"name": RULE_NAME, "n_max": int(self.n_max), "radii": [float(r) for r in self.radii],
                "first": self.first, "growth": self.growth, "final_share": self.final_share,
                "beta": self.beta}  # fmt: skip

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> SequentialRule:
        if record.get("name") != RULE_NAME:
            raise ValueError(f"unknown sequential rule {record.get('name')!r}; known: {RULE_NAME}")
        return cls(int(record["n_max"]), tuple(float(r) for r in record["radii"]),
                   int(record["first"]), float(record["growth"]), float(record["final_share"]),
                   float(record["beta"]))  # fmt: skip

    def bounds(self, counts: np.ndarray, alpha: float) -> np.ndarray:
        """Running maxima max_{m<=k} L_m [B, k] of the bounds at the first k looks, from
        the cumulative counts [B, k] of the certified class at those looks."""
        counts = np.atleast_2d(np.asarray(counts, dtype=np.int64))
        k = counts.shape[1]
        lower = cp_lower(counts, self._looks[:k], self.levels(alpha)[:k])
        return np.maximum.accumulate(lower, axis=1) if k else lower

    def stops(self, k: int, count: np.ndarray, bound: np.ndarray, thresholds: np.ndarray,
              alpha: float) -> np.ndarray:  # fmt: skip
        """Whether each input stops at look ``k`` (0-based), given its count of ĉ_A there,
        its running bound and its grid ``thresholds`` [B, G] (positive radii)."""
        count = np.asarray(count, dtype=np.int64)
        looks, levels = self._looks, self.levels(alpha)
        if k == len(looks) - 1:
            return np.ones(len(count), dtype=bool)
        rate = cp_upper(count, looks[k], self.beta)
        reach = np.asarray(bound, dtype=np.float64).copy()
        for m in range(k + 1, len(looks)):
            more = looks[m] - looks[k]
            projected = count + np.minimum(more, np.ceil(more * rate).astype(np.int64))
            reach = np.maximum(reach, cp_lower(projected, looks[m], levels[m]))
        return places(bound, thresholds) >= places(reach, thresholds)


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
    ``top``, the ``thresholds`` of its grid and the level ``alpha``)."""
    out: list[str | None] = []
    schedule = rule.looks
    for i, record in enumerate(looks):
        sizes = [int(look.get("n", -1)) for look in record]
        counts = np.array([look.get("counts", []) for look in record], dtype=np.int64)
        out.append(_problem(rule, schedule, sizes, counts, int(top[i]), estimation[i],
                            thresholds[i : i + 1], alpha))  # fmt: skip
    return out


def _problem(rule, schedule, sizes, counts, top, estimation, thresholds, alpha) -> str | None:
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
    bounds = rule.bounds(counts[None, :, top], alpha)[0]
    for k in range(len(sizes)):
        stop = bool(rule.stops(k, counts[k : k + 1, top], bounds[k : k + 1], thresholds, alpha)[0])
        if stop != (k == len(sizes) - 1):
            verb = "stops" if stop else "continues"
            return f"the rule {verb} at look {k + 1} (n = {sizes[k]}), its draws end at n = {sizes[-1]}"
    return None


def best_bound(rule: SequentialRule, alpha: float) -> float:
    """The largest bound the rule can give: every sample agreeing, at the best look."""
    return float(np.max(cp_lower(rule.looks, rule.looks, rule.levels(alpha))))


def check_n_max(protocol) -> None:
    """Raise a one-line :class:`~harness.foundation.errors.ParameterError` naming the value
    and the fix when a sequential protocol's ``n_max`` is too small for its bound to pass
    1/2 even if every sample agreed (then no input certifies the grid's first radius)."""
    from harness.foundation.errors import ParameterError

    grid = tuple(protocol.grid)
    if best_bound(SequentialRule(protocol.n_max, grid), protocol.alpha) > 0.5:
        return
    least = next(n for n in range(protocol.n_max + 1, 1 << 40)
                 if best_bound(SequentialRule(n, grid), protocol.alpha) > 0.5)  # fmt: skip
    raise ParameterError(
        f"n_max = {protocol.n_max} cannot certify the grid's first radius {grid[0]:g}: even if "
        f"all {protocol.n_max} samples agreed, the sequential bound at α = {protocol.alpha:g} "
        f"stays <= 1/2; set certification.n_max >= {least}"
    )
