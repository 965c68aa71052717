"""A leaderboard as data: tables per dataset and base model, rows ranked, verdicts attached.

Rows of one table are all (run, method, setting) of the runs that share a dataset and a
base model (content hash). Rows whose verdict is ``sound`` are ranked apart from the
others (a setting of an unfinished run is marked ``incomplete`` and never sound); within each group the order is: certified accuracy at the headline radius
(descending), then ACR (descending), then method, setting and run id (ascending), so
that ties are broken deterministically.

The benchmark's radii are the spec's ``radii`` when its stored config has them,
else :data:`harness.results.RADII`; the headline radius is the spec's
``headline_radius`` if present, else the median of the radii (0.5 by default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.leaderboard.metrics import certified_key, row_metrics
from harness.leaderboard.source import StoredRun
from harness.leaderboard.verdicts import SOUND, row_verdict
from harness.results import RADII


@dataclass
class Row:
    """One (run, method, setting) with its metrics, verdict and the checks behind it."""

    run_id: str
    method: str
    setting: str
    metrics: dict[str, Any]
    verdict: str
    checks: list[dict[str, Any]]
    correct_radii: list[float]  # sorted radii of the correctly certified inputs (for curves)

    @property
    def sound(self) -> bool:
        return self.verdict == SOUND


@dataclass
class Table:
    """All rows on one dataset and base model."""

    index: int  # 1-based, in order of first appearance among the runs
    dataset: str
    architecture: str
    model_hash: str
    radii: list[float]
    headline_radius: float
    runs: list[StoredRun] = field(default_factory=list)
    sound_rows: list[Row] = field(default_factory=list)
    other_rows: list[Row] = field(default_factory=list)

    @property
    def rows(self) -> list[Row]:
        return self.sound_rows + self.other_rows

    @property
    def failures(self) -> list[dict[str, Any]]:
        return [f | {"run_id": run.run_id} for run in self.runs for f in run.failures]


@dataclass
class Board:
    title: str
    runs: list[StoredRun]
    tables: list[Table]


def benchmark_radii(config: dict[str, Any]) -> list[float]:
    """The spec's ``radii`` if its config has them, else :data:`harness.results.RADII`."""
    radii = config.get("radii") or RADII
    return sorted({float(r) for r in radii})


def headline_radius(config: dict[str, Any], radii: Sequence[float]) -> float:
    """The spec's ``headline_radius`` if present, else the median of ``radii``."""
    value = config.get("headline_radius")
    return float(value) if value is not None else float(radii[len(radii) // 2])


def rank_key(row: Row, radius: float) -> tuple:
    m = row.metrics
    return (-m[certified_key(radius)], -m["acr"], row.method, row.setting, row.run_id)


def build_board(runs: Sequence[StoredRun]) -> Board:
    """Group ``runs`` into tables, compute every row's metrics and verdict, rank the rows."""
    tables: dict[tuple[str, str, str], Table] = {}
    for run in runs:
        config = run.run["config"]
        key = (config["dataset"]["name"], config["model"]["architecture"], run.run["model_hash"])
        radii = benchmark_radii(config)
        table = tables.get(key)
        if table is None:
            table = tables[key] = Table(
                index=len(tables) + 1, dataset=key[0], architecture=key[1], model_hash=key[2],
                radii=radii, headline_radius=headline_radius(config, radii),
            )  # fmt: skip
        else:
            table.radii = sorted(set(table.radii) | set(radii))
        table.runs.append(run)
    for table in tables.values():
        table.radii = sorted({*table.radii, table.headline_radius})
        rows = [row for run in table.runs for row in _rows(run, table.radii)]
        ordered = sorted(rows, key=lambda r: rank_key(r, table.headline_radius))
        table.sound_rows = [r for r in ordered if r.sound]
        table.other_rows = [r for r in ordered if not r.sound]
    names = list(dict.fromkeys(run.run["name"] for run in runs))
    return Board(title=", ".join(names), runs=list(runs), tables=list(tables.values()))


def _rows(run: StoredRun, radii: Sequence[float]) -> list[Row]:
    """One row per (method, setting); a setting not finished is marked and never ranked sound."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for cert in run.certificates:
        groups.setdefault((cert["method"], cert["setting"]), []).append(cert)
    status = {(s["method"], s["setting"]): s for s in run.settings()}
    out = []
    for (method, setting), certs in groups.items():
        checks = [c for c in run.checks if c["method"] == method and c["setting"] == setting]
        verdict = row_verdict(checks)
        done = status.get((method, setting))
        if done is not None and not done["complete"]:
            verdict = (
                f"incomplete ({done['inputs']} of {done['expected'] or '?'} inputs), {verdict}"
            )
        out.append(
            Row(
                run_id=run.run_id,
                method=method,
                setting=setting,
                metrics=row_metrics(certs, radii),
                verdict=verdict,
                checks=checks,
                correct_radii=sorted(c["radius"] for c in certs if c["prediction"] == c["label"]),
            )
        )
    return out
