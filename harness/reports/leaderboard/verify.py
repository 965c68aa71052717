"""``idrs-bench leaderboard --verify NAME.md``: re-derive a committed board and re-render it.

Each run's record of what its plugins had of the test split is checked
(:func:`check_test_split_records`: ``withheld``, or none for a run begun before it was recorded)
and stated in a note.

Every certificate and the verdicts that are functions of their recorded evidence (S0's
and the replay check's) are re-derived from the run export
(:mod:`harness.reports.leaderboard.recheck`); with ``--reaudit`` every check is re-run
(:mod:`harness.reports.leaderboard.board_reaudit`). :func:`row_verifications` says per
row what the verification established: a row's verdict counts as verified only when
every check's verdict was re-derived or re-run and agreed (or a re-derived check alone
makes it ``violated``); a verdict only read is "recorded, not re-run".

The runs come from the run export ``NAME.run.json`` beside the board, or, when a
results database is given, from that database (the run ids are read from the export,
else from ``NAME.json``). Every text file of the board (markdown, JSON, CSV, specs,
and the export itself when rendering from a database) must equal its re-rendering,
text exactly and numbers up to :data:`RELATIVE_TOLERANCE`: a float computed on another
machine (another BLAS, another GPU) may differ in its last digits, and a board must
still verify there. Integers (counts, seeds, ids) are compared exactly. The plots must
exist and be PNG files (their bytes depend on the matplotlib version, so they are not
compared).
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.foundation.errors import IdrsError
from harness.reports.leaderboard.board import build_board
from harness.reports.leaderboard.render import board_stem, plot_names, render_texts
from harness.reports.leaderboard.source import (
    EVIDENCE_FORMATS,
    read_export,
    read_export_and_format,
)
from harness.store.storedrun import StoredRun, combined_verdict, load_runs

if TYPE_CHECKING:
    from harness.audit.reaudit import RowReaudit

Rederived = dict[tuple[str, str, str], set[str] | None]
"""Per (run id, method, setting): the checks whose recorded verdict was re-derived (None:
the row's certificates or verdicts did not re-derive)."""

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

RELATIVE_TOLERANCE = 1e-9
"""Two floats of a board agree when |a − b| <= 1e-9·max(|a|, |b|) (or both are within 1e-12 of 0)."""
ABSOLUTE_TOLERANCE = 1e-12

_NUMBER = re.compile(r"(?<![\w.])(-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)(?![\w.])")


def _numbers_agree(a: str, b: str) -> bool:
    if a == b:
        return True
    if not any(c in a + b for c in ".eE"):  # integers: exactly
        return False
    return math.isclose(float(a), float(b), rel_tol=RELATIVE_TOLERANCE, abs_tol=ABSOLUTE_TOLERANCE)


def numeric_differences(committed: str, expected: str) -> list[str] | None:
    """The numbers that differ beyond the tolerance, as ``line L: committed X, re-rendered Y``.

    Text outside numbers must match exactly; None when it does not (the files differ in
    more than numbers), [] when the files agree.
    """
    ours, theirs = _NUMBER.split(committed), _NUMBER.split(expected)
    if len(ours) != len(theirs) or ours[0::2] != theirs[0::2]:
        return None
    out = []
    line = 1
    for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if k % 2 == 0:
            line += a.count("\n")
        elif not _numbers_agree(a, b):
            out.append(f"line {line}: committed {a}, re-rendered {b}")
    return out


def _run_ids(folder: Path, stem: str) -> list[str]:
    export = folder / f"{stem}.run.json"
    if export.is_file():
        return [run.run_id for run in read_export(export)]
    metrics = folder / f"{stem}.json"
    if metrics.is_file():
        return [run["run_id"] for run in json.loads(metrics.read_text())["runs"]]
    raise IdrsError(f"neither {export} nor {metrics} exists: which runs does the board show?")


@dataclass(frozen=True)
class BoardSource:
    """The runs a board renders from, and whether their certificates carry the evidence
    that ``--verify`` re-derives them from (a results database, or a run export of format 2
    or later; a format-1 export is only re-rendered)."""

    runs: list[StoredRun]
    rederivable: bool


def board_source(board_path: Path, db: Path | None = None) -> BoardSource:
    """The board's :class:`BoardSource`: its ``NAME.run.json`` (read once), or those runs in
    ``db``."""
    stem = board_stem(board_path)
    folder = board_path.parent
    if not board_path.is_file():
        raise IdrsError(f"board {str(board_path)!r} not found")
    if db is None:
        export_format, runs = read_export_and_format(folder / f"{stem}.run.json")
        return BoardSource(runs, export_format in EVIDENCE_FORMATS)
    return BoardSource(load_runs(db, _run_ids(folder, stem)), True)


def verify_board(
    board_path: Path, db: Path | None = None, data_root: str | None = None,
    notes: list[str] | None = None, rederived: Rederived | None = None,
    source: BoardSource | None = None,
) -> list[str]:  # fmt: skip
    """The problems of a committed board (empty: verified): every certificate and the
    verdicts re-derived from its evidence (:func:`harness.reports.leaderboard.recheck.recheck_runs`;
    not for a format-1 export, which has none; rows that could not be re-derived for lack
    of evidence are appended to ``notes``; ``rederived`` receives which checks' verdicts
    were re-derived), and the differences between each file and its re-rendering.
    ``source`` is :func:`board_source` of the board, when the caller has read it."""
    from harness.reports.leaderboard.recheck import recheck_runs

    stem = board_stem(board_path)
    folder = board_path.parent
    source = board_source(board_path, db) if source is None else source
    runs = source.runs
    board = build_board(runs)
    problems = check_test_split_records(runs, notes)
    if source.rederivable:
        problems += recheck_runs(runs, data_root, notes, rederived)
    for name, expected in render_texts(board, stem).items():
        if db is None and name == f"{stem}.run.json":
            continue  # the source itself
        path = folder / name
        if not path.is_file():
            problems.append(f"{path}: missing (the re-rendered board has it)")
            continue
        committed = path.read_text(encoding="utf-8")
        numbers = numeric_differences(committed, expected)
        if numbers != []:
            named = (
                f"{path}: numbers differ beyond a relative {RELATIVE_TOLERANCE:g}: "
                + "; ".join(numbers)
                + "\n"
                if numbers
                else ""
            )
            diff = difflib.unified_diff(
                committed.splitlines(keepends=True),
                expected.splitlines(keepends=True),
                fromfile=f"{path} (committed)",
                tofile=f"{path} (re-rendered)",
            )
            problems.append(named + "".join(diff))
    for name in plot_names(board, stem):
        path = folder / name
        if not path.is_file() or path.read_bytes()[:8] != PNG_SIGNATURE:
            problems.append(f"{path}: missing or not a PNG file")
    return problems


def check_test_split_records(runs: list[StoredRun], notes: list[str] | None = None) -> list[str]:
    """The problems of the runs' test-split records (one the harness does not write); a
    line per run appended to ``notes`` says what its plugins had of the test split: that
    the run records it withheld, or that it records nothing (it began before runs recorded
    it, so its plugins may have read the test split). The board's header states the same,
    and its re-rendering compares them."""
    from harness.foundation.data import WITHHELD
    from harness.reports.leaderboard.stated_protocol import statement_of_test_split

    problems = []
    for run in runs:
        if run.imported:
            continue
        record = run.run.get("test_split")
        if record not in (None, WITHHELD):
            problems.append(f"run {run.run_id[:12]}: test split record {record!r} is not one the "
                            f"harness writes ({WITHHELD!r}, or none)")  # fmt: skip
        elif notes is not None:
            notes.append(f"run {run.run_id[:12]}: test split {statement_of_test_split(record)}")
    return problems


@dataclass(frozen=True)
class RowVerification:
    """What a verification established about one checked row of a board: the verdict the
    board records, the verdict it ``verified`` (None: none), the checks whose verdicts it
    only ``read`` as recorded, and ``why`` a row could not be verified."""

    label: str
    recorded: str
    verified: str | None
    read: tuple[str, ...]
    why: str | None = None

    def line(self) -> str:
        if self.verified is not None:
            how = "a re-derived check gives it" if self.read else "every check re-derived or re-run"
            return f"{self.label}: {self.verified} (verified: {how})"
        if self.why is not None:
            return f"{self.label}: recorded {self.recorded}, not verified: {self.why}"
        return f"{self.label}: recorded {self.recorded}, not re-run ({', '.join(self.read)} read)"


def row_verifications(
    runs: list[StoredRun], rederived: Rederived,
    reaudited: Mapping[tuple[str, str, str], RowReaudit] | None = None,
) -> list[RowVerification]:  # fmt: skip
    """Per checked row of ``runs``, what the verification established from the checks
    whose verdicts were re-derived (``rederived``) and, with ``--reaudit``, re-run
    (``reaudited``): the row's verdict only when every check's verdict was re-derived or
    re-run and agreed, or when the re-derived ones alone make it ``violated``."""
    out = []
    for run in runs:
        if run.imported:
            continue
        for row in run.rows():
            if not row.checks:
                continue
            key = (run.run_id, row.method, row.setting)
            label = f"run {run.run_id[:12]} {row.method} ({row.setting})"
            derived, why = rederived.get(key, set()), None
            if derived is None:
                derived, why = set(), "its certificates or verdicts do not re-derive (below)"
            again = (reaudited or {}).get(key)
            if again is not None and again.error is not None:
                why = "not re-audited (below)"
            elif again is not None and again.problems:
                why = "its re-audit differs (below)"
            elif again is not None and why is None:
                derived = derived | set(again.recorded)
            read = tuple(sorted(c.check for c in row.checks if c.check not in derived))
            agreed = combined_verdict([c for c in row.checks if c.check in derived])
            verified = None
            if why is None and (not read or agreed == "violated"):
                verified = row.verdict if not read else agreed
            out.append(RowVerification(label, row.verdict, verified, read, why))
    return out
