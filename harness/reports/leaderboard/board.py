"""A leaderboard as data: tables per dataset and model family, rows ranked, verdicts attached.

Rows of one table are all (run, method, setting) of the runs that share a dataset and a
model family: base models made alike but for their training σ and seed (one run per base
model: :mod:`harness.running.model_variants`), so that a benchmark's σ_b certified each
on its own model are read side by side, each row with its model (``Row.model``). Rows whose verdict is ``sound`` are ranked apart from the
others, and ``order-dependent`` (memory) rows apart from both, scored at the worst input
order their check replayed (Súkeník et al. 2022, App. C.2). Runs imported from published
logs (``idrs-bench import-log``) join the first table of their dataset (or open their own)
as a group of their own, ``imported``: their radii are claims without evidence, never
ranked as certified. A setting of an unfinished run is marked ``incomplete`` and
never sound; one whose certification failed (a plugin that raised, hung or crashed:
the run's ``failures``) is marked ``failed``, never sound either. Within each group the
order is: certified accuracy at the headline radius (descending), then at the other
radii in increasing order (descending), then method, setting and run id (ascending), so
that ties are broken deterministically; the ACR ranks nothing
(:mod:`harness.reports.leaderboard.metrics`). The order is a listing, not a verdict:
the board reads a table per radius (:mod:`harness.reports.leaderboard.envelope`).

The benchmark's radii are :func:`harness.mathematics.accuracy.benchmark_radii`; the headline radius
is the spec's ``headline_radius`` if present, else the median of the radii (0.5 by
default). Rows and their verdicts come from :meth:`harness.store.storedrun.StoredRun.rows`.

Every accuracy carries its 95 % interval over the test inputs, the ACR its t interval
(:mod:`harness.mathematics.significance`), and every row its paired difference from the
best verified-sound constant-σ row at each radius, with Newcombe's interval
(:mod:`harness.reports.leaderboard.paired_differences`). Where the empirical attack ran
(:mod:`harness.audit.empirical`), each row also has its empirical robust accuracy at the
radii attacked.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from harness.foundation.identity import content_hash
from harness.mathematics.accuracy import (
    benchmark_radii,
    certified_key,
    empirical_key,
    empirical_successes,
    row_metrics,
)
from harness.mathematics.significance import (
    PairedDifference,
    mean_interval,
    proportion_interval,
)
from harness.reports.leaderboard.paired_differences import attach_differences
from harness.running.model_variants import model_label
from harness.store.storedrun import (
    IMPORTED,
    ORDER_DEPENDENT,
    SOUND,
    StoredCertificate,
    StoredCheck,
    StoredRun,
)


@dataclass
class Row:
    """One (run, method, setting) with its metrics, verdict and the checks behind it."""

    run_id: str
    method: str
    setting: str
    metrics: dict[str, Any]
    verdict: str
    checks: tuple[StoredCheck, ...]
    correct_radii: list[float]  # sorted radii of the correctly certified inputs (for curves)
    applied: list[str] = field(default_factory=list)  # checks that applied to the row
    order: dict[str, Any] | None = None  # memory rows: orders replayed, ACR spread
    class_counts: dict[int, int] = field(default_factory=dict)  # inputs per label
    certified: dict[int, float | None] = field(default_factory=dict)  # input -> radius if correct
    differences: dict[float, PairedDifference | None] = field(default_factory=dict)
    """Per radius: the row minus its model's reference row there, paired (None: the row
    is the reference, there is none, or the two certified other inputs)."""
    model: str = ""  # the recipe hash of the base model it certified
    model_label: str = ""  # that model's training σ and seed (``σ 0.25 · seed 0``)
    attack: dict[str, Any] | None = None  # the empirical attack's result, where it ran
    beyond_attack: dict[float, list[int]] = field(default_factory=dict)
    """Per radius: the inputs certified at it that the attack counts robust at no radius that
    high (broken within it, or not answered right by PREDICT): certified above empirical."""
    regions: dict[str, Any] | None = None
    """The ellipsoids its certificates claim (:mod:`harness.reports.leaderboard.regions`)."""

    def certified_at(self, radius: float) -> dict[int, bool]:
        """Per input id: certified correctly with radius >= ``radius``."""
        return {i: r is not None and r >= radius for i, r in self.certified.items()}

    @property
    def sound(self) -> bool:
        return self.verdict == SOUND

    @property
    def order_dependent(self) -> bool:
        return self.verdict == ORDER_DEPENDENT


@dataclass
class Table:
    """All rows on one dataset and base model."""

    index: int  # 1-based, in order of first appearance among the runs
    dataset: str
    architecture: str
    recipe_hash: str
    radii: list[float]
    headline_radius: float
    runs: list[StoredRun] = field(default_factory=list)
    sound_rows: list[Row] = field(default_factory=list)
    memory_rows: list[Row] = field(default_factory=list)
    other_rows: list[Row] = field(default_factory=list)
    imported_rows: list[Row] = field(default_factory=list)
    references: dict[str, dict[float, Row | None]] = field(default_factory=dict)
    """Per base model and radius: the best verified-sound constant-σ row of that model
    there, its other rows' reference (:mod:`harness.reports.leaderboard.paired_differences`)."""

    @property
    def rows(self) -> list[Row]:
        return self.sound_rows + self.memory_rows + self.other_rows + self.imported_rows

    @property
    def models(self) -> dict[str, str]:
        """The base models of its runs (recipe hash -> label), in order of first run."""
        return {r.run["recipe_hash"]: model_label(r.config) for r in self.runs if not r.imported}

    @property
    def title(self) -> str:
        """``dataset · architecture · model HASH``, or ``· N base models``."""
        models = self.models or {self.recipe_hash: ""}
        which = (
            f"model {self.recipe_hash[:12]}" if len(models) == 1 else f"{len(models)} base models"
        )
        return f"{self.dataset} · {self.architecture} · {which}"

    @property
    def failures(self) -> list[dict[str, Any]]:
        return [f | {"run_id": run.run_id} for run in self.runs for f in run.failures]

    @property
    def class_names(self) -> list[str]:
        """The dataset's class names as its runs recorded them (empty when none did)."""
        return next((list(r.run["class_names"]) for r in self.runs if r.run.get("class_names")), [])


