"""Verdicts of soundness checks and how they combine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Verdict(StrEnum):
    """What a check concludes about a method's certificates, and what a row's checks add up to.

    Verdicts of one check: ``sound``: the audit ran and passed. ``unjustified``: no
    valid proof covers the claimed radii (a hypothesis of the theorem is false, or the
    worst case over the certified ball exceeds what the certificate allows).
    ``violated``: a concrete counterexample or a certificate its own evidence does not
    derive. ``order-dependent``: memory certificates, which certify no fixed classifier
    (Súkeník et al. 2022, App. C.2), replayed over input orders. ``error``: the check
    raised; it did not complete. ``not-applicable``: the check's documented
    applicability rule excludes the method (only then).

    The combination of a row (:func:`overall`) is one of these, or ``not-verified``: some
    applicable check did not complete (``error``), or none applied.
    """

    SOUND = "sound"
    ORDER_DEPENDENT = "order-dependent"
    UNJUSTIFIED = "unjustified"
    VIOLATED = "violated"
    ERROR = "error"
    NOT_APPLICABLE = "not-applicable"
    NOT_VERIFIED = "not-verified"


_SEVERITY = {
    Verdict.NOT_APPLICABLE: 0,
    Verdict.SOUND: 1,
    Verdict.ORDER_DEPENDENT: 2,
    Verdict.ERROR: 3,
    Verdict.NOT_VERIFIED: 3,
    Verdict.UNJUSTIFIED: 4,
    Verdict.VIOLATED: 5,
}


@dataclass
class CheckResult:
    """One check's verdict on one (run, method, setting), with evidence a reader can follow."""

    check: str
    verdict: Verdict
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)
    cost: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    """What the check cost here (seconds, σ queries, samples: harness.audit.cost), when measured."""


def overall(results: list[CheckResult]) -> Verdict:
    """A row's verdict from its checks.

    ``violated`` or ``unjustified`` if any check says so (the worst of them); else
    ``not-verified`` if any applicable check raised (``error``) or no check applied;
    else ``order-dependent`` if a check found memory certificates; else ``sound``.
    """
    applicable = [r.verdict for r in results if r.verdict != Verdict.NOT_APPLICABLE]
    if not applicable:
        return Verdict.NOT_VERIFIED
    worst = max(applicable, key=_SEVERITY.__getitem__)
    return Verdict.NOT_VERIFIED if worst == Verdict.ERROR else worst


def applied(results: list[CheckResult]) -> list[str]:
    """Names of the checks that applied to a row (every verdict but ``not-applicable``)."""
    return [r.check for r in results if r.verdict != Verdict.NOT_APPLICABLE]


P_THRESHOLD = 1e-3
"""A p-value below this for the count of false certificates is a violation."""


STATISTICAL_CHECKS = ("coverage", "counterexamples", "replay")
"""Checks whose verdict rests on a statistical test: each flags a sound row with
probability at most :data:`P_THRESHOLD` (its sub-tests Holm-corrected; replay only in
its replication test on another device type). The others (S0 evidence, S2
σ-regularity, S3 worst-case justification, S5 memory order, replay bit for bit) compare
exact quantities and never flag a sound row."""

SOUND_MEANS = (
    "A row verified sound asserts three things, no more: every certificate rests on evidence the "
    "harness drew itself on its own keys (the class counts or mean outputs of its samples, "
    "re-derived by S0 and, where the replay check runs, re-drawn and found equal); the "
    "hypotheses of the theorem behind its radius were verified by the harness on the "
    "objects themselves (the declared formula re-derived by S0 and held to exact smoothed "
    "classifiers by S1; σ's declared regularity, the worst σ in each certified ball and "
    "the theorem's constants by S2 and S3); and the regularity the certificate relies on "
    "was not refuted by searches of the stated budget (S2's pairs and ascent, S3's "
    "extremes, S4's attack: a search that finds nothing is not a proof)."
)


def false_alarm_rates(applied_per_row: Sequence[Sequence[str]]) -> tuple[float, float]:
    """(row-level, board-level) family-wise false-alarm bounds: a sound row is flagged with
    probability at most :data:`P_THRESHOLD` times the statistical checks that applied to it
    (Bonferroni over its checks; the largest over the rows), and some sound row of the
    board with probability at most the sum over its rows (capped at 1)."""
    per_row = [P_THRESHOLD * sum(c in STATISTICAL_CHECKS for c in applied)
               for applied in applied_per_row]  # fmt: skip
    return max(per_row, default=0.0), min(1.0, sum(per_row))


def false_alarm_statement(applied_per_row: Sequence[Sequence[str]]) -> str:
    """What :data:`SOUND_MEANS`, and the false-alarm rates of the rows' checks."""
    row, board = false_alarm_rates(applied_per_row)
    rows = sum(1 for applied in applied_per_row if applied)
    return (
        f"{SOUND_MEANS} False alarms: each statistical check (S1 coverage, S4 "
        f"counterexamples, the replay check's replication test) flags a sound row with "
        f"probability at most {P_THRESHOLD:g} (Holm over its sub-tests); the other checks "
        f"compare exact quantities. A sound row is flagged with probability at most {row:.3g} "
        f"(the sum over its statistical checks), some sound row of these {rows} checked rows "
        f"with probability at most {board:.3g} (the sum over the rows)."
    )
