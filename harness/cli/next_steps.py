"""The commands ``idrs-bench run`` prints to go on with, typed as this process was started
(the script or the Python that runs it), each safe to type: a board it suggests goes to a
file of its own beside the results, never over a published one."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from rich.markup import escape

from harness.cli.console import RUN_WIDTH, terminal
from harness.store.store import DEFAULT_DB


def print_next_steps(
    db: Path, run_ids: str | list[str], name: str, rows: list[dict[str, Any]]
) -> None:
    """Where the results are, the verdict counts, and the commands to type next; a benchmark
    with a base model per training σ or seed made one run per model (``run_ids``), which
    its board shows together."""
    run_ids = [run_ids] if isinstance(run_ids, str) else run_ids
    counts: dict[str, int] = {}
    for row in rows:
        verdict = row["verdict"].split(" (")[0] if row["complete"] else "incomplete"
        counts[verdict] = counts.get(verdict, 0) + 1
    verdicts = ", ".join(f"{n} {v}" for v, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    shorts = " ".join(run_id[:12] for run_id in run_ids)
    db_arg = db_option(db)
    board = shlex.quote(str(new_board_path(db, name, run_ids[0])))
    program = typed_program()
    where = f"run {shorts}" if len(run_ids) == 1 else f"{len(run_ids)} runs (a model each)"
    results = f"{program} results {run_ids[0][:12]}{db_arg}"
    if len(run_ids) > 1:
        results = f"{program} results RUN{db_arg} (each of the runs)"
    lines = [
        f"results: {db}, {where}: {verdicts or 'no rows'}",
        f"next: {results}   (every metric and check)",
        f"      {program} leaderboard {shorts}{db_arg} --out {board}",
    ]
    console = terminal(RUN_WIDTH)
    for line in lines:
        console.print(escape(line), highlight=False, soft_wrap=True)


def new_board_path(db: Path, name: str, run_id: str) -> Path:
    """Where the board `run` suggests is written: ``boards/NAME-RUN.md`` beside the results
    database, a file of its own for each run, never a published board (``leaderboards/``,
    which ``leaderboard --out`` would not overwrite without ``--force`` either)."""
    return db.parent / "boards" / f"{name}-{run_id[:12]}.md"


def db_option(db: Path) -> str:
    """`` --db PATH`` for a command about ``db``, nothing for the default database."""
    return "" if db == DEFAULT_DB else f" --db {shlex.quote(str(db))}"


def typed_program() -> str:
    """How to type this command again: ``idrs-bench`` when that name on PATH is the
    script this process runs, else the script's path as it was started (e.g.
    ``.venv/bin/idrs-bench`` from a virtual environment that is not activated)."""
    started = Path(sys.argv[0])
    if started.name != "idrs-bench":  # python -m harness.cli.main, the API, tests
        return "idrs-bench"
    on_path = shutil.which("idrs-bench")
    if on_path is not None and Path(on_path).resolve() == started.resolve():
        return "idrs-bench"
    return shlex.quote(sys.argv[0])


def typed_python() -> str:
    """How to type the Python that runs this process, for a ``-m`` command the output
    names: ``python3`` when that name on PATH is it, else its path (relative to the working
    folder when under it, e.g. ``.venv/bin/python`` from an environment not activated)."""
    if not sys.executable:
        return "python3"
    on_path = shutil.which("python3")
    if on_path is not None and os.path.abspath(on_path) == os.path.abspath(sys.executable):
        return "python3"
    path = Path(os.path.abspath(sys.executable))
    if path.is_relative_to(Path.cwd()):
        path = path.relative_to(Path.cwd())
    return shlex.quote(str(path))
