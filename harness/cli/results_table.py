"""What ``idrs-bench results`` and the end of ``idrs-bench run`` print: the summary
table of a run (compact at the run's end, full for ``results``), its verdicts, and the
commands to go on with; the ``results`` command itself."""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.foundation.errors import IdrsError
from harness.store.store import DEFAULT_DB


def add_results_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``idrs-bench results``: a run's summary table, or Cohen et al.'s certify log."""
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
    results.set_defaults(handler=results_command)
    return results


def results_command(args: argparse.Namespace) -> int:
    """``idrs-bench results``."""
    if not args.db.is_file():
        raise IdrsError(
            f"results database {str(args.db)!r} not found; run a benchmark first or pass --db"
        )
    if args.format == "cohen-log":
        from harness.reports.cohen_log import write_run_log

        sys.stdout.write(write_run_log(args.db, args.run, args.method, args.setting))
        return 0
    print_results(args.db, args.run, as_json=args.json)
    return 0


def print_results(
    db: Path, run_id: str | None, as_json: bool, compact: bool = False
) -> list[dict[str, Any]]:
    """Print a run's summary (``compact``: the few columns `run` shows, in
    :data:`RUN_WIDTH` columns when piped); returns its rows."""
    from harness.mathematics.accuracy import RADII, summary
    from harness.store.store import ResultStore
    from harness.store.storedrun import IMPORTED, incomplete_note, read_run

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
        out["certification_seconds"] = row.certification_seconds
        out["audit_seconds"] = row.audit_seconds
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
            "recipe_hash": run["recipe_hash"],
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
    console = terminal(RUN_WIDTH if compact else None)
    title = (
        f"run {run['run_id'][:12]} · {escape(run['name'])} · {escape(run['config']['dataset']['name'])} · "
        f"model {run['recipe_hash'][:12]} · "
        + (f"weights {run['weights_digest'][:12]} · " if run.get("weights_digest") else "")
        + f"n0={protocol['n0']} n={protocol['n']} "
        f"α={protocol['alpha']} · {run['device']}"
    )
    if compact:
        console.print(_compact_table(title, rows, _headline_radius(run["config"])))
    else:
        console.print(_full_table(title, rows))
        console.print("checks applied (and the seconds of certification and audit):",
                      highlight=False)  # fmt: skip
        for row in rows:
            applied = ", ".join(row["checks_applied"]) or "none"
            audit = row["audit_seconds"]
            seconds = (f"certification {row['certification_seconds']:,.1f} s, audit "
                       + ("not measured" if audit is None else f"{audit:,.1f} s"))  # fmt: skip
            console.print(
                escape(f"  {row['method']} {row['setting']} ({seconds}): {applied}"),
                highlight=False,
                soft_wrap=True,
            )
    note = incomplete_note(settings)
    if note is not None:
        console.print(
            f"[yellow]run {run['run_id'][:12]} is {escape(note)}[/yellow]; "
            "`idrs-bench run` with the same spec and --db finishes it"
        )
    for failure in [] if compact else failures:  # (`run` says more: print_failed_rows)
        console.print(
            f"[red]failed:[/red] {escape(failure['method'])} ({escape(failure['setting'])}): "
            f"{escape(failure['error'].splitlines()[0])}"
        )
    return rows


def print_failed_rows(db: Path, run_id: str, retry: str) -> int:
    """At the end of ``run``: each row that failed, with the plugins of its method, why, and
    ``retry``, the command that certifies it again (the others are kept); how many failed."""
    from harness.store.store import ResultStore
    from harness.store.storedrun import read_run

    store = ResultStore(db)
    try:
        stored = read_run(store, run_id)
    finally:
        store.close()
    if not stored.failures:
        return 0
    components = stored.run.get("components") or {}
    console = terminal(RUN_WIDTH)
    console.print(f"[red]{len(stored.failures)} row(s) failed[/red] (every other row is above):")
    for failure in stored.failures:
        method = failure["method"]
        console.print(
            f"  [red]failed:[/red] {escape(method)} ({escape(failure['setting'])}), "
            f"{escape(_plugins_of(method, components))}: "
            f"{escape(failure['error'].splitlines()[0])}",
            highlight=False, soft_wrap=True,
        )  # fmt: skip
    console.print(f"retry the failed row(s): {escape(retry)}   (finished rows are kept)",
                  highlight=False, soft_wrap=True)  # fmt: skip
    return len(stored.failures)


def _plugins_of(method: str, components: dict[str, Any]) -> str:
    """The plugin (and package) of ``method``, as the run recorded it (``runs.components``)."""
    provenance = (components.get("methods") or {}).get(method)
    if not provenance:
        return "its plugin not recorded"
    package = " ".join(p for p in (provenance.get("distribution"), provenance.get("version")) if p)
    return f"plugin {provenance['plugin']}" + (f" of {package}" if package else "")


def _headline_radius(config: dict[str, Any]) -> float:
    """The radius `run`'s compact table reports certified accuracy at (the board's)."""
    from harness.mathematics.accuracy import benchmark_radii
    from harness.reports.leaderboard.board import headline_radius

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


def attack_statement(budget: str) -> str:
    """What the empirical attack after the checks did (:mod:`harness.audit.empirical`)."""
    from harness.audit.empirical import STRENGTHS

    return f"empirical robust accuracy ({budget} budget): {STRENGTHS[budget].statement()}"


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _with_interval(value: float, interval: list[float]) -> str:
    """``0.710 [0.642, 0.772]``: a value and its 95 % interval."""
    return f"{value:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]"


def print_next_steps(db: Path, run_id: str, name: str, rows: list[dict[str, Any]]) -> None:
    """Where the results are, the verdict counts, and the commands to type next."""
    counts: dict[str, int] = {}
    for row in rows:
        verdict = row["verdict"].split(" (")[0] if row["complete"] else "incomplete"
        counts[verdict] = counts.get(verdict, 0) + 1
    verdicts = ", ".join(f"{n} {v}" for v, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    short = run_id[:12]
    db_arg = "" if db == DEFAULT_DB else f" --db {shlex.quote(str(db))}"
    board = shlex.quote(f"leaderboards/{name}.md")
    program = typed_program()
    lines = [
        f"results: {db}, run {short}: {verdicts or 'no rows'}",
        f"next: {program} results {short}{db_arg}   (every metric and check)",
        f"      {program} leaderboard {short}{db_arg} --out {board}",
    ]
    console = terminal(RUN_WIDTH)
    for line in lines:
        console.print(escape(line), highlight=False, soft_wrap=True)


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


RUN_WIDTH = 100
"""Columns of `run`'s output when it is not a terminal."""


