"""The empirical attack: every break real, clear breaks found, stored and shown on boards."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import optimize, stats

from harness.audit.auditor import run_checks
from harness.audit.empirical import STRENGTHS, attack_row
from harness.audit.session import audits
from harness.foundation.progress import Progress
from harness.mathematics.accuracy import RADII, empirical_key, empirical_successes
from harness.reports.leaderboard.board import build_board
from harness.reports.leaderboard.board_schema import BOARD_SCHEMA
from harness.reports.leaderboard.markdown import render_markdown
from harness.reports.leaderboard.render import write_board
from harness.reports.leaderboard.source import export_runs, read_export
from harness.reports.leaderboard.verify import verify_board
from harness.running.benchmark import parse_benchmark
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark
from harness.store.store import ResultStore
from harness.store.storedrun import load_runs

SIGMA = 0.5


def _spec() -> dict:
    return {
        "name": "ball", "seed": 0,
        "dataset": {"name": "ball-2", "test_count": 60},
        "model": {"architecture": "ball-N", "trainer": "none"},
        "certification": {"n0": 32, "n": 500, "alpha": 0.001, "batch_size": 4096},
        "methods": [{"name": "cohen", "settings": [{"sigma": SIGMA}]}],
    }  # fmt: skip


@pytest.fixture(scope="module")
def ball_run(tmp_path_factory):
    """A Cohen run on the exact ball-2 classifier, checked (and so attacked) by a fixed
    audit: the same verdicts and attack every time."""
    db = tmp_path_factory.mktemp("attack") / "r.sqlite"
    options = RunOptions(db=db)
    run_id = run_benchmark(parse_benchmark(_spec()), options, Progress(enabled=False))
    run_checks(db, run_id, options, Progress(enabled=False), entropy=0x5EED)
    return db, run_id


def _exact_robust_radius(points: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Distance to the boundary of the exact smoothed ball classifier (constant σ): its
    'inside' region is the ball ‖x‖ < ρ* where χ²₂(1/σ²; ρ*²/σ²) = 1/2 (f = [‖x‖ <= 1]);
    0 where the smoothed prediction is not the label."""

    def inside(d):
        return stats.ncx2.cdf(1.0 / SIGMA**2, 2, d**2 / SIGMA**2) - 0.5

    rho = optimize.brentq(inside, 1e-9, 5.0)
    dist = np.linalg.norm(points.reshape(len(points), -1), axis=1)
    margin = np.where(labels == 1, rho - dist, dist - rho)
    return np.maximum(margin, 0.0)


def test_every_break_is_real_and_clear_breaks_are_found(ball_run):
    db, run_id = ball_run
    store = ResultStore(db)
    try:
        (audit,) = audits(store, run_id, RunOptions(db=db), Progress(False), _manager(), None,
                          entropy=0x5EED)  # a fixed audit: the same PGD noise every time  # fmt: skip
    finally:
        store.close()
    result = attack_row(audit, STRENGTHS["small"])
    labels = np.array([c["label"] for c in audit.certificates])
    robust = _exact_robust_radius(audit.inputs.double().numpy(), labels)
    ids = [c["input_id"] for c in audit.certificates]
    broken = {int(i): r for i, r in result["broken"].items()}
    for k, i in enumerate(ids):
        if i in broken:  # a confirmed break lies within the radius: the exact margin is smaller
            assert robust[k] < broken[i] + 1e-9, (i, robust[k], broken[i])
    # a point that can be pushed 0.5 beyond the boundary (P(inside) <= 0.2 there, far from
    # the screening's margin of 0.3 with 32 samples and clear for 256 confirming samples)
    for r in result["radii"]:
        clear = [i for k, i in enumerate(ids) if robust[k] < r - 0.5]
        assert all(i in broken and broken[i] <= r for i in clear), r
    assert result["radii"] == list(RADII) and result["inputs"] == len(ids)
    assert len(broken) > 10  # the test has teeth
    # empirical accuracy is an upper bound on the exact robust accuracy of the inputs the
    # smoothed classifier answers right, and at most their share (clean accuracy)
    right = [i for i in ids if i % 3]  # (as if PREDICT erred on the others)
    answered = np.array([i in right for i in ids])
    for r in RADII:
        exact = float(np.mean((robust >= r if r > 0 else robust > 0) & answered))
        found = empirical_successes(result, r, right) / len(ids)
        assert exact - 1e-12 <= found <= len(right) / len(ids)


