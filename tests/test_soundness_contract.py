"""The declared soundness contract, S0 evidence re-derivation, error and memory verdicts.

Third-party plugins from ``tests/soundness_plugins.py`` (the fixture ``soundness_plugins``)
are registered in-process; every test asserts the verdict the audit must reach.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import beta, norm

from harness.audit.audit import Budget
from harness.audit.auditor import run_checks
from harness.audit.evidence import check_evidence
from harness.audit.justification import check_justification
from harness.audit.session import audits
from harness.foundation.progress import Progress
from harness.foundation.verdict import Verdict, overall
from harness.mathematics.radius import COHEN, SUKENIK, is_pure
from harness.reports.leaderboard.board import build_board
from harness.reports.leaderboard.markdown import render_markdown
from harness.running.benchmark import parse_benchmark
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark
from harness.store.storedrun import load_runs

TINY = Budget("tiny", coverage_trials=40, coverage_n=100, pairs=4, ascent_steps=3,
              audited_inputs=6, attack_steps=3, attack_samples=16, orders=4)  # fmt: skip
ENTROPY = 0x47_C047
"""The audits' entropy: fixed, so that the verdicts asserted here are the same every time
(with fresh entropy a sound row is flagged 1 time in 1,000, as the checks promise)."""


@pytest.fixture
def plugins(manager, soundness_plugins):
    manager.register(soundness_plugins, name="soundness-test-plugins")
    return manager


def _run(tmp_path, manager, methods, alpha=0.001, n=400, count=24, dataset="ball-2"):
    raw = {
        "name": "contract", "seed": 0,
        "dataset": {"name": dataset, "test_count": count},
        "model": {"architecture": "ball-N", "trainer": "none"},
        "certification": {"n0": 32, "n": n, "alpha": alpha, "batch_size": 4096},
        "methods": [{"name": m} for m in methods],
    }  # fmt: skip
    db = tmp_path / "r.sqlite"
    run_id = run_benchmark(
        parse_benchmark(raw), RunOptions(db=db), Progress(enabled=False), manager
    )
    return db, run_id


def _audits(db, run_id, manager):
    from harness.store.store import ResultStore

    store = ResultStore(db)
    try:
        return {a.method.name: a for a in audits(store, run_id, RunOptions(db=db),
                                                  Progress(enabled=False), manager, budget=TINY,
                                                  entropy=ENTROPY)}  # fmt: skip
    finally:
        store.close()


def test_a_certifier_that_reports_its_own_alpha_or_counts_breaks_the_contract(tmp_path, plugins):
    """The harness records α and every sample itself: a certifier that hands back its own
    α or class counts fails with an error naming it, its plugin and the contract, and the
    other methods of the benchmark finish."""
    from harness.store.store import ResultStore

    db, run_id = _run(tmp_path, plugins, ["laundered-alpha", "own-counts", "cohen"], count=6)
    store = ResultStore(db)
    try:
        failures = {f["method"]: f["error"] for f in store.failures(run_id)}
        assert store.stored_inputs(run_id, "cohen", "default") == set(range(6))
    finally:
        store.close()
    assert set(failures) == {"laundered-alpha", "own-counts"}
    plugin = "plugin 'soundness-test-plugins'"
    assert (
        f"certifier 'laundered-alpha' ({plugin}) put 'alpha' in a claim"
        in failures["laundered-alpha"]
    )
    assert (
        f"certifier 'own-counts' ({plugin}) returned a Certificate with its own class counts"
        in (failures["own-counts"])
    )
    assert all("the harness draws every sample" in e for e in failures.values())


def test_s0_catches_a_hidden_alpha_and_an_inflated_radius(tmp_path, plugins):
    methods = ["cohen", "hidden-alpha", "inflated", "minimal"]
    db, run_id = _run(tmp_path, plugins, methods)
    results = {name: check_evidence(a) for name, a in _audits(db, run_id, plugins).items()}
    assert results["cohen"].verdict == Verdict.SOUND, results["cohen"].summary
    assert results["minimal"].verdict == Verdict.SOUND, results["minimal"].summary
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


@pytest.mark.slow
def test_a_minimal_third_party_certifier_is_fully_audited(tmp_path, plugins):
    db, run_id = _run(tmp_path, plugins, ["minimal"], alpha=0.01, n=500, count=30)
    [(_, results)] = run_checks(db, run_id, RunOptions(db=db), Progress(enabled=False), plugins,
                                  budget=TINY, entropy=ENTROPY).items()  # fmt: skip
    names = {r.check for r in results}
    assert names >= {"evidence", "coverage", "sigma-regularity", "counterexamples",
                     "worst-case-justification", "memory-order"}  # fmt: skip
    assert not [r for r in results if r.verdict == Verdict.ERROR], [
        (r.check, r.summary) for r in results
    ]
    assert overall(results) == Verdict.SOUND, [(r.check, r.summary) for r in results]


@pytest.mark.slow
def test_a_raising_sigma_provider_is_an_error_and_the_row_is_not_verified(
    tmp_path, plugins, soundness_plugins
):
    db, run_id = _run(tmp_path, plugins, ["switchable"], alpha=0.05, count=12)
    soundness_plugins.ARMED["raise"] = True
    [(_, results)] = run_checks(db, run_id, RunOptions(db=db), Progress(enabled=False), plugins,
                                budget=TINY, entropy=ENTROPY).items()  # fmt: skip
    by = {r.check: r for r in results}
    assert by["evidence"].verdict == Verdict.SOUND  # S0 needs no σ: it completed
    errors = [r for r in results if r.verdict == Verdict.ERROR]
    assert {"coverage", "sigma-regularity"} <= {r.check for r in errors}
    assert all("cannot handle inputs" in r.summary for r in errors)
    assert overall(results) == Verdict.NOT_VERIFIED
    (table,) = build_board(load_runs(db)).tables
    assert not table.sound_rows and [r.verdict for r in table.other_rows] == ["not-verified"]
    text = render_markdown(build_board(load_runs(db)), None)
    assert "No row is verified sound" in text
    # the verdict matrix marks the checks that raised, and its footnote says why
    rows = [line for line in text.splitlines() if line.startswith("| switchable ")]
    assert any(row.count("| error ") >= 2 for row in rows) and "cannot handle inputs" in text


@pytest.mark.slow
def test_a_huge_sigma_is_blamed_on_the_provider_not_the_checkpoint(
    tmp_path, plugins, soundness_plugins
):
    db, run_id = _run(tmp_path, plugins, ["switchable"], alpha=0.05, count=12)
    soundness_plugins.ARMED["sigma"] = 1e42
    [(_, results)] = run_checks(db, run_id, RunOptions(db=db), Progress(enabled=False), plugins,
                                budget=TINY, entropy=ENTROPY).items()  # fmt: skip
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


@pytest.mark.gpu
def test_the_default_benchmark_methods_and_checks_run_on_cuda(tmp_path, manager):
    """Every check completes on cuda (no cpu/cuda mixing): none is an ``error``."""
    import tomllib

    from harness.running.benchmark import BENCHMARKS_DIR

    raw = tomllib.loads((BENCHMARKS_DIR / "fashion-mnist.toml").read_text())
    raw["dataset"].update(test_every=1000, test_count=6)
    raw["model"]["trainer_params"].update(epochs=1)
    raw["certification"].update(n0=20, n=500, batch_size=500)
    raw["device"] = "cuda"
    for method in raw["methods"]:  # σ = 0.25, or the one setting a method lists
        method["settings"] = method["settings"][1:2] or method["settings"][:1]
    db = tmp_path / "gpu.sqlite"
    options = RunOptions(db=db, device="cuda")
    run_id = run_benchmark(parse_benchmark(raw), options, Progress(enabled=False), manager)
    results = run_checks(db, run_id, options, Progress(enabled=False), manager, budget=TINY,
                         entropy=ENTROPY)  # fmt: skip
    assert len(results) == len(raw["methods"])
    for key, checks in results.items():
        errors = [(r.check, r.summary) for r in checks if r.verdict == Verdict.ERROR]
        assert not errors, (key, errors)


@pytest.mark.slow
def test_memory_certificates_are_their_own_category_scored_at_the_worst_order(tmp_path, manager):
    raw = {
        "name": "memory", "seed": 0,
        "dataset": {"name": "ball-2", "test_count": 30},
        "model": {"architecture": "ball-N", "trainer": "none"},
        "certification": {"n0": 32, "n": 400, "alpha": 0.01, "batch_size": 4096},
        "methods": [{"name": "alfarra-ds-memory", "settings": [{"sigma": 0.25, "beta": 0.01, "steps": 5}]},
                    {"name": "cohen", "settings": [{"sigma": 0.25}]}],
    }  # fmt: skip
    db = tmp_path / "m.sqlite"
    run_id = run_benchmark(
        parse_benchmark(raw), RunOptions(db=db), Progress(enabled=False), manager
    )
    budget = Budget("tiny", coverage_trials=40, coverage_n=100, pairs=4, ascent_steps=3,
                    audited_inputs=6, attack_steps=3, attack_samples=16, orders=12)  # fmt: skip
    results = run_checks(db, run_id, RunOptions(db=db), Progress(enabled=False), manager,
                         budget=budget, entropy=ENTROPY)  # fmt: skip
    [checks] = [rs for (m, _), rs in results.items() if m == "alfarra-ds-memory"]
    memory = {r.check: r for r in checks}
    assert overall(list(memory.values())) == Verdict.ORDER_DEPENDENT  # never sound
    assert memory["evidence"].verdict == Verdict.SOUND  # its radii follow from its evidence
    order = memory["memory-order"].evidence
    (table,) = build_board(load_runs(db)).tables
    assert [r.method for r in table.memory_rows] == ["alfarra-ds-memory"]
    assert "alfarra-ds-memory" not in [r.method for r in table.sound_rows + table.other_rows]
    row = table.memory_rows[0]
    # the board scores the row at the worst replayed order: its ACR, from the certificates
    # of that order, equals the replay's own minimum over orders
    assert row.metrics["acr"] == pytest.approx(order["acr"]["min"], rel=1e-12)
    assert order["acr"]["min"] <= order["acr"]["max"]
    text = render_markdown(build_board(load_runs(db)), None)
    assert "### Order-dependent: memory certificates" in text
    assert "alfarra-ds-memory" not in text.split("### Verified sound")[0]  # not the headline
    assert f"{order['acr']['min']:.3f}–{order['acr']['max']:.3f}" in text


def test_memory_formula_bounds_an_inside_certificate_by_the_enclosing_ball():
    """S0's formula for memory certificates: an input placed inside an earlier ball may
    claim at most R_A − ‖x_B − x_A‖, with R_A Cohen's radius at the ball's own σ."""
    import torch

    from harness.foundation.protocol import CertificationProtocol
    from harness.foundation.regularity import Unregularized
    from plugins.alfarra.certifier import memory_recompute

    protocol = CertificationProtocol(n0=10, n=1000, alpha=0.001)
    a = {
        "input_id": 0,
        "sigma": 0.5,
        "draws": {
            "base": {
                "kind": "hard",
                "n0": 10,
                "n": 1000,
                "sigma": 0.5,
                "selection": [0, 10],
                "estimation": [40, 960],
            }
        },
        "prediction": 1,
        "radius": 0.0,
        "evidence": {"memory_raw_prediction": 1, "memory_action": "kept", "memory_decided_by": []},
    }
    b = {"input_id": 1, "sigma": 0.3,
         "draws": {"base": {"kind": "hard", "n0": 10, "n": 1000, "sigma": 0.3,
                            "selection": [10, 0], "estimation": [990, 10]}},
         "prediction": 1, "radius": 0.0,
         "evidence": {"memory_raw_prediction": 0, "memory_action": "inside", "memory_decided_by": [0]}}  # fmt: skip
    x = torch.tensor([[0.0, 0.0], [0.3, 0.4]], dtype=torch.float64)
    out = memory_recompute([a, b], x, protocol, Unregularized(), inner=COHEN)
    r_a = 0.5 * norm.ppf(beta.ppf(0.001, 960, 41))
    assert out.radius[0] == pytest.approx(r_a, rel=1e-12)
    assert out.prediction[1] == 1 and out.radius[1] == pytest.approx(r_a - 0.5, rel=1e-12)
    assert out.bound[1] == pytest.approx(beta.ppf(0.001, 990, 11), rel=1e-12)  # B's own evidence


@pytest.mark.parametrize("radius", [1e-5, 2.4e-4, 0.5])
def test_s3_queries_sigma_only_inside_the_ball(radius):
    """S3's search for σ's extremes asks σ only at points of B(x0, R), however small R is
    (a start 10⁻³ off x0 once lay outside small balls, and its σ flagged a sound radius)."""
    import torch

    from harness.audit.justification import sigma_extremes

    x0 = torch.rand(3, 1, 28, 28)
    farthest = []

    def sigma(x):  # log σ 0.2-Lipschitz, differentiable
        centres = x0.flatten(1).repeat(len(x) // len(x0), 1)  # σ is asked ball by ball
        farthest.append(float((x.detach().flatten(1) - centres).norm(dim=1).max()))
        return 0.25 * torch.exp(0.2 * (x.flatten(1) - 0.5).norm(dim=1))

    lo, hi = sigma_extremes(
        sigma, x0, torch.full((3,), radius), 4, torch.Generator().manual_seed(0)
    )
    assert max(farthest) <= radius
    centre = sigma(x0).double().numpy()
    assert np.all(hi <= centre * np.exp(0.2 * radius))
    assert np.all(lo >= centre * np.exp(-0.2 * radius))
