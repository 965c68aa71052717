"""Where the command line prints: stdout as a rich console, its width the terminal's, or
when stdout is not a terminal (piped, a log) one chosen so that names wrap rather than
being cut."""

from __future__ import annotations

import os
import sys

from rich.console import Console

RUN_WIDTH = 100
"""Columns of `run`'s output, and of the results table, when stdout is not a terminal
(the results table: unless $COLUMNS says otherwise)."""


def results_console() -> Console:
    """Stdout for the results table: the terminal's width, else $COLUMNS, else
    :data:`RUN_WIDTH` columns."""
    if sys.stdout.isatty():
        return Console()
    columns = os.environ.get("COLUMNS", "")
    return Console(width=int(columns) if columns.isdigit() and int(columns) > 0 else RUN_WIDTH)


def terminal(width: int | None = None) -> Console:
    """Stdout; when it is not a terminal, ``width`` columns (default: wide enough for
    every column of the results table; names wrap rather than being cut)."""
    return Console() if sys.stdout.isatty() else Console(width=width or 200)
