"""Power of S1/S4: the right null, exact truth in the run's dimension, multiplicity.

A naive "Cohen's radius at σ(x)" method with Súkeník's kNN σ on Fashion-MNIST (784-d)
is flagged by S1, while cohen and sukenik (the same σ with its own certificate) are not;
S1 rebuilds a method in a context like the run's (recipe hash, the benchmark's dataset
and classes, its n) and calibrates the harness's draws against the exact binomial law,
which catches a plugin that patches the engine in-process; every rigged method of
``tests/rigged_methods.py`` is caught on ball-2; soft smoothing of the one-hot analytic
models equals the closed form.
"""

import contextlib
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from harness import hookimpl
from harness.audit.analytic import BallClassifier, LinearClassifier
from harness.audit.audit import BUDGETS, Budget
from harness.audit.coverage import check_coverage
from harness.audit.detection_power import SOUND_METHODS, flags_per_check
from harness.audit.session import audits
from harness.engine.sampling import SamplingEngine
from harness.foundation.errors import ContractError
from harness.foundation.progress import Progress
from harness.foundation.verdict import Verdict
from harness.mathematics.calibration import calibration_pvalues, detectable_rate, pit_score
from harness.mathematics.stats import false_certificates_pvalue, holm_rejections
from harness.plugin.components import MethodSpec
from harness.running.benchmark import parse_benchmark
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark
from harness.store.store import ResultStore
from plugins.lipschitz.normalization import NormalizedModel

TINY = Budget("tiny", coverage_trials=80, coverage_n=100, pairs=2, ascent_steps=2,
              audited_inputs=8, attack_steps=3, attack_samples=16, orders=2)  # fmt: skip
ENTROPY = 0x5EED
"""The audits' entropy: fixed, so that the verdicts of a statistical check do not vary from
run to run of the suite (its false-alarm and power figures are measured by
tests.rigged_methods, each audit with fresh entropy)."""


def _naive_plugin():
    """``cohen-at-knn``: Súkeník's kNN σ(x), but Cohen's radius at σ(x0) (unsound)."""
    module = types.ModuleType("naive")

    @hookimpl
    def idrs_register_methods(register):
        register(MethodSpec("cohen-at-knn", "sukenik-knn", "cohen",
                            {"sigma": 0.25, "rate": 1.0, "k": 20, "m": "min", "max_ratio": 0.0}))  # fmt: skip

    module.idrs_register_methods = idrs_register_methods
    return module


@pytest.mark.long
@pytest.mark.slow
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
    run_id = run_benchmark(parse_benchmark(raw), RunOptions(db=db), quiet, manager)
    verdicts = {}
    for audit in audits(ResultStore(db), run_id, RunOptions(db=db), quiet, manager, budget=TINY,
                        entropy=ENTROPY):  # fmt: skip
        result = check_coverage(audit)
        assert result.evidence["dimension"] == 784
        verdicts[audit.method.name] = (result.verdict, result.summary)
    assert verdicts["cohen-at-knn"][0] == Verdict.VIOLATED, verdicts
    assert "ball-784" in verdicts["cohen-at-knn"][1] and "rejected" in verdicts["cohen-at-knn"][1]
    assert verdicts["cohen"][0] == Verdict.SOUND, verdicts
    assert verdicts["sukenik"][0] == Verdict.SOUND, verdicts


@pytest.mark.long
@pytest.mark.slow
def test_every_rigged_method_is_caught_on_ball2_and_no_sound_method_flagged(
    tmp_path, manager, rigged_methods
):  # fmt: skip
    """One seed of the detection-power table on ball-2 (n = 10,000, 30 points; cheap in 2-D)."""
    manager.register(rigged_methods, name="rigged")
    budget = Budget("test", coverage_trials=60, coverage_n=10_000, pairs=4, ascent_steps=4,
                    audited_inputs=8, attack_steps=4, attack_samples=32, orders=2)  # fmt: skip
    common = {"name": "ball-2", "test_count": 30}
    caught = flags_per_check({m: {} for m in rigged_methods.METHODS}, [0], budget, manager,
                             tmp_path, entropy=ENTROPY, **common)  # fmt: skip
    caught |= flags_per_check({"cohen": {"sigma": 0.25}}, [0], budget, manager, tmp_path,
                              around=rigged_methods.engine_patched, label="engine-patch",
                              entropy=ENTROPY, **common)  # fmt: skip
    missed = [m for m, row in caught.items() if row["any"] != 1]
    assert missed == [], caught
    assert set(caught) == {*rigged_methods.METHODS, "engine-patch"}
    # the self-consistent cheats pass S0; S1 audits the run's formula on exact models
    for method in ("padded-formula", "honest-when-rebuilt", "engine-patch"):
        assert caught[method]["evidence"] == 0 and caught[method]["coverage"] == 1, caught
    sound = {m: s for m, s in SOUND_METHODS.items() if m != "lipschitz-sigma-net"}
    alarms = flags_per_check(sound, [100], budget, manager, tmp_path, entropy=ENTROPY, **common)
    assert all(row["any"] == 0 for row in alarms.values()), alarms


