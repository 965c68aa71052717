"""Sampling error over the test inputs: intervals for a row's accuracies, paired tests
between rows.

A board's accuracies are fractions k/n of its n test inputs (certified correctly at
radius r, classified correctly, not broken by an attack), so they carry the sampling
error of the test subset, apart from the Monte Carlo error each certificate already
accounts for with its α. Each gets a two-sided 95 % Clopper–Pearson interval,
[B⁻¹(0.025; k, n − k + 1), B⁻¹(0.975; k + 1, n − k)] (Clopper & Pearson 1934), which
covers the accuracy on the distribution the inputs were drawn from with probability at
least 0.95.

Every row of a table certifies the same inputs on the same base model, so two rows are
compared paired (McNemar 1947): of the inputs where exactly one of them succeeds, b
favour the first row and c the second; under "equally accurate" each such input is a
fair coin, and the exact two-sided p-value is min(1, 2·P(X <= min(b, c))) for
X ~ Binomial(b + c, 1/2). A difference with p >= :data:`SIGNIFICANCE` is not
significant.

Two rows' certified accuracies at a radius differ by (b − c)/n; its 95 % interval is
Newcombe's hybrid score interval for the difference of paired proportions (Newcombe
1998, Stat. Med. 17:2635–2650, method 10; worked in Altman et al. 2000, *Statistics with
Confidence*, ch. 6): the Wilson intervals of the two marginal proportions, combined with
the correlation φ of the paired outcomes (:func:`paired_difference`). It stays inside
[−1, 1] and is not degenerate when no input is discordant, unlike the Wald interval.

The average certified radius is a mean over inputs of per-input radii (0 where not
certified correctly); its 95 % interval is Student's t interval of that mean,
x̄ ± t(0.975; n − 1)·s/√n (:func:`mean_interval`), its lower end clipped at 0 (a radius is
never negative). With the hundreds of inputs of a board the central limit theorem covers
the skew of the many zeros; on a handful of inputs the interval is rough.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from harness.mathematics.stats import clopper_pearson_lower, clopper_pearson_upper

CONFIDENCE = 0.95
"""Coverage of the intervals on a board's accuracies."""
SIGNIFICANCE = 0.05
"""Level of the paired test: a row whose p-value against the leader is >= this ties with it."""


def proportion_interval(successes: int, trials: int) -> tuple[float, float]:
    """Two-sided :data:`CONFIDENCE` Clopper–Pearson interval of ``successes`` / ``trials``."""
    tail = (1 - CONFIDENCE) / 2
    return (clopper_pearson_lower(successes, trials, tail),
            clopper_pearson_upper(successes, trials, tail))  # fmt: skip


