"""The JSON and CSV beside a leaderboard (built with pandas; numbers stay numbers).

``NAME.json`` (schema: :data:`harness.reports.leaderboard.board_schema.BOARD_SCHEMA`) holds the title,
the protocol of every run, the metric catalog (each metric with its higher-is-better
flag; ``null`` for descriptive ones such as mean σ), the tables, one record per row
(ranked, with its verdict and the per-class accuracies) and the failures.

Each row record also holds ``intervals`` (every accuracy over test inputs -> its 95 %
Clopper–Pearson [low, high], the ACR -> its 95 % t interval), ``best_at`` (the radii at
which it is a best verified-sound row: :mod:`harness.reports.leaderboard.envelope`) and
``differences`` (per radius, its paired difference from the table's reference row there,
the best verified-sound constant-σ row: discordant counts, difference, Newcombe's 95 %
interval and its reading; null where the row is the reference, there is none, or the
two are not paired: :mod:`harness.reports.leaderboard.paired_differences`); each table
names its ``references``. Where the empirical attack ran, the ``empirical_accuracy@r``
metrics.

``NAME.csv`` is the same rows in long form, one line per (row, metric): the run's
protocol columns, the row's identity and verdict, ``metric``, ``radius`` (certified and
empirical accuracy, and the paired test), ``class`` (per-class accuracy only),
``value``, ``lower`` and ``upper`` (the 95 % interval, where the metric has one) and
``higher_is_better``; the metric ``paired_difference`` is the difference from the
table's reference row at ``radius``, ``lower`` and ``upper`` its Newcombe interval. Floats are written as their shortest round-trip repr in both files.
"""

from __future__ import annotations

import json
import math
from typing import Any

from harness.mathematics.accuracy import empirical_key
from harness.reports.leaderboard.board import Board, Row, Table
from harness.reports.leaderboard.envelope import best_rows
from harness.reports.leaderboard.metrics import (
    Metric,
    certified_key,
    metric_catalog,
    sampled_in_rounds,
)
from harness.reports.leaderboard.plots import certified_plot_name, classwise_plot_name
from harness.reports.leaderboard.seeds import seed_groups, seeds_record
from harness.reports.leaderboard.stated_protocol import run_protocol

BOARD_FORMAT = "idrs-bench/leaderboard/4"
"""Format 4: format 3 with the tables' ``references`` per base model (recipe hash), each
row's ``recipe_hash`` its own model's, the tables' ``seeds`` (rows over training seeds) and
each row's ``load_per_core``; format 3: format 2 with per-radius ``differences`` from a reference row (and the
tables' ``references``) for the McNemar test against the group's first row (``paired``),
``best_at``, the σ(x) distribution, the ACR's interval and the weights file's SHA-256;
format 2: format 1 with ``model_hash`` (runs, tables, rows) named ``recipe_hash``."""
PROTOCOL_COLUMNS = ("dataset", "recipe_hash", "n0", "n", "alpha", "seed", "device")


def board_radii(board: Board) -> list[float]:
    return sorted({r for table in board.tables for r in table.radii})


def _attacked(rows: list[Row]) -> bool:
    return any(row.attack for row in rows)


def _sections(table: Table) -> list[tuple[str, int, Row]]:
    return (
        [("sound", i, r) for i, r in enumerate(table.sound_rows, 1)]
        + [("order-dependent", i, r) for i, r in enumerate(table.memory_rows, 1)]
        + [("not-certified", i, r) for i, r in enumerate(table.other_rows, 1)]
        + [("imported", i, r) for i, r in enumerate(table.imported_rows, 1)]
    )


def _identity(row: Row | None) -> dict[str, str] | None:
    return None if row is None else {"run_id": row.run_id, "method": row.method,
                                     "setting": row.setting}  # fmt: skip


def _records(board: Board, catalog: list[Metric]) -> list[dict[str, Any]]:
    records = []
    for table in board.tables:
        best = {r: {id(row) for row in best_rows(table, r)} for r in table.radii}
        for section, rank, row in _sections(table):
            record = {
                "table": table.index,
                "section": section,
                "rank": rank,
                "run_id": row.run_id,
                "dataset": table.dataset,
                "recipe_hash": row.model or table.recipe_hash,
                "method": row.method,
                "setting": row.setting,
                "verdict": row.verdict,
                "sound": row.sound,
                "checks_applied": list(row.applied),
                "inputs": row.metrics["inputs"],
            }
            for metric in catalog:
                record[metric.key] = row.metrics.get(metric.key)
            record["classwise_accuracy"] = {
                str(c): a for c, a in row.metrics["classwise_accuracy"].items()
            }
            record["intervals"] = {k: list(v) for k, v in sorted(row.metrics["intervals"].items())}
            record["best_at"] = [r for r in table.radii if id(row) in best[r]]
            record["differences"] = {f"{r:g}": None if d is None else d.as_dict()
                                     for r, d in row.differences.items()}  # fmt: skip
            records.append(record)
    return records


