"""``idrs-bench leaderboard``: render a board from stored runs, or verify a committed one.

    idrs-bench leaderboard [RUN ...] [--db PATH] [--out leaderboards/NAME.md] [--no-plots]
    idrs-bench leaderboard --verify leaderboards/NAME.md [--db PATH]

Without ``--out`` the markdown goes to stdout (no files are written). ``RUN`` is a run
id or a unique prefix in ``--db`` (default: the latest run there), a run export
``*.run.json`` (all its runs), or another results database (its latest run), so that
runs of several benchmarks make one board, one table per dataset and base model.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.errors import IdrsError
from harness.leaderboard.source import resolve_runs
from harness.store import DEFAULT_DB
from harness.storedrun import incomplete_note


def add_leaderboard_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``leaderboard`` subcommand to ``idrs-bench``'s subparsers."""
    parser = sub.add_parser(
        "leaderboard", help="render a leaderboard (markdown, plots, JSON, CSV) from stored runs"
    )
    parser.add_argument(
        "runs", nargs="*", metavar="RUN",
        help="run id or unique prefix (in --db), run export (*.run.json), or results database "
        "(its latest run); default: the latest run in --db",
    )  # fmt: skip
    parser.add_argument(
        "--db", type=Path, default=None, metavar="PATH",
        help=f"results database (default {DEFAULT_DB}; with --verify: the board's NAME.run.json)",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=Path, metavar="NAME.md", help="write NAME.md and its files (default: stdout)"
    )
    parser.add_argument("--no-plots", action="store_true", help="do not draw the PNG plots")
    parser.add_argument(
        "--verify", type=Path, metavar="BOARD.md",
        help="re-render a committed board from its stored runs and fail if it differs",
    )  # fmt: skip
    parser.add_argument(
        "--allow-incomplete", action="store_true",
        help="render runs whose settings are not all finished (their rows are marked, never ranked sound)",
    )  # fmt: skip
    parser.set_defaults(handler=leaderboard_command, default_db=DEFAULT_DB)
    return parser


def leaderboard_command(args: argparse.Namespace) -> int:
    if args.verify is not None:
        if args.runs or args.out:
            raise IdrsError("--verify takes only the board (and optionally --db)")
        from harness.leaderboard.verify import verify_board

        problems = verify_board(args.verify, args.db)
        if problems:
            for problem in problems:
                sys.stdout.write(problem if problem.endswith("\n") else problem + "\n")
            print(
                f"{args.verify}: differs from its re-rendering ({len(problems)} file(s)); "
                "re-render it with `idrs-bench leaderboard RUN --out ...` and commit the result"
            )
            return 1
        print(
            f"{args.verify}: verified (re-rendered from the stored runs: text identical, "
            "floats equal up to a relative 1e-9)"
        )
        return 0
    runs = resolve_runs(args.runs, args.db or args.default_db)
    if not args.allow_incomplete:
        for run in runs:
            note = incomplete_note(run.settings())
            if note is not None:
                raise IdrsError(
                    f"run {run.run_id[:12]} is {note}; finish it with `idrs-bench run` "
                    "(same spec and --db) or pass --allow-incomplete to render it marked"
                )
    if args.out is None:
        from harness.leaderboard.board import build_board
        from harness.leaderboard.markdown import render_markdown

        sys.stdout.write(render_markdown(build_board(runs), None))
        return 0
    from harness.leaderboard.render import write_board

    for path in write_board(runs, args.out, plots=not args.no_plots):
        print(f"wrote {path}")
    return 0