def widest_half_width(trials: int) -> float:
    """The largest half-width of :func:`proportion_interval` over all success counts of
    ``trials`` inputs (reached near half of them): the sampling error a subset of this
    size allows."""
    near = {max(0, min(trials, trials // 2 + d)) for d in (-1, 0, 1)}
    return max((hi - lo) / 2 for lo, hi in (proportion_interval(k, trials) for k in near))


def mcnemar_exact(first_only: int, second_only: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts (1 when there are none)."""
    if first_only < 0 or second_only < 0:
        raise ValueError(f"discordant counts must be >= 0, got {first_only}, {second_only}")
    from scipy import stats

    total = first_only + second_only
    if total == 0:
        return 1.0
    return min(1.0, 2.0 * float(stats.binom.cdf(min(first_only, second_only), total, 0.5)))


@dataclass(frozen=True)
class PairedComparison:
    """A row against the leader of its section on the same inputs, at one radius."""

    radius: float
    inputs: int
    leader_only: int  # inputs the leader certifies correctly at the radius and the row does not
    row_only: int  # and the reverse
    p_value: float

    @property
    def tie(self) -> bool:
        """The difference is not significant at :data:`SIGNIFICANCE`."""
        return self.p_value >= SIGNIFICANCE

    def as_dict(self) -> dict:
        return {"radius": self.radius, "inputs": self.inputs, "leader_only": self.leader_only,
                "row_only": self.row_only, "p_value": self.p_value, "tie": self.tie}  # fmt: skip


def paired_comparison(
    leader: Mapping[int, bool], row: Mapping[int, bool], radius: float
) -> PairedComparison | None:
    """McNemar's exact test of two rows' successes per input id, or None when they did
    not certify the same inputs (then they cannot be paired)."""
    if set(leader) != set(row):
        return None
    leader_only = sum(leader[i] and not row[i] for i in leader)
    row_only = sum(row[i] and not leader[i] for i in leader)
    return PairedComparison(radius, len(leader), leader_only, row_only,
                            mcnemar_exact(leader_only, row_only))  # fmt: skip


@dataclass(frozen=True)
class PairedDifference:
    """A row's certified accuracy at one radius minus a reference row's, on the same
    inputs, with Newcombe's 95 % interval (:func:`paired_difference`)."""

    radius: float
    inputs: int
    row_only: int  # inputs the row certifies correctly at the radius and the reference does not
    reference_only: int  # and the reverse
    difference: float  # (row_only − reference_only) / inputs
    low: float
    high: float

    @property
    def reading(self) -> str:
        """``above`` or ``below`` the reference when the interval excludes 0, else
        ``not separated`` (the interval contains 0: no claim either way)."""
        if self.low > 0:
            return "above"
        if self.high < 0:
            return "below"
        return "not separated"

    def as_dict(self) -> dict:
        return {"radius": self.radius, "inputs": self.inputs, "row_only": self.row_only,
                "reference_only": self.reference_only, "difference": self.difference,
                "low": self.low, "high": self.high, "reading": self.reading}  # fmt: skip


def _wilson(successes: int, trials: int) -> tuple[float, float]:
    """The two-sided :data:`CONFIDENCE` Wilson score interval of ``successes`` / ``trials``."""
    from scipy import stats

    ci = stats.binomtest(successes, trials).proportion_ci(CONFIDENCE, method="wilson")
    return float(ci.low), float(ci.high)


def newcombe_interval(
    both: int, first_only: int, second_only: int, neither: int
) -> tuple[float, float]:
    """Newcombe's (1998) method-10 interval for p₁ − p₂ from a paired 2×2 table.

    p₁ = (both + first_only)/n and p₂ = (both + second_only)/n with Wilson intervals
    [l₁, u₁] and [l₂, u₂]; φ is the phi coefficient of the table, with Newcombe's
    correction (AD − BC − n/2 when AD − BC > n/2, 0 when 0 <= AD − BC <= n/2, AD − BC when
    negative; 0 when a margin is empty); the interval is
    [θ − √((p₁ − l₁)² − 2φ(p₁ − l₁)(u₂ − p₂) + (u₂ − p₂)²),
     θ + √((u₁ − p₁)² − 2φ(u₁ − p₁)(p₂ − l₂) + (p₂ − l₂)²)], θ = p₁ − p₂.
    """
    counts = (both, first_only, second_only, neither)
    if min(counts) < 0 or sum(counts) == 0:
        raise ValueError(f"a paired table needs counts >= 0 and at least one pair, got {counts}")
    n = sum(counts)
    first, second = both + first_only, both + second_only
    p1, p2 = first / n, second / n
    l1, u1 = _wilson(first, n)
    l2, u2 = _wilson(second, n)
    margins = first * (n - first) * second * (n - second)
    cross = both * neither - first_only * second_only
    corrected = cross - n / 2 if cross > n / 2 else (cross if cross < 0 else 0.0)
    phi = corrected / math.sqrt(margins) if margins > 0 else 0.0
    theta = p1 - p2
    down = (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2
    up = (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2
    return theta - math.sqrt(max(down, 0.0)), theta + math.sqrt(max(up, 0.0))


def paired_difference(
    row: Mapping[int, bool], reference: Mapping[int, bool], radius: float
) -> PairedDifference | None:
    """``row``'s successes per input id minus ``reference``'s, with Newcombe's interval
    (:func:`newcombe_interval`), or None when they did not certify the same inputs."""
    if set(row) != set(reference) or not row:
        return None
    both = sum(row[i] and reference[i] for i in row)
    row_only = sum(row[i] and not reference[i] for i in row)
    reference_only = sum(reference[i] and not row[i] for i in row)
    n = len(row)
    low, high = newcombe_interval(
        both, row_only, reference_only, n - both - row_only - reference_only
    )
    return PairedDifference(radius, n, row_only, reference_only, (row_only - reference_only) / n,
                            low, high)  # fmt: skip


def mean_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """Student's two-sided :data:`CONFIDENCE` t interval of the mean of ``values``, its
    lower end clipped at 0 (for means of non-negative values: radii); None for fewer than
    two values."""
    n = len(values)
    if n < 2:
        return None
    from scipy import stats

    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1)) * sd / math.sqrt(n)
    return max(0.0, mean - half), mean + half
