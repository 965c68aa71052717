"""Dual randomized smoothing (Sun et al. 2026): the plugin ``dual-rs``, its α accounting,
its training, and the audit of its σ-smoothing (broken variants caught)."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import types
from importlib.metadata import entry_points

import numpy as np
import pytest
import torch
from scipy import stats

from harness import hookimpl
from harness.audit.analytic import LinearClassifier
from harness.audit.audit import Budget
from harness.audit.auditor import run_checks
from harness.audit.session import audits
from harness.audit.sigma_smoothing import probe_constancy
from harness.cli.main import main
from harness.engine.draws import HARD, Draws, Evidence
from harness.engine.sampling import SamplingEngine
from harness.foundation.data import Dataset
from harness.foundation.errors import ParameterError
from harness.foundation.progress import Progress
from harness.foundation.protocol import CertificationProtocol
from harness.foundation.regularity import Unregularized
from harness.foundation.verdict import Verdict, overall
from harness.plugin.components import (
    BuildContext,
    CertifierSpec,
    MethodSpec,
    RunMemo,
    SigmaProviderSpec,
)
from harness.plugin.manager import PluginManager
from harness.running.benchmark import parse_benchmark
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark
from harness.store.store import ResultStore
from plugins.dual_rs import METHOD_DEFAULTS, check_params
from plugins.dual_rs.certifier import DualCertifier
from plugins.dual_rs.estimator import SmoothedSigmaChoice
from plugins.dual_rs.training import fit_estimator, obtain_estimator

TINY = Budget("tiny", coverage_trials=40, coverage_n=100, pairs=4, ascent_steps=4,
              audited_inputs=12, attack_steps=3, attack_samples=16, orders=4)  # fmt: skip
ENTROPY = 0x47_D0A1
"""The audits' entropy: fixed, so that the verdicts asserted here are the same every time
(with fresh entropy a sound row is flagged 1 time in 1,000, as the checks promise)."""
ALPHA, SPLIT, LEVELS, SIGMA_V = 0.01, 0.5, (0.25, 0.5), 0.25


# --- the method's parameters and registration -------------------------------------------


def test_registered_through_the_entry_point():
    [point] = [e for e in entry_points(group="idrs_bench") if e.name == "dual-rs"]
    assert point.value == "plugins.dual_rs"
    registry = PluginManager(third_party=False).registry
    assert registry.provided_by("dual-rs") == {"certifiers": ["dual-rs"], "methods": ["dual-rs"],
                                               "sigma_providers": ["dual-rs-estimator"]}  # fmt: skip
    method = registry.get("methods", "dual-rs")
    assert (method.sigma_provider, method.certifier) == ("dual-rs-estimator", "dual-rs")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"levels": [0.25, -0.5]}, "levels must be positive finite numbers; -0.5"),
        ({"levels": [0.0, 0.5]}, "levels must be positive finite numbers; 0.0"),
        ({"levels": [0.25]}, "levels must be a list of at least two noise levels"),
        ({"levels": [0.25, 0.25]}, "levels must be distinct"),
        ({"estimator_sigma": 0}, "estimator_sigma (the σ-estimator's own noise level) must be > 0, got 0"),
        ({"estimator_sigma": -0.5}, "must be > 0, got -0.5"),
        ({"alpha_split": 0}, "alpha_split (the share of α spent on the σ choice) must lie in (0, 1), got 0"),
        ({"alpha_split": 1.0}, "must lie in (0, 1), got 1.0"),
        ({"alpha_split": 1.5}, "must lie in (0, 1), got 1.5"),
        ({"label_samples": 0}, "label_samples must be an integer >= 1, got 0"),
    ],
)  # fmt: skip
def test_bad_parameters_are_one_line_errors_before_any_work(tmp_path, capsys, change, message):
    check_params(METHOD_DEFAULTS)
    with pytest.raises(ParameterError, match=r"must|distinct"):
        check_params({**METHOD_DEFAULTS, **change})
    spec = tmp_path / "spec.toml"
    spec.write_text('[dataset]\nname = "cone-4"\n[model]\narchitecture = "mlp"\n'
                    'trainer = "gaussian-augmentation"\n[certification]\nn0 = 10\nn = 20\n')  # fmt: skip
    setting = ", ".join(f"{k} = {json.dumps(v)}" for k, v in change.items())
    code = main(["run", str(spec), "--db", str(tmp_path / "r.sqlite"), "--quiet", "--set",
                 f'methods=[{{name = "dual-rs", settings = [{{ {setting} }}]}}]'])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "r.sqlite").exists()  # nothing ran: no model trained, no run stored


# --- the certificate: min(R_σ, R_c) with α split, against scipy --------------------------


def _expected(sel_s, est_s, sel_b, est_b, alpha, alpha_sigma, sigma_v, levels):
    """(prediction, radius, σ) of one dual-RS certificate, computed with scipy only."""
    level = int(np.argmax(sel_s))
    n_s, k_s = int(np.sum(est_s)), int(est_s[level])
    p_s = stats.beta.ppf(alpha_sigma, k_s, n_s - k_s + 1) if k_s else 0.0
    top = int(np.argmax(sel_b))
    n_b, k_b = int(np.sum(est_b)), int(est_b[top])
    p_b = stats.beta.ppf(alpha - alpha_sigma, k_b, n_b - k_b + 1) if k_b else 0.0
    if p_s <= 0.5 or p_b <= 0.5:
        return -1, 0.0, levels[level]
    r_sigma, r_c = sigma_v * stats.norm.ppf(p_s), levels[level] * stats.norm.ppf(p_b)
    return top, min(r_sigma, r_c), levels[level]


def test_certifier_caps_at_r_sigma_and_splits_alpha_as_scipy_computes():
    n = 1000
    # per input: σ-estimator counts (selection, estimation), base counts at σ(x)
    cases = [
        ([0, 20], [3, 997], [0, 0, 20], [1, 4, 995]),  # both sure: min of two radii
        ([0, 20], [80, 920], [0, 0, 20], [0, 0, 1000]),  # R_σ < R_c: capped
        ([20, 0], [1000, 0], [0, 20, 0], [0, 900, 100]),  # R_c < R_σ
        ([11, 9], [520, 480], [0, 0, 20], [0, 0, 1000]),  # σ level not certified: abstain
        ([0, 20], [0, 1000], [10, 10, 0], [480, 500, 20]),  # base abstains
    ]
    sel_s, est_s, sel_b, est_b = (np.array([c[i] for c in cases]) for i in range(4))
    alpha_sigma = SPLIT * ALPHA
    evidence = Evidence.from_counts(
        sel_b, est_b, np.array(LEVELS)[sel_s.argmax(1)], ALPHA - alpha_sigma
    )
    drawn = Draws(HARD, 20, n, np.full(len(cases), SIGMA_V), sel_s, est_s, levels=LEVELS,
                  alpha=alpha_sigma)  # fmt: skip
    claims = DualCertifier().certify(dataclasses.replace(evidence, sigma_draws=drawn))
    for case, claim in zip(cases, claims, strict=True):
        prediction, radius, _ = _expected(*map(np.array, case), ALPHA, alpha_sigma, SIGMA_V, LEVELS)
        assert claim.prediction == prediction
        assert claim.radius == pytest.approx(radius, rel=1e-9, abs=1e-12)
    assert claims[1].radius == pytest.approx(claims[1].evidence["r_sigma"], rel=1e-12)
    assert claims[1].radius < claims[1].evidence["r_classifier"]
    assert claims[2].radius == pytest.approx(claims[2].evidence["r_classifier"], rel=1e-12)
    assert claims[3].predict == -1  # the estimator's PREDICT cannot tell the level apart


# --- a fixed σ-estimator whose level changes on a hyperplane: variants, sound and broken ---


class HalfPlane(torch.nn.Module):
    """σ-estimator logits (−s·x_1, s·x_1): level 1 where x_1 > 0, level 0 elsewhere."""

    def forward(self, x):
        t = 1e3 * x.flatten(1)[:, :1]
        return torch.cat([-t, t], dim=1)


class RawLevels:
    """σ(x) = levels[argmax h(x)] of the *unsmoothed* estimator: no R_σ, no α share."""

    regularity = Unregularized()

    def __call__(self, x):
        return torch.tensor(LEVELS, device=x.device)[HalfPlane()(x).argmax(1)].double()


class Uncapped(DualCertifier):
    """Dual RS without the local-constancy cap: Cohen's claim at σ(x) whatever R_σ is."""

    def certify(self, evidence):
        return super(DualCertifier, self).certify(evidence)


