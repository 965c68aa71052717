"""The ``idrs-bench`` command line: run, results, check, leaderboard, compare, plugins.

Nothing heavy is imported before it is needed: ``--help``, ``plugins`` and every
error in a benchmark file or its parameters answer without importing torch (the spec
is parsed and checked against the registered plugins first). A subcommand defined
in another module is one ``add_<name>_parser(subparsers)`` in :data:`SUBCOMMANDS`.
SIGTERM is handled like Ctrl-C: the run stops, says how to resume, exits 143.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sqlite3
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness import __version__
from harness.bench import add_bench_parser
from harness.errors import IdrsError, plain
from harness.import_log import add_import_log_parser
from harness.leaderboard import add_compare_parser, add_leaderboard_parser
from harness.store import DEFAULT_DB, check_database

SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], object]] = [
    add_leaderboard_parser,
    add_compare_parser,
    add_bench_parser,
    add_import_log_parser,
]
"""Registration functions of the subcommands defined in their own modules."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is (handled like Ctrl-C)."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help()
        return 2
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main_thread else None
    try:
        return args.handler(args)
    except IdrsError as exc:
        _error(str(exc))
        return 2
    except sqlite3.Error as exc:  # damaged after it was opened, or locked for too long
        _error(
            f"the results database failed: {exc}; if it is damaged, restore it from a backup "
            'or pass another --db (`sqlite3 FILE "PRAGMA quick_check"` checks it)'
        )
        return 2
    except KeyboardInterrupt as exc:
        Console(stderr=True, soft_wrap=True).print(
            "interrupted; `idrs-bench run` again resumes where it stopped"
        )
        return 143 if isinstance(exc, Terminated) else 130
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


def _error(message: str) -> None:
    """``error: message`` on stderr, one line, without a library's terminal codes."""
    Console(stderr=True, soft_wrap=True).print(
        f"[red]error:[/red] {escape(plain(message))}", highlight=False
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="idrs-bench", description="Benchmark input-dependent randomized smoothing, soundly."
    )
    parser.add_argument("--version", action="version", version=f"idrs-bench {__version__}")
    sub = parser.add_subparsers(title="commands")

    run = sub.add_parser("run", help="run (or resume) a benchmark and print its results")
    run.add_argument(
        "spec", nargs="?", metavar="SPEC.toml",
        help="benchmark TOML file (default: the built-in quick benchmark)",
    )  # fmt: skip
    run.add_argument(
        "--db", type=Path, default=DEFAULT_DB, metavar="PATH",
        help=f"results database (default {DEFAULT_DB}); processes running the same benchmark "
        "on one database share its shards",
    )  # fmt: skip
    run.add_argument(
        "--device", type=device_name, default=None, metavar="auto|cpu|cuda[:N]",
        help="override the spec's device (cuda:1: the second GPU)",
    )  # fmt: skip
    run.add_argument("--data-root", metavar="DIR", help="folder with dataset files")
    run.add_argument(
        "--download", action="store_true", help="let torchvision download a missing dataset"
    )
    run.add_argument(
        "--cache-dir", type=Path, metavar="DIR", help="where trained base models are cached"
    )
    run.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="override a spec value, e.g. --set certification.n=200 (VALUE is TOML)",
    )  # fmt: skip
    run.add_argument(
        "--executor", choices=("local", "ray"), default="local", metavar="local|ray",
        help="where shards are certified: this process (default) or Ray workers",
    )  # fmt: skip
    run.add_argument(
        "--address", metavar="HOST:PORT",
        help="Ray cluster to join (--executor ray; default: start one here)",
    )  # fmt: skip
    run.add_argument(
        "--workers", type=int, metavar="K",
        help="Ray workers (--executor ray; default: one per GPU, or per CPU on CPU runs)",
    )  # fmt: skip
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.add_argument(
        "--no-check", action="store_true", help="skip the soundness checks after certifying"
    )
    run.add_argument(
        "--timings", action="store_true", help="print the wall time of every stage at the end"
    )
    run.set_defaults(handler=_run)

    results = sub.add_parser("results", help="summary metrics of a run")
    results.add_argument(
        "run", nargs="?", metavar="RUN", help="run id or unique prefix (default: the latest)"
    )
    results.add_argument("--db", type=Path, default=DEFAULT_DB, metavar="PATH")
    results.add_argument("--json", action="store_true", help="machine-readable output")
    results.add_argument(
        "--format", choices=("table", "cohen-log"), default="table", metavar="table|cohen-log",
        help="cohen-log: Cohen et al.'s per-input certify log of one method and setting",
    )  # fmt: skip
    results.add_argument("--method", metavar="M", help="the method whose log to write (cohen-log)")
    results.add_argument(
        "--setting", metavar="S", help="the setting whose log to write (cohen-log)"
    )
    results.set_defaults(handler=_results)

    check = sub.add_parser("check", help="audit the certificates of a finished run")
    check.add_argument(
        "run", nargs="?", metavar="RUN", help="run id or unique prefix (default: the latest)"
    )
    check.add_argument("--db", type=Path, default=DEFAULT_DB, metavar="PATH")
    check.add_argument("--method", metavar="M", help="audit only this method")
    check.add_argument(
        "--budget", choices=("small", "full"), default="small", metavar="small|full",
        help="how hard to search",
    )  # fmt: skip
    check.add_argument(
        "--orders", type=int, metavar="P", help="input orders replayed for memory certifiers (S5)"
    )
    check.add_argument("--device", type=device_name, default=None, metavar="auto|cpu|cuda[:N]")
    check.add_argument("--data-root", metavar="DIR", help="folder with dataset files")
    check.add_argument(
        "--cache-dir", type=Path, metavar="DIR", help="where trained base models are cached"
    )
    check.add_argument("--quiet", action="store_true", help="no progress bars")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.add_argument(
        "--timings", action="store_true", help="print the wall time of each setting's checks"
    )
    check.add_argument(
        "--entropy", metavar="HEX",
        help="re-run an audit from its record: the entropy (hex) in its checks' evidence",
    )  # fmt: skip
    check.set_defaults(handler=_check)

    plugins = sub.add_parser("plugins", help="list loaded plugins and what they provide")
    plugins.add_argument("--json", action="store_true", help="machine-readable output")
    plugins.set_defaults(handler=_plugins)

    for add_parser in SUBCOMMANDS:
        add_parser(sub)
    return parser


