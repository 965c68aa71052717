"""The declared soundness contract, S0 evidence re-derivation, error and memory verdicts.

Third-party plugins from ``tests/soundness_plugins.py`` are registered in-process; every
test asserts the verdict the audit must reach.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import beta, norm

from harness.leaderboard.board import build_board
from harness.leaderboard.markdown import render_markdown
from harness.leaderboard.source import load_runs
from harness.progress import Progress
from harness.radius import COHEN, SUKENIK, is_pure
from harness.runner import RunOptions, run_benchmark
from harness.soundness.audit import Budget
from harness.soundness.evidence import check_evidence
from harness.soundness.justification import check_justification
from harness.soundness.runner import audits, run_checks
from harness.soundness.verdict import Verdict, overall
from harness.spec import parse_spec
from tests import soundness_plugins

TINY = Budget("tiny", coverage_trials=40, coverage_n=100, pairs=4, ascent_steps=3,
              audited_inputs=6, attack_steps=3, attack_samples=16, orders=4)  # fmt: skip


@pytest.fixture
def plugins(manager):
    manager.register(soundness_plugins, name="soundness-test-plugins")
    soundness_plugins.ARMED.update({"raise": False, "sigma": None})
    yield manager
    soundness_plugins.ARMED.update({"raise": False, "sigma": None})


def _run(tmp_path, manager, methods, alpha=0.001, n=400, count=24, dataset="ball-2"):
    raw = {
        "name": "contract", "seed": 0,
        "dataset": {"name": dataset, "test_count": count},
        "model": {"architecture": "ball-N", "trainer": "none"},
        "certification": {"n0": 32, "n": n, "alpha": alpha, "batch_size": 4096},
        "methods": [{"name": m} for m in methods],
    }  # fmt: skip
    db = tmp_path / "r.sqlite"
    run_id = run_benchmark(parse_spec(raw), RunOptions(db=db), Progress(enabled=False), manager)
    return db, run_id


def _audits(db, run_id, manager):
    from harness.store import ResultStore

    store = ResultStore(db)
    try:
        return {a.method.name: a for a in audits(store, run_id, RunOptions(db=db),
                                                  Progress(enabled=False), manager, budget=TINY)}  # fmt: skip
    finally:
        store.close()


def test_s0_catches_alpha_laundering_hidden_alpha_and_an_inflated_radius(tmp_path, plugins):
    methods = ["cohen", "laundered-alpha", "hidden-alpha", "inflated", "minimal"]
    db, run_id = _run(tmp_path, plugins, methods)
    results = {name: check_evidence(a) for name, a in _audits(db, run_id, plugins).items()}
    assert results["cohen"].verdict == Verdict.SOUND, results["cohen"].summary
    assert results["minimal"].verdict == Verdict.SOUND, results["minimal"].summary
    laundered = results["laundered-alpha"]
    assert laundered.verdict == Verdict.VIOLATED
    assert laundered.evidence["first"]["quantity"] == "α"
    assert "input 0: stored α 0.01 differs from the run's α 0.001" in laundered.summary
    hidden = results["hidden-alpha"]
    assert hidden.verdict == Verdict.VIOLATED
    first = hidden.evidence["first"]
    assert first["quantity"] == "bound"
    # independent: the bound at α = 0.01 that it stored vs the one at the run's α = 0.001
    audit = _audits(db, run_id, plugins)["hidden-alpha"]
    row = next(r for r in audit.certificates if r["input_id"] == first["input_id"])
    counts = np.array(row["counts_estimation"])
    top = int(np.argmax(row["counts_selection"]))
    k, n = int(counts[top]), int(counts.sum())
    assert first["stored"] == pytest.approx(beta.ppf(0.01, k, n - k + 1), rel=1e-9)
    assert first["recomputed"] == pytest.approx(beta.ppf(0.001, k, n - k + 1), rel=1e-9)
    inflated = results["inflated"]
    assert (
        inflated.verdict == Verdict.VIOLATED and inflated.evidence["first"]["quantity"] == "radius"
    )
    e = inflated.evidence["first"]
    assert e["stored"] == pytest.approx(1.02 * e["recomputed"], rel=1e-12)
    row = next(r for r in _audits(db, run_id, plugins)["inflated"].certificates
               if r["input_id"] == e["input_id"])  # fmt: skip
    assert e["recomputed"] == pytest.approx(row["sigma"] * norm.ppf(row["p_lower"]), rel=1e-12)


def test_a_closure_as_radius_formula_is_unjustified(tmp_path, plugins):
    db, run_id = _run(tmp_path, plugins, ["impure"], count=6)
    result = check_evidence(_audits(db, run_id, plugins)["impure"])
    assert result.verdict == Verdict.UNJUSTIFIED and "not a pure" in result.summary
    assert is_pure(COHEN.recompute) and is_pure(SUKENIK.recompute)


def test_a_minimal_third_party_certifier_is_fully_audited(tmp_path, plugins):
    db, run_id = _run(tmp_path, plugins, ["minimal"], alpha=0.01, n=500, count=30)
    [(key, results)] = run_checks(db, run_id, RunOptions(db=db), Progress(enabled=False), plugins,
                                  budget=TINY).items()  # fmt: skip
    names = {r.check for r in results}
    assert names >= {"evidence", "coverage", "sigma-regularity", "counterexamples",
                     "worst-case-justification", "memory-order"}  # fmt: skip
    assert not [r for r in results if r.verdict == Verdict.ERROR], [
        (r.check, r.summary) for r in results
    ]
    assert overall(results) == Verdict.SOUND, [(r.check, r.summary) for r in results]


def test_a_raising_sigma_provider_is_an_error_and_the_row_is_not_verified(tmp_path, plugins):
    db, run_id = _run(tmp_path, plugins, ["switchable"], alpha=0.05, count=12)
    soundness_plugins.ARMED["raise"] = True
    [(_, results)] = run_checks(db, run_id, RunOptions(db=db), Progress(enabled=False), plugins,
                                budget=TINY).items()  # fmt: skip
    by = {r.check: r for r in results}
    assert by["evidence"].verdict == Verdict.SOUND  # S0 needs no σ: it completed
    errors = [r for r in results if r.verdict == Verdict.ERROR]
    assert {"coverage", "sigma-regularity"} <= {r.check for r in errors}
    assert all("cannot handle inputs" in r.summary for r in errors)
    assert overall(results) == Verdict.NOT_VERIFIED
    (table,) = build_board(load_runs(db)).tables
    assert not table.sound_rows and [r.verdict for r in table.other_rows] == ["not-verified"]
    text = render_markdown(build_board(load_runs(db)), None)
    assert "No row is verified sound" in text and "checks applied: " in text


def test_a_huge_sigma_is_blamed_on_the_provider_not_the_checkpoint(tmp_path, plugins):
    db, run_id = _run(tmp_path, plugins, ["switchable"], alpha=0.05, count=12)
    soundness_plugins.ARMED["sigma"] = 1e42
    [(_, results)] = run_checks(db, run_id, RunOptions(db=db), Progress(enabled=False), plugins,
                                budget=TINY).items()  # fmt: skip
    by = {r.check: r for r in results}
    assert by["counterexamples"].verdict == Verdict.ERROR
    assert "1e+42" in by["counterexamples"].summary
    assert "σ-provider is at fault" in by["counterexamples"].summary
    assert "checkpoint" not in by["counterexamples"].summary
    assert overall(results) == Verdict.NOT_VERIFIED


def test_s3_uses_the_declared_rate(tmp_path, plugins):
    db, run_id = _run(tmp_path, plugins, ["lying-rate"], alpha=0.01, n=500, count=12)
    result = check_justification(_audits(db, run_id, plugins)["lying-rate"])
    assert result.verdict == Verdict.UNJUSTIFIED, result.summary
    assert "0.01-semi-elastic" in result.summary or "ξ" in result.summary


def test_s3_bounds_lipschitz_from_the_weights(tmp_path, plugins):
    db, run_id = _run(tmp_path, plugins, ["lying-lipschitz"], alpha=0.01, n=300, count=8)
    result = check_justification(_audits(db, run_id, plugins)["lying-lipschitz"])
    assert result.verdict == Verdict.UNJUSTIFIED
    assert result.evidence["lip_from_weights"] == pytest.approx(2.0, rel=1e-12)  # ‖W1‖‖W2‖ = 2·1
    assert "the weights only give 2" in result.summary