class Unsplit(DualCertifier):
    """Dual RS whose base bound holds at the run's whole α (the σ choice's share unpaid)."""

    def certify(self, evidence):
        whole = dataclasses.replace(evidence, alpha=evidence.alpha + evidence.sigma_draws.alpha)
        return super().certify(whole)


def _variants_plugin():
    module = types.ModuleType("dual_variants")

    def smoothed(context, params):  # the built-in linear-N model, so the replay rebuilds it
        return SmoothedSigmaChoice(LinearClassifier(2, 0.0), LEVELS, SIGMA_V,
                                   SPLIT * context.protocol.alpha, "linear-N", {"offset": 0.0})  # fmt: skip

    @hookimpl
    def idrs_register_sigma_providers(register):
        register(SigmaProviderSpec("half-plane-smoothed", smoothed))
        register(SigmaProviderSpec("half-plane-raw", lambda context, params: RawLevels()))

    @hookimpl
    def idrs_register_certifiers(register):
        register(CertifierSpec("dual-uncapped", lambda c, p, s: Uncapped()))
        register(CertifierSpec("dual-unsplit", lambda c, p, s: Unsplit()))

    @hookimpl
    def idrs_register_methods(register):
        register(MethodSpec("dual-half-plane", "half-plane-smoothed", "dual-rs"))
        register(MethodSpec("dual-unsmoothed", "half-plane-raw", "cohen"))
        register(MethodSpec("dual-uncapped", "half-plane-smoothed", "dual-uncapped"))
        register(MethodSpec("dual-unsplit", "half-plane-smoothed", "dual-unsplit"))

    module.idrs_register_sigma_providers = idrs_register_sigma_providers
    module.idrs_register_certifiers = idrs_register_certifiers
    module.idrs_register_methods = idrs_register_methods
    return module


