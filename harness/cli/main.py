"""The ``idrs-bench`` command line: run, results, check, leaderboard, compare, plugins.

Nothing heavy is imported before it is needed: ``--help``, ``plugins`` and every
error in a benchmark file or its parameters answer without importing torch (the spec
is parsed and checked against the registered plugins first). A subcommand defined
in another module is one ``add_<name>_parser(subparsers)`` in :data:`SUBCOMMANDS`.
SIGTERM is handled like Ctrl-C: the run stops, its plugin hosts end with everything they
started, it says how to resume and exits 143 (130 for Ctrl-C). Exit statuses: 0, done; 2, an
error; 3 (:data:`ROWS_FAILED`), ``run`` finished but rows failed (each is named with its
plugin, why, and the command that retries it); 1, ``--reaudit`` found a verdict that
differs. Idle OpenMP threads are told to sleep before anything imports torch, and ``run`` and
``check`` compute with their share of the machine's cores
(:mod:`harness.foundation.threads`).
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
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.cli.bench import add_bench_parser
from harness.cli.console import RUN_WIDTH, terminal
from harness.cli.next_steps import print_next_steps, typed_program, typed_python
from harness.cli.plugins_table import add_plugins_parser, warn_plugin_failures
from harness.cli.results_table import (
    add_results_parser,
    attack_statement,
    print_failed_rows,
    print_results,
    print_timings,
)
from harness.cli.working import add_threads_option, working
from harness.foundation.errors import IdrsError, plain
from harness.foundation.threads import requested_threads, set_passive_wait
from harness.foundation.version import __version__
from harness.plugin.hosting.in_harness.confinement_options import add_unconfined_option, opted_out
from harness.plugin.hosting.in_harness.limits import (
    add_plugin_memory_option,
    add_plugin_timeout_option,
    memory_set,
    timeout_set,
)
from harness.reports.import_log import add_import_log_parser
from harness.reports.leaderboard import add_compare_parser, add_leaderboard_parser
from harness.store.integrity import check_database
from harness.store.store import DEFAULT_DB

if TYPE_CHECKING:
    from harness.plugin.manager import PluginManager

SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], object]] = [
    add_plugins_parser,
    add_leaderboard_parser,
    add_compare_parser,
    add_bench_parser,
    add_import_log_parser,
]
"""Registration functions of the subcommands defined in their own modules."""


ROWS_FAILED = 3
"""``run``'s exit status when it finished but some rows failed (docs/cli.md)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is (handled like Ctrl-C)."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    set_passive_wait()  # before torch is imported: the OpenMP runtime reads it when it starts
    parser = _parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # (what `run` says to retry)
    if not hasattr(args, "handler"):
        parser.print_help()
        return 2
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main_thread else None
    try:
        with (
            opted_out(getattr(args, "unconfined", False)),
            timeout_set(getattr(args, "plugin_timeout", None)),
            memory_set(getattr(args, "plugin_memory", None)),
        ):
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
    add_threads_option(run)
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.add_argument(
        "--no-check", action="store_true", help="skip the soundness checks after certifying"
    )
    run.add_argument(
        "--timings", action="store_true",
        help="print the wall time of every stage at the end, and what each row's checks cost "
             "(seconds, σ queries, samples drawn) beside its certification",
    )  # fmt: skip
    run.add_argument(
        "--entropy", metavar="HEX",
        help="audit every row from this entropy (hex) instead of fresh entropy: a reproducible "
        "audit (as the tests make), which a plugin that knows it can foresee",
    )  # fmt: skip
    add_unconfined_option(run)
    add_plugin_timeout_option(run)
    add_plugin_memory_option(run)
    run.set_defaults(handler=_run)

    add_results_parser(sub)  # (defined with its table)

    check = sub.add_parser("check", help="audit the certificates of a finished run")
    check.add_argument(
        "run", nargs="?", metavar="RUN", help="run id or unique prefix (default: the latest)"
    )
    check.add_argument("--db", type=Path, default=DEFAULT_DB, metavar="PATH")
    check.add_argument("--method", metavar="M", help="audit only this method")
    check.add_argument(
        "--budget", choices=("small", "full"), default=None, metavar="small|full",
        help="how hard to search (default small)",
    )  # fmt: skip
    check.add_argument(
        "--orders", type=int, metavar="P", help="input orders replayed for memory certifiers (S5)"
    )
    check.add_argument("--device", type=device_name, default=None, metavar="auto|cpu|cuda[:N]")
    check.add_argument("--data-root", metavar="DIR", help="folder with dataset files")
    check.add_argument(
        "--cache-dir", type=Path, metavar="DIR", help="where trained base models are cached"
    )
    add_threads_option(check)
    check.add_argument("--quiet", action="store_true", help="no progress bars")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.add_argument(
        "--timings", action="store_true",
        help="print the wall time of each setting's checks, and what each check cost "
             "(seconds, σ queries, samples drawn)",
    )  # fmt: skip
    check.add_argument(
        "--entropy", metavar="HEX",
        help="re-run an audit from its record: the entropy (hex) in its checks' evidence",
    )  # fmt: skip
    check.add_argument(
        "--reaudit", action="store_true",
        help="re-run every row's recorded audit (its entropy, budget and orders) on a copy of "
        "the run and fail on any verdict that differs from the stored one (nothing is stored)",
    )  # fmt: skip
    add_unconfined_option(check)
    add_plugin_timeout_option(check)
    add_plugin_memory_option(check)
    check.set_defaults(handler=_check)

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
    from harness.plugin.manager import PluginManager
    from harness.running.benchmark import (
        DEFAULT_BENCHMARK,
        check_data_root,
        load_benchmark,
        validate,
    )

    if args.executor != "ray" and (args.address is not None or args.workers is not None):
        raise IdrsError("--address and --workers apply to --executor ray only; add it")
    if args.no_check and args.entropy is not None:
        raise IdrsError("--entropy is the checks' entropy; leave out --no-check, or --entropy")
    spec = load_benchmark(args.spec or DEFAULT_BENCHMARK, args.set)
    # every name and parameter, before torch and before third-party plugins are imported;
    # this command's manager (the run's and the checks'), whose plugin hosts end with it
    with PluginManager() as manager:
        spec = validate(spec, manager.checking_registry())
        check_data_root(args.data_root, spec.dataset.name)
        check_database(args.db)
        requested = requested_threads(args.threads)
        with working(requested, args.quiet):
            return _run_checked(args, spec, manager, requested)


