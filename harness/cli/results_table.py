"""What ``idrs-bench results`` and the end of ``idrs-bench run`` print: a run's summary table
(compact at the run's end), its verdicts, the commands to go on with; the ``results`` command."""

from __future__ import annotations

import argparse
import io
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.cli.console import RUN_WIDTH, results_console, terminal
from harness.cli.next_steps import db_option, typed_program
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
        "--wide", action="store_true",
        help="every column, accuracies with their 95 %% intervals, however wide the lines "
        "(e.g. piped to `less -S`; by default the table fits the terminal or $COLUMNS)",
    )  # fmt: skip
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
    print_results(args.db, args.run, as_json=args.json, wide=args.wide)
    return 0


def print_results(
    db: Path,
    run_id: str | None,
    as_json: bool,
    compact: bool = False,
    wide: bool = False,
    console: Console | None = None,
) -> list[dict[str, Any]]:
    """Print a run's summary on ``console`` (default: stdout, :func:`results_console`), its
    table fitted to the console's width (:func:`fitted_table`; ``compact``: the few columns
    `run` shows; ``wide``: every column); returns its rows."""
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
    rows, briefs = [], []
    for row in stored.rows():
        out = summary(row.method, row.setting, row.certificates, radii, stored.unknown_metrics)
        out["checks_applied"] = row.applied
        out["checks"] = {c.check: {"verdict": c.verdict, "summary": c.summary} for c in row.checks}
        out["complete"] = row.complete
        out["certification_seconds"] = row.certification_seconds
        out["audit_seconds"] = row.audit_seconds
        out["expected_inputs"] = row.status.expected if row.status else None
        brief = "imported (claims, no evidence)" if row.verdict == IMPORTED else row.verdict
        if not row.complete:
            brief = f"incomplete ({row.inputs} of {out['expected_inputs'] or '?'}), {brief}"
        flags = f" ({', '.join(row.flags)})" if row.flags and row.verdict != IMPORTED else ""
        out["verdict"] = brief + flags
        rows.append(out)
        briefs.append((brief, list(row.flags) if flags else []))
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
    for out, (brief, flags) in zip(rows, briefs, strict=True):  # (the table's, not JSON's)
        out["verdict_brief"], out["flags"] = brief, flags
    protocol = run["config"]["protocol"]
    console = console or results_console()
    title = (
        f"run {run['run_id'][:12]} · {escape(run['name'])} · {escape(run['config']['dataset']['name'])} · "
        f"model {run['recipe_hash'][:12]} · "
        + (f"weights {run['weights_digest'][:12]} · " if run.get("weights_digest") else "")
        + f"n0={protocol['n0']} n={protocol['n']} "
        f"α={protocol['alpha']} · {run['device']}"
    )
    wider = "--wide"  # (`run`'s compact table: the command that shows the run's table)
    if compact:
        wider = f"`{typed_program()} results {run['run_id'][:12]}{db_option(db)} --wide`"
    print_table(console, title, rows, _headline_radius(run["config"]), compact, wide, wider)
    if not compact:
        console.print("checks applied (and the seconds of certification and audit; the "
                      "verdict's flags):", highlight=False)  # fmt: skip
        for row in rows:
            applied = ", ".join(row["checks_applied"]) or "none"
            if row["flags"]:
                applied += f"; flags: {', '.join(row['flags'])}"
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


ESSENTIAL = ("method", "setting", "verdict")
"""The columns the results table always shows whole: a row is read by them."""


@dataclass(frozen=True)
class _Column:
    """One column of the results table: its header, its cells (markup), and whether it
    names (left-aligned) or counts (right-aligned)."""

    header: str
    cells: list[str]
    name: bool = False


def print_table(
    console: Console, title: str, rows: list[dict[str, Any]], radius: float,
    compact: bool = False, wide: bool = False, wider: str = "--wide",
) -> list[str]:  # fmt: skip
    """``rows``' table fitted to ``console``'s width (:func:`fitted_table`), then a line
    naming the columns it left out and ``wider``, the command that shows them; returns
    their headers."""
    width = console.width
    table, left_out, _ = fitted_table(title, rows, radius, width, compact=compact, wide=wide)
    console.width = max(width, _natural_width(table))  # (names whole, however narrow)
    try:
        console.print(table)
    finally:
        console.width = width
    if left_out:
        console.print(
            f"left out to fit {width} columns: {escape(', '.join(left_out))}; {escape(wider)} "
            "shows every column" + ("" if compact else " with its 95 % interval"),
            highlight=False,
        )
    return left_out