def _run(tmp_path, manager, methods, count=40, seed=0):
    raw = {
        "name": "dual", "seed": seed,
        "dataset": {"name": "ball-2", "test_count": count},
        "model": {"architecture": "ball-N", "trainer": "none"},
        "certification": {"n0": 32, "n": 500, "alpha": ALPHA, "batch_size": 4096},
        "methods": methods,
    }  # fmt: skip
    db = tmp_path / "r.sqlite"
    run_id = run_benchmark(
        parse_benchmark(raw), RunOptions(db=db), Progress(enabled=False), manager
    )
    return db, run_id


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """One ball-2 run of the four half-plane variants, audited at the tiny budget."""
    manager = PluginManager(third_party=False)
    manager.register(_variants_plugin(), name="dual-variants")
    tmp = tmp_path_factory.mktemp("variants")
    names = ["dual-half-plane", "dual-unsmoothed", "dual-uncapped", "dual-unsplit"]
    db, run_id = _run(tmp, manager, [{"name": m} for m in names])
    results = run_checks(
        db, run_id, RunOptions(db=db), Progress(enabled=False), manager, budget=TINY,
        entropy=ENTROPY,
    )  # fmt: skip
    checks = {method: {r.check: r for r in rs} for (method, _), rs in results.items()}
    return db, run_id, manager, checks


def test_the_stored_certificates_follow_the_alpha_split_as_scipy_computes(variants):
    db, *_ = variants
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT prediction, radius, sigma, alpha, draws, evidence FROM "
                           "certificates WHERE method = 'dual-half-plane'").fetchall()  # fmt: skip
    levels_used, capped = set(), 0
    for prediction, radius, sigma, alpha, draws, claimed in rows:
        d = json.loads(draws)
        s, b = d["sigma"], d["base"]
        assert alpha == ALPHA and s["alpha"] == SPLIT * ALPHA and s["sigma"] == SIGMA_V
        assert b["n0"] == 32 and b["n"] == 500 and s["n0"] == 32 and s["n"] == 500
        expected = _expected(*(np.array(v) for v in (s["selection"], s["estimation"],
                                                     b["selection"], b["estimation"])),
                             ALPHA, SPLIT * ALPHA, SIGMA_V, LEVELS)  # fmt: skip
        assert (prediction, sigma) == (expected[0], expected[2])
        assert radius == pytest.approx(expected[1], rel=1e-9, abs=1e-12)
        levels_used.add(sigma)
        claimed = json.loads(claimed)
        capped += prediction >= 0 and claimed["r_sigma"] < claimed["r_classifier"]
    assert levels_used == set(LEVELS) and capped > 0  # both levels used, R_σ binding somewhere


