"""``idrs-bench leaderboard``: render a board from stored runs, or verify a committed one.

    idrs-bench leaderboard [RUN ...] [--db PATH] [--out NAME.md [--force]] [--no-plots]
    idrs-bench leaderboard --verify leaderboards/NAME.md [--db PATH] [--data-root DIR]
                           [--replay K] [--reaudit] [--device auto|cpu|cuda] [--unconfined]
                           [--plugin-timeout SECONDS] [--plugin-memory MiB]

Without ``--out`` the markdown goes to stdout (no files are written). ``--out`` never
overwrites a board (NAME.md, or its NAME.json, NAME.csv or NAME.run.json) without
``--force``: a published board is re-rendered in place only on purpose. ``RUN`` is a run
id or a unique prefix in ``--db`` (default: the latest run there), a run export
``*.run.json`` (all its runs), or another results database (its latest run), so that
runs of several benchmarks make one board, one table per dataset and model family; a
latest run comes with the other runs of its benchmark (a base model each).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.foundation.errors import IdrsError
from harness.plugin.hosting.in_harness.confinement_options import add_unconfined_option
from harness.plugin.hosting.in_harness.limits import (
    add_plugin_memory_option,
    add_plugin_timeout_option,
)
from harness.reports.leaderboard.source import resolve_runs
from harness.store.store import DEFAULT_DB
from harness.store.storedrun import incomplete_note


def add_leaderboard_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``leaderboard`` subcommand to ``idrs-bench``'s subparsers."""
    parser = sub.add_parser(
        "leaderboard", help="render a leaderboard (markdown, plots, JSON, CSV) from stored runs"
    )
    parser.add_argument(
        "runs", nargs="*", metavar="RUN",
        help="run id or unique prefix (in --db), run export (*.run.json), or results database "
        "(its latest run, with the other runs of its benchmark: a base model each); default: "
        "the latest run in --db, so",
    )  # fmt: skip
    parser.add_argument(
        "--db", type=Path, default=None, metavar="PATH",
        help=f"results database (default {DEFAULT_DB}; with --verify: the board's NAME.run.json)",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=Path, metavar="NAME.md", help="write NAME.md and its files (default: stdout)"
    )
    parser.add_argument(
        "--force", action="store_true",
        help="with --out: overwrite the board already there (NAME.md and the files beside it)",
    )  # fmt: skip
    parser.add_argument("--no-plots", action="store_true", help="do not draw the PNG plots")
    parser.add_argument(
        "--verify", type=Path, metavar="BOARD.md",
        help="re-render a committed board from its stored runs and fail if it differs",
    )  # fmt: skip
    parser.add_argument(
        "--replay", type=int, metavar="K",
        help="with --verify: re-certify K random inputs of every row from the files shipped "
        "beside the board (bit for bit on the run's arithmetic, else a replication test)",
    )  # fmt: skip
    parser.add_argument(
        "--entropy", metavar="HEX",
        help="with --replay: the entropy (hex) a replay printed, to repeat it (the same inputs "
        "and fresh noise; default: fresh entropy)",
    )  # fmt: skip
    parser.add_argument(
        "--reaudit", action="store_true",
        help="with --verify: re-run every check of every row from its recorded entropy on the "
        "board's files and the plugins installed here (as long as the run's checks took) and "
        "fail on any verdict that differs",
    )  # fmt: skip
    parser.add_argument(
        "--data-root", metavar="DIR", help="with --verify: where the boards' dataset files are (default: the usual places)"
    )  # fmt: skip
    parser.add_argument(
        "--device",
        default="auto",
        metavar="auto|cpu|cuda",
        help="with --replay or --reaudit: auto, cpu or cuda (default auto: the run's device)",
    )
    parser.add_argument(
        "--allow-incomplete", action="store_true",
        help="render runs whose settings are not all finished (their rows are marked, never ranked sound)",
    )  # fmt: skip
    add_unconfined_option(parser)
    add_plugin_timeout_option(parser)
    add_plugin_memory_option(parser)
    parser.set_defaults(handler=leaderboard_command, default_db=DEFAULT_DB)
    return parser


def leaderboard_command(args: argparse.Namespace) -> int:
    if args.entropy is not None and args.replay is None:
        raise IdrsError("--entropy repeats a replay: give it with --verify BOARD.md --replay K")
    if args.verify is not None:
        return _verify(args)
    if args.replay is not None or args.reaudit:
        raise IdrsError(
            "--replay and --reaudit re-check a published board: give them with --verify BOARD.md"
        )
    if args.force and args.out is None:
        raise IdrsError("--force overwrites the board --out names: give it with --out NAME.md")
    if args.out is not None and not args.force:
        refuse_overwrite(args.out)
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
        from harness.reports.leaderboard.board import build_board
        from harness.reports.leaderboard.markdown import render_markdown

        sys.stdout.write(render_markdown(build_board(runs), None))
        return 0
    from harness.reports.leaderboard.render import write_board
    from harness.reports.leaderboard.stated_protocol import statement_of_test_split

    missing: list[str] = []
    for path in write_board(runs, args.out, plots=not args.no_plots, problems=missing):
        print(f"wrote {path}")
    for line in missing:
        print(f"warning: {line}", file=sys.stderr)
    for run in runs:  # its board states nothing about the test split
        if not run.imported and not run.run.get("test_split"):
            print(f"note: run {run.run_id[:12]}: test split {statement_of_test_split(None)}",
                  file=sys.stderr)  # fmt: skip
    return 0