def _manager():
    from harness.plugin.manager import PluginManager

    return PluginManager()


def test_the_attack_is_stored_exported_and_shown(ball_run, tmp_path):
    db, run_id = ball_run
    (run,) = load_runs(db, [run_id])
    (row,) = run.rows()
    assert row.attack is not None and row.attack.budget == "small"
    assert row.attack.result["strength"]["steps"] == STRENGTHS["small"].steps
    # the export keeps what the board needs, and the board renders the same from it
    (exported,) = read_export_text(export_runs([run]), tmp_path)
    assert exported.rows()[0].attack.result["broken"] == row.attack.result["broken"]
    assert "examples" not in exported.rows()[0].attack.result
    board = build_board([run])
    assert render_markdown(board, "b") == render_markdown(build_board([exported]), "b")
    text = render_markdown(board, "b")
    assert "| emp\\@0.5 |" in text and "an upper bound on robust accuracy" in text
    (table_row,) = board.tables[0].rows
    emp = table_row.metrics[empirical_key(0.5)]
    right = [int(c.input_id) for c in row.certificates if c.predict == c.label]
    assert emp == empirical_successes(row.attack.result, 0.5, right) / row.inputs
    assert emp <= table_row.metrics["clean_accuracy"]
    lo, hi = table_row.metrics["intervals"][empirical_key(0.5)]
    assert lo <= emp <= hi
    out = tmp_path / "board" / "b.md"
    write_board([run], out)
    assert verify_board(out) == []
    import jsonschema

    data = json.loads((out.parent / "b.json").read_text())
    jsonschema.validate(data, BOARD_SCHEMA)
    assert data["rows"][0][empirical_key(1.0)] == table_row.metrics[empirical_key(1.0)]
    csv = (out.parent / "b.csv").read_text()
    assert f"{empirical_key(0.5)},0.5," in csv


def read_export_text(text: str, tmp_path):
    path = tmp_path / "x.run.json"
    path.write_text(text)
    return read_export(path)


def test_a_run_without_attack_shows_no_empirical_columns(tmp_path, golden_run, make_run,
                                                          monkeypatch):  # fmt: skip
    make_run(tmp_path / "r.sqlite", monkeypatch)
    text = render_markdown(build_board(load_runs(tmp_path / "r.sqlite")), "g")
    assert "emp\\@" not in text


def test_a_row_certified_above_its_attack_names_the_inputs():
    """Inputs certified at r that the attack broke within r, or that PREDICT answers
    otherwise, are named per radius (a sound row showing them has certificates an attack
    broke, or CERTIFY and PREDICT disagreeing); empirical accuracy never exceeds clean."""
    from harness.reports.leaderboard.board import beyond_attack, empirical_metrics
    from harness.store.storedrun import StoredCertificate

    def cert(i, prediction, predict, radius):
        return StoredCertificate("m", "s", i, 1, prediction, predict, radius, 0.25, 0.0)

    certs = [cert(0, 1, 1, 0.8), cert(1, 1, 1, 0.3), cert(2, 1, 0, 0.6), cert(3, 0, 1, 0.0),
             cert(4, -1, -1, 0.0)]  # fmt: skip
    attack = {"radii": [0.0, 0.25, 0.5, 1.0], "inputs": 5, "broken": {"0": 0.5, "3": 0.25}}
    right = [int(c.input_id) for c in certs if c.predict == c.label]  # 0, 1, 3
    assert beyond_attack(certs, attack, right, [0.0, 0.25, 0.5, 0.75, 1.0]) == {
        0.0: [2], 0.25: [2], 0.5: [0, 2]}  # fmt: skip
    metrics = empirical_metrics(attack, [0.0, 0.25, 0.5, 1.0], right)
    assert [metrics[empirical_key(r)] for r in (0.0, 0.25, 0.5, 1.0)] == [0.6, 0.4, 0.2, 0.2]
    assert beyond_attack(certs, None, right, [0.5]) == {}
