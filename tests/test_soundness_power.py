"""Power of S1/S4: the right null, exact truth in the run's dimension, multiplicity.

A naive "Cohen's radius at σ(x)" method with Súkeník's kNN σ on Fashion-MNIST (784-d)
is flagged by S1, while cohen and sukenik (the same σ with its own certificate) are not;
the rigged ×1.15 radius of the detection-power script is flagged; soft smoothing of the
one-hot analytic models equals the closed form.
"""

import types

import numpy as np
import pytest
import torch
from scipy import stats

from harness import hookimpl
from harness.components import MethodSpec
from harness.progress import Progress
from harness.runner import RunOptions, run_benchmark
from harness.sampling import SamplingEngine
from harness.soundness.analytic import BallClassifier, LinearClassifier
from harness.soundness.audit import Budget
from harness.soundness.coverage import check_coverage, detectable_rate
from harness.soundness.detection_power import flags_per_check, rigged_plugin
from harness.soundness.runner import audits
from harness.soundness.verdict import Verdict, false_certificates_pvalue
from harness.spec import parse_spec
from harness.stats import holm_rejections
from harness.store import ResultStore
from plugins.lipschitz.normalization import NormalizedModel

TINY = Budget("tiny", coverage_trials=80, coverage_n=100, pairs=2, ascent_steps=2,
              audited_inputs=8, attack_steps=3, attack_samples=16, orders=2)  # fmt: skip


def _naive_plugin():
    """``cohen-at-knn``: Súkeník's kNN σ(x), but Cohen's radius at σ(x0) (unsound)."""
    module = types.ModuleType("naive")

    @hookimpl
    def idrs_register_methods(register):
        register(MethodSpec("cohen-at-knn", "sukenik-knn", "cohen",
                            {"sigma": 0.25, "rate": 1.0, "k": 20, "m": "min", "max_ratio": 0.0}))  # fmt: skip

    module.idrs_register_methods = idrs_register_methods
    return module


def test_s1_flags_cohen_at_an_input_dependent_sigma_in_the_runs_dimension(tmp_path, manager):
    manager.register(_naive_plugin(), name="naive")
    knn = {"sigma": 0.25, "rate": 1.0, "k": 20}
    raw = {
        "name": "gm", "seed": 0,
        "dataset": {"name": "gauss-mix-784", "test_count": 20},
        "model": {"architecture": "mlp", "trainer": "gaussian-augmentation",
                  "trainer_params": {"sigma": 0.25, "epochs": 1}},
        "certification": {"n0": 20, "n": 200, "alpha": 0.001},
        "methods": [{"name": "cohen-at-knn", "settings": [knn]},
                    {"name": "sukenik", "settings": [knn]},
                    {"name": "cohen", "settings": [{"sigma": 0.25}]}],
    }  # fmt: skip
    db = tmp_path / "gm.sqlite"
    quiet = Progress(enabled=False)
    run_id = run_benchmark(parse_spec(raw), RunOptions(db=db), quiet, manager)
    verdicts = {}
    for audit in audits(ResultStore(db), run_id, RunOptions(db=db), quiet, manager, budget=TINY):
        result = check_coverage(audit)
        assert result.evidence["dimension"] == 784
        verdicts[audit.method.name] = (result.verdict, result.summary)
    assert verdicts["cohen-at-knn"][0] == Verdict.VIOLATED, verdicts
    assert "ball-784" in verdicts["cohen-at-knn"][1] and "rejected" in verdicts["cohen-at-knn"][1]
    assert verdicts["cohen"][0] == Verdict.SOUND, verdicts
    assert verdicts["sukenik"][0] == Verdict.SOUND, verdicts


def test_detection_power_core_flags_the_inflated_radius_and_not_cohen(tmp_path, manager):
    plugin = rigged_plugin()
    manager.register(plugin, name="rigged")
    counts = flags_per_check({"cohen-radius-x1.15": {}, "cohen": {"sigma": 0.25}}, [0], TINY,
                             manager, tmp_path, test_count=40)  # fmt: skip
    mine = ("coverage", "counterexamples")
    assert sum(counts["cohen-radius-x1.15"].get(c, 0) for c in mine) >= 1, counts
    assert counts["cohen"]["any"] == 0, counts


def test_holm_against_its_definition():
    assert holm_rejections([0.01, 0.04, 0.03], 0.05) == [True, False, False]
    assert holm_rejections([0.01, 0.02, 0.03], 0.1) == [True, True, True]  # 0.033, 0.05, 0.1
    assert holm_rejections([0.2, 1e-4], 1e-3) == [False, True]
    assert holm_rejections([6e-4, 6e-4], 1e-3) == [False, False]  # 6e-4 >= 1e-3 / 2


