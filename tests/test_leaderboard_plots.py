"""The board's plots read at a glance: small multiples, one panel per method with its
settings together (at most six curves a panel, in distinct colours ordered by σ, each
with a marker), the envelope of the verified-sound rows as a reference on every panel, attack curves
only where they can be told apart, legends inside the figure; class-wise columns named
by the dataset's classes with their counts."""

from __future__ import annotations

import pytest
from matplotlib.colors import to_rgb

from harness.reports.leaderboard.board import Row, build_board
from harness.reports.leaderboard.plots import (
    PER_PANEL,
    REFERENCE,
    REFERENCE_LABEL,
    certified_figure,
    classwise_figure,
    panels,
    visible_attack,
)
from harness.reports.leaderboard.render import class_names, write_board
from harness.store.storedrun import load_runs

SIGMAS = (0.12, 0.25, 0.5, 1.0)


def _rows(methods: int, sigmas=SIGMAS) -> dict:
    """``methods`` methods × the σ, four inputs each: inputs 0-2 correct with radii σ, 2σ,
    3σ, input 3 abstains."""
    out = {}
    for m in range(methods):
        for sigma in sigmas:
            out[f"method-{m}", f"sigma={sigma}"] = [
                (0, 0, sigma * (k + 1), sigma, 0.1) for k in range(2)
            ] + [(1, 1, sigma * 3, sigma, 0.1), (-1, 0, 0.0, sigma, 0.1)]
    return out


@pytest.fixture
def table(tmp_path, monkeypatch, make_run, golden_run):
    def make(methods: int, sigmas=SIGMAS, sound: bool = False):
        db = tmp_path / f"{methods}-{len(sigmas)}-{sound}.sqlite"
        rows = _rows(methods, sigmas)
        checks = [(*key, "evidence", "sound", "", []) for key in rows] if sound else []
        make_run(db, monkeypatch, rows=rows, checks=checks, failure=None)
        (table,) = build_board(load_runs(db)).tables
        return table

    return make


def _panels(figure):
    return [ax for ax in figure.axes if ax.get_visible()]


def _curves(ax):
    """The certified-accuracy curves of a panel (those in its legend), by label."""
    return {
        line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")
    }


def test_one_panel_per_method_with_its_settings_in_sigma_order(table):
    figure = certified_figure(table(3), "a title")
    axes = _panels(figure)
    assert sorted(ax.get_title() for ax in axes) == ["method-0", "method-1", "method-2"]
    for ax in axes:
        curves = _curves(ax)
        # not checked, so not sound: each label says so
        assert list(curves) == [f"sigma={s} · not checked" for s in SIGMAS]
        colours = [to_rgb(line.get_color()) for line in curves.values()]
        assert len(set(colours)) == len(SIGMAS)  # distinct colours ...
        luminance = [0.2126 * r + 0.7152 * g + 0.0722 * b for r, g, b in colours]
        assert luminance == sorted(luminance)  # ... ordered by σ, dark to light
        assert len({line.get_marker() for line in curves.values()}) == len(SIGMAS)


def test_at_most_six_curves_a_panel(table):
    sigmas = tuple(0.1 * k for k in range(1, PER_PANEL + 3))  # 8 settings
    t = table(1, sigmas)
    assert [(title, len(rows)) for title, rows in panels(t.rows)] == [
        ("method-0 (1/2)", PER_PANEL), ("method-0 (2/2)", 2),
    ]  # fmt: skip
    assert [len(_curves(ax)) for ax in _panels(certified_figure(t, "x"))] == [PER_PANEL, 2]


def test_the_envelope_of_the_sound_rows_is_the_reference_on_every_panel(
    tmp_path, monkeypatch, make_run, table
):
    """The grey line is the best sound row at each radius, not one row's curve: a small σ
    certifying all 4 inputs to 0.2, a larger one 2 inputs to 1, a third unsound one 4
    inputs to 3 (not part of it)."""
    rows = {("cohen", "sigma=0.12"): [(0, 0, 0.2, 0.12, 1), (0, 0, 0.2, 0.12, 1),
                                      (1, 1, 0.2, 0.12, 1), (1, 1, 0.2, 0.12, 1)],
            ("cohen", "sigma=0.5"): [(0, 0, 1.0, 0.5, 1), (-1, 0, 0.0, 0.5, 1),
                                     (1, 1, 1.0, 0.5, 1), (-1, 1, 0.0, 0.5, 1)],
            ("chen-fgss", "sigma=0.5"): [(0, 0, 3.0, 0.5, 1), (0, 0, 3.0, 0.5, 1),
                                         (1, 1, 3.0, 0.5, 1), (1, 1, 3.0, 0.5, 1)]}  # fmt: skip
    checks = [("cohen", s, "evidence", "sound", "", []) for s in ("sigma=0.12", "sigma=0.5")]
    checks.append(("chen-fgss", "sigma=0.5", "evidence", "violated", "", []))
    db = tmp_path / "envelope.sqlite"
    make_run(db, monkeypatch, rows=rows, checks=checks, failure=None)
    (t,) = build_board(load_runs(db)).tables
    figure = certified_figure(t, "x")
    for ax in _panels(figure):
        [reference] = [line for line in ax.get_lines() if line.get_color() == REFERENCE]
        for r, fraction in zip(reference.get_xdata(), reference.get_ydata(), strict=True):
            expected = 1.0 if r <= 0.2 else 0.5 if r <= 1.0 else 0.0
            assert fraction == pytest.approx(expected)
    assert figure.legends[0].get_texts()[0].get_text() == REFERENCE_LABEL
    # no sound row, no reference
    assert not any(line.get_color() == REFERENCE for ax in _panels(certified_figure(table(1), "x"))
                   for line in ax.get_lines())  # fmt: skip


def _attacked_row(certified: dict, empirical: dict) -> Row:
    metrics = {f"certified_accuracy@{r:g}": v for r, v in certified.items()}
    metrics |= {f"empirical_accuracy@{r:g}": v for r, v in empirical.items()}
    return Row("r", "m", "s", metrics, "sound", (), [], attack={"inputs": 4})


def test_an_attack_curve_is_drawn_only_where_it_can_be_told_apart():
    radii = [0.0, 0.5, 1.0]
    same = _attacked_row({0: 0.8, 0.5: 0.5, 1: 0.2}, {0: 0.8, 0.5: 0.5, 1: 0.2})
    assert visible_attack(same, radii) == []
    apart = _attacked_row({0: 0.8, 0.5: 0.5, 1: 0.2}, {0: 0.8, 0.5: 0.6, 1: 0.2})
    assert visible_attack(apart, radii) == [(0.0, 0.8), (0.5, 0.6), (1.0, 0.2)]
    not_run = _attacked_row({0: 0.8, 0.5: 0.5, 1: 0.2}, {})
    assert visible_attack(not_run, radii) == []


@pytest.mark.parametrize("methods", [1, 3, 7])
def test_every_legend_fits_inside_the_figure(table, methods):
    figure = certified_figure(table(methods, sound=True), "a title")
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    frame = figure.bbox
    legends = [ax.get_legend() for ax in _panels(figure)] + list(figure.legends)
    assert len(legends) == methods + 1
    for legend in legends:
        box = legend.get_window_extent(renderer)
        assert box.x0 >= frame.x0 - 1 and box.x1 <= frame.x1 + 1
        assert box.y0 >= frame.y0 - 1 and box.y1 <= frame.y1 + 1
    assert len(_panels(figure)) == methods


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