def _native(value: Any) -> Any:
    """Plain Python values for JSON: NaN (a missing radius) becomes null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "item") and not isinstance(value, dict | list | str):
        return _native(value.item())
    return value


def board_json(board: Board, stem: str) -> str:
    """``NAME.json`` as deterministic text."""
    import pandas as pd

    catalog = metric_catalog(
        board_radii(board),
        any(_attacked(t.rows) for t in board.tables),
        sampled_in_rounds(board.runs),
    )
    records = _records(board, catalog)
    nested = ("classwise_accuracy", "intervals", "best_at", "differences")
    frame = pd.DataFrame([{k: v for k, v in r.items() if k not in nested} for r in records])
    rows = [
        {k: _native(v) for k, v in record.items()} | {k: source[k] for k in nested}
        for record, source in zip(frame.to_dict(orient="records"), records, strict=True)
    ]
    data = {
        "format": BOARD_FORMAT,
        "title": board.title,
        "runs": [run_protocol(run, stem) for run in board.runs],
        "metrics": [
            {
                "key": m.key,
                "header": m.header,
                "higher_is_better": m.higher_is_better,
                "description": m.description,
            }
            for m in catalog
        ],
        "tables": [
            {
                "index": t.index,
                "dataset": t.dataset,
                "architecture": t.architecture,
                "recipe_hash": t.recipe_hash,
                "radii": t.radii,
                "headline_radius": t.headline_radius,
                "runs": [run.run_id for run in t.runs],
                "references": {
                    model: {f"{r:g}": _identity(ref) for r, ref in refs.items()}
                    for model, refs in t.references.items()
                },
                "seeds": [seeds_record(group, t) for group in seed_groups(t)],
                "plots": {
                    "certified_accuracy": certified_plot_name(stem, t),
                    "classwise_accuracy": classwise_plot_name(stem, t),
                },
            }
            for t in board.tables
        ],
        "rows": rows,
        "failures": [
            {k: f[k] for k in ("run_id", "method", "setting", "error")}
            for t in board.tables
            for f in t.failures
        ],
    }
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


def board_csv(board: Board, stem: str) -> str:
    """``NAME.csv``: one line per (row, metric), protocol columns included."""
    import pandas as pd

    protocols = {run.run_id: run_protocol(run, stem) for run in board.runs}
    lines = []
    for table in board.tables:
        catalog = metric_catalog(table.radii, _attacked(table.rows), sampled_in_rounds(table.runs))
        for section, rank, row in _sections(table):
            base = {
                "table": table.index,
                "section": section,
                "rank": rank,
                "run_id": row.run_id,
                **{k: protocols[row.run_id][k] for k in PROTOCOL_COLUMNS},
                "method": row.method,
                "setting": row.setting,
                "verdict": row.verdict,
            }
            for metric in catalog:
                radius = next((r for r in table.radii if metric.key in (certified_key(r),
                               empirical_key(r))), None)  # fmt: skip
                low, high = row.metrics["intervals"].get(metric.key, (None, None))
                lines.append(base | {"metric": metric.key, "radius": radius, "class": None,
                                     "value": row.metrics[metric.key], "lower": low,
                                     "upper": high,
                                     "higher_is_better": metric.higher_is_better})  # fmt: skip
            for radius, d in row.differences.items():
                if d is not None:
                    lines.append(base | {"metric": "paired_difference", "radius": radius,
                                         "class": None, "value": d.difference, "lower": d.low,
                                         "upper": d.high, "higher_is_better": None})  # fmt: skip
            for label, accuracy in row.metrics["classwise_accuracy"].items():
                lines.append(base | {"metric": "class_accuracy", "radius": None, "class": label,
                                     "value": accuracy, "higher_is_better": True})  # fmt: skip
    columns = ["table", "section", "rank", "run_id", *PROTOCOL_COLUMNS, "method", "setting",
               "verdict", "metric", "radius", "class", "value", "lower", "upper",
               "higher_is_better"]  # fmt: skip
    frame = pd.DataFrame(lines, columns=columns)
    frame["class"] = frame["class"].astype("Int64")
    frame["higher_is_better"] = frame["higher_is_better"].astype("boolean")
    return frame.to_csv(index=False, lineterminator="\n")
