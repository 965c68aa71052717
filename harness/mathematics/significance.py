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
significant: the rows tie.
"""

from __future__ import annotations

from collections.abc import Mapping
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