def device_name(text: str) -> str:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (an argparse type)."""
    kind, _, index = text.partition(":")
    if text in ("auto", "cpu", "cuda") or (kind == "cuda" and index.isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is not auto, cpu, cuda or cuda:N (e.g. cuda:1)")


def _run(args: argparse.Namespace) -> int:
    from harness.plugins import get_plugin_manager
    from harness.spec import DEFAULT_BENCHMARK, check_data_root, load_spec, validate

    if args.executor != "ray" and (args.address is not None or args.workers is not None):
        raise IdrsError("--address and --workers apply to --executor ray only; add it")
    spec = load_spec(args.spec or DEFAULT_BENCHMARK, args.set)
    # every name and parameter, before torch and before third-party plugins are imported
    validate(spec, get_plugin_manager().checking_registry())
    check_data_root(args.data_root, spec.dataset.name)
    check_database(args.db)

    from harness.progress import Progress
    from harness.runner import RunOptions, run_benchmark

    if args.device is not None and args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise IdrsError(
                f"--device {args.device}, but no CUDA device is available; use --device cpu or auto"
            )
        index = int(args.device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise IdrsError(
                f"--device {args.device}, but this machine has {torch.cuda.device_count()} "
                f"CUDA device(s): cuda:0 to cuda:{torch.cuda.device_count() - 1}"
            )
    options = RunOptions(
        db=args.db, device=args.device, data_root=args.data_root,
        download=args.download, cache_dir=args.cache_dir,
    )  # fmt: skip
    _warn_plugin_failures()
    executor = None
    if args.executor == "ray":
        from harness.ray_executor import RayExecutor, import_ray

        import_ray()  # a missing Ray is an error before the model is trained
        executor = RayExecutor(address=args.address, workers=args.workers)
    progress = Progress(enabled=not args.quiet)
    run_id = run_benchmark(spec, options, progress, executor=executor)
    if not args.no_check:
        from harness.leases import exclusive
        from harness.soundness.runner import run_checks

        with exclusive(args.db, run_id, "the soundness checks", progress.note) as ours:
            if ours:
                run_checks(args.db, run_id, options, progress, budget="small")
    rows = _print_results(args.db, run_id, as_json=False, compact=True)
    if not args.no_check:
        from harness.soundness.audit import BUDGETS

        _console(RUN_WIDTH).print(escape(BUDGETS["small"].statement()))
        _console(RUN_WIDTH).print(escape(_attack_statement("small")))
    if args.timings:
        _print_timings(progress.timings)
    _print_next_steps(args.db, run_id, spec.name, rows)
    return 0


def _print_timings(timings: list[tuple[str, float]]) -> None:
    """Wall time per stage (training, each setting's certification, each setting's checks)."""
    table = Table(title="stage times")
    table.add_column("stage")
    table.add_column("seconds", justify="right")
    for stage, seconds in timings:
        table.add_row(escape(stage), f"{seconds:,.1f}")
    table.add_row("sum of the stages", f"{sum(s for _, s in timings):,.1f}")
    _console().print(table)


def _check(args: argparse.Namespace) -> int:
    from harness.progress import Progress
    from harness.runner import RunOptions
    from harness.soundness.audit import BUDGETS, parse_entropy
    from harness.soundness.runner import run_checks
    from harness.soundness.verdict import applied, overall

    entropy = parse_entropy(args.entropy)
    if not args.db.is_file():
        raise IdrsError(
            f"results database {str(args.db)!r} not found; run a benchmark first or pass --db"
        )
    options = RunOptions(
        db=args.db, device=args.device, data_root=args.data_root, cache_dir=args.cache_dir
    )
    progress = Progress(enabled=not args.quiet and not args.json)
    results = run_checks(args.db, args.run, options, progress,
                         method=args.method, budget=args.budget, orders=args.orders,
                         entropy=entropy)  # fmt: skip
    if args.json:
        print(json.dumps([
            {"method": m, "setting": s, "verdict": str(overall(rs)), "checks_applied": applied(rs),
             "checks": [{"check": r.check, "verdict": str(r.verdict), "summary": r.summary,
                         "evidence": r.evidence, "flags": r.flags} for r in rs]}
            for (m, s), rs in results.items()
        ], indent=2, default=str))  # fmt: skip
        return 0  # (--timings is not mixed into the JSON)
    table = Table(title=f"soundness checks ({args.budget} budget)")
    for column in ("method", "setting", "verdict", "check", "result", "summary"):
        table.add_column(column)
    for (method, setting), rs in results.items():
        all_flags = sorted({f for r in rs for f in r.flags})
        flags = f" ({', '.join(all_flags)})" if all_flags else ""
        verdict = f"{overall(rs)}{flags}\n{len(applied(rs))} of {len(rs)} checks applied"
        for k, r in enumerate(rs):
            table.add_row(escape(method) if k == 0 else "", escape(setting) if k == 0 else "",
                          verdict if k == 0 else "", r.check, str(r.verdict),
                          escape(r.summary))  # fmt: skip
    _console().print(table)
    _console().print(escape(BUDGETS[args.budget].statement()))
    _console().print(escape(_attack_statement(args.budget)))
    if args.timings:
        _print_timings(progress.timings)
    return 0


def _results(args: argparse.Namespace) -> int:
    if not args.db.is_file():
        raise IdrsError(
            f"results database {str(args.db)!r} not found; run a benchmark first or pass --db"
        )
    if args.format == "cohen-log":
        from harness.cohen_log import write_run_log

        sys.stdout.write(write_run_log(args.db, args.run, args.method, args.setting))
        return 0
    _print_results(args.db, args.run, as_json=args.json)
    return 0


def _print_results(
    db: Path, run_id: str | None, as_json: bool, compact: bool = False
) -> list[dict[str, Any]]:
    """Print a run's summary (``compact``: the few columns `run` shows, in
    :data:`RUN_WIDTH` columns when piped); returns its rows."""
    from harness.results import RADII, summary
    from harness.store import ResultStore
    from harness.storedrun import IMPORTED, incomplete_note, read_run

    store = ResultStore(db)
    try:
        stored = read_run(store, run_id)
    finally:
        store.close()
    run, settings = stored.run, stored.settings()
    radii = run["config"].get("radii", RADII)
    rows = []
    for row in stored.rows():
        out = summary(row.method, row.setting, row.certificates, radii, stored.unknown_metrics)
        flags = f" ({', '.join(row.flags)})" if row.flags else ""
        out["verdict"] = (
            "imported (claims, no evidence)" if row.verdict == IMPORTED else row.verdict + flags
        )
        out["checks_applied"] = row.applied
        out["checks"] = {c.check: {"verdict": c.verdict, "summary": c.summary} for c in row.checks}
        out["complete"] = row.complete
        out["expected_inputs"] = row.status.expected if row.status else None
        if not row.complete:
            out["verdict"] = (
                f"incomplete ({row.inputs} of {out['expected_inputs'] or '?'}), " + out["verdict"]
            )
        rows.append(out)
    failures = [{"run_id": stored.run_id} | f for f in stored.failures]
    if as_json:
        out = {
            "run_id": run["run_id"],
            "name": run["name"],
            "model_hash": run["model_hash"],
            "weights_digest": run.get("weights_digest"),
            "device": run["device"],
            "protocol": run["config"]["protocol"],
            "methods": rows,
            "failures": failures,
            "complete": all(s.complete for s in settings),
            "settings": [asdict(s) for s in settings],
            "data_files": stored.data_files,
        }
        print(json.dumps(out, indent=2))
        return rows
    protocol = run["config"]["protocol"]
    console = _console(RUN_WIDTH if compact else None)
    title = (
        f"run {run['run_id'][:12]} · {escape(run['name'])} · {escape(run['config']['dataset']['name'])} · "
        f"model {run['model_hash'][:12]} · "
        + (f"weights {run['weights_digest'][:12]} · " if run.get("weights_digest") else "")
        + f"n0={protocol['n0']} n={protocol['n']} "
        f"α={protocol['alpha']} · {run['device']}"
    )
    if compact:
        console.print(_compact_table(title, rows, _headline_radius(run["config"])))
    else:
        console.print(_full_table(title, rows))
        console.print("checks applied:", highlight=False)
        for row in rows:
            applied = ", ".join(row["checks_applied"]) or "none"
            console.print(
                escape(f"  {row['method']} {row['setting']}: {applied}"),
                highlight=False,
                soft_wrap=True,
            )
    note = incomplete_note(settings)
    if note is not None:
        console.print(
            f"[yellow]run {run['run_id'][:12]} is {escape(note)}[/yellow]; "
            "`idrs-bench run` with the same spec and --db finishes it"
        )
    for failure in failures:
        console.print(
            f"[red]failed:[/red] {escape(failure['method'])} ({escape(failure['setting'])}): "
            f"{escape(failure['error'].splitlines()[0])}"
        )
    return rows


def _headline_radius(config: dict[str, Any]) -> float:
    """The radius `run`'s compact table reports certified accuracy at (the board's)."""
    from harness.leaderboard.board import headline_radius
    from harness.results import benchmark_radii

    return headline_radius(config, benchmark_radii(config))


def _name_column(table: Table, header: str) -> None:
    """A column of names, never cut: they wrap (fold) when space runs out."""
    table.add_column(header, overflow="fold")


def _compact_table(title: str, rows: list[dict[str, Any]], radius: float) -> Table:
    """Method, setting, inputs, clean accuracy, certified accuracy at the headline radius,
    ACR and the verdict (its flags and the checks applied are in `results`)."""
    from rich import box

    table = Table(
        title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True
    )
    _name_column(table, "method")
    _name_column(table, "setting")
    for column in ("inputs", "clean acc", f"cert@{radius:g}", "ACR"):
        table.add_column(column, justify="right", no_wrap=True)
    _name_column(table, "verdict")
    for row in rows:
        verdict = row["verdict"].split(" (")[0] if row["complete"] else row["verdict"]
        table.add_row(
            escape(row["method"]), escape(row["setting"]), str(row["inputs"]),
            f"{row['clean_accuracy']:.3f}", f"{row['certified_accuracy'][f'{radius:g}']:.3f}",
            f"{row['acr']:.3f}", escape(verdict),
        )  # fmt: skip
    return table


def _full_table(title: str, rows: list[dict[str, Any]]) -> Table:
    """Every metric of every row, accuracies with their 95 % intervals, and the verdict
    with its flags."""
    inputs = rows[0]["inputs"] if rows else 0
    table = Table(title=title, caption=f"accuracies: value [95 % Clopper–Pearson interval "
                  f"over the {inputs} test inputs]")  # fmt: skip
    radii = list(rows[0]["certified_accuracy"]) if rows else []
    _name_column(table, "method")
    _name_column(table, "setting")
    for column in ("inputs", "clean acc", *[f"cert@{r}" for r in radii], "ACR", "abstain",
                   "misclass", "mean σ", "s/input"):  # fmt: skip
        table.add_column(column, justify="right", no_wrap=True)
    _name_column(table, "verdict")
    for row in rows:
        table.add_row(
            escape(row["method"]), escape(row["setting"]), str(row["inputs"]),
            _with_interval(row["clean_accuracy"], row["clean_accuracy_interval"]),
            *[_with_interval(row["certified_accuracy"][r], row["certified_accuracy_interval"][r])
              for r in radii],
            *[_number(row[k]) for k in ("acr", "abstention_rate", "misclassification_rate",
                                        "mean_sigma", "seconds_per_input")],
            escape(row["verdict"]),
        )  # fmt: skip
    return table


def _attack_statement(budget: str) -> str:
    """What the empirical attack after the checks did (:mod:`harness.empirical`)."""
    from harness.empirical import STRENGTHS

    return f"empirical robust accuracy ({budget} budget): {STRENGTHS[budget].statement()}"


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _with_interval(value: float, interval: list[float]) -> str:
    """``0.710 [0.642, 0.772]``: a value and its 95 % interval."""
    return f"{value:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]"


def _print_next_steps(db: Path, run_id: str, name: str, rows: list[dict[str, Any]]) -> None:
    """Where the results are, the verdict counts, and the commands to type next."""
    counts: dict[str, int] = {}
    for row in rows:
        verdict = row["verdict"].split(" (")[0] if row["complete"] else "incomplete"
        counts[verdict] = counts.get(verdict, 0) + 1
    verdicts = ", ".join(f"{n} {v}" for v, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    short = run_id[:12]
    db_arg = "" if db == DEFAULT_DB else f" --db {shlex.quote(str(db))}"
    board = shlex.quote(f"leaderboards/{name}.md")
    lines = [
        f"results: {db}, run {short}: {verdicts or 'no rows'}",
        f"next: idrs-bench results {short}{db_arg}   (every metric and check)",
        f"      idrs-bench leaderboard {short}{db_arg} --out {board}",
    ]
    console = _console(RUN_WIDTH)
    for line in lines:
        console.print(escape(line), highlight=False, soft_wrap=True)


RUN_WIDTH = 100
"""Columns of `run`'s output when it is not a terminal."""


