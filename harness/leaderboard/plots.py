"""The PNG plots of a leaderboard table (matplotlib, Agg canvas, no pyplot state).

- certified accuracy vs radius: for every row, the fraction of inputs certified
  correctly with radius >= r, on a grid of r from 0 to just past the largest radius;
  verified-sound rows solid, the others dashed and marked "not certified"; where the
  empirical attack ran, the row's empirical robust accuracy at the attacked radii as a
  dotted line with markers in the row's colour (an upper bound: the certified curve
  should lie below it);
- class-wise accuracy: a heat map of PREDICT's accuracy per class (columns) for every
  row (Mohapatra et al. 2021, §3.2).

Plugin text is drawn with mathtext off, so a ``$`` in a name is just a dollar sign.
The PNG metadata carries no software version or date: same data, same matplotlib,
same bytes.
"""

from __future__ import annotations

import bisect
from pathlib import Path

from harness.leaderboard.board import Row, Table
from harness.leaderboard.escape import flatten
from harness.results import empirical_key

_RC = {"text.parse_math": False, "text.usetex": False, "font.size": 9}
_PNG_METADATA = {"Software": None}


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


def _attack_curve(row: Row, radii: list[float]) -> list[tuple[float, float]]:
    """(radius, empirical robust accuracy) at the radii the attack ran."""
    return [(r, row.metrics[empirical_key(r)]) for r in radii
            if row.metrics.get(empirical_key(r)) is not None]  # fmt: skip


def write_certified_plot(table: Table, path: Path, title: str) -> None:
    """Certified accuracy vs radius of every row of ``table``."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = table.rows
    top = max([*table.radii, *(r for row in rows for r in row.correct_radii[-1:])], default=1.0)
    top = top * 1.05 if top > 0 else 1.0
    grid = [top * i / 400 for i in range(401)]
    with_run = len(table.runs) > 1
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(9, 4.8), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        colors = matplotlib.colormaps["tab10" if len(rows) <= 10 else "tab20"].colors
        for i, row in enumerate(rows):
            ax.step(grid, _curve(row, grid), where="post", color=colors[i % len(colors)],
                    linestyle="-" if row.sound else "--", label=row_label(row, with_run))  # fmt: skip
            attacked = _attack_curve(row, table.radii)
            if attacked:
                ax.plot(*zip(*attacked, strict=True), color=colors[i % len(colors)],
                        linestyle=":", marker="o", markersize=3,
                        label=flatten(f"{row.method} ({row.setting})") + " · attack (upper bound)")  # fmt: skip
        ax.set_xlim(0, top)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("radius (ℓ2)")
        attacked = any(_attack_curve(row, table.radii) for row in rows)
        ax.set_ylabel(
            "certified (—) and empirical (··) accuracy" if attacked else "certified accuracy"
        )
        ax.set_title(flatten(f"certified accuracy · {title}"))
        ax.grid(alpha=0.3)
        if rows:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
        fig.tight_layout()
        fig.savefig(path, format="png", metadata=_PNG_METADATA)


def write_classwise_plot(table: Table, path: Path, title: str) -> None:
    """Heat map of per-class clean accuracy, one line per row of ``table``."""
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
        width = 2.5 + 0.55 * max(len(classes), 2) + 0.065 * max(map(len, labels), default=0)
        fig = Figure(figsize=(max(width, 6.0), 1.6 + 0.32 * max(len(rows), 1)), dpi=100)
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
        ax.set_xticks(range(len(classes)), [str(c) for c in classes])
        ax.set_yticks(range(len(rows)), labels)
        ax.set_xlabel("class")
        fig.suptitle(flatten(f"class-wise clean accuracy · {title}"))
        fig.tight_layout()
        fig.savefig(path, format="png", metadata=_PNG_METADATA)
