"""Verdicts of soundness checks and how they combine."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from scipy import stats


class Verdict(StrEnum):
    """What a check concludes about a method's certificates.

    ``sound``: every applicable audit passed. ``unjustified``: no valid proof covers
    the claimed radii (a regularity the proof needs is false, or the worst case
    over the certified ball exceeds what the certificate allows). ``violated``: a
    concrete counterexample exists. ``not-applicable``: the check does not apply.
    """

    SOUND = "sound"
    UNJUSTIFIED = "unjustified"
    VIOLATED = "violated"
    NOT_APPLICABLE = "not-applicable"


_SEVERITY = {
    Verdict.NOT_APPLICABLE: 0,
    Verdict.SOUND: 1,
    Verdict.UNJUSTIFIED: 2,
    Verdict.VIOLATED: 3,
}


@dataclass
class CheckResult:
    """One check's verdict on one (run, method, setting), with evidence a reader can follow."""

    check: str
    verdict: Verdict
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)


def overall(results: list[CheckResult]) -> Verdict:
    """``sound`` only when every applicable check passed; otherwise the worst verdict."""
    applicable = [r.verdict for r in results if r.verdict != Verdict.NOT_APPLICABLE]
    if not applicable:
        return Verdict.NOT_APPLICABLE
    return max(applicable, key=_SEVERITY.__getitem__)


P_THRESHOLD = 1e-3
"""A p-value below this for the count of false certificates is a violation."""


def false_certificates_pvalue(false: int, certified: int, alpha: float) -> float:
    """P(Binomial(certified, α) >= false): each valid certificate is false w.p. <= α."""
    return float(stats.binom.sf(false - 1, certified, alpha)) if certified and false else 1.0