def test_honest_when_rebuilt_cheats_on_the_model_of_each_run(rigged_methods):
    """The rigged method pads on each run's base model (in one process that makes several
    runs, as ``--benchmark both`` does) and is honest on the models S1 rebuilds it on."""
    from types import SimpleNamespace as Context

    rigged = rigged_methods.HonestWhenRebuilt
    assert rigged(Context(run_id="ball-2 run", recipe_hash="mlp")).cheating
    assert not rigged(Context(run_id="ball-2 run", recipe_hash="exact ball")).cheating
    assert rigged(Context(run_id="fashion run", recipe_hash="fashion mlp")).cheating
    assert rigged(Context(run_id="fashion run", recipe_hash="fashion mlp")).cheating  # its checks


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
    from harness.audit.auditor import run_checks

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
    run_id = run_benchmark(parse_benchmark(raw), options, quiet, manager)
    results = run_checks(db, run_id, options, quiet, manager, budget=TINY, entropy=ENTROPY)
    for key, checks in results.items():
        mine = {r.check: r for r in checks if r.check in ("coverage", "counterexamples")}
        assert {c: r.verdict for c, r in mine.items()} == {
            "coverage": Verdict.SOUND,
            "counterexamples": Verdict.SOUND,
        }, (key, [(r.check, r.summary) for r in checks])


def test_the_budget_statement_names_what_the_checks_examine():
    budget = Budget("probe", coverage_trials=123, coverage_n=456, pairs=7, ascent_steps=11,
                    audited_inputs=13, attack_steps=17, attack_samples=19, orders=23,
                    replay_inputs=29)  # fmt: skip
    text = budget.statement()
    for number in ("123", "456", "7 pairs", "ascents of 11", "13 random certificates", "paths of 17",
                   "19 samples", "23 input orders", "re-draws 29 random inputs"):  # fmt: skip
        assert number in text, number
    for claim in ("entropy", "calibration", "10⁻³ per statistical check", "Fashion-MNIST"):
        assert claim in text, claim
    assert "--budget probe" in text  # where its detection power is measured


def test_the_randomized_transform_is_exactly_uniform_and_keeps_its_tails():
    """P(u <= t) = t for u = F(k − 1) + V·P(k), k ~ Binomial(n, p), V ~ U(0, 1), summed
    exactly over k (scipy's binomial law); the far tail keeps Φ(−z) = 1 − u."""
    n, p = 9, 0.3
    cdf = stats.binom.cdf(np.arange(-1, n + 1), n, p)
    for t in (0.01, 0.2, 0.5, 0.77, 0.999):
        below = cdf[:-1]
        mass = np.diff(cdf)
        assert np.sum(mass * np.clip((t - below) / mass, 0, 1)) == pytest.approx(t, abs=1e-12)
    for k, v in ((0, 0.4), (3, 0.9), (9, 0.1)):
        u = stats.binom.cdf(k - 1, n, p) + v * stats.binom.pmf(k, n, p)
        assert pit_score(k, n, p, v) == pytest.approx(stats.norm.ppf(u), rel=1e-12)
    z = pit_score(1000, 1000, 0.5, 0.3)  # u = 1 − 0.7·2⁻¹⁰⁰⁰ in exact arithmetic
    assert z > 30 and stats.norm.sf(z) == pytest.approx(0.7 * 0.5**1000, rel=1e-9)
    assert pit_score(3, 10, 0.0, 0.5) == np.inf  # a count the law does not allow
    assert pit_score(0, 10, 0.0, 0.5) == pytest.approx(stats.norm.ppf(0.5), abs=1e-15)


def test_calibration_pvalues_against_scipy():
    z = np.array([0.3, -1.2, 2.5, 0.1, 1.7])
    p_bias, p_disp = calibration_pvalues(z)
    assert p_bias == pytest.approx(2 * stats.norm.sf(abs(z.sum()) / np.sqrt(5)), rel=1e-12)
    chi = np.sum(z**2)
    assert p_disp == pytest.approx(2 * min(stats.chi2.cdf(chi, 5), stats.chi2.sf(chi, 5)))
    assert calibration_pvalues(np.array([0.0, np.inf])) == (0.0, 0.0)