def terminal(width: int | None = None) -> Console:
    """Stdout; when it is not a terminal, ``width`` columns (default: wide enough for
    every column of the results table; names wrap rather than being cut)."""
    return Console() if sys.stdout.isatty() else Console(width=width or 200)


def print_timings(timings: list[tuple[str, float]], db: Path, run_id: str | None) -> None:
    """``--timings``: the wall time of every stage (training, each setting's certification
    and checks), then the run's estimation samples (sequential) and each row's audit cost."""
    table = Table(title="stage times")
    table.add_column("stage")
    table.add_column("seconds", justify="right")
    for stage, seconds in timings:
        table.add_row(escape(stage), f"{seconds:,.1f}")
    table.add_row("sum of the stages", f"{sum(s for _, s in timings):,.1f}")
    terminal().print(table)
    for extra in (samples_table(db, run_id), cost_table(db, run_id)):
        if extra is not None:
            terminal().print(extra)


def samples_table(db: Path, run_id: str | None) -> Table | None:
    """For a run that drew its estimation samples sequentially, per setting: the samples
    drawn, what fixed sampling at n_max would draw, and the fraction saved (None for a
    fixed-n run)."""
    from harness.mathematics.accuracy import estimation_samples
    from harness.store.store import ResultStore
    from harness.store.storedrun import read_run

    store = ResultStore(db)
    try:
        stored = read_run(store, run_id)
    finally:
        store.close()
    protocol = stored.config["protocol"]
    if protocol.get("sampling") != "sequential":
        return None
    table = Table(title=f"estimation samples (sequential, n_max = {protocol['n_max']:,})")
    for column in ("method", "setting", "inputs", "drawn", "mean", "max", "at n_max", "saved"):
        table.add_column(column, justify="left" if column in ("method", "setting") else "right")
    total = cap = 0
    for row in stored.rows():
        drawn = [estimation_samples(c) or 0 for c in row.certificates]
        fixed = len(drawn) * int(protocol["n_max"])
        total, cap = total + sum(drawn), cap + fixed
        table.add_row(escape(row.method), escape(row.setting), str(len(drawn)),
                      f"{sum(drawn):,}", f"{sum(drawn) / max(len(drawn), 1):,.0f}",
                      f"{max(drawn, default=0):,}", f"{fixed:,}", _saved(sum(drawn), fixed))  # fmt: skip
    table.add_row("all", "", "", f"{total:,}", "", "", f"{cap:,}", _saved(total, cap))
    return table


def cost_table(db: Path, run_id: str | None) -> Table | None:
    """What each row's audit cost, check by check (:mod:`harness.audit.cost`): seconds, σ
    queries (calls and points), samples drawn and rows through base models, beside the
    row's certification seconds (None when no check recorded its cost)."""
    from harness.store.store import ResultStore
    from harness.store.storedrun import read_run

    store = ResultStore(db)
    try:
        rows = read_run(store, run_id).rows()
    finally:
        store.close()
    if not any(row.audit_costs() for row in rows):
        return None
    table = Table(title="audit cost (σ: calls / points queried; samples drawn and rows through "
                  "base models in this process)")  # fmt: skip
    for column in ("method", "setting", "stage", "seconds", "σ calls", "σ points", "samples",
                   "forward rows"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("method", "setting", "stage")
                         else "right")  # fmt: skip
    for row in rows:
        costs = row.audit_costs()
        if not costs:
            continue
        table.add_row(escape(row.method), escape(row.setting), "certification",
                      f"{row.certification_seconds:,.1f}", "", "", "", "")  # fmt: skip
        total = {key: 0.0 for key in ("seconds", "sigma_calls", "sigma_points", "samples",
                                      "forward_rows")}  # fmt: skip
        for stage, cost in costs:
            values = [float(cost.get(key, 0)) for key in total]
            for key, value in zip(total, values, strict=True):
                total[key] += value
            table.add_row("", "", escape(stage), *_cost_cells(values))
        table.add_row("", "", "[bold]audit[/bold]", *_cost_cells(list(total.values())),
                      end_section=True)  # fmt: skip
    return table


def _cost_cells(values: list[float]) -> list[str]:
    """Seconds (0.1 s) and counts (thousands separated)."""
    return [f"{values[0]:,.1f}", *(f"{int(v):,}" for v in values[1:])]


def _saved(drawn: int, fixed: int) -> str:
    """``92.1 % (12.7x fewer)``: the share of ``fixed`` samples not drawn, and the factor."""
    if not fixed:
        return "–"
    factor = f"{fixed / drawn:.1f}x fewer" if drawn else "none drawn"
    return f"{1 - drawn / fixed:.1%} ({factor})"
