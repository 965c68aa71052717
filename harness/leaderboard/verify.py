"""``idrs-bench leaderboard --verify NAME.md``: re-render a committed board and compare.

The runs come from the run export ``NAME.run.json`` beside the board, or, when a
results database is given, from that database (the run ids are read from the export,
else from ``NAME.json``). Every text file of the board (markdown, JSON, CSV, specs,
and the export itself when rendering from a database) must equal its re-rendering
byte for byte; the plots must exist and be PNG files (their bytes depend on the
matplotlib version, so they are not compared).
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from harness.errors import IdrsError
from harness.leaderboard.board import build_board
from harness.leaderboard.render import board_stem, plot_names, render_texts
from harness.leaderboard.source import StoredRun, load_runs, read_export

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _run_ids(folder: Path, stem: str) -> list[str]:
    export = folder / f"{stem}.run.json"
    if export.is_file():
        return [run.run_id for run in read_export(export)]
    metrics = folder / f"{stem}.json"
    if metrics.is_file():
        return [run["run_id"] for run in json.loads(metrics.read_text())["runs"]]
    raise IdrsError(f"neither {export} nor {metrics} exists: which runs does the board show?")


def verify_board(board_path: Path, db: Path | None = None) -> list[str]:
    """The differences between the committed board and its re-rendering (empty: verified)."""
    stem = board_stem(board_path)
    folder = board_path.parent
    if not board_path.is_file():
        raise IdrsError(f"board {str(board_path)!r} not found")
    runs: list[StoredRun]
    if db is None:
        runs = read_export(folder / f"{stem}.run.json")
    else:
        runs = load_runs(db, _run_ids(folder, stem))
    board = build_board(runs)
    problems = []
    for name, expected in render_texts(board, stem).items():
        if db is None and name == f"{stem}.run.json":
            continue  # the source itself
        path = folder / name
        if not path.is_file():
            problems.append(f"{path}: missing (the re-rendered board has it)")
            continue
        committed = path.read_text(encoding="utf-8")
        if committed != expected:
            diff = difflib.unified_diff(
                committed.splitlines(keepends=True),
                expected.splitlines(keepends=True),
                fromfile=f"{path} (committed)",
                tofile=f"{path} (re-rendered)",
            )
            problems.append("".join(diff))
    for name in plot_names(board, stem):
        path = folder / name
        if not path.is_file() or path.read_bytes()[:8] != PNG_SIGNATURE:
            problems.append(f"{path}: missing or not a PNG file")
    return problems