def _probe_plugin(seen: list):
    """``probe``: Cohen at a constant σ whose σ-provider records every context it is built in."""
    from harness import Constant, SigmaProviderSpec

    module = types.ModuleType("probe")

    class Probe:
        regularity = Constant(0.25)

        def __call__(self, x):
            return torch.full((len(x),), 0.25, dtype=torch.float64, device=x.device)

    def withheld(dataset) -> bool:
        try:
            _ = dataset.test_y
        except ContractError as exc:
            return "test_y is withheld from plugins" in str(exc)
        return False

    def build(context, params):
        seen.append({"recipe_hash": context.recipe_hash, "dataset": context.dataset.name,
                     "shape": context.dataset.input_shape, "classes": context.dataset.num_classes,
                     "train_points": len(context.dataset.train_x), "seed": context.seed,
                     "withheld": withheld(context.dataset), "n": context.protocol.n,
                     "artifacts": context.artifact_dir("probe")})  # fmt: skip
        return Probe()

    @hookimpl
    def idrs_register_sigma_providers(register):
        register(SigmaProviderSpec("probe", build))

    @hookimpl
    def idrs_register_methods(register):
        register(MethodSpec("probe", "probe", "cohen", {}))

    module.idrs_register_sigma_providers = idrs_register_sigma_providers
    module.idrs_register_methods = idrs_register_methods
    return module


def test_s1_rebuilds_the_method_in_a_context_like_the_runs(tmp_path, manager):
    seen: list[dict] = []
    manager.register(_probe_plugin(seen), name="probe")
    raw = {
        "name": "fm", "seed": 5,
        "dataset": {"name": "fashion-mnist", "test_every": 500, "test_count": 8},
        "model": {"architecture": "mlp", "trainer": "gaussian-augmentation",
                  "trainer_params": {"epochs": 0}},
        "certification": {"n0": 20, "n": 300, "alpha": 0.001},
        "methods": [{"name": "probe", "settings": [{}]}],
    }  # fmt: skip
    db = tmp_path / "fm.sqlite"
    quiet = Progress(enabled=False)
    run_id = run_benchmark(parse_benchmark(raw), RunOptions(db=db), quiet, manager)
    budget = Budget("probe", coverage_trials=16, coverage_n=100, pairs=2, ascent_steps=2,
                    audited_inputs=4, attack_steps=2, attack_samples=16, orders=2)  # fmt: skip
    [audit] = audits(ResultStore(db), run_id, RunOptions(db=db), quiet, manager, budget=budget,
                     entropy=ENTROPY)  # fmt: skip
    result = check_coverage(audit)
    assert result.verdict == Verdict.SOUND, result.summary
    run, rebuilt = seen[0], seen[2:]  # the run's build, the audit's, then S1's
    assert len(rebuilt) == 2  # one linear round, one ball round
    for ctx in rebuilt:
        assert ctx["recipe_hash"] is not None and ctx["recipe_hash"] != run["recipe_hash"]
        assert len(ctx["recipe_hash"]) == len(run["recipe_hash"]) == 64
        same = ("dataset", "shape", "classes", "train_points", "seed", "withheld")
        assert {k: ctx[k] for k in same} == {k: run[k] for k in same}
        assert ctx["withheld"]  # the rebuilt method, as the run's, never sees the test split
        assert ctx["n"] == 100  # min(run's n, budget.coverage_n)
        assert ctx["artifacts"] is not None and not ctx["artifacts"].exists()  # removed after S1
        assert ctx["artifacts"].parents[2] != run["artifacts"].parents[2]  # not the cache
    assert result.evidence["classes"] == 10 and result.evidence["n"] == 100
    assert "sensitivity" in result.evidence  # S1 ran below the run's n: it says what is lost
    pairs = result.evidence["linear-784"]["classes"] + result.evidence["ball-784"]["classes"]
    assert all(a != b and 0 <= a < 10 and 0 <= b < 10 for a, b in pairs)