def refuse_overwrite(out: Path) -> None:
    """An error when a board is already at ``out``: its NAME.md, NAME.json, NAME.csv or
    NAME.run.json exists (its other files are named after these; ``--force`` overwrites)."""
    from harness.reports.leaderboard.render import board_stem

    stem = board_stem(out)
    for name in (f"{stem}.md", f"{stem}.json", f"{stem}.csv", f"{stem}.run.json"):
        existing = out.parent / name
        if existing.exists():
            what = "" if name == f"{stem}.md" else f", a file of the board {str(out)!r},"
            raise IdrsError(
                f"{str(existing)!r}{what} exists: pass --force to overwrite the board and the "
                "files beside it, or --out another NAME.md"
            )


def _verify(args: argparse.Namespace) -> int:
    """``--verify BOARD.md [--reaudit] [--replay K]``: re-derive, re-render, re-audit and
    replay a board; one line per row says what was verified."""
    if args.runs or args.out or args.force:
        raise IdrsError(
            "--verify takes only the board (and optionally --db, --replay K, --reaudit)"
        )
    from harness.reports.leaderboard.verify import board_source, row_verifications, verify_board

    notes: list[str] = []
    rederived: dict = {}
    source = board_source(args.verify, args.db)
    problems = verify_board(args.verify, args.db, args.data_root, notes, rederived, source)
    runs = source.runs
    reaudited = None
    if args.reaudit:
        if not source.rederivable:
            raise IdrsError("--reaudit needs the checks' evidence (their recorded entropy), which "
                            "a format-1 run export lacks; publish the board again")  # fmt: skip
        reaudited = _reaudit(args, runs)
        problems += [p for r in reaudited.values() for p in r.problems]
    rows = row_verifications(runs, rederived, reaudited)
    for note in notes:
        print(f"note: {note}")
    for row in rows:
        print(row.line())
    if problems:
        for problem in problems:
            sys.stdout.write(problem if problem.endswith("\n") else problem + "\n")
        print(
            f"{args.verify}: does not verify ({len(problems)} problem(s)): a certificate or "
            "verdict its evidence or its re-audit does not give, a plugin not installed, or a "
            "file that differs from its re-rendering (`idrs-bench leaderboard RUN --out ... "
            "--force` renders it again)"
        )
        return 1
    if source.rederivable:
        skipped = sum(  # rows certified before the harness drew the evidence
            (run.run_id, row.method, row.setting) not in rederived
            for run in runs if not run.imported for row in run.rows() if row.checks
        )  # fmt: skip
        which = "every certificate" if not skipped else f"the certificates (but {skipped} row(s))"
        print(
            f"{args.verify}: verified ({which} and the verdicts of S0 and the replay check "
            "re-derived from the run export's evidence; re-rendered: text identical, floats "
            "equal up to a relative 1e-9)"
        )
        read = sorted({check for row in rows if row.verified is None for check in row.read})
        how = (
            "every check re-run from its recorded entropy gave its recorded verdict"
            if args.reaudit
            else f"{', '.join(read) or 'no check'} read as recorded, not re-run: --reaudit "
            "re-runs every check"
        )
        verified = sum(row.verified is not None for row in rows)
        print(f"{args.verify}: {verified} of {len(rows)} row verdicts verified ({how})")
    else:
        print(
            f"{args.verify}: re-rendered identically, but its run export (format 1) carries no "
            "evidence, so nothing was re-derived; publish the board again to make it re-checkable"
        )
    if args.replay is None:
        return 0
    from harness.audit.audit import parse_entropy
    from harness.reports.leaderboard.recheck import replay_board

    lines, disagreements = replay_board(
        runs, args.replay, args.data_root, args.device,
        parse_entropy(args.entropy),
    )  # fmt: skip
    for line in lines:
        print(line)
    if disagreements:
        print(f"{args.verify}: replay disagrees; first disagreement: {disagreements[0]}")
        return 1
    print(f"{args.verify}: replayed ({args.replay} inputs per row agreed)")
    return 0


def _reaudit(args: argparse.Namespace, runs) -> dict:
    """Every row of the board re-audited (:mod:`harness.reports.leaderboard.board_reaudit`),
    with progress and the time it took, by (run id, method, setting)."""
    import time

    from harness.foundation.progress import Progress
    from harness.reports.leaderboard.board_reaudit import reaudit_board

    start = time.monotonic()
    rows = reaudit_board(runs, args.data_root, args.device, Progress(), workers=None)
    print(f"re-audited {len(rows)} row(s) in {time.monotonic() - start:,.0f} s")
    return {(r.run_id, r.method, r.setting): r for r in rows}
