"""The PNG plots of a leaderboard table (matplotlib, Agg canvas, no pyplot state).

- certified accuracy vs radius, as small multiples in the style of the field's figures
  (Cohen et al. 2019, Fig. 7; Súkeník et al. 2022, Fig. 4): one panel per method with its
  settings together, at most :data:`PER_PANEL` curves per panel (a method with more
  settings gets more panels), all panels on the same axes. A curve is the fraction of
  inputs certified correctly with radius >= r, on a grid of r from 0 to just past the
  largest radius. A panel's curves go through an ordered colour map (:data:`SETTINGS`)
  by mean σ, with a marker each; the parameters its settings share are in its title,
  the others in its legend; rows not verified sound are thinner and lighter, their
  verdict in the legend. The envelope of the table's verified-sound rows (at each
  radius, the highest certified accuracy of any of them:
  :func:`harness.reports.leaderboard.envelope.envelope_curve`) is drawn on every panel
  as a broad grey reference line under the curves. Where the empirical attack ran
  and its robust accuracy differs from the certified accuracy at some attacked radius,
  it is a dashed line with crosses in the row's colour (an upper bound: the certified
  curve should lie below it);
- class-wise accuracy: a heat map of PREDICT's accuracy per class (columns, named by
  the dataset's class names with the number of inputs of each) for every row
  (Mohapatra et al. 2021, §3.2).

Plugin text is drawn with mathtext off, so a ``$`` in a name is just a dollar sign.
The PNG metadata carries no software version or date: same data, same matplotlib,
same bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from harness.mathematics.accuracy import certified_key, empirical_key
from harness.reports.leaderboard.board import Row, Table
from harness.reports.leaderboard.envelope import certified_curve, envelope_curve
from harness.reports.leaderboard.escape import flatten

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_RC = {"text.parse_math": False, "text.usetex": False, "font.size": 9}
_PNG_METADATA = {"Software": None}
SETTINGS = "viridis"
"""The ordered colour map of a panel's settings (by mean σ), sampled in [0, 0.85]: every
colour distinct from its neighbours and readable on white."""
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
"""Markers of a method's settings in order of mean σ (sparse along each curve)."""
PER_PANEL = 6
"""The most curves (rows) in one panel."""
COLUMNS = 3
"""Panels per line of the figure."""
REFERENCE = "#9a9a9a"
"""The colour of the reference line: the envelope of the sound rows."""
REFERENCE_LABEL = "best verified-sound row at each radius (envelope over methods and σ)"
ATTACK_STYLE = (0, (4, 2))
"""The attack's curves: dashed, in the row's colour, with crosses at the attacked radii."""
ATTACK_VISIBLE = 0.005
"""An attack curve is drawn where it differs from the certified one by more than this at
some attacked radius (closer, the two lines would be one)."""


def certified_plot_name(stem: str, table: Table) -> str:
    return f"{stem}-{table.index}-certified-accuracy.png"


def classwise_plot_name(stem: str, table: Table) -> str:
    return f"{stem}-{table.index}-classwise-accuracy.png"


def which(table: Table) -> Callable[[Row], str]:
    """What tells a row's curve from another of the same setting: its base model's training
    σ and seed where ``table`` has several models, else its run where it has several runs."""
    if len(table.models) > 1:
        return lambda row: flatten(row.model_label)
    if len(table.runs) > 1:
        return lambda row: row.run_id[:8]
    return lambda row: ""


def row_label(row: Row, model: Callable[[Row], str]) -> str:
    label = flatten(f"{row.method} ({row.setting})")
    if model(row):
        label += f" [{model(row)}]"
    return label if row.sound else label + " (not certified)"


def _parts(setting: str) -> list[str] | None:
    """``["rate=0.03", "sigma=0.8"]`` of a canonical setting key; None if it does not split."""
    parts = setting.split(",")
    return parts if all(p.count("=") == 1 for p in parts) else None


def _panel_labels(rows: Sequence[Row], model: Callable[[Row], str]) -> tuple[str, list[str]]:
    """The parameters ``rows`` (one panel's, several) share, and each row's legend entry:
    its other parameters (its model or run, its verdict when not sound)."""
    split = [_parts(row.setting) for row in rows]
    common: list[str] = []
    if len(rows) > 1 and None not in split:
        common = [p for p in split[0] if all(p in parts for parts in split)]
    labels = []
    for row, parts in zip(rows, split, strict=True):
        label = ",".join(p for p in parts if p not in common) if common else row.setting
        if not label and model(row):  # the setting is the panel's: the model tells them apart
            label = model(row)
        else:
            label = flatten(label or row.setting) + (f" [{model(row)}]" if model(row) else "")
        labels.append(label if row.sound else f"{label} · {flatten(row.verdict)}")
    return flatten(", ".join(common)), labels


