"""The board's plots read at a glance: one colour family and line style per method, its
settings in shades light to dark by σ with a marker each, a legend inside the figure
however many rows; class-wise columns named by the dataset's classes with their counts."""

from __future__ import annotations

import colorsys
import itertools

import pytest
from matplotlib.colors import to_rgb

from harness.reports.leaderboard.board import build_board
from harness.reports.leaderboard.plots import certified_figure, classwise_figure, line_styles
from harness.reports.leaderboard.render import class_names, write_board
from harness.store.storedrun import load_runs

SIGMAS = (0.12, 0.25, 0.5, 1.0)


def _rows(methods: int) -> dict:
    """``methods`` methods × 4 σ, four inputs each, radii growing with σ."""
    out = {}
    for m in range(methods):
        for sigma in SIGMAS:
            out[f"method-{m}", f"sigma={sigma}"] = [
                (0, 0, sigma * (k + 1), sigma, 0.1) for k in range(2)
            ] + [(1, 1, sigma * 3, sigma, 0.1), (-1, 0, 0.0, sigma, 0.1)]
    return out


@pytest.fixture
def table(tmp_path, monkeypatch, make_run, golden_run):
    def make(methods: int):
        db = tmp_path / f"{methods}.sqlite"
        make_run(db, monkeypatch, rows=_rows(methods), checks=[], failure=None)
        (table,) = build_board(load_runs(db)).tables
        return table

    return make


def _hue_and_lightness(color) -> tuple[float, float]:
    h, lightness, _ = colorsys.rgb_to_hls(*to_rgb(color))
    return h, lightness


def test_one_family_and_style_per_method_shades_and_markers_per_sigma(table):
    rows = table(3).rows
    styles = line_styles(rows)
    by_method: dict[str, list] = {}
    for i, row in enumerate(rows):
        by_method.setdefault(row.method, []).append((row.metrics["mean_sigma"], *styles[i]))
    assert len({entries[0][2] for entries in by_method.values()}) == 3  # line styles differ
    hues = []
    for entries in by_method.values():
        entries.sort(key=lambda e: e[0])
        assert len({e[2] for e in entries}) == 1  # one line style per method
        assert len({e[3] for e in entries}) == len(SIGMAS)  # a marker per σ
        lightness = [_hue_and_lightness(e[1])[1] for e in entries]
        assert lightness == sorted(lightness, reverse=True)  # darker as σ grows
        assert lightness[0] - lightness[-1] > 0.25
        hue = [_hue_and_lightness(e[1])[0] for e in entries]
        assert max(hue) - min(hue) < 0.08  # one colour family
        hues.append(sum(hue) / len(hue))
    hues.sort()
    assert all(b - a > 0.1 for a, b in itertools.pairwise(hues))  # three families


@pytest.mark.parametrize("methods", [1, 3, 6])
def test_the_legend_fits_inside_the_figure(table, methods):
    figure = certified_figure(table(methods), "a title")
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    legend = figure.axes[0].get_legend().get_window_extent(renderer)
    frame = figure.bbox
    assert legend.x0 >= frame.x0 - 1 and legend.x1 <= frame.x1 + 1
    assert legend.y0 >= frame.y0 - 1 and legend.y1 <= frame.y1 + 1
    assert len(figure.axes[0].get_legend().get_texts()) == 4 * methods


def test_classwise_columns_name_the_classes_and_count_their_inputs(table, tmp_path):
    t = table(1)
    figure = classwise_figure(t, "a title", ["outside", "cone"])
    ticks = [label.get_text() for label in figure.axes[0].get_xticklabels()]
    assert ticks == ["outside\n2 inputs", "cone\n2 inputs"]  # labels 0, 0, 1, 1
    figure = classwise_figure(t, "a title", [])
    assert [label.get_text() for label in figure.axes[0].get_xticklabels()] == [
        "0\n2 inputs",
        "1\n2 inputs",
    ]


def test_class_names_come_from_the_run_else_from_the_dataset_plugin(
    table, tmp_path, monkeypatch, make_run
):
    assert class_names(table(1)) == ["outside", "cone"]  # cone-N declares its classes
    db = tmp_path / "named.sqlite"
    make_run(db, monkeypatch, failure=None)
    import sqlite3

    with sqlite3.connect(db) as con:
        con.execute("UPDATE runs SET class_names = ?", ('["no", "yes"]',))
    con.close()
    (recorded,) = build_board(load_runs(db)).tables
    assert class_names(recorded) == ["no", "yes"]
    written = write_board(load_runs(db), tmp_path / "out" / "b.md")
    assert any(p.name == "b-1-classwise-accuracy.png" for p in written)