def _run_checked(
    args: argparse.Namespace, spec, manager: PluginManager, requested: int | None
) -> int:
    """``run`` once its benchmark and options are checked."""
    from harness.audit.audit import parse_entropy
    from harness.foundation.progress import Progress
    from harness.running.preparation import RunOptions
    from harness.running.runner import run_benchmark

    entropy = parse_entropy(args.entropy)
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
        download=args.download, cache_dir=args.cache_dir, threads=requested,
    )  # fmt: skip
    warn_plugin_failures(manager)
    executor = None
    if args.executor == "ray":
        from harness.running.ray_executor import RayExecutor
        from harness.running.ray_worker import import_ray

        import_ray()  # a missing Ray is an error before the model is trained
        executor = RayExecutor(address=args.address, workers=args.workers)
    from harness.foundation.identity import content_hash
    from harness.running.model_variants import model_label, model_variants
    from harness.store.benchmark_runs import record_benchmark

    progress = Progress(enabled=not args.quiet)
    variants = model_variants(spec)  # a run per base model (training σ, seed)
    run_ids, rows = [], []
    for variant in variants:
        if len(variants) > 1:
            progress.log(f"base model {len(run_ids) + 1} of {len(variants)}: "
                          f"{model_label(variant.to_dict())}")  # fmt: skip
        run_id = run_benchmark(variant, options, progress, manager, executor=executor)
        run_ids.append(run_id)
        if len(variants) > 1:  # `leaderboard DB` finds the others from any one of them
            record_benchmark(args.db, run_id, content_hash(spec.to_dict()))
        if not args.no_check:
            from harness.audit.auditor import run_checks
            from harness.store.leases import exclusive

            with exclusive(args.db, run_id, "the soundness checks", progress.note) as ours:
                if ours:
                    run_checks(args.db, run_id, options, progress, manager, budget="small",
                               entropy=entropy, workers=None, resume=True)  # fmt: skip
    for variant, run_id in zip(variants, run_ids, strict=True):
        if len(variants) > 1:
            terminal(RUN_WIDTH).print(escape(f"base model {model_label(variant.to_dict())} "
                                             f"(run {run_id[:12]})"), highlight=False)  # fmt: skip
        rows += print_results(args.db, run_id, as_json=False, compact=True)
    if not args.no_check:
        from harness.audit.audit import BUDGETS

        terminal(RUN_WIDTH).print(escape(BUDGETS["small"].statement(typed_python())))
        terminal(RUN_WIDTH).print(escape(attack_statement("small")))
    if args.timings:
        print_timings(progress.timings, args.db, run_ids)
    print_next_steps(args.db, run_ids, spec.name, rows)
    retry = " ".join([typed_program(), shlex.join(args.argv)])
    failed = sum(print_failed_rows(args.db, run_id, retry) for run_id in run_ids)
    return ROWS_FAILED if failed else 0