@dataclass
class Board:
    title: str
    runs: list[StoredRun]
    tables: list[Table]


def headline_radius(config: dict[str, Any], radii: Sequence[float]) -> float:
    """The spec's ``headline_radius`` if present, else the median of ``radii``."""
    value = config.get("headline_radius")
    return float(value) if value is not None else float(radii[len(radii) // 2])


def rank_key(row: Row, radius: float, radii: Sequence[float] = ()) -> tuple:
    """Certified accuracy at ``radius``, then at the other ``radii`` in increasing order
    (all descending), then method, setting and run id."""
    m = row.metrics
    others = [-m[certified_key(r)] for r in sorted(radii) if r != radius]
    return (-m[certified_key(radius)], *others, row.method, row.setting, row.run_id)


def build_board(runs: Sequence[StoredRun]) -> Board:
    """Group ``runs`` into tables, compute every row's metrics and verdict, rank the rows."""
    tables: dict[tuple[str, str, str], Table] = {}
    imported = [run for run in runs if run.imported]
    for run in [r for r in runs if r not in imported] + imported:
        config = run.run["config"]
        key = (config["dataset"]["name"], config["model"]["architecture"], model_family(run))
        if run in imported:  # beside the runs made here on the same dataset
            key = next((k for k in tables if k[0] == key[0]), key)
        radii = benchmark_radii(config)
        table = tables.get(key)
        if table is None:
            table = tables[key] = Table(
                index=len(tables) + 1, dataset=key[0], architecture=key[1],
                recipe_hash=run.run["recipe_hash"],
                radii=radii, headline_radius=headline_radius(config, radii),
            )  # fmt: skip
        else:
            table.radii = sorted(set(table.radii) | set(radii))
        table.runs.append(run)
    for table in tables.values():
        table.radii = sorted({*table.radii, table.headline_radius})
        rows = [row for run in table.runs for row in _rows(run, table.radii)]
        ordered = sorted(rows, key=lambda r: rank_key(r, table.headline_radius, table.radii))
        table.imported_rows = [r for r in ordered if r.verdict == IMPORTED]
        table.sound_rows = [r for r in ordered if r.sound]
        table.memory_rows = [r for r in ordered if r.order_dependent]
        table.other_rows = [
            r for r in ordered if not r.sound and not r.order_dependent and r.verdict != IMPORTED
        ]
        attach_differences(table)
    names = list(dict.fromkeys(run.run["name"] for run in runs))
    return Board(title=", ".join(names), runs=list(runs), tables=list(tables.values()))


def model_family(run: StoredRun) -> str:
    """What the base models of a table share: the run's model recipe without its training σ
    and seed (the recipe hash itself for an imported run or a checkpoint)."""
    model = run.config.get("model", {})
    if run.imported or model.get("checkpoint") is not None:
        return str(run.run["recipe_hash"])
    params = {k: v for k, v in model.get("trainer_params", {}).items() if k != "sigma"}
    return content_hash({**model, "seed": None, "trainer_params": params})


def empirical_metrics(
    attack: dict[str, Any] | None, radii: Sequence[float], correct: Collection[int]
) -> dict[str, Any]:
    """The empirical robust accuracy at each radius (None where the attack did not run)
    and its 95 % intervals; ``correct``: the inputs PREDICT answers right (the others are
    robust at no radius: :func:`~harness.mathematics.accuracy.empirical_successes`)."""
    values: dict[str, Any] = {}
    intervals: dict[str, tuple[float, float]] = {}
    for r in radii:
        k = None if attack is None else empirical_successes(attack, r, correct)
        values[empirical_key(r)] = None if k is None else k / attack["inputs"]  # type: ignore[index]
        if k is not None:
            intervals[empirical_key(r)] = proportion_interval(k, attack["inputs"])  # type: ignore[index]
    return values | {"intervals": intervals}


def _rows(run: StoredRun, radii: Sequence[float]) -> list[Row]:
    """One row per (method, setting); a setting not finished, or failed, is marked and never
    ranked sound."""
    out = []
    failed = {(f["method"], f["setting"]) for f in run.failures}
    for stored in run.rows():
        verdict, order, certs = stored.verdict, stored.order, stored.certificates
        if order is not None:
            certs = at_order(certs, order["worst_order"])
        done = stored.status
        if (stored.method, stored.setting) in failed:
            verdict = f"failed ({len(certs)} inputs certified before), {verdict}"
        elif done is not None and not done.complete:
            verdict = f"incomplete ({done.inputs} of {done.expected or '?'} inputs), {verdict}"
        metrics = row_metrics(certs, radii, run.unknown_metrics)
        attack = None if stored.attack is None else stored.attack.result
        correct = [int(c.input_id) for c in certs if c.predict == c.label]
        empirical = empirical_metrics(attack, radii, correct)
        metrics["intervals"] |= empirical.pop("intervals")
        acr = mean_interval([c.radius if c.correct else 0.0 for c in certs])
        if acr is not None and metrics.get("acr") is not None:
            metrics["intervals"]["acr"] = acr
        out.append(
            Row(
                run_id=run.run_id,
                method=stored.method,
                setting=stored.setting,
                metrics=metrics | empirical,
                verdict=verdict,
                checks=stored.checks,
                correct_radii=sorted(c.radius for c in certs if c.correct),
                applied=stored.applied,
                order=order,
                class_counts=dict(sorted(Counter(int(c.label) for c in certs).items())),
                certified={int(c.input_id): c.radius if c.correct else None for c in certs},
                attack=attack,
                beyond_attack=beyond_attack(certs, attack, correct, radii),
                regions=region_metrics(certs),
                model=str(run.run["recipe_hash"]),
                model_label=model_label(run.config),
            )
        )
    return out


def beyond_attack(
    certs: Sequence[StoredCertificate], attack: dict[str, Any] | None, correct: Collection[int],
    radii: Sequence[float],
) -> dict[float, list[int]]:  # fmt: skip
    """Per radius r the attack ran at: the input ids certified correctly at r or more that it
    does not count robust at r (broken within r, or PREDICT not the label), so that the row
    is certified above its empirical accuracy there; radii without any are left out. On a
    sound row each is a certificate an attack broke, or an input CERTIFY and PREDICT answer
    differently."""
    if attack is None:
        return {}
    right, broken = set(correct), attack["broken"]
    out = {}
    for r in radii:
        if not any(abs(r - a) <= 1e-12 for a in attack["radii"]):
            continue
        found = sorted(int(c.input_id) for c in certs if c.correct and c.radius >= r and (
            int(c.input_id) not in right or broken.get(str(int(c.input_id)), math.inf) <= r + 1e-12))  # fmt: skip
        if found:
            out[r] = found
    return out


def region_metrics(certs: Sequence[StoredCertificate]) -> dict[str, Any] | None:
    """A row's claimed ellipsoids (None where no certificate claims one; shown by
    :mod:`harness.reports.leaderboard.regions`): ``claimed``, the correctly classified
    inputs with one, the ``median`` proxy radius of those, the ``mean`` over all inputs."""
    proxies = [float(c.region["proxy_radius"]) for c in certs
               if c.correct and isinstance(c.region, dict) and "proxy_radius" in c.region]  # fmt: skip
    if not any(c.region for c in certs):
        return None
    return {"claimed": len(proxies), "inputs": len(certs),
            "median": statistics.median(proxies) if proxies else None,
            "mean": sum(proxies) / len(certs) if certs else None}  # fmt: skip


def at_order(certs: Sequence[StoredCertificate], order: dict[str, list]) -> list[StoredCertificate]:
    """Certificates with CERTIFY's prediction and radius as a replayed input order left them;
    a claimed ellipsoid only where the order left the certificate as recorded (a memory
    keeps a region on the certificates it leaves unchanged: docs/soundness.md, S5)."""
    replayed = {
        int(i): (int(p), float(r))
        for i, p, r in zip(order["input_id"], order["prediction"], order["radius"], strict=True)
    }
    out = []
    for c in certs:
        p, r = replayed.get(int(c.input_id), (c.prediction, c.radius))
        region = c.region if (p, r) == (c.prediction, c.radius) else None
        out.append(replace(c, prediction=p, radius=r, region=region))
    return out
