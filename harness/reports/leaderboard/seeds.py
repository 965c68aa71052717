"""Rows over training seeds: a method's numbers as a mean over base models trained with
different seeds, their spread, and whether its difference from the constant-σ reference
holds on every seed.

The spread of certified accuracy across training seeds can exceed the gains papers report
(arXiv 2601.13303, "On the Extreme Variance of Certified Local Robustness Across Model
Seeds"), and the input-level interval of one row says nothing of it. A table whose runs
certify the same (method, setting) on k >= 2 base models that differ only in their
training seed (``[model] seeds``: :mod:`harness.running.model_variants`) therefore gets,
per such group and radius r:

- the mean over seeds of the certified accuracy (and of the clean accuracy), its range
  over seeds and the seed-level 95 % Student t interval of the mean, with k − 1 degrees
  of freedom (:func:`harness.mathematics.significance.mean_interval`): the interval of
  what another seed would give on average, which holds the training's variation beside
  each row's input-level Clopper–Pearson interval;
- on each seed, the paired difference from the reference of that seed's model
  (:mod:`harness.reports.leaderboard.paired_differences`, Newcombe's interval), read
  across seeds by an intersection–union test (Berger 1982, "Multiparameter hypothesis
  testing and acceptance sampling", Technometrics 24): "above on every seed" when every
  seed's interval lies above 0, which as a test of "above on every seed" has level 5 %
  (each seed's test does), "below on every seed" likewise, and otherwise "not separated
  across seeds". A method is better than the reference across seeds only when it is
  above on every seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.mathematics.accuracy import certified_key
from harness.mathematics.significance import CONFIDENCE, mean_interval
from harness.reports.leaderboard.board import Row, Table
from harness.reports.leaderboard.escape import md_text

ABOVE, BELOW, NOT_SEPARATED = "above on every seed", "below on every seed", "not separated"


@dataclass
class SeedGroup:
    """One (method, setting, training σ) certified on base models of several seeds."""

    method: str
    setting: str
    training_sigma: float | None
    rows: list[Row] = field(default_factory=list)  # one per seed, in seed order
    seeds: list[int] = field(default_factory=list)

    def values(self, key: str) -> list[float]:
        return [row.metrics[key] for row in self.rows]

    def reading(self, radius: float) -> str | None:
        """The intersection–union reading of the per-seed differences at ``radius`` (None
        where some seed's row is not paired there)."""
        differences = [row.differences.get(radius) for row in self.rows]
        if any(d is None for d in differences):
            return None
        if all(d.low > 0 for d in differences):  # type: ignore[union-attr]
            return ABOVE
        if all(d.high < 0 for d in differences):  # type: ignore[union-attr]
            return BELOW
        return NOT_SEPARATED


def seed_groups(table: Table) -> list[SeedGroup]:
    """The groups of ``table``'s rows that differ only in the training seed of their base
    model, those with at least two seeds, in board order of their first row."""
    models = {run.run_id: run.config.get("model") or {} for run in table.runs if not run.imported}
    groups: dict[tuple, SeedGroup] = {}
    for row in table.rows:
        model = models.get(row.run_id)
        if model is None:
            continue
        sigma = (model.get("trainer_params") or {}).get("sigma")
        key = (row.method, row.setting, sigma)
        group = groups.setdefault(key, SeedGroup(row.method, row.setting, sigma))
        group.rows.append(row)
        group.seeds.append(int(model.get("seed", 0)))
    out = []
    for group in groups.values():
        if len(set(group.seeds)) < 2:
            continue
        order = sorted(range(len(group.seeds)), key=lambda k: group.seeds[k])
        group.rows = [group.rows[k] for k in order]
        group.seeds = [group.seeds[k] for k in order]
        out.append(group)
    return out


def _mean_cell(values: list[float]) -> str:
    """``0.612 [0.580, 0.644] (0.600–0.630)``: mean, seed-level interval, range."""
    mean = sum(values) / len(values)
    low, high = mean_interval(values) or (mean, mean)
    high = min(high, 1.0)  # (an accuracy)
    return f"{mean:.3f} [{low:.3f}, {high:.3f}] ({min(values):.3f}–{max(values):.3f})"


def _verdicts(group: SeedGroup) -> str:
    """``sound on 3 of 3 seeds``, or each seed's verdict where they differ."""
    verdicts = [row.verdict for row in group.rows]
    if len(set(verdicts)) == 1:
        return f"{verdicts[0]} on {len(verdicts)} of {len(verdicts)} seeds"
    return "; ".join(f"seed {s}: {v}" for s, v in zip(group.seeds, verdicts, strict=True))


def seeds_record(group: SeedGroup, table: Table) -> dict:
    """A group as the board's JSON holds it: per metric the mean, the seed-level interval
    and the range; per radius the reading across seeds."""
    keys = ["clean_accuracy", *[certified_key(r) for r in table.radii]]
    record: dict = {"method": group.method, "setting": group.setting,
                    "training_sigma": group.training_sigma, "seeds": group.seeds,
                    "runs": [row.run_id for row in group.rows], "metrics": {}}  # fmt: skip
    for key in keys:
        values = group.values(key)
        low, high = mean_interval(values) or (None, None)
        record["metrics"][key] = {"mean": sum(values) / len(values), "interval": [low, high],
                                  "range": [min(values), max(values)]}  # fmt: skip
    record["across_seeds"] = {f"{r:g}": group.reading(r) for r in table.radii}
    return record


def seeds_section(table: Table) -> list[str]:
    """The markdown of the rows over training seeds ([] when no row has two seeds)."""
    groups = seed_groups(table)
    if not groups:
        return []
    keys = ["clean_accuracy", *[certified_key(r) for r in table.radii]]
    headers = ["clean acc", *[f"cert@{r:g}" for r in table.radii]]
    head = ["method", "setting", "training σ", "seeds", "verdicts", *map(md_text, headers)]
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join([":--"] * 5 + ["--:"] * len(keys)) + "|",
    ]
    for g in groups:
        sigma = "–" if g.training_sigma is None else f"{g.training_sigma:g}"
        cells = [md_text(g.method), md_text(g.setting), sigma,
                 ", ".join(map(str, g.seeds)), md_text(_verdicts(g)),
                 *[_mean_cell(g.values(key)) for key in keys]]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    differences = ["| " + " | ".join(["method", "setting", "training σ",
                                      *[md_text(f"Δ@{r:g}") for r in table.radii]]) + " |",
                   "|" + "|".join([":--"] * 3 + ["--:"] * len(table.radii)) + "|"]  # fmt: skip
    for g in groups:
        sigma = "–" if g.training_sigma is None else f"{g.training_sigma:g}"
        cells = []
        for radius in table.radii:
            reading = g.reading(radius)
            if reading is None:
                cells.append("–")
                continue
            mean = sum(d.difference for d in (r.differences[radius] for r in g.rows)) / len(g.rows)
            cells.append(f"{mean:+.3f} {reading}")
        differences.append("| " + " | ".join([md_text(g.method), md_text(g.setting), sigma,
                                              *cells]) + " |")  # fmt: skip
    return [
        "### Over training seeds",
        "",
        "The rows certified on base models that differ only in their training seed, as a mean "
        f"over the seeds with its seed-level {CONFIDENCE:.0%} Student t interval and, in "
        "parentheses, the range over seeds: another seed moves a number by as much as the "
        "range (each row's own interval above counts the test inputs only).",
        "",
        *lines,
        "",
        "Against the best verified-sound constant-σ row of each seed's own model: the mean "
        "difference over seeds, `above on every seed` (or `below`) when the paired "
        f"difference's {CONFIDENCE:.0%} interval excludes 0 on every seed (an "
        'intersection–union test, of level 5 % for "on every seed"), `not separated` '
        "otherwise; `–` where some seed's row is the reference or has none.",
        "",
        *differences,
        "",
    ]
