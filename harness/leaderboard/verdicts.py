"""The soundness verdict a leaderboard row shows, from the rows of the ``checks`` table.

A row's verdict combines its checks as :func:`harness.soundness.verdict.overall` does:
``sound`` only when every applicable check passed, otherwise the worst verdict
(violated > unjustified > sound > not-applicable); only not-applicable checks give
``not-applicable``. A verdict string the harness does not know counts as ``violated``
(the safe side). A row without any check row is ``not checked``. Only ``sound`` rows
are ranked as certified.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

NOT_CHECKED = "not checked"
IMPORTED = "imported"  # radii from a published log: claims with no evidence to check
SOUND = "sound"


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
