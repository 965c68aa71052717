"""Each row of a table against the best verified-sound constant-σ row of its own base model,
radius by radius.

The reference of a base model at radius r is its verified-sound row whose σ(x) is one
constant over all its inputs (every certificate records its σ: Cohen et al.'s smoothing
at one σ) with the highest certified accuracy at r, the first in board order on a tie: a
constant σ chosen for that radius, i.e. the per-radius envelope of the model's constant-σ
rows, as a row the others can be paired with. Rows are paired only with rows of the same
model (a row of another model certifies another classifier); a row imported from a
published log is paired with the table's first model. Every other row of the model (sound
or not) gets its certified accuracy at r minus the reference's, on the same inputs, with
Newcombe's 95 % interval
(:func:`harness.mathematics.significance.paired_difference`), read as ``above`` or
``below`` when the interval excludes 0 and ``not separated`` when it contains 0 (which
claims no tie: the interval holds differences of both signs). A table without a sound
constant-σ row has no reference; seeds compared: :mod:`harness.reports.leaderboard.seeds`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.mathematics.accuracy import certified_key
from harness.mathematics.significance import paired_difference

if TYPE_CHECKING:
    from harness.reports.leaderboard.board import Row, Table


def constant_sigma(row: Row) -> bool:
    """Whether the row's σ(x) is the same on every input (its certificates' σ)."""
    low, high = row.metrics.get("sigma_min"), row.metrics.get("sigma_max")
    return low is not None and low == high


def references(table: Table, model: str) -> dict[float, Row | None]:
    """Per radius of ``table``: the reference row of base model ``model`` (module
    docstring), None without one."""
    baselines = [row for row in table.sound_rows if constant_sigma(row) and row.model == model]
    out: dict[float, Row | None] = {}
    for radius in table.radii:
        key = certified_key(radius)
        out[radius] = max(baselines, key=lambda row: row.metrics[key], default=None)
    return out  # max keeps the first of equal rows: board order


def reference_of(table: Table, row: Row) -> dict[float, Row | None]:
    """The references ``row`` is paired with: its model's, or (a row of a model without
    runs of its own here, i.e. imported) the table's first model's."""
    found = table.references.get(row.model)
    if found is None and table.references:
        found = next(iter(table.references.values()))
    return found or {radius: None for radius in table.radii}


def has_reference(table: Table) -> bool:
    """Whether some model of ``table`` has a reference row at some radius."""
    return any(ref is not None for refs in table.references.values() for ref in refs.values())


def attach_differences(table: Table) -> None:
    """Set the table's references and every row's paired differences from them (None
    where the row is the reference, there is none, or the two certified other inputs)."""
    table.references = {model: references(table, model) for model in table.models}
    for row in table.rows:
        row.differences = {}
        for radius, reference in reference_of(table, row).items():
            if reference is None or reference is row:
                row.differences[radius] = None
                continue
            row.differences[radius] = paired_difference(
                row.certified_at(radius), reference.certified_at(radius), radius
            )