def test_s1_calibration_catches_a_plugin_that_patches_the_engine(tmp_path, manager, rigged_methods):
    """The patch moves 3 % of the votes onto the top class in every estimation draw: S0
    re-derives the patched counts consistently, S1's calibration against Binomial(n, p)
    on the exact models does not (the replay check catches it in a separate process)."""
    raw = {
        "name": "ball", "seed": 0, "dataset": {"name": "ball-2", "test_count": 30},
        "model": {"architecture": "ball-N", "trainer": "none"},
        "certification": {"n0": 32, "n": 2000, "alpha": 0.001},
        "methods": [{"name": "cohen", "settings": [{"sigma": 0.25}]}],
    }  # fmt: skip
    budget = Budget("tiny", coverage_trials=40, coverage_n=2000, pairs=2, ascent_steps=2,
                    audited_inputs=4, attack_steps=2, attack_samples=16, orders=2)  # fmt: skip
    quiet = Progress(enabled=False)
    for patched in (False, True):
        db = tmp_path / f"patched-{patched}.sqlite"
        around = rigged_methods.engine_patched() if patched else contextlib.nullcontext()
        with around:
            run_id = run_benchmark(parse_benchmark(raw), RunOptions(db=db), quiet, manager)
            [audit] = audits(ResultStore(db), run_id, RunOptions(db=db), quiet, manager,
                             budget=budget, entropy=ENTROPY)  # fmt: skip
            result = check_coverage(audit)
        calibration = result.evidence["calibration"]
        if patched:
            assert result.verdict == Verdict.VIOLATED, result.summary
            assert calibration["bias"] > 0 and calibration["p_bias"] < 1e-6, calibration
        else:
            assert result.verdict == Verdict.SOUND, result.summary
            assert calibration["p_bias"] > 1e-3 and calibration["p_dispersion"] > 1e-3


@pytest.mark.reproduction
@pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist").is_dir(),
    reason="needs Fashion-MNIST under /usr/share/datasets",
)
def test_every_rigged_method_is_caught_on_fashion_mnist_at_the_default_budget(
    tmp_path, manager, rigged_methods
):  # fmt: skip
    """One seed of the Fashion-MNIST table (784-d, the default MLP, 100 points, n = 10,000)
    at the `small` budget: every rigged method caught, no sound method flagged."""
    manager.register(rigged_methods, name="rigged")
    budget = BUDGETS["small"]
    common = {"name": "fashion-mnist"}
    caught = flags_per_check({m: {} for m in rigged_methods.METHODS}, [0], budget, manager,
                             tmp_path, entropy=ENTROPY, **common)  # fmt: skip
    caught |= flags_per_check({"cohen": {"sigma": 0.25}}, [0], budget, manager, tmp_path,
                              around=rigged_methods.engine_patched, label="engine-patch",
                              entropy=ENTROPY, **common)  # fmt: skip
    assert [m for m, row in caught.items() if row["any"] != 1] == [], caught
    alarms = flags_per_check(SOUND_METHODS, [100], budget, manager, tmp_path, entropy=ENTROPY,
                             **common)  # fmt: skip
    assert all(row["any"] == 0 for row in alarms.values()), alarms


def test_s4_corrects_over_the_subtests_that_ran_and_counts_the_confirmations_error(
    tmp_path, manager
):  # fmt: skip
    """Off the ball model S4 runs two sub-tests (intersections, attack): Holm over two, and
    the fewest significant confirmed violations are those of P(Binomial(m, α) >= k) +
    the confirmations' own error < 10⁻³ / 2 (scipy)."""
    from harness.audit.counterexamples import (
        CONFIRMATION_ERROR,
        attack_pvalue,
        check_counterexamples,
    )

    assert attack_pvalue(0, 16, 1e-3) == 1.0
    assert attack_pvalue(2, 16, 1e-3) == pytest.approx(stats.binom.sf(1, 16, 1e-3) + 1e-5)
    raw = {
        "name": "gm", "seed": 0, "dataset": {"name": "gauss-mix", "test_count": 20},
        "model": {"architecture": "mlp", "architecture_params": {"width": 16},
                  "trainer": "gaussian-augmentation", "trainer_params": {"epochs": 1}},
        "certification": {"n0": 20, "n": 300, "alpha": 0.001},
        "methods": [{"name": "cohen", "settings": [{"sigma": 0.25}]}],
    }  # fmt: skip
    db = tmp_path / "gm.sqlite"
    quiet = Progress(enabled=False)
    run_id = run_benchmark(parse_benchmark(raw), RunOptions(db=db), quiet, manager)
    budget = Budget("tiny", coverage_trials=8, coverage_n=100, pairs=2, ascent_steps=2,
                    audited_inputs=12, attack_steps=2, attack_samples=16, orders=2)  # fmt: skip
    [audit] = audits(ResultStore(db), run_id, RunOptions(db=db), quiet, manager, budget=budget)
    result = check_counterexamples(audit)
    attack = result.evidence["attack"]
    assert result.evidence["correction"].startswith("Holm over 2 sub-tests")
    assert attack["audited"] == 12 and attack["confirmation_error"] == CONFIRMATION_ERROR
    k = next(k for k in range(1, 13) if stats.binom.sf(k - 1, 12, 1e-3) + 1e-5 < 1e-3 / 2)
    assert attack["minimal_significant_count"] == k