def _by_sigma(rows: Sequence[Row], indices: Sequence[int]) -> list[int]:
    return sorted(indices, key=lambda i: (rows[i].metrics["mean_sigma"], rows[i].setting,
                                          rows[i].run_id))  # fmt: skip


def line_styles(rows: Sequence[Row]) -> list[tuple[tuple, str]]:
    """(colour, marker) of each of one panel's ``rows``, given in order of mean σ: the
    colours through :data:`SETTINGS` from dark to light, the markers through
    :data:`MARKERS`."""
    import matplotlib

    cmap = matplotlib.colormaps[SETTINGS]
    count = len(rows)
    return [(cmap(0.3 if count == 1 else 0.85 * j / (count - 1)), MARKERS[j % len(MARKERS)])
            for j in range(count)]  # fmt: skip


def panels(rows: Sequence[Row]) -> list[tuple[str, list[int]]]:
    """(title, row positions) of each panel: one per method in the table's order (its
    best-ranked row first), its rows by mean σ, split into panels of at most
    :data:`PER_PANEL` (titled ``method (1/2)``, ...)."""
    out = []
    for method in dict.fromkeys(row.method for row in rows):
        mine = _by_sigma(rows, [i for i, row in enumerate(rows) if row.method == method])
        chunks = [mine[k : k + PER_PANEL] for k in range(0, len(mine), PER_PANEL)]
        for c, chunk in enumerate(chunks, 1):
            title = flatten(method) + (f" ({c}/{len(chunks)})" if len(chunks) > 1 else "")
            out.append((title, chunk))
    return out


def _attack_curve(row: Row, radii: list[float]) -> list[tuple[float, float]]:
    """(radius, empirical robust accuracy) at the radii the attack ran."""
    return [(r, row.metrics[empirical_key(r)]) for r in radii
            if row.metrics.get(empirical_key(r)) is not None]  # fmt: skip


def visible_attack(row: Row, radii: list[float]) -> list[tuple[float, float]]:
    """The row's attack curve if it can be told apart from its certified curve (it
    differs by more than :data:`ATTACK_VISIBLE` at some attacked radius), else []."""
    attacked = _attack_curve(row, radii)
    certified = {r: row.metrics.get(certified_key(r)) for r, _ in attacked}
    if any(certified[r] is None or abs(v - certified[r]) > ATTACK_VISIBLE for r, v in attacked):
        return attacked
    return []


def write_certified_plot(table: Table, path: Path, title: str) -> None:
    """Certified accuracy vs radius of every row of ``table``, as a PNG at ``path``."""
    import matplotlib

    with matplotlib.rc_context(_RC):
        certified_figure(table, title).savefig(path, format="png", metadata=_PNG_METADATA)


