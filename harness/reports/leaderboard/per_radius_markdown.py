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

from collections.abc import Callable

from harness.mathematics.accuracy import certified_key
from harness.mathematics.significance import CONFIDENCE, PairedDifference
from harness.reports.leaderboard.board import Row, Table
from harness.reports.leaderboard.envelope import Band, bands
from harness.reports.leaderboard.escape import md_code, md_text
from harness.reports.leaderboard.paired_differences import has_reference, reference_of


def own_model(table: Table) -> str:
    """`` on the same base model`` where ``table`` has several, else nothing."""
    return ", on the row's own base model" if len(table.models) > 1 else ""


def row_name(row: Row, table: Table | None = None) -> str:
    """``method (setting)``, with the row's base model where ``table`` has several."""
    model = f"; {md_text(row.model_label)}" if table is not None and len(table.models) > 1 else ""
    return f"{md_text(row.method)} ({md_text(row.setting)}{model})"


def _names(rows: tuple[Row, ...] | list[Row], table: Table) -> str:
    names = [row_name(row, table) for row in rows]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _radii(radii: tuple[float, ...]) -> str:
    if len(radii) == 1:
        return f"radius {radii[0]:g}"
    return f"radii {radii[0]:g}–{radii[-1]:g}"


def _value(row: Row, radius: float) -> str:
    key = certified_key(radius)
    low, high = row.metrics["intervals"][key]
    return f"{row.metrics[key]:.3f} [{low:.3f}, {high:.3f}]"


def _band(band: Band, table: Table) -> str:
    if not band.rows:
        return f"- {_radii(band.radii)}: no verified-sound row certifies an input"
    row = band.rows[0]  # the best rows have equal certified accuracy at every radius of the band
    if len(band.radii) == 1:
        values = _value(row, band.radii[0])
    else:
        values = ", ".join(f"{_value(row, r)} at {r:g}" for r in band.radii)
    return f"- {_radii(band.radii)}: {_names(band.rows, table)}, {values}"


def difference_text(difference: PairedDifference) -> str:
    """``+0.030 [+0.017, +0.049] above`` (no word when the interval contains 0)."""
    text = (f"{difference.difference:+.3f} [{difference.low:+.3f}, "
            f"{difference.high:+.3f}]")  # fmt: skip
    return text if difference.reading == "not separated" else f"{text} {difference.reading}"


def _above(table: Table) -> str:
    """The sentence on the verified-sound rows above the reference at some radius."""
    if not has_reference(table):
        return ("No verified-sound row has one σ for every input, so no row is paired with a "
                "constant-σ reference.")  # fmt: skip
    found = []
    for row in table.sound_rows:
        above = [
            (r, d) for r, d in row.differences.items() if d is not None and d.reading == "above"
        ]
        if above:
            at = ", ".join(f"{r:g} ({difference_text(d).removesuffix(' above')})" for r, d in above)
            found.append(f"{row_name(row, table)} at radius {at}")
    own = " of its own base model" if len(table.models) > 1 else ""
    if not found:
        return (f"Paired with the best verified-sound constant-σ row{own} at each radius (differences "
                f"below), no verified-sound row is above it at any radius by its "
                f"{CONFIDENCE:.0%} interval.")  # fmt: skip
    return (f"Paired with the best verified-sound constant-σ row{own} at each radius (differences "
            f"below), above it by its {CONFIDENCE:.0%} interval: " + "; ".join(found) + ".")  # fmt: skip


def headline(table: Table) -> list[str]:
    """The headline of a table: the best verified-sound rows by band of radii."""
    if table.sound_rows:
        return [
            f"**Headline.** The best verified-sound row at each radius, with its "
            f"{CONFIDENCE:.0%} interval (bold in the table below; the grey line of the plot):",
            "",
            *[_band(band, table) for band in bands(table)],
            "",
            _above(table),
            "",
        ]
    if table.other_rows or table.memory_rows:
        return ["**Headline.** No row is verified sound: no radius of this table has a "
                "certified best, and the rows below claim radii that are not certified.", ""]  # fmt: skip
    return ["**Headline.** No method produced certificates.", ""]


def _reference_line(table: Table) -> str:
    """``radius 0: cohen (sigma=0.12); radii 0.25–0.75: cohen (sigma=0.25)``, per base model
    where the table has several."""
    lines = []
    for model, references in table.references.items():
        groups: list[tuple[list[float], Row]] = []
        for radius, row in references.items():
            if row is None:
                continue
            if groups and groups[-1][1] is row:
                groups[-1][0].append(radius)
            else:
                groups.append(([radius], row))
        line = "; ".join(f"{_radii(tuple(radii))}: {row_name(row)}" for radii, row in groups)
        if len(table.models) > 1:
            line = f"model {md_text(table.models[model])}: {line or 'none'}"
        lines.append(line)
    return "; ".join(lines)


def identity_columns(table: Table) -> tuple[list[str], Callable[[Row], list[str]]]:
    """The columns that name a row of ``table``: its base model where the table has several,
    else its run where it has several, then method and setting; and a row's cells."""
    if len(table.models) > 1:
        return ["model", "method", "setting"], lambda row: [
            md_text(row.model_label or "imported"), md_text(row.method), md_text(row.setting)]  # fmt: skip
    if len(table.runs) > 1:
        return ["run", "method", "setting"], lambda row: [
            md_code(row.run_id[:12]), md_text(row.method), md_text(row.setting)]  # fmt: skip
    return ["method", "setting"], lambda row: [md_text(row.method), md_text(row.setting)]


def differences_table(table: Table) -> list[str]:
    """Every row minus its model's reference at each radius, with Newcombe's interval; []
    without a reference."""
    if not has_reference(table):
        return []
    radii = table.radii
    names, identity = identity_columns(table)
    head = [*names, *[md_text(f"Δ@{r:g}") for r in radii], "verdict"]
    align = [*[":--" for _ in names], *["--:" for _ in radii], ":--"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    for row in table.rows:
        cells = []
        references = reference_of(table, row)
        for radius in radii:
            difference = row.differences.get(radius)
            if references.get(radius) is row:
                cells.append("reference")
            elif difference is None:
                cells.append("not paired" if references.get(radius) is not None else "–")
            else:
                cells.append(difference_text(difference))
        lines.append("| " + " | ".join([*identity(row), *cells, md_text(row.verdict)]) + " |")
    return [
        "### Paired differences from the best constant-σ row",
        "",
        "At each radius, each row's certified accuracy minus the reference's on the same "
        f"inputs, with its {CONFIDENCE:.0%} interval (Newcombe's hybrid score interval for "
        "paired proportions). The reference: the verified-sound row of one σ for every input "
        f"with the highest certified accuracy at that radius{own_model(table)} "
        f"({_reference_line(table)}). "
        "`above`, `below`: the interval excludes 0; no word: it contains 0, and the two rows "
        "are not separated at this number of inputs (which is not a tie: the interval holds "
        "differences of both signs).",
        "",
        *lines,
        "",
    ]
