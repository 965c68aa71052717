"""The verdicts of a table as a matrix: a line per checked row, a column per check.

The columns are the soundness checks S0–S5 and the replay check in their order
(:mod:`harness.audit`: S0 ``evidence``, S1 ``coverage``, S2 ``sigma-regularity``, S3
``worst-case-justification``, S4 ``counterexamples``, S5 ``memory-order``), any other
check a row records after them, and the empirical attack. A cell is a mark: ``pass``
(the check ran and found nothing), the check's verdict in bold where it flagged the
row (``violated``, ``unjustified``, ``order-dependent``), ``error`` where it did not
complete, ``–`` where it did not apply or did not run. The attack's cell is **flagged**
where some input is certified at a radius the attack broke it within (or that PREDICT
answers otherwise), ``pass`` where none is. A row with a flag or an error gets a short
footnote (:data:`FOOTNOTE_BUDGET` characters or so): the first finding of each such
check as its summary states it (a count, not an example); the full summaries and
evidence stay in the run export and the JSON. The words claim what the checks found, on
what they examined, and no more: a ``pass`` of a sampling check covers the inputs it
audited at its budget, not every input.
"""

from __future__ import annotations

from harness.reports.leaderboard.board import Row, Table
from harness.reports.leaderboard.escape import md_text
from harness.reports.leaderboard.per_radius_markdown import identity_columns
from harness.store.storedrun import IMPORTED, SOUND, StoredCheck

CHECKS = (
    ("evidence", "S0"), ("coverage", "S1"), ("sigma-regularity", "S2"),
    ("worst-case-justification", "S3"), ("counterexamples", "S4"), ("memory-order", "S5"),
    ("replay", "replay"),
)  # fmt: skip
"""The built-in checks in the matrix's order, with the code the documentation uses."""
HEADERS = {"evidence": "S0 evidence", "coverage": "S1 coverage",
           "sigma-regularity": "S2 σ-regularity", "worst-case-justification": "S3 worst case",
           "counterexamples": "S4 counterexamples", "memory-order": "S5 memory order"}  # fmt: skip
PASS, NOT_APPLIED, ERROR, FLAGGED = "pass", "–", "error", "**flagged**"
FOOTNOTE_BUDGET = 200
"""About the most characters of a row's footnote (past its label)."""
FINDING = 100
"""The most characters of one check's finding in a footnote."""


def check_columns(rows: list[Row]) -> list[str]:
    """The checks of the matrix: the built-in ones in order, then any other the rows
    record, in order of first appearance."""
    recorded = list(dict.fromkeys(c.check for row in rows for c in row.checks))
    known = [name for name, _ in CHECKS]
    return known + [name for name in recorded if name not in known]


def code(check: str) -> str:
    """S0–S5, ``replay``, or the check's own name."""
    return dict(CHECKS).get(check, check)


def mark(check: StoredCheck | None) -> str:
    """The matrix cell of one check's verdict on a row."""
    if check is None or check.verdict == "not-applicable":
        return NOT_APPLIED
    if check.verdict == SOUND:
        return PASS
    if check.verdict == "error":
        return ERROR
    return f"**{md_text(check.verdict)}**"


def attack_mark(row: Row) -> str:
    if row.attack is None:
        return NOT_APPLIED
    return FLAGGED if row.beyond_attack else PASS


def finding(summary: str) -> str:
    """The first finding of a check's summary, short: the clause that rejected (else the
    first), up to its example (``, e.g.``), at most :data:`FINDING` characters."""
    clauses = [c for c in summary.split("; ") if c.strip()]
    if not clauses:
        return ""
    text = next((c for c in clauses if "rejected" in c), clauses[0]).split(", e.g.")[0]
    if len(text) > FINDING:
        colon = text.find(": ", 20)
        text = text[:colon] if 0 < colon <= FINDING else text[: FINDING - 1].rstrip() + "…"
    return text


def _attack_finding(row: Row) -> str:
    inputs = sorted({i for ids in row.beyond_attack.values() for i in ids})
    radii = ", ".join(f"{r:g}" for r in row.beyond_attack)
    return (f"attack: {len(inputs)} input(s) certified at radius {radii} that the attack broke "
            "within it or PREDICT answers otherwise")  # fmt: skip


class Footnotes:
    """Numbered footnotes of the rows with a flag or an error, in order of reference."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, row: Row) -> str:
        """The footnote reference of ``row``'s findings ('' when it has none)."""
        order = {name: k for k, name in enumerate(check_columns([row]))}
        flagged = sorted((c for c in row.checks if c.verdict not in (SOUND, "not-applicable")),
                         key=lambda c: order[c.check])  # fmt: skip
        parts = [f"{code(c.check)}: {finding(c.summary) or c.verdict}" for c in flagged]
        if row.attack is not None and row.beyond_attack:
            parts.append(_attack_finding(row))
        if not parts:
            return ""
        text = "; ".join(parts)
        if len(text) > FOOTNOTE_BUDGET:  # the full summaries are in the run export
            text = text[: FOOTNOTE_BUDGET - 1].rstrip() + "…"
        label = f"v{len(self.lines) + 1}"
        self.lines.append(f"[^{label}]: {md_text(text)}.")
        return f"[^{label}]"


def verdict_matrix(table: Table, notes: Footnotes) -> list[str]:
    """The table's checked rows (not the imported ones) × its checks, with the heading and
    what the marks mean; [] when no row records a check."""
    rows = [row for row in table.rows if row.verdict != IMPORTED]
    if not any(row.checks for row in rows):
        return []
    columns = check_columns(rows)
    names, identity = identity_columns(table)
    head = [*names, "verdict", *[md_text(HEADERS.get(c, c)) for c in columns], "attack",
            "finding"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join([":--"] * len(head)) + "|"]
    for row in rows:
        by_check = {c.check: c for c in row.checks}
        cells = [*identity(row), md_text(row.verdict),
                 *[mark(by_check.get(c)) for c in columns], attack_mark(row),
                 notes.add(row) or " "]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return [
        "### Verdicts: what each check found",
        "",
        "`pass`: the check ran and found nothing on what it examined at its budget (a search "
        "that finds nothing is not a proof); **bold**: the check flagged the row, with its "
        "verdict; `error`: it did not complete; `–`: it did not apply or did not run. S0 "
        "re-derives every certificate; S2, S3, S4's attack and the replay check examine a "
        "sample of the inputs (which ones: the check's evidence in the run export); S1 tests "
        "the certifier on exact classifiers it builds; S5 replays the inputs in other orders. "
        "attack: **flagged** where an input is certified at a radius the empirical attack "
        "broke it within, or that PREDICT answers otherwise.",
        "",
        *lines,
        "",
    ]