def _console(width: int | None = None) -> Console:
    """Stdout; when it is not a terminal, ``width`` columns (default: wide enough for
    every column of the results table; names wrap rather than being cut)."""
    return Console() if sys.stdout.isatty() else Console(width=width or 200)


def _warn_plugin_failures() -> None:
    from harness.plugins import get_plugin_manager

    manager = get_plugin_manager()
    manager.registry  # noqa: B018 - building it records registration failures
    for failure in manager.failures:
        Console(stderr=True, soft_wrap=True).print(
            f"[yellow]warning:[/yellow] plugin {escape(failure.plugin)} failed: {escape(failure.error)}"
        )


def _plugins(args: argparse.Namespace) -> int:
    from harness.plugins import get_plugin_manager

    manager = get_plugin_manager()
    rows = manager.describe()
    failures = [{"plugin": f.plugin, "error": f.error} for f in manager.failures]
    if args.json:
        print(json.dumps({"plugins": rows, "failures": failures}, indent=2))
        return 0
    table = Table(title="idrs-bench plugins")
    for column in ("plugin", "version", "hooks", "provides"):
        table.add_column(column)
    for row in rows:
        provides = "\n".join(
            f"{kind}: {', '.join(names)}" for kind, names in sorted(row["provides"].items())
        )
        hooks = "\n".join(h.removeprefix("idrs_register_") for h in row["hooks"])
        table.add_row(escape(row["name"]), escape(row["version"]), hooks, escape(provides))
    console = _console()
    console.print(table)
    for failure in failures:
        console.print(
            f"[red]failed to load[/red] {escape(failure['plugin'])}: {escape(failure['error'])}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
