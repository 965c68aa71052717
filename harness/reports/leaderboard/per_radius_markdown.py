"""The per-radius reading of a table in markdown: the headline and the paired differences.

The headline names, band by band of radii, the verified-sound rows with the highest
certified accuracy there (:func:`harness.reports.leaderboard.envelope.bands`), each value
with its 95 % interval, then which verified-sound rows the paired differences put above
the best constant-σ row, at which radius (none, mostly). It names no single winner: the
best row changes with the radius. The differences table holds every row of the table
against that reference at each radius, with Newcombe's interval
(:mod:`harness.reports.leaderboard.paired_differences`); a cell says ``above`` or
``below`` only where its interval excludes 0.
"""

from __future__ import annotations

from harness.mathematics.accuracy import certified_key
from harness.mathematics.significance import CONFIDENCE, PairedDifference
from harness.reports.leaderboard.board import Row, Table
from harness.reports.leaderboard.envelope import Band, bands
from harness.reports.leaderboard.escape import md_code, md_text


def row_name(row: Row) -> str:
    return f"{md_text(row.method)} ({md_text(row.setting)})"


def _names(rows: tuple[Row, ...] | list[Row]) -> str:
    names = [row_name(row) for row in rows]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _radii(radii: tuple[float, ...]) -> str:
    if len(radii) == 1:
        return f"radius {radii[0]:g}"
    return f"radii {radii[0]:g}–{radii[-1]:g}"


def _value(row: Row, radius: float) -> str:
    key = certified_key(radius)
    low, high = row.metrics["intervals"][key]
    return f"{row.metrics[key]:.3f} [{low:.3f}, {high:.3f}]"


def _band(band: Band) -> str:
    if not band.rows:
        return f"- {_radii(band.radii)}: no verified-sound row certifies an input"
    row = band.rows[0]  # the best rows have equal certified accuracy at every radius of the band
    if len(band.radii) == 1:
        values = _value(row, band.radii[0])
    else:
        values = ", ".join(f"{_value(row, r)} at {r:g}" for r in band.radii)
    return f"- {_radii(band.radii)}: {_names(band.rows)}, {values}"


def difference_text(difference: PairedDifference) -> str:
    """``+0.030 [+0.017, +0.049] above`` (no word when the interval contains 0)."""
    text = (f"{difference.difference:+.3f} [{difference.low:+.3f}, "
            f"{difference.high:+.3f}]")  # fmt: skip
    return text if difference.reading == "not separated" else f"{text} {difference.reading}"


def _above(table: Table) -> str:
    """The sentence on the verified-sound rows above the reference at some radius."""
    if not any(table.references.values()):
        return ("No verified-sound row has one σ for every input, so no row is paired with a "
                "constant-σ reference.")  # fmt: skip
    found = []
    for row in table.sound_rows:
        above = [
            (r, d) for r, d in row.differences.items() if d is not None and d.reading == "above"
        ]
        if above:
            at = ", ".join(f"{r:g} ({difference_text(d).removesuffix(' above')})" for r, d in above)
            found.append(f"{row_name(row)} at radius {at}")
    if not found:
        return (f"Paired with the best verified-sound constant-σ row at each radius (differences "
                f"below), no verified-sound row is above it at any radius by its "
                f"{CONFIDENCE:.0%} interval.")  # fmt: skip
    return (f"Paired with the best verified-sound constant-σ row at each radius (differences "
            f"below), above it by its {CONFIDENCE:.0%} interval: " + "; ".join(found) + ".")  # fmt: skip


def headline(table: Table) -> list[str]:
    """The headline of a table: the best verified-sound rows by band of radii."""
    if table.sound_rows:
        return [
            f"**Headline.** The best verified-sound row at each radius, with its "
            f"{CONFIDENCE:.0%} interval (bold in the table below; the grey line of the plot):",
            "",
            *[_band(band) for band in bands(table)],
            "",
            _above(table),
            "",
        ]
    if table.other_rows or table.memory_rows:
        return ["**Headline.** No row is verified sound: no radius of this table has a "
                "certified best, and the rows below claim radii that are not certified.", ""]  # fmt: skip
    return ["**Headline.** No method produced certificates.", ""]


def _reference_line(table: Table) -> str:
    """``radius 0: cohen (sigma=0.12); radii 0.25–0.75: cohen (sigma=0.25)``."""
    groups: list[tuple[list[float], Row]] = []
    for radius, row in table.references.items():
        if row is None:
            continue
        if groups and groups[-1][1] is row:
            groups[-1][0].append(radius)
        else:
            groups.append(([radius], row))
    return "; ".join(f"{_radii(tuple(radii))}: {row_name(row)}" for radii, row in groups)


def differences_table(table: Table) -> list[str]:
    """Every row minus the reference at each radius, with Newcombe's interval; [] without
    a reference."""
    if not any(table.references.values()):
        return []
    with_run = len(table.runs) > 1
    radii = list(table.references)
    head = [*(["run"] if with_run else []), "method", "setting",
            *[md_text(f"Δ@{r:g}") for r in radii], "verdict"]  # fmt: skip
    align = [*([":--"] if with_run else []), ":--", ":--", *["--:" for _ in radii], ":--"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    for row in table.rows:
        cells = []
        for radius in radii:
            difference = row.differences.get(radius)
            if table.references[radius] is row:
                cells.append("reference")
            elif difference is None:
                cells.append("not paired" if table.references[radius] is not None else "–")
            else:
                cells.append(difference_text(difference))
        lines.append("| " + " | ".join([*([md_code(row.run_id[:12])] if with_run else []),
                                         md_text(row.method), md_text(row.setting), *cells,
                                         md_text(row.verdict)]) + " |")  # fmt: skip
    return [
        "### Paired differences from the best constant-σ row",
        "",
        "At each radius, each row's certified accuracy minus the reference's on the same "
        f"inputs, with its {CONFIDENCE:.0%} interval (Newcombe's hybrid score interval for "
        "paired proportions). The reference: the verified-sound row of one σ for every input "
        f"with the highest certified accuracy at that radius ({_reference_line(table)}). "
        "`above`, `below`: the interval excludes 0; no word: it contains 0, and the two rows "
        "are not separated at this number of inputs (which is not a tie: the interval holds "
        "differences of both signs).",
        "",
        *lines,
        "",
    ]