def fitted_table(
    title: str, rows: list[dict[str, Any]], radius: float, width: int,
    compact: bool = False, wide: bool = False,
) -> tuple[Table, list[str], str | None]:  # fmt: skip
    """The results table that fits ``width`` columns, the headers it leaves out, and its
    caption. Method, setting and verdict are always shown whole (the table is wider than
    ``width`` only when they alone are); then, while they fit, clean accuracy, certified
    accuracy at the headline ``radius``, ACR, inputs, the other radii, abstention,
    misclassification, mean σ and seconds per input, accuracies with their 95 % intervals
    when at least the first two fit with them; a setting of several parameters is put one
    per line when the first two fit only so. ``compact`` (`run`'s table): the first four
    only, without intervals; ``wide``: every column with its interval, however wide."""
    inputs = rows[0]["inputs"] if rows else 0
    caption = f"accuracies: value [95 % Clopper–Pearson interval over the {inputs} test inputs]"
    headline = f"cert@{radius:g}"
    tries = ((True, False), (False, False), (False, True))  # (intervals, folded settings)
    for intervals, folded in tries[1:] if compact else tries:
        columns = _columns(rows, radius, intervals, compact, wide, folded)
        headers = [c.header for c in columns]
        if wide:
            return _table(title, columns, caption), [], caption
        order = ["clean acc", headline, "ACR", "inputs"]
        order += [h for h in headers if h not in order and h not in ESSENTIAL]
        shown = set(ESSENTIAL)
        for header in (h for h in order if h in headers):
            trial = shown | {header}
            if _natural_width(_table(title, [c for c in columns if c.header in trial])) > width:
                break
            shown = trial
        if {"clean acc", headline} <= shown:
            break
    left_out = [h for h in headers if h not in shown]
    caption = caption if intervals else None
    return _table(title, [c for c in columns if c.header in shown], caption), left_out, caption


def _columns(rows: list[dict[str, Any]], radius: float, intervals: bool, compact: bool,
             wide: bool, folded: bool = False) -> list[_Column]:  # fmt: skip
    """Every column of the table in the order it is shown (``compact``: `run`'s few;
    ``wide``: the verdicts with their flags; ``folded``: a setting's parameters one per line)."""
    radii = list(rows[0]["certified_accuracy"]) if rows else []
    if compact:
        radii = [f"{radius:g}"]

    def accuracy(value: float, interval: list[float]) -> str:
        return _with_interval(value, interval) if intervals else f"{value:.3f}"

    columns = [
        _Column("method", [escape(row["method"]) for row in rows], name=True),
        _Column("setting", [escape(row["setting"]).replace(",", ",\n" if folded else ",")
                            for row in rows], name=True),
        _Column("inputs", [str(row["inputs"]) for row in rows]),
        _Column("clean acc", [accuracy(row["clean_accuracy"], row["clean_accuracy_interval"])
                              for row in rows]),
        *[_Column(f"cert@{r}", [accuracy(row["certified_accuracy"][r],
                                         row["certified_accuracy_interval"][r]) for row in rows])
          for r in radii],
        _Column("ACR", [_number(row["acr"]) for row in rows]),
    ]  # fmt: skip
    if not compact:
        for header, key in (("abstain", "abstention_rate"), ("misclass", "misclassification_rate"),
                            ("mean σ", "mean_sigma"), ("s/input", "seconds_per_input")):  # fmt: skip
            columns.append(_Column(header, [_number(row[key]) for row in rows]))
    # the verdict (its flags are listed below the table; ``wide``: beside it)
    verdict = "verdict" if wide else "verdict_brief"
    columns.append(_Column("verdict", [escape(row[verdict]) for row in rows], name=True))
    return columns


def _table(title: str, columns: list[_Column], caption: str | None = None) -> Table:
    """``columns`` as a table without outer edges (names never wrap: the table is sized
    for them by :func:`fitted_table`)."""
    from rich import box

    table = Table(
        title=title, caption=caption, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
        collapse_padding=True,
    )  # fmt: skip
    for column in columns:
        table.add_column(column.header, justify="left" if column.name else "right", no_wrap=True)
    for cells in zip(*(c.cells for c in columns), strict=True):
        table.add_row(*cells)
    return table


def _natural_width(table: Table) -> int:
    """The columns ``table`` takes when nothing in it is wrapped or cut."""
    console = Console(width=100_000, file=io.StringIO())
    return console.measure(table).maximum


def attack_statement(budget: str) -> str:
    """What the empirical attack after the checks did (:mod:`harness.audit.empirical`)."""
    from harness.audit.empirical import STRENGTHS

    return f"empirical robust accuracy ({budget} budget): {STRENGTHS[budget].statement()}"


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _with_interval(value: float, interval: list[float]) -> str:
    """``0.710 [0.642, 0.772]``: a value and its 95 % interval."""
    return f"{value:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]"


def print_timings(
    timings: list[tuple[str, float]], db: Path, run_ids: str | list[str] | None
) -> None:
    """``--timings``: the wall time of every stage (training, each setting's certification
    and checks), then each run's estimation samples (sequential) and each row's audit cost."""
    table = Table(title="stage times")
    table.add_column("stage")
    table.add_column("seconds", justify="right")
    for stage, seconds in timings:
        table.add_row(escape(stage), f"{seconds:,.1f}")
    table.add_row("sum of the stages", f"{sum(s for _, s in timings):,.1f}")
    terminal().print(table)
    for run_id in run_ids if isinstance(run_ids, list) else [run_ids]:
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
