"""Writing a board: the markdown and everything beside it.

For ``leaderboards/NAME.md``: ``NAME.json`` and ``NAME.csv`` (metrics),
``NAME.run.json`` (the run export the board re-renders from),
``NAME.spec-RUNID.toml`` (each run's benchmark file), per table
``NAME-T-certified-accuracy.png`` and ``NAME-T-classwise-accuracy.png``, and the files a
replay needs (``NAME.weights.pt`` and the methods' trained parts,
:func:`harness.running.runfiles.shipped_name`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from harness.foundation.errors import IdrsError
from harness.reports.leaderboard.board import Board, Table, build_board
from harness.reports.leaderboard.markdown import render_markdown
from harness.reports.leaderboard.plots import (
    certified_plot_name,
    classwise_plot_name,
    write_certified_plot,
    write_classwise_plot,
)
from harness.reports.leaderboard.reproduce import spec_toml
from harness.reports.leaderboard.source import export_runs
from harness.reports.leaderboard.stated_protocol import run_protocol
from harness.reports.leaderboard.tabular import board_csv, board_json
from harness.store.storedrun import StoredRun


def board_stem(out: Path) -> str:
    if out.suffix != ".md" or not out.stem:
        raise IdrsError(f"--out must name a markdown file NAME.md, got {str(out)!r}")
    return out.stem


def render_texts(board: Board, stem: str) -> dict[str, str]:
    """File name -> content of every text file of the board ``stem``."""
    texts = {
        f"{stem}.md": render_markdown(board, stem),
        f"{stem}.json": board_json(board, stem),
        f"{stem}.csv": board_csv(board, stem),
        f"{stem}.run.json": export_runs(board.runs, stem),
    }
    for run in board.runs:
        texts[run_protocol(run, stem)["spec_file"]] = spec_toml(run.run["config"])
    return texts


def plot_names(board: Board, stem: str) -> list[str]:
    return [
        name
        for table in board.tables
        if table.rows
        for name in (certified_plot_name(stem, table), classwise_plot_name(stem, table))
    ]


def class_names(table: Table) -> list[str]:
    """The class names its runs recorded, else those its dataset's plugin declares
    (runs made before class names were recorded), else none."""
    if table.class_names:
        return table.class_names
    from harness.plugin.manager import PluginManager

    with PluginManager() as manager:
        try:
            return list(manager.registry.get("datasets", table.dataset).class_names)
        except IdrsError:  # a dataset no loaded plugin provides
            return []


def ship_files(runs: list[StoredRun], folder: Path, stem: str) -> tuple[list[Path], list[str]]:
    """Copy the files a replay needs (:mod:`harness.running.runfiles`) beside the board, each under
    its shipped name and only if its SHA-256 is the recorded one. Returns the paths
    written and, for each file that could not be shipped, why."""
    from harness.foundation.artifacts import file_digest
    from harness.running.runfiles import shipped_name

    written, missing = [], []
    for run in runs:
        for entry in run.files:
            source = Path(entry["path"])
            target = folder / shipped_name(stem, run.run_id, entry, len(runs) == 1)
            if target.is_file() and file_digest(target) == entry["sha256"]:
                written.append(target)
            elif not source.is_file() or file_digest(source) != entry["sha256"]:
                what = "is missing" if not source.is_file() else "has another SHA-256 now"
                missing.append(f"{target.name} not shipped: {source} {what}; `idrs-bench "
                               "leaderboard --replay` will need it")  # fmt: skip
            elif source.resolve() != target.resolve():
                shutil.copyfile(source, target)
                written.append(target)
    return written, missing


def write_board(
    runs: list[StoredRun], out: Path, plots: bool = True, problems: list[str] | None = None
) -> list[Path]:
    """Render ``runs`` into ``out`` (NAME.md) and the files beside it (the replay files
    included, :func:`ship_files`); returns their paths, and appends to ``problems`` a
    line per replay file that could not be shipped."""
    stem = board_stem(out)
    board = build_board(runs)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_texts(board, stem).items():
        path = out.parent / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    shipped, missing = ship_files(runs, out.parent, stem)
    written += shipped
    if problems is not None:
        problems += missing
    if plots:
        for table in board.tables:
            if not table.rows:
                continue
            title = table.title
            path = out.parent / certified_plot_name(stem, table)
            write_certified_plot(table, path, title)
            written.append(path)
            path = out.parent / classwise_plot_name(stem, table)
            write_classwise_plot(table, path, title, class_names(table))
            written.append(path)
    return written
