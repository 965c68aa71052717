"""The soundness verdict a leaderboard row shows, from the rows of the ``checks`` table.

A row's verdict combines its checks as :func:`harness.soundness.verdict.overall` does:
``violated`` or ``unjustified`` if a check says so; else ``not-verified`` if a check
raised (``error``) or none applied; else ``order-dependent`` for memory certificates
(never sound, Súkeník et al. 2022, App. C.2); else ``sound``. A verdict string the
harness does not know counts as ``violated`` (the safe side). A row without any check
row is ``not checked``. Only ``sound`` rows are ranked as certified; ``order-dependent``
rows are ranked apart, at their worst replayed input order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

NOT_CHECKED = "not checked"
IMPORTED = "imported"  # radii from a published log: claims with no evidence to check
SOUND = "sound"
ORDER_DEPENDENT = "order-dependent"
NOT_APPLICABLE = "not-applicable"
MEMORY_CHECK = "memory-order"
"""The check whose evidence holds the worst replayed order of memory certificates."""


def row_verdict(checks: Sequence[dict[str, Any]]) -> str:
    """The verdict of one (method, setting) from its check rows (dicts with ``verdict``)."""
    from harness.soundness.verdict import CheckResult, Verdict, overall

    if not checks:
        return NOT_CHECKED
    known = {v.value: v for v in Verdict}
    results = [
        CheckResult(str(c.get("check", "?")), known.get(c["verdict"], Verdict.VIOLATED), "")
        for c in checks
    ]
    return overall(results).value


def applied_checks(checks: Sequence[dict[str, Any]]) -> list[str]:
    """Names of the checks that applied to a row (all but ``not-applicable``), sorted."""
    return sorted(str(c.get("check", "?")) for c in checks if c["verdict"] != NOT_APPLICABLE)


def worst_order(checks: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The memory-order check's worst replayed order and spread, or None."""
    for c in checks:
        if c.get("check") == MEMORY_CHECK and c.get("order"):
            return c["order"]
    return None