def test_dual_rs_with_a_varying_sigma_is_sound_in_every_check(variants):
    *_, checks = variants
    fixed = checks["dual-half-plane"]
    assert overall(list(fixed.values())) == Verdict.SOUND, {k: r.summary for k, r in fixed.items()}
    # S1 ran certified trials on the exact classifiers; S2/S3 probed the σ-estimator
    assert fixed["coverage"].evidence["ball-2"]["certified"] > 0
    assert fixed["sigma-regularity"].evidence["with_r_sigma"] > 0
    assert fixed["worst-case-justification"].evidence["certified"] > 0


def test_an_unsmoothed_sigma_estimator_is_caught(variants):
    """σ = the estimator's raw argmax, Cohen's radius at it: σ jumps inside certified balls."""
    *_, checks = variants
    raw = checks["dual-unsmoothed"]
    assert raw["worst-case-justification"].verdict == Verdict.UNJUSTIFIED
    assert overall(list(raw.values())) in (Verdict.UNJUSTIFIED, Verdict.VIOLATED)


@pytest.mark.parametrize(
    ("method", "quantity"), [("dual-uncapped", "R_σ"), ("dual-unsplit", "bound")]
)
def test_a_missing_cap_or_an_unsplit_alpha_is_violated_by_s0(variants, method, quantity):
    *_, checks = variants
    evidence = checks[method]["evidence"]
    assert evidence.verdict == Verdict.VIOLATED, evidence.summary
    assert quantity in evidence.evidence["mismatches"]
    assert overall(list(checks[method].values())) == Verdict.VIOLATED


def test_the_constancy_search_finds_level_changes_beyond_r_sigma_and_none_within(variants):
    """S2/S3's search, held to the half-plane estimator whose smoothed level changes exactly
    at x_1 = 0: balls three times R_σ cross it (flagged), balls of R_σ do not."""
    db, run_id, manager, _ = variants
    store = ResultStore(db)
    try:
        [audit] = [a for a in audits(store, run_id, RunOptions(db=db), Progress(enabled=False),
                                     manager, budget=TINY, entropy=ENTROPY)
                   if a.method.name == "dual-half-plane"]  # fmt: skip
    finally:
        store.close()
    smoothing = audit.sigma_provider.smoothing
    x = audit.inputs.float()
    distance = x[:, 0].abs().double().numpy()
    near = np.flatnonzero((distance > 0.15) & (distance < 0.4))[:6]
    assert len(near) >= 3
    level = (x[near, 0] > 0).long().numpy()
    cross = probe_constancy(audit, smoothing, x[near], level, 3 * distance[near], "test/cross")
    inside = probe_constancy(audit, smoothing, x[near], level, 0.9 * distance[near], "test/in")
    assert cross.changed.all() and not inside.changed.any()


# --- the trained method end to end --------------------------------------------------------

SMALL = {"levels": [0.25, 0.5], "estimator_sigma": 0.25, "train_examples": 256,
         "label_samples": 16, "epochs": 3, "estimator_params": {"width": 16}}  # fmt: skip