def _check(args: argparse.Namespace) -> int:
    from harness.audit.audit import BUDGETS, parse_entropy
    from harness.audit.auditor import run_checks
    from harness.foundation.progress import Progress
    from harness.foundation.verdict import applied, overall
    from harness.running.preparation import RunOptions

    entropy = parse_entropy(args.entropy)
    if not args.db.is_file():
        raise IdrsError(
            f"results database {str(args.db)!r} not found; run a benchmark first or pass --db"
        )
    requested = requested_threads(args.threads)
    options = RunOptions(db=args.db, device=args.device, data_root=args.data_root,
                         cache_dir=args.cache_dir, threads=requested)  # fmt: skip
    progress = Progress(enabled=not args.quiet and not args.json)
    with working(requested, args.quiet or args.json):
        if args.reaudit:
            return _reaudit(args, options, progress)
        args.budget = args.budget or "small"
        results = run_checks(args.db, args.run, options, progress,
                             method=args.method, budget=args.budget, orders=args.orders,
                             entropy=entropy, workers=None)  # fmt: skip
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
    terminal().print(table)
    terminal().print(escape(BUDGETS[args.budget].statement(typed_python())))
    terminal().print(escape(attack_statement(args.budget)))
    if args.timings:
        print_timings(progress.timings, args.db, args.run)
    return 0


def _reaudit(args: argparse.Namespace, options, progress) -> int:
    """``check --reaudit``: each row's recorded audit re-run (:mod:`harness.audit.reaudit`)."""
    from harness.audit.reaudit import reaudit_stored

    if args.entropy is not None or args.budget is not None or args.orders is not None:
        raise IdrsError("--reaudit re-runs the recorded audits, with their entropy, budget and "
                        "orders: leave out --entropy, --budget and --orders")  # fmt: skip
    stored, rows = reaudit_stored(args.db, args.run, options, progress, method=args.method,
                                  workers=None)  # fmt: skip
    problems = [p for r in rows for p in r.problems]
    if args.json:
        print(json.dumps([{"method": r.method, "setting": r.setting, "verified": not r.problems,
                           "error": r.error, "recorded": r.recorded,
                           "reaudit": {c: str(v.verdict) for c, v in r.results.items()}}
                          for r in rows], indent=2))  # fmt: skip
        return 1 if problems else 0
    for r in rows:
        if not r.problems:
            print(f"{r.label}: {r.verdict} (verified: {len(r.results)} checks re-run from the "
                  "recorded entropy, each gave its recorded verdict)")  # fmt: skip
    for problem in problems:
        print(problem)
    verified = sum(not r.problems for r in rows)
    print(f"run {stored.run_id[:12]}: {verified} of {len(rows)} row(s) re-audited with their "
          f"recorded verdicts{'' if not problems else f'; {len(problems)} problem(s)'}")  # fmt: skip
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
