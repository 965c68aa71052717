"""``idrs-bench compare RUN_A RUN_B``: per-row metric differences of two runs.

Rows are matched by (method, setting); every leaderboard metric
(:func:`harness.reports.leaderboard.metrics.metric_catalog`, at the union of both runs' radii)
is shown for A and B with the difference B − A, plus both verdicts
(:attr:`harness.store.storedrun.StoredRow.verdict`). A row present in
one run only is listed with the other side empty. Differences are only meaningful under
the same protocol, so a warning names every protocol field that differs: dataset and
test subset, n0, n, α, base model's recipe hash, certification and model seeds, architecture
and trainer (with their parameters); a separate warning says when the two base models'
weights (their SHA-256 digests, where recorded) differ. Devices may differ (CPU vs GPU is a common
comparison); that is noted, not warned about.

A run is a run id or unique prefix in a results database, a run export
(``*.run.json``, as committed beside a leaderboard), or a results database file (its
latest run), e.g. ``idrs-bench compare cpu.sqlite gpu.sqlite``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.foundation.errors import IdrsError
from harness.mathematics.accuracy import benchmark_radii, row_metrics
from harness.reports.leaderboard.metrics import metric_catalog, sampled_in_rounds
from harness.reports.leaderboard.source import resolve_runs
from harness.reports.leaderboard.stated_protocol import NOT_RECORDED, run_protocol
from harness.store.store import DEFAULT_DB
from harness.store.storedrun import StoredRun

PROTOCOL_FIELDS = (
    "dataset", "test_every", "test_count", "n0", "n", "alpha", "recipe_hash", "seed",
    "model_seed", "architecture", "architecture_params", "trainer", "trainer_params",
    "sampling", "n_max", "test_split",
)  # fmt: skip


@dataclass
class RowDiff:
    method: str
    setting: str
    verdicts: tuple[str | None, str | None]
    metrics: list[dict[str, Any]]  # {key, header, higher_is_better, a, b, diff}


@dataclass
class Comparison:
    run_a: str
    run_b: str
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rows: list[RowDiff] = field(default_factory=list)


def protocol_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """One line per protocol field whose value differs between protocols ``a`` and ``b``."""
    # a fixed-n run's protocol does not name its sampling, nor an older run its test split
    fixed = {"sampling": "fixed", "test_split": NOT_RECORDED}
    a, b = fixed | a, fixed | b
    return [
        f"{key}: {a.get(key)!r} (A) vs {b.get(key)!r} (B)"
        for key in PROTOCOL_FIELDS
        if a.get(key) != b.get(key)
    ]


def compare_runs(a: StoredRun, b: StoredRun) -> Comparison:
    """Compare two stored runs, row by row."""
    pa, pb = run_protocol(a, None), run_protocol(b, None)
    out = Comparison(a.run_id, b.run_id)
    differences = protocol_differences(pa, pb)
    if differences:
        out.warnings.append(
            "the protocols differ, so the differences below are not like for like: "
            + "; ".join(differences)
        )
    wa, wb = a.run.get("weights_digest"), b.run.get("weights_digest")
    if wa and wb and wa != wb:
        out.warnings.append(
            f"the base models' weights differ (SHA-256 {wa[:12]} (A) vs {wb[:12]} (B)): the "
            "certificates are of two different models"
        )
    if pa["device"] != pb["device"]:
        out.notes.append(f"devices: {pa['device']} (A) vs {pb['device']} (B)")
    radii = sorted(set(benchmark_radii(a.config)) | set(benchmark_radii(b.config)))
    catalog = metric_catalog(radii, sequential=sampled_in_rounds([a, b]))
    ra = {(row.method, row.setting): row for row in a.rows()}
    rb = {(row.method, row.setting): row for row in b.rows()}
    for key in sorted(set(ra) | set(rb)):
        ma = row_metrics(ra[key].certificates, radii) if key in ra else None
        mb = row_metrics(rb[key].certificates, radii) if key in rb else None
        if ma and mb and ma["inputs"] != mb["inputs"]:
            out.warnings.append(
                f"{key[0]} ({key[1]}): {ma['inputs']} inputs in A, {mb['inputs']} in B"
            )
        metrics = []
        for m in catalog:
            va = None if ma is None else ma[m.key]
            vb = None if mb is None else mb[m.key]
            metrics.append(
                {"key": m.key, "header": m.header, "higher_is_better": m.higher_is_better,
                 "a": va, "b": vb, "diff": None if va is None or vb is None else vb - va}
            )  # fmt: skip
        verdicts = (ra[key].verdict if key in ra else None, rb[key].verdict if key in rb else None)
        out.rows.append(RowDiff(key[0], key[1], verdicts, metrics))
    return out


def comparison_json(comparison: Comparison) -> str:
    data = {
        "run_a": comparison.run_a,
        "run_b": comparison.run_b,
        "warnings": comparison.warnings,
        "notes": comparison.notes,
        "rows": [
            {
                "method": r.method,
                "setting": r.setting,
                "verdict_a": r.verdicts[0],
                "verdict_b": r.verdicts[1],
                "metrics": r.metrics,
            }
            for r in comparison.rows
        ],
    }
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=False)


def _number(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "–"
    return f"{value:+.4f}" if signed else f"{value:.4f}"


def print_comparison(comparison: Comparison) -> None:
    """A rich table: one section per (method, setting), one line per metric."""
    import sys

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console() if sys.stdout.isatty() else Console(width=160)
    err = Console(stderr=True, soft_wrap=True)
    for warning in comparison.warnings:
        err.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
    for note in comparison.notes:
        err.print(f"note: {escape(note)}", highlight=False)
    table = Table(title=f"A = run {comparison.run_a[:12]} · B = run {comparison.run_b[:12]}")
    for column in ("method", "setting", "metric", "A", "B", "B − A"):
        table.add_column(
            column, justify="left" if column in ("method", "setting", "metric") else "right"
        )
    for row in comparison.rows:
        va, vb = (v or "–" for v in row.verdicts)
        table.add_row(
            escape(row.method), escape(row.setting), "verdict", escape(va), escape(vb), ""
        )
        for m in row.metrics:
            table.add_row("", "", m["header"], _number(m["a"]), _number(m["b"]),
                          _number(m["diff"], signed=True))  # fmt: skip
        table.add_section()
    console.print(table)


def add_compare_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``compare`` subcommand to ``idrs-bench``'s subparsers."""
    parser = sub.add_parser("compare", help="per-row metric differences of two runs")
    parser.add_argument(
        "run_a", metavar="RUN_A", help="run id or prefix, *.run.json, or a database"
    )
    parser.add_argument(
        "run_b", metavar="RUN_B", help="run id or prefix, *.run.json, or a database"
    )
    parser.add_argument(
        "--db", type=Path, default=DEFAULT_DB, metavar="PATH",
        help=f"results database (default {DEFAULT_DB})",
    )  # fmt: skip
    parser.add_argument(
        "--db-b", type=Path, metavar="PATH", help="results database of RUN_B (default: --db)"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=compare_command)
    return parser


def _one_run(name: str, db: Path) -> StoredRun:
    runs = resolve_runs([name], db)
    if len(runs) != 1:
        raise IdrsError(f"{name} holds {len(runs)} runs; name one run id (or prefix) instead")
    return runs[0]


def compare_command(args: argparse.Namespace) -> int:
    a = _one_run(args.run_a, args.db)
    b = _one_run(args.run_b, args.db_b or args.db)
    comparison = compare_runs(a, b)
    if args.json:
        print(comparison_json(comparison))
    else:
        print_comparison(comparison)
    return 0