def certified_figure(table: Table, title: str) -> Figure:
    """The figure of :func:`write_certified_plot`: one panel per method (:func:`panels`)."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    rows = table.rows
    top = max([*table.radii, *(r for row in rows for r in row.correct_radii[-1:])], default=1.0)
    top = top * 1.05 if top > 0 else 1.0
    grid = [top * i / 400 for i in range(401)]
    model = which(table)
    layout = panels(rows)
    reference = envelope_curve(table.sound_rows, grid)
    columns = max(1, min(COLUMNS, len(layout)))
    lines = max(1, -(-len(layout) // columns))
    any_attack = any(visible_attack(row, table.radii) for row in rows)
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(max(0.4 + 3.4 * columns, 7.2), 1.1 + 2.7 * lines), dpi=100)
        FigureCanvasAgg(fig)
        axes = fig.subplots(lines, columns, sharex=True, sharey=True, squeeze=False)
        for k, ax in enumerate(axes.flat):
            if k >= len(layout):
                ax.set_visible(False)
                continue
            panel_title, members = layout[k]
            shared, labels = _panel_labels([rows[i] for i in members], model)
            styles = line_styles([rows[i] for i in members])
            if reference is not None:
                ax.plot(grid, reference, color=REFERENCE, linewidth=4.5, alpha=0.45,
                        solid_capstyle="butt", zorder=1)  # fmt: skip
            for n, i in enumerate(members):
                row, (color, marker) = rows[i], styles[n]
                curve = certified_curve(row, grid)
                marks = [j for j in range(9 * n % 40, len(grid), 40) if curve[j] > 0]
                ax.step(grid, curve, where="post", color=color,
                        linewidth=1.6 if row.sound else 1.0, alpha=1.0 if row.sound else 0.75,
                        marker=marker, markersize=3.5, markevery=marks, zorder=3,
                        label=labels[n])  # fmt: skip
                attacked = visible_attack(row, table.radii)
                if attacked:
                    ax.plot(*zip(*attacked, strict=True), color=color, linestyle=ATTACK_STYLE,
                            linewidth=0.9, marker="x", markersize=3.5, zorder=2)  # fmt: skip
            ax.set_title(panel_title + (f" · {shared}" if shared else ""), fontsize=9)
            ax.set_xlim(0, top)
            ax.set_ylim(0, 1.02)
            ax.grid(alpha=0.3)
            ax.legend(loc="upper right", fontsize=6.5, frameon=False, handlelength=2.2)
            if k % columns == 0:
                ax.set_ylabel("certified accuracy")
            if k + columns >= len(layout):
                ax.set_xlabel("radius (ℓ2)")
                ax.tick_params(labelbottom=True)
        key = []
        if reference is not None:
            key.append(Line2D([], [], color=REFERENCE, linewidth=4.5, alpha=0.45,
                              label=REFERENCE_LABEL))  # fmt: skip
        if any_attack:
            key.append(Line2D([], [], color="black", linestyle=ATTACK_STYLE, linewidth=0.9,
                              marker="x", markersize=3.5,
                              label="attack: empirical robust accuracy (an upper bound)"))  # fmt: skip
        if key:
            fig.legend(handles=key, loc="lower center", ncols=len(key), fontsize=7,
                       frameon=False)  # fmt: skip
        fig.suptitle(flatten(f"certified accuracy · {title}"))
        fig.tight_layout(rect=(0, 0.05 if key else 0, 1, 1))
    return fig


def class_labels(table: Table, names: Sequence[str], classes: Sequence[int]) -> list[str]:
    """Each class's name (its index when ``names`` lacks it) and its number of inputs
    (a range when the rows certified different numbers)."""
    out = []
    for c in classes:
        counts = sorted({row.class_counts.get(c, 0) for row in table.rows})
        count = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
        name = flatten(names[c]) if 0 <= c < len(names) else str(c)
        out.append(f"{name}\n{count} inputs")
    return out


def write_classwise_plot(
    table: Table, path: Path, title: str, class_names: Sequence[str] = ()
) -> None:
    """Heat map of per-class clean accuracy, one line per row of ``table``; columns are
    named by ``class_names`` (the dataset's, by label) with their number of inputs."""
    import matplotlib

    with matplotlib.rc_context(_RC):
        fig = classwise_figure(table, title, class_names)
        fig.savefig(path, format="png", metadata=_PNG_METADATA)


def classwise_figure(table: Table, title: str, class_names: Sequence[str] = ()) -> Figure:
    """The figure of :func:`write_classwise_plot`."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = table.rows
    classes = sorted({c for row in rows for c in row.metrics["classwise_accuracy"]})
    values = [[row.metrics["classwise_accuracy"].get(c, float("nan")) for c in classes]
              for row in rows]  # fmt: skip
    model = which(table)
    with matplotlib.rc_context(_RC):
        labels = [row_label(row, model) for row in rows]
        ticks = class_labels(table, class_names, classes)
        column = max(0.55, 0.062 * max((len(t.split("\n")[0]) for t in ticks), default=0))
        width = 2.5 + column * max(len(classes), 2) + 0.065 * max(map(len, labels), default=0)
        fig = Figure(figsize=(max(width, 6.0), 2.0 + 0.32 * max(len(rows), 1)), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        if rows and classes:
            image = ax.imshow(values, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
            for i, line in enumerate(values):
                for j, value in enumerate(line):
                    if value == value:  # not NaN
                        ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7,
                                color="black" if value > 0.6 else "white")  # fmt: skip
            fig.colorbar(image, ax=ax, label="clean accuracy")
        ax.set_xticks(range(len(classes)), ticks, fontsize=7)
        ax.set_yticks(range(len(rows)), labels)
        ax.set_xlabel("class (inputs certified)")
        fig.suptitle(flatten(f"class-wise clean accuracy · {title}"))
        fig.tight_layout()
    return fig