def test_per_trial_null_and_the_stated_power():
    # the guarantee is per trial: 3 false of 200 trials at α = 0.01 is ordinary
    assert false_certificates_pvalue(3, 200, 0.01) == pytest.approx(stats.binom.sf(2, 200, 0.01))
    assert false_certificates_pvalue(3, 200, 0.01) > 0.1
    rate = detectable_rate(100, 0.001, 5e-4)
    k_min = next(k for k in range(1, 100) if stats.binom.sf(k - 1, 100, 0.001) < 5e-4)
    assert stats.binom.sf(k_min - 1, 100, rate) == pytest.approx(0.9, abs=1e-6)


@pytest.mark.parametrize("dim", [2, 50])
def test_soft_smoothing_of_the_one_hot_ball_is_exact(dim):
    """E[g_inside] = (1 − 2 p_min)·χ²_N(ρ²/σ²; ‖x − c‖²/σ²) + p_min (Remark 2 normalization)."""
    p_min, sigma, n = 1e-3, 0.5, 20_000
    model = BallClassifier(dim, one_hot=True)
    center = torch.zeros(dim)
    center[0] = 0.3
    model.set_ball(center, sigma * np.sqrt(dim) * 1.02)
    x = torch.zeros(3, dim)
    x[1, 1], x[2, 0] = 0.4, -0.5
    engine = SamplingEngine(NormalizedModel(model, 2, p_min), 2, torch.device("cpu"), seed=1)
    means = np.stack([s.means for s in engine.soft_stats(x, [sigma] * 3, [0, 1, 2], n, 1)])
    exact = (1 - 2 * p_min) * model.smoothed_probability(x.numpy(), np.full(3, sigma)) + p_min
    assert np.abs(means[:, 1] - exact).max() < 4 * 0.5 / np.sqrt(n)
    assert np.allclose(means.sum(1), 1.0)


def test_linear_plane_moves_and_stays_exact():
    model = LinearClassifier(3, one_hot=True)
    model.set_plane(torch.tensor([0.0, 3.0, 4.0]), 1.0)
    x = np.array([[0.0, 0.6, 0.8], [5.0, 0.0, 0.0]])
    assert np.allclose(model.signed_distance(x), [0.0, -1.0], atol=1e-6)
    logits = model(torch.tensor([[0.0, 0.6, 1.0], [0.0, 0.0, 0.0]]))
    assert torch.softmax(logits.double(), 1).tolist() == [[0.0, 1.0], [1.0, 0.0]]


@pytest.mark.gpu
def test_s1_and_s4_run_on_cuda(tmp_path, manager):
    """Every tensor of S1/S4 is made where the model lives: no check fails on cuda."""
    from harness.soundness.runner import run_checks

    raw = {
        "name": "ball", "seed": 0, "dataset": {"name": "ball-2", "test_count": 30},
        "model": {"architecture": "ball-N", "trainer": "none"},
        "certification": {"n0": 32, "n": 1000, "alpha": 0.01},
        "methods": [{"name": "cohen", "settings": [{"sigma": 0.25}]},
                    {"name": "sukenik", "settings": [{"sigma": 0.25, "rate": 0.2, "k": 5}]},
                    {"name": "lipschitz-sigma-net",
                     "settings": [{"train_examples": 64, "train_steps": 5, "sigma_min": 0.3}]}],
    }  # fmt: skip
    db = tmp_path / "cuda.sqlite"
    options = RunOptions(db=db, device="cuda")
    quiet = Progress(enabled=False)
    run_id = run_benchmark(parse_spec(raw), options, quiet, manager)
    results = run_checks(db, run_id, options, quiet, manager, budget=TINY)
    for key, checks in results.items():
        mine = {r.check: r for r in checks if r.check in ("coverage", "counterexamples")}
        assert {c: r.verdict for c, r in mine.items()} == {
            "coverage": Verdict.SOUND,
            "counterexamples": Verdict.SOUND,
        }, (key, [(r.check, r.summary) for r in checks])


def test_the_budget_statement_names_what_the_checks_examine():
    budget = Budget("probe", coverage_trials=123, coverage_n=456, pairs=7, ascent_steps=11,
                    audited_inputs=13, attack_steps=17, attack_samples=19, orders=23)  # fmt: skip
    text = budget.statement()
    for number in ("123", "456", "7 pairs", "11 ascent", "13 certificates", "17 attack",
                   "19 samples", "23 input orders"):  # fmt: skip
        assert number in text, number
    assert "--budget probe" in text  # where its detection power is measured
