"""The per-radius envelope of a table: at each radius, the best verified-sound row.

No one σ, nor one method, is best at every radius: a constant σ caps the radius it can
certify (Cohen's radius is at most σ·Φ⁻¹(α^(1/n)), 3.81σ at n = 100,000 and α = 0.001),
so a small σ leads near 0 and certifies nothing past its cap. The field reads a table per radius: Cohen et al. (2019,
Table 1) bold the best σ at each radius, Alfarra et al. (2022, Table 1) report the
envelope over σ. So does the board: at each radius of a table, :func:`best_rows` are the
verified-sound rows with the highest certified accuracy there (several on a tie; none
where no sound row certifies any input), bold in the table; :func:`bands` groups
consecutive radii with the same best rows for the headline; :func:`envelope_curve` is the
highest certified accuracy of any sound row at each radius of a fine grid, the plot's
reference line (one row's curve would drop to 0 at its own cap while another sound row
still certifies further out).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.mathematics.accuracy import certified_key

if TYPE_CHECKING:
    from harness.reports.leaderboard.board import Row, Table


def certified_curve(row: Row, grid: Sequence[float]) -> list[float]:
    """The row's certified accuracy at each radius of ``grid``: the fraction of its inputs
    certified correctly with radius >= r."""
    radii, count = row.correct_radii, row.metrics["inputs"]
    return [(len(radii) - bisect.bisect_left(radii, r)) / count for r in grid]


def envelope_curve(rows: Sequence[Row], grid: Sequence[float]) -> list[float] | None:
    """The highest certified accuracy of any of ``rows`` (a table's sound rows) at each
    radius of ``grid``; None without rows."""
    if not rows:
        return None
    curves = [certified_curve(row, grid) for row in rows]
    return [max(values) for values in zip(*curves, strict=True)]


def best_rows(table: Table, radius: float) -> list[Row]:
    """The verified-sound rows of ``table`` with the highest certified accuracy at
    ``radius``, in board order; [] when no sound row certifies an input there."""
    key = certified_key(radius)
    values = [row.metrics.get(key) or 0.0 for row in table.sound_rows]
    top = max(values, default=0.0)
    if top <= 0:
        return []
    return [row for row, value in zip(table.sound_rows, values, strict=True) if value == top]


@dataclass(frozen=True)
class Band:
    """Consecutive radii of a table at which the same rows are best (:func:`best_rows`)."""

    radii: tuple[float, ...]
    rows: tuple[Row, ...]  # () where no sound row certifies an input


def bands(table: Table) -> list[Band]:
    """The table's radii, in order, grouped into :class:`Band` s of the same best rows."""
    out: list[Band] = []
    for radius in table.radii:
        rows = tuple(best_rows(table, radius))
        if out and [id(r) for r in out[-1].rows] == [id(r) for r in rows]:
            out[-1] = Band((*out[-1].radii, radius), rows)
        else:
            out.append(Band((radius,), rows))
    return out
