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
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness import __version__
from harness.bench import add_bench_parser
from harness.errors import IdrsError
from harness.import_log import add_import_log_parser
from harness.leaderboard import add_compare_parser, add_leaderboard_parser
from harness.store import DEFAULT_DB

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
        Console(stderr=True, soft_wrap=True).print(
            f"[red]error:[/red] {escape(str(exc))}", highlight=False
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="idrs-bench", description="Benchmark input-dependent randomized smoothing, soundly."
    )
    parser.add_argument("--version", action="version", version=f"idrs-bench {__version__}")
    sub = parser.add_subparsers(title="commands")

    run = sub.add_parser("run", help="run (or resume) a benchmark and print its results")
    run.add_argument(
        "spec", nargs="?", help="benchmark TOML file (default: the built-in quick benchmark)"
    )
    run.add_argument(
        "--db", type=Path, default=DEFAULT_DB, help=f"results database (default {DEFAULT_DB})"
    )
    run.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default=None, help="override the spec's device"
    )
    run.add_argument("--data-root", help="folder with dataset files")
    run.add_argument(
        "--download", action="store_true", help="let torchvision download a missing dataset"
    )
    run.add_argument("--cache-dir", type=Path, help="where trained base models are cached")
    run.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="override a spec value, e.g. --set certification.n=200 (VALUE is TOML)",
    )  # fmt: skip
    run.add_argument(
        "--executor", choices=("local", "ray"), default="local",
        help="where shards are certified: this process (default) or Ray workers",
    )  # fmt: skip
    run.add_argument(
        "--address", help="Ray cluster to join (--executor ray; default: start one here)"
    )
    run.add_argument(
        "--workers", type=int,
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
    results.add_argument("run", nargs="?", help="run id or unique prefix (default: the latest)")
    results.add_argument("--db", type=Path, default=DEFAULT_DB)
    results.add_argument("--json", action="store_true", help="machine-readable output")
    results.add_argument(
        "--format", choices=("table", "cohen-log"), default="table",
        help="cohen-log: Cohen et al.'s per-input certify log of one method and setting",
    )  # fmt: skip
    results.add_argument("--method", help="the method whose log to write (cohen-log)")
    results.add_argument("--setting", help="the setting whose log to write (cohen-log)")
    results.set_defaults(handler=_results)

    check = sub.add_parser("check", help="audit the certificates of a finished run")
    check.add_argument("run", nargs="?", help="run id or unique prefix (default: the latest)")
    check.add_argument("--db", type=Path, default=DEFAULT_DB)
    check.add_argument("--method", help="audit only this method")
    check.add_argument(
        "--budget", choices=("small", "full"), default="small", help="how hard to search"
    )
    check.add_argument(
        "--orders", type=int, help="input orders replayed for memory certifiers (S4d)"
    )
    check.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None)
    check.add_argument("--data-root", help="folder with dataset files")
    check.add_argument("--cache-dir", type=Path, help="where trained base models are cached")
    check.add_argument("--quiet", action="store_true", help="no progress bars")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.add_argument(
        "--timings", action="store_true", help="print the wall time of each setting's checks"
    )
    check.set_defaults(handler=_check)

    plugins = sub.add_parser("plugins", help="list loaded plugins and what they provide")
    plugins.add_argument("--json", action="store_true", help="machine-readable output")
    plugins.set_defaults(handler=_plugins)

    for add_parser in SUBCOMMANDS:
        add_parser(sub)
    return parser


def _run(args: argparse.Namespace) -> int:
    from harness.plugins import get_plugin_manager
    from harness.spec import DEFAULT_BENCHMARK, check_data_root, load_spec, validate

    if args.executor != "ray" and (args.address is not None or args.workers is not None):
        raise IdrsError("--address and --workers apply to --executor ray only; add it")
    spec = load_spec(args.spec or DEFAULT_BENCHMARK, args.set)
    validate(spec, get_plugin_manager().registry)  # every name and parameter, before torch
    check_data_root(args.data_root, spec.dataset.name)

    from harness.progress import Progress
    from harness.runner import RunOptions, run_benchmark

    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise IdrsError(
                "--device cuda, but no CUDA device is available; use --device cpu or auto"
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
        from harness.soundness.runner import run_checks

        run_checks(args.db, run_id, options, progress, budget="small")
    _print_results(args.db, run_id, as_json=False)
    if not args.no_check:
        from harness.soundness.audit import BUDGETS

        _console().print(escape(BUDGETS["small"].statement()))
        _console().print(escape(_attack_statement("small")))
    if args.timings:
        _print_timings(progress.timings)
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
    from harness.soundness.audit import BUDGETS
    from harness.soundness.runner import run_checks
    from harness.soundness.verdict import applied, overall

    if not args.db.is_file():
        raise IdrsError(
            f"results database {str(args.db)!r} not found; run a benchmark first or pass --db"
        )
    options = RunOptions(
        db=args.db, device=args.device, data_root=args.data_root, cache_dir=args.cache_dir
    )
    progress = Progress(enabled=not args.quiet and not args.json)
    results = run_checks(args.db, args.run, options, progress,
                         method=args.method, budget=args.budget, orders=args.orders)  # fmt: skip
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


def _print_results(db: Path, run_id: str | None, as_json: bool) -> None:
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
        return
    protocol = run["config"]["protocol"]
    console = _console()
    title = (
        f"run {run['run_id'][:12]} · {escape(run['name'])} · {escape(run['config']['dataset']['name'])} · "
        f"model {run['model_hash'][:12]} · "
        + (f"weights {run['weights_digest'][:12]} · " if run.get("weights_digest") else "")
        + f"n0={protocol['n0']} n={protocol['n']} "
        f"α={protocol['alpha']} · {run['device']}"
    )
    table = Table(title=title, caption=f"accuracies: value [95 % Clopper–Pearson interval over "
                  f"the {rows[0]['inputs'] if rows else 0} test inputs]")  # fmt: skip
    radii = list(rows[0]["certified_accuracy"]) if rows else []
    for column in ("method", "setting", "inputs", "clean acc", *[f"cert@{r}" for r in radii],
                   "ACR", "abstain", "misclass", "mean σ", "s/input", "verdict", "checks applied"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("method", "setting") else "right")
    for row in rows:
        table.add_row(
            escape(row["method"]), escape(row["setting"]), str(row["inputs"]),
            _with_interval(row["clean_accuracy"], row["clean_accuracy_interval"]),
            *[_with_interval(row["certified_accuracy"][r], row["certified_accuracy_interval"][r])
              for r in radii],
            *[_number(row[k]) for k in ("acr", "abstention_rate", "misclassification_rate",
                                        "mean_sigma", "seconds_per_input")],
            escape(row["verdict"]),
            escape(", ".join(row["checks_applied"]) or "–"),
        )  # fmt: skip
    console.print(table)
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


def _attack_statement(budget: str) -> str:
    """What the empirical attack after the checks did (:mod:`harness.empirical`)."""
    from harness.empirical import STRENGTHS

    return f"empirical robust accuracy ({budget} budget): {STRENGTHS[budget].statement()}"


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _with_interval(value: float, interval: list[float]) -> str:
    """``0.710 [0.642, 0.772]``: a value and its 95 % interval."""
    return f"{value:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]"


def _console() -> Console:
    """Stdout; wide enough for the results table when it is not a terminal."""
    return Console() if sys.stdout.isatty() else Console(width=200)


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
            f"{kind}: {', '.join(names)}" for kind, names in row["provides"].items()
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
