"""Writing a board: the markdown and everything beside it.

For ``leaderboards/NAME.md``: ``NAME.json`` and ``NAME.csv`` (metrics),
``NAME.run.json`` (the run export the board re-renders from),
``NAME.spec-RUNID.toml`` (each run's benchmark file), and per table
``NAME-T-certified-accuracy.png`` and ``NAME-T-classwise-accuracy.png``.
"""

from __future__ import annotations

from pathlib import Path

from harness.errors import IdrsError
from harness.leaderboard.board import Board, Table, build_board
from harness.leaderboard.markdown import render_markdown
from harness.leaderboard.plots import (
    certified_plot_name,
    classwise_plot_name,
    write_certified_plot,
    write_classwise_plot,
)
from harness.leaderboard.protocol import run_protocol
from harness.leaderboard.reproduce import spec_toml
from harness.leaderboard.source import export_runs
from harness.leaderboard.tabular import board_csv, board_json
from harness.storedrun import StoredRun


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
        f"{stem}.run.json": export_runs(board.runs),
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
    from harness.plugins import get_plugin_manager

    try:
        return list(get_plugin_manager().registry.get("datasets", table.dataset).class_names)
    except IdrsError:  # a dataset no loaded plugin provides
        return []


def write_board(runs: list[StoredRun], out: Path, plots: bool = True) -> list[Path]:
    """Render ``runs`` into ``out`` (NAME.md) and the files beside it; returns their paths."""
    stem = board_stem(out)
    board = build_board(runs)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_texts(board, stem).items():
        path = out.parent / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    if plots:
        for table in board.tables:
            if not table.rows:
                continue
            title = f"{table.dataset} · {table.architecture} · model {table.model_hash[:12]}"
            path = out.parent / certified_plot_name(stem, table)
            write_certified_plot(table, path, title)
            written.append(path)
            path = out.parent / classwise_plot_name(stem, table)
            write_classwise_plot(table, path, title, class_names(table))
            written.append(path)
    return written
