"""The PNG plots of a leaderboard table (matplotlib, Agg canvas, no pyplot state).

- certified accuracy vs radius: for every row, the fraction of inputs certified
  correctly with radius >= r, on a grid of r from 0 to just past the largest radius.
  Each method has a colour family (blues, oranges, greens, ...) and a line style of its
  own, so two methods whose curves coincide stay apart; its settings are shades of that
  family, light to dark in order of mean σ, with a marker each. Verified-sound rows are drawn full, the
  others thinner and lighter and marked "not certified". The legend lists the rows by
  method and σ beside the axes, in columns below them when there are many. Where the
  empirical attack ran, the row's empirical robust accuracy at the attacked radii is a
  thin dotted line with crosses in the row's colour (an upper bound: the certified curve
  should lie below it);
- class-wise accuracy: a heat map of PREDICT's accuracy per class (columns, named by
  the dataset's class names with the number of inputs of each) for every row
  (Mohapatra et al. 2021, §3.2).

Plugin text is drawn with mathtext off, so a ``$`` in a name is just a dollar sign.
The PNG metadata carries no software version or date: same data, same matplotlib,
same bytes.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from harness.mathematics.accuracy import empirical_key
from harness.reports.leaderboard.board import Row, Table
from harness.reports.leaderboard.escape import flatten

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_RC = {"text.parse_math": False, "text.usetex": False, "font.size": 9}
_PNG_METADATA = {"Software": None}
FAMILIES = ("Blues", "Oranges", "Greens", "Reds", "Purples", "Greys", "YlOrBr", "PuRd", "BuGn",
            "RdPu")  # fmt: skip
"""Sequential colour maps, one per method, in the table's order (best-ranked first)."""
LINE_STYLES = ((0, ()), (0, (6, 2)), (0, (1, 1.5)), (0, (6, 2, 1, 2)), (0, (3, 1)),
               (0, (6, 1.5, 1, 1.5, 1, 1.5)))  # fmt: skip
"""Solid, dashed, dotted, dash-dot, ...: one per method, cycled."""
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
"""Markers of a method's settings in order of mean σ (sparse along each curve)."""
LEGEND_BESIDE = 12
"""Legends of up to this many rows go beside the axes; longer ones below, in columns."""


def certified_plot_name(stem: str, table: Table) -> str:
    return f"{stem}-{table.index}-certified-accuracy.png"


def classwise_plot_name(stem: str, table: Table) -> str:
    return f"{stem}-{table.index}-classwise-accuracy.png"


def row_label(row: Row, with_run: bool) -> str:
    label = flatten(f"{row.method} ({row.setting})")
    if with_run:
        label += f" [{row.run_id[:8]}]"
    return label if row.sound else label + " (not certified)"


def _curve(row: Row, grid: list[float]) -> list[float]:
    radii, count = row.correct_radii, row.metrics["inputs"]
    return [(len(radii) - bisect.bisect_left(radii, r)) / count for r in grid]


def line_styles(rows: Sequence[Row]) -> dict[int, tuple[tuple, object, str]]:
    """For each row (by position): (colour, line style, marker). A method's rows share a
    colour map and a line style (the first families and styles, the clearest, go to the
    methods of the best-ranked rows); by mean σ, their shades go from light to dark and
    their markers through :data:`MARKERS`."""
    import matplotlib

    methods = list(dict.fromkeys(row.method for row in rows))
    out = {}
    for k, method in enumerate(methods):
        cmap = matplotlib.colormaps[FAMILIES[k % len(FAMILIES)]]
        mine = sorted(
            (i for i, row in enumerate(rows) if row.method == method),
            key=lambda i: (rows[i].metrics["mean_sigma"], rows[i].setting, rows[i].run_id),
        )
        for j, i in enumerate(mine):
            shade = 0.8 if len(mine) == 1 else 0.45 + 0.55 * j / (len(mine) - 1)
            out[i] = (cmap(shade), LINE_STYLES[k % len(LINE_STYLES)], MARKERS[j % len(MARKERS)])
    return out


def _attack_curve(row: Row, radii: list[float]) -> list[tuple[float, float]]:
    """(radius, empirical robust accuracy) at the radii the attack ran."""
    return [(r, row.metrics[empirical_key(r)]) for r in radii
            if row.metrics.get(empirical_key(r)) is not None]  # fmt: skip


def write_certified_plot(table: Table, path: Path, title: str) -> None:
    """Certified accuracy vs radius of every row of ``table``, as a PNG at ``path``."""
    import matplotlib

    with matplotlib.rc_context(_RC):
        certified_figure(table, title).savefig(path, format="png", metadata=_PNG_METADATA)


def certified_figure(table: Table, title: str) -> Figure:
    """The figure of :func:`write_certified_plot`."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = table.rows
    top = max([*table.radii, *(r for row in rows for r in row.correct_radii[-1:])], default=1.0)
    top = top * 1.05 if top > 0 else 1.0
    grid = [top * i / 400 for i in range(401)]
    with_run = len(table.runs) > 1
    styles = line_styles(rows)
    order = sorted(range(len(rows)), key=lambda i: (rows[i].method, rows[i].metrics["mean_sigma"],
                                                    rows[i].setting, rows[i].run_id))  # fmt: skip
    beside = len(rows) <= LEGEND_BESIDE
    labels = [row_label(row, with_run) for row in rows]
    longest = max(map(len, labels), default=0)
    columns = 1 if beside else max(1, min(3, int(110 // max(longest, 1))))
    below = 0 if beside else 0.2 * -(-len(rows) // columns) + 0.4
    width = 6.5 + (0.055 * longest + 0.5 if beside else 0)
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(max(width, 7.5), 4.8 + below), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for n, i in enumerate(order):
            row, (color, style, marker) = rows[i], styles[i]
            curve = _curve(row, grid)
            marks = [k for k in range(7 * n % 40, len(grid), 40) if curve[k] > 0]
            ax.step(grid, curve, where="post", color=color, linestyle=style,
                    linewidth=1.8 if row.sound else 1.2, alpha=1.0 if row.sound else 0.8,
                    marker=marker, markersize=3.5, markevery=marks,
                    label=labels[i])  # fmt: skip
            attacked = _attack_curve(row, table.radii)
            if attacked:
                ax.plot(*zip(*attacked, strict=True), color=color, linestyle=(0, (1, 1.5)),
                        linewidth=1.0, marker="x", markersize=4,
                        label=labels[i] + " · attack (upper bound)")  # fmt: skip
        ax.set_xlim(0, top)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("radius (ℓ2)")
        attacked = any(_attack_curve(row, table.radii) for row in rows)
        ax.set_ylabel(
            "certified (—) and empirical (··) accuracy" if attacked else "certified accuracy"
        )
        ax.set_title(flatten(f"certified accuracy · {title}"))
        ax.grid(alpha=0.3)
        if rows and beside:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False,
                      handlelength=3.5)  # fmt: skip
        elif rows:
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize=7, frameon=False,
                      ncols=columns, handlelength=3.5)  # fmt: skip
        fig.tight_layout()
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
    with_run = len(table.runs) > 1
    with matplotlib.rc_context(_RC):
        labels = [row_label(row, with_run) for row in rows]
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