def test_the_trained_method_is_audited_sound_next_to_cohen(tmp_path):
    manager = PluginManager(third_party=False)
    db, run_id = _run(tmp_path, manager, [{"name": "dual-rs", "settings": [SMALL]},
                                          {"name": "cohen", "settings": [{"sigma": 0.25}]}], count=24)  # fmt: skip
    results = run_checks(
        db, run_id, RunOptions(db=db), Progress(enabled=False), manager, budget=TINY,
        entropy=ENTROPY,
    )  # fmt: skip
    [dual] = [rs for (m, _), rs in results.items() if m == "dual-rs"]
    by_name = {r.check: r for r in dual}
    assert overall(dual) == Verdict.SOUND, {r.check: r.summary for r in dual}
    assert {"evidence", "coverage", "sigma-regularity", "worst-case-justification",
            "counterexamples"} <= {r.check for r in dual if r.verdict == Verdict.SOUND}  # fmt: skip
    assert by_name["coverage"].evidence["ball-2"]["certified"] > 0


def _context(tmp_path, monkeypatch, linear_model, seed=0):
    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path))
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(6, generator=gen)
    x = torch.rand(300, 6, generator=gen)
    y = (x @ w > float(torch.median(x @ w))).long()
    dataset = Dataset("tiny", x, y, x[:10], y[:10], 2)
    model = linear_model(4 * w, 4 * float(torch.median(x @ w)))
    return BuildContext(
        dataset, model, torch.device("cpu"), seed, CertificationProtocol(n0=10, n=50, alpha=0.01),
        SamplingEngine(model, 2, torch.device("cpu"), 256, seed), Progress(enabled=False),
        registry=PluginManager(third_party=False).registry, recipe_hash="f" * 64,
    )  # fmt: skip


def test_a_sigma_estimator_built_elsewhere_is_drawn_where_the_run_draws(
    tmp_path, monkeypatch, linear_model
):  # fmt: skip
    """A plugin may build its σ-estimator on the CPU; the harness moves it to the run's
    device when it builds the method (here the ``meta`` device stands for a GPU)."""
    from harness.certification.method import build_method

    manager = PluginManager(third_party=False)
    manager.register(_variants_plugin(), name="dual-variants")
    context = dataclasses.replace(_context(tmp_path, monkeypatch, linear_model),
                                  registry=manager.registry, device=torch.device("meta"))  # fmt: skip
    provider, _ = build_method(manager.registry, "dual-half-plane", {}, context)
    assert {b.device.type for b in provider.smoothing.model.buffers()} == {"meta"}


def test_training_is_deterministic_and_depends_on_the_seed(tmp_path, monkeypatch, linear_model):
    params = {**METHOD_DEFAULTS, **SMALL}
    context = _context(tmp_path, monkeypatch, linear_model)
    first, summary = fit_estimator(context, params)
    again, _ = fit_estimator(dataclasses.replace(context, memos=RunMemo()), params)
    other, _ = fit_estimator(dataclasses.replace(context, seed=1, memos=RunMemo()), params)
    a, b, c = (m.state_dict() for m in (first, again, other))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert sum(summary["labels"]) == 256 and len(summary["labels"]) == 2


def test_the_fit_is_cached_under_the_base_models_hash(tmp_path, monkeypatch, linear_model):
    from plugins.dual_rs import training

    calls = []
    original = training.fit_estimator
    monkeypatch.setattr(training, "fit_estimator", lambda *a: calls.append(1) or original(*a))
    params = {**METHOD_DEFAULTS, **SMALL}
    context = _context(tmp_path, monkeypatch, linear_model)
    provider = obtain_estimator(context, params)
    assert provider.smoothing.alpha == pytest.approx(0.5 * 0.01)
    assert provider.smoothing.levels == (0.25, 0.5) and provider.smoothing.noise == 0.25
    assert obtain_estimator(context, params).network is provider.network  # memo: one fit per run
    fresh = obtain_estimator(dataclasses.replace(context, memos=RunMemo()), params)  # a new process
    assert len(calls) == 1  # loaded from the artifact directory, not refitted
    saved = list((tmp_path / "plugins" / "dual-rs" / ("f" * 64)).glob("sigma-estimator-*.pt"))
    assert len(saved) == 1
    a, b = provider.network.state_dict(), fresh.network.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    obtain_estimator(dataclasses.replace(context, memos=RunMemo()), {**params, "epochs": 4})
    assert len(calls) == 2  # another fit parameter: another file
    with pytest.raises(Exception, match="drawn by the harness"):
        provider(torch.zeros(1, 6))  # nothing may take σ from the method itself
