"""The replay check: σ recomputed alone and in a shuffled batch, samples re-drawn by a
process without third-party plugins (bit for bit on the run's arithmetic), and the
replication test elsewhere, whose statistics are checked against SciPy and by simulation.
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy import stats

from harness import (
    MethodSpec,
    SigmaProviderSpec,
    SigmaSmoothing,
    Unregularized,
    hookimpl,
)
from harness.audit.audit import BUDGETS
from harness.audit.auditor import run_checks
from harness.audit.evidence import check_evidence
from harness.audit.replay import check_replay, judge
from harness.audit.session import audits
from harness.foundation.progress import Progress
from harness.foundation.verdict import Verdict
from harness.mathematics.stats import mean_difference_z, replication_test, replication_z
from harness.running.preparation import RunOptions
from harness.store.store import ResultStore

ALL = replace(BUDGETS["small"], replay_inputs=1000)  # every certificate of a tiny row
ENTROPY = 0x47_2E91
"""The audits' entropy: fixed, so that the verdicts asserted here (a replication test's
among them) are the same every time (with fresh entropy a sound row is flagged 1 time in
1,000, as the checks promise)."""


def _audits(db, run_id, manager, budget=ALL, entropy=ENTROPY):
    store = ResultStore(db)
    try:
        return {(a.method.name, a.setting): a for a in audits(
            store, run_id, RunOptions(db=db), Progress(enabled=False), manager, budget=budget,
            entropy=entropy)}  # fmt: skip
    finally:
        store.close()


# --- the statistics --------------------------------------------------------------------


@pytest.mark.parametrize("stored, fresh, n", [(930, 941, 1000), (12, 30, 50), (500, 480, 1000)])
def test_replication_z_is_the_randomized_pit_of_the_hypergeometric(stored, fresh, n):
    """z = Φ⁻¹(P(X < k) + u·P(X = k)), X ~ Hypergeom(2n, k + f, n), by SciPy's own
    hypergeometric CDF and PMF (not the log-space formulas of harness.mathematics.stats)."""
    law = stats.hypergeom(2 * n, stored + fresh, n)
    for u in (0.0, 0.3, 0.999):
        expected = stats.norm.ppf(law.cdf(stored - 1) + u * law.pmf(stored))
        got = replication_z(np.array([stored]), np.array([fresh]), n, n, np.array([u]))[0]
        assert got == pytest.approx(expected, rel=1e-9, abs=1e-9)


@pytest.mark.slow
def test_replication_z_is_standard_normal_under_the_null_whatever_p():
    """Under the null the scores are exactly N(0, 1): simulated stored and fresh counts at
    the same p (from 0.5 to 1 − 1e-4, where counts hit n) give N(0, 1) by a KS test."""
    rng = np.random.default_rng(7)
    n = 1000
    p = np.concatenate([rng.uniform(0.5, 0.99, 2000), rng.uniform(0.99, 1 - 1e-4, 2000)])
    z = replication_z(rng.binomial(n, p), rng.binomial(n, p), n, n, rng.uniform(size=len(p)))
    assert np.all(np.isfinite(z))
    assert abs(z.mean()) < 4 / np.sqrt(len(z)) and abs(z.var() - 1) < 0.03
    assert stats.kstest(z, "norm").pvalue > 1e-3


def test_replication_test_p_values_and_holm():
    z = np.array([0.5, -1.2, 2.0, 0.1, 1.7, -0.3, 0.9, 1.1])
    test = replication_test(z, 0.05)
    m = len(z)
    assert test["p_bias"] == pytest.approx(2 * stats.norm.sf(abs(z.sum()) / np.sqrt(m)))
    d = (z**2).sum()
    assert test["p_dispersion"] == pytest.approx(2 * min(stats.chi2.cdf(d, m), stats.chi2.sf(d, m)))
    assert test["rejected"] == []
    shifted = replication_test(z + 3.0, 0.001)  # biased and over-dispersed
    assert shifted["rejected"][0] == "bias" and shifted["p_bias"] < 1e-10
    small = replication_test(np.full(16, 0.01), 0.001)  # counts set at their expectation
    assert small["rejected"] == ["dispersion"]


@pytest.mark.slow
def test_replication_test_false_alarm_rate_by_simulation():
    """Family-wise false-alarm rate of bias + dispersion (Holm) at level 0.2, 400
    simulated rows of m = 16 inputs, n = 1,000: within 3 standard errors of <= 0.2."""
    rng = np.random.default_rng(11)
    n, m, rows = 1000, 16, 400
    p = rng.uniform(0.5, 1 - 1e-4, (rows, m))
    z = replication_z(rng.binomial(n, p).ravel(), rng.binomial(n, p).ravel(), n, n,
                      rng.uniform(size=rows * m)).reshape(rows, m)  # fmt: skip
    rate = np.mean([bool(replication_test(row, 0.2)["rejected"]) for row in z])
    assert rate <= 0.2 + 3 * np.sqrt(0.2 * 0.8 / rows)


@pytest.mark.slow
def test_replication_test_detects_a_3_percent_inflation():
    """Stored top-class counts inflated by 3 % (capped at n), m = 16, n = 10,000, at the
    checks' threshold 10⁻³: measured power 50/50 seeds with p_A ~ U(0.5, 0.999), and
    50/50 with p_A ~ U(0.99, 0.99999), where most counts sit near n (0/50 false alarms
    on the honest counts of the same seeds)."""
    n, m = 10_000, 16
    for low, high in ((0.5, 0.999), (0.99, 0.99999)):
        caught = alarms = 0
        for seed in range(50):
            rng = np.random.default_rng(seed)
            p = rng.uniform(low, high, m)
            stored, fresh = rng.binomial(n, p), rng.binomial(n, p)
            inflated = np.minimum(n, np.round(stored * 1.03).astype(np.int64))
            u = rng.uniform(size=m)
            caught += bool(
                replication_test(replication_z(inflated, fresh, n, n, u), 1e-3)["rejected"]
            )
            alarms += bool(
                replication_test(replication_z(stored, fresh, n, n, u), 1e-3)["rejected"]
            )
        assert caught >= 48 and alarms <= 1, (low, high, caught, alarms)


def test_welch_scores_of_soft_means_are_standard_normal():
    """Soft smoothing has no count to condition on: the Welch score of two means of n
    outputs in [0, 1] is N(0, 1) in the limit; at n = 2,000 by simulation (Beta outputs)."""
    rng = np.random.default_rng(3)
    n, rows = 2000, 4000
    a, b = rng.uniform(0.5, 5, rows), rng.uniform(0.5, 5, rows)
    s = rng.beta(a[:, None], b[:, None], (rows, n))
    f = rng.beta(a[:, None], b[:, None], (rows, n))
    z = mean_difference_z(s.mean(1), (s**2).mean(1), f.mean(1), (f**2).mean(1), n)
    assert abs(z.mean()) < 4 / np.sqrt(rows) and abs(z.var() - 1) < 0.1
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert mean_difference_z(1.0, 1.0, 1.0, 1.0, n) == 0.0  # no spread, equal means


# --- the engine ------------------------------------------------------------------------


def test_padded_engine_replays_one_input_from_a_shard():
    """With every forward pass padded to the batch size, an input's counts re-drawn alone
    equal those it got inside a 32-input shard (a CPU BLAS may round a row differently
    for another number of rows, never for other rows' contents or positions)."""
    from harness import SamplingEngine

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 200), torch.nn.ReLU(),
                                torch.nn.Linear(200, 10)).eval()  # fmt: skip
    x = torch.rand(32, 1, 28, 28)
    engine = SamplingEngine(model, 10, torch.device("cpu"), 256, seed=5, pad_batches=True)
    shard = engine.counts(x, [0.5] * 32, list(range(100, 132)), 300, 1)
    for k in (0, 17, 31):
        alone = engine.counts(x[k : k + 1], [0.5], [100 + k], 300, 1)
        assert np.array_equal(alone[0], shard[k])


# --- the check -------------------------------------------------------------------------


@pytest.mark.slow
def test_replay_is_sound_on_the_runs_arithmetic_and_reruns_from_its_record(
    tmp_path, manager, replay_run
):
    db, run_id = replay_run(tmp_path, manager, ["cohen", {"name": "sukenik", "settings": [{}]}])
    for key, audit in _audits(db, run_id, manager, BUDGETS["small"]).items():
        result = check_replay(audit)
        assert result.verdict == Verdict.SOUND, (key, result.summary)
        evidence = result.evidence
        assert evidence["mode"] == "exact" and evidence["differences"] == []
        assert len(evidence["inputs"]) == 12 and evidence["replayed"]["base"]["estimation"]
        # the verdict is a function of the record and the certificates
        by_id = {int(c["input_id"]): c for c in audit.certificates}
        assert judge(evidence, by_id)[0] == Verdict.SOUND
    # the inputs are chosen with the audit's entropy (fresh here): recorded, reproducible
    a = _audits(db, run_id, manager, replace(BUDGETS["small"], replay_inputs=4), entropy=None)
    first = check_replay(a["cohen", "default"])
    again = next(iter(audits(ResultStore(db), run_id, RunOptions(db=db), Progress(enabled=False),
                             manager, budget=replace(BUDGETS["small"], replay_inputs=4),
                             entropy=a["cohen", "default"].entropy)))  # fmt: skip
    assert check_replay(again).evidence["inputs"] == first.evidence["inputs"]


@pytest.mark.slow
def test_an_audit_stops_its_replay_process_when_it_returns(
    tmp_path, manager, replay_run, live_processes
):
    """Each run_checks starts one replay process and stops it before it returns: audits
    one after another (a detection-power measurement audits hundreds) never stack them."""
    db, run_id = replay_run(tmp_path, manager, ["cohen"])

    def replayers() -> set[str]:  # this process's replay processes
        return set(live_processes("harness.running.redraw", parent=os.getpid()))

    before = replayers()  # (other tests' audits)
    for _ in range(3):
        results = run_checks(db, run_id, RunOptions(db=db), Progress(enabled=False), manager,
                             budget=BUDGETS["small"], entropy=ENTROPY, attack=False)  # fmt: skip
        [replay] = [r for rs in results.values() for r in rs if r.check == "replay"]
        assert replay.evidence["mode"] == "exact"  # the process answered
        assert replayers() <= before


@pytest.mark.slow
def test_an_engine_patched_at_import_is_caught_only_by_the_replay(
    tmp_path, manager, replay_run, engine_patch
):
    """A plugin that patches harness.SamplingEngine when imported pads the top class by
    3 %: the in-process checks see consistent counts (S0 sound), the replay process,
    which loads no third-party plugin, does not reproduce them."""
    manager.register(engine_patch(), name="engine-patch")
    db, run_id = replay_run(tmp_path, manager, ["cohen"])
    audit = _audits(db, run_id, manager)["cohen", "default"]
    assert check_evidence(audit).verdict == Verdict.SOUND
    result = check_replay(audit)
    assert result.verdict == Verdict.VIOLATED, result.summary
    mismatch = result.evidence["mismatch"]
    assert f"input {mismatch['input_id']}, stream {mismatch['stream']}" in result.summary
    assert mismatch["stream"] in (0, 1) and mismatch["stored"] != mismatch["replayed"]
    c = mismatch["class"]
    assert mismatch["stored"][c] > mismatch["replayed"][c]  # the padded top class


@pytest.mark.slow
def test_the_replication_test_on_another_arithmetic(tmp_path, manager, replay_run, engine_patch):
    """Recorded on another arithmetic (here: another CPU), the counts are replicated
    statistically with fresh noise: the honest row passes, the padded one fails
    (n = 4,000, 24 inputs)."""
    db, run_id = replay_run(tmp_path, manager, ["cohen"], n=4000, count=24, shard_size=8)
    plugin = engine_patch()
    manager.register(plugin, name="engine-patch")
    other = tmp_path / "other"
    other.mkdir()
    db_padded, padded_id = replay_run(other, manager, ["cohen"], n=4000, count=24, shard_size=8)
    plugin.unpatch()
    for path in (db, db_padded):
        with sqlite3.connect(path) as con:
            (text,) = con.execute("SELECT arithmetic FROM runs").fetchone()
            con.execute("UPDATE runs SET arithmetic = ?",
                        (json.dumps(json.loads(text) | {"device_name": "another CPU"}),))  # fmt: skip
    honest = check_replay(_audits(db, run_id, manager)["cohen", "default"])
    assert honest.verdict == Verdict.SOUND, honest.summary
    assert honest.evidence["mode"] == "replication" and len(honest.evidence["z"]) == 24
    assert "device_name: 'another CPU' →" in honest.summary
    padded = check_replay(_audits(db_padded, padded_id, manager)["cohen", "default"])
    assert padded.verdict == Verdict.VIOLATED, padded.summary
    assert padded.evidence["test"]["rejected"] and padded.evidence["test"]["bias"] > 0


class BatchDependent:
    """σ that depends on how many inputs it is asked about at once."""

    regularity = Unregularized()

    def __call__(self, x):
        return torch.full((len(x),), 0.25 + 0.01 * len(x), device=x.device)


class Stateful:
    """σ that drifts with every call."""

    regularity = Unregularized()

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x):
        self.calls += 1
        return torch.full((len(x),), 0.25 + 1e-3 * self.calls, device=x.device)


class SigmaPlugins:
    """σ-providers that depend on the batch or on state, certified by Cohen's certifier."""

    @hookimpl
    def idrs_register_sigma_providers(self, register):
        register(SigmaProviderSpec("batch-dependent", lambda context, params: BatchDependent()))
        register(SigmaProviderSpec("stateful", lambda context, params: Stateful()))

    @hookimpl
    def idrs_register_methods(self, register):
        register(MethodSpec("batch-dependent", "batch-dependent", "cohen", {}))
        register(MethodSpec("stateful", "stateful", "cohen", {}))


@pytest.mark.slow
def test_a_sigma_that_depends_on_the_batch_or_on_state_is_violated(tmp_path, manager, replay_run):
    manager.register(SigmaPlugins(), name="sigma-plugins")
    db, run_id = replay_run(tmp_path, manager, ["batch-dependent", "stateful"])
    found = _audits(db, run_id, manager)
    for name in ("batch-dependent", "stateful"):
        result = check_replay(found[name, "default"])
        assert result.verdict == Verdict.VIOLATED, (name, result.summary)
        mismatch = result.evidence["mismatch"]
        assert mismatch["quantity"] == "sigma" and mismatch["alone"] != mismatch["batch"]
        assert (f"input {mismatch['input_id']}: σ recomputed alone" in result.summary
                and repr(mismatch["batch"]) in result.summary)  # fmt: skip


@pytest.mark.parametrize("mode, relative, flagged", [
    ("exact", 1e-15, False), ("exact", 1e-3, True), ("fresh", 1e-3, True), ("exact", 0.0, False),
    ("fresh", 1e-9, False)])  # fmt: skip
def test_sigma_is_held_to_a_tolerance_on_every_arithmetic(mode, relative, flagged):
    """σ recomputed may round its last bits otherwise, on another CPU (exp) and on the
    run's own (a BLAS that rounds a row of a gradient by its position in the batch), so
    it is held to SIGMA_TOLERANCE against the stored σ on every arithmetic."""
    from harness.audit.replay import SIGMA_TOLERANCE

    stored = 0.12213990144007479
    here = stored * (1 + relative)
    evidence = {"inputs": [7], "sigma": {"alone": [here], "batch": [here], "order": [0]},
                "mode": mode, "replayed": {}, "fresh": {}, "u": [[0.5], [0.5]]}  # fmt: skip
    _, summary, detail = judge(evidence, {7: {"sigma": stored, "draws": {}}})
    sigma_flagged = "mismatch" in detail and detail["mismatch"]["quantity"] == "sigma"
    assert sigma_flagged == flagged, summary
    if flagged:
        assert f"within {SIGMA_TOLERANCE:g} (relative)" in summary


@pytest.mark.parametrize("mode, relative, flagged", [
    ("exact", 1e-15, False), ("exact", 1e-3, True), ("fresh", 1e-3, True),
    ("fresh", 1e-9, False)])  # fmt: skip
def test_sigma_alone_and_in_a_batch_are_held_to_the_same_rule(mode, relative, flagged):
    """σ alone and σ in a batch may differ in their last bits on any arithmetic (the
    ascent's input gradient on an AVX-512 CPU): held to the tolerance everywhere."""
    stored = 0.12213990144007479
    evidence = {"inputs": [7], "mode": mode, "replayed": {}, "fresh": {}, "u": [[0.5], [0.5]],
                "sigma": {"alone": [stored * (1 + relative)], "batch": [stored], "order": [0]}}  # fmt: skip
    _, summary, detail = judge(evidence, {7: {"sigma": stored, "draws": {}}})
    assert ("mismatch" in detail and detail["mismatch"]["how"] == "alone vs batch") == flagged
    if flagged:
        assert "σ recomputed alone (a batch of one)" in summary


class SmoothedSigma:
    """σ(x) chosen by a smoothed linear classifier between two levels (a σ-smoothing)."""

    regularity = Unregularized()

    def __init__(self, context, architecture):
        model = context.registry.get("models", "linear-N").build((2,), 2, {"offset": 0.2})
        self.smoothing = SigmaSmoothing(model, 0.5, (0.25, 0.5), 2e-4, architecture,
                                        {"offset": 0.2})  # fmt: skip

    def __call__(self, x):
        raise AssertionError("the harness draws a σ-smoothing's σ itself")


class SmoothingPlugins:
    @hookimpl
    def idrs_register_sigma_providers(self, register):
        register(SigmaProviderSpec("smoothed", lambda c, p: SmoothedSigma(c, "linear-N")))
        register(SigmaProviderSpec("smoothed-opaque", lambda c, p: SmoothedSigma(c, None)))

    @hookimpl
    def idrs_register_methods(self, register):
        register(MethodSpec("smoothed", "smoothed", "cohen", {}))
        register(MethodSpec("smoothed-opaque", "smoothed-opaque", "cohen", {}))


@pytest.mark.slow
def test_a_sigma_smoothing_is_replayed_from_its_saved_estimator(tmp_path, manager, replay_run):
    """The σ-estimator's state dict is saved with the run; the replay process rebuilds
    it (a built-in architecture) and re-draws streams 4/5; an edited σ draw is caught.
    One that declares no architecture cannot be replayed: an error that says why."""
    manager.register(SmoothingPlugins(), name="smoothing-plugins")
    db, run_id = replay_run(tmp_path, manager, ["smoothed", "smoothed-opaque"])
    found = _audits(db, run_id, manager)
    result = check_replay(found["smoothed", "default"])
    assert result.verdict == Verdict.SOUND, result.summary
    assert len(result.evidence["replayed"]["sigma"]["estimation"]) == 12
    with pytest.raises(Exception, match="declares no architecture"):
        check_replay(found["smoothed-opaque", "default"])
    with sqlite3.connect(db) as con:
        input_id, text = con.execute(
            "SELECT input_id, draws FROM certificates WHERE method = 'smoothed' LIMIT 1"
        ).fetchone()
        draws = json.loads(text)
        counts = draws["sigma"]["estimation"]
        top = int(np.argmax(counts))
        counts[top], counts[1 - top] = counts[top] - 1, counts[1 - top] + 1
        con.execute("UPDATE certificates SET draws = ? WHERE method = 'smoothed' AND input_id = ?",
                    (json.dumps(draws), input_id))  # fmt: skip
    edited = check_replay(_audits(db, run_id, manager)["smoothed", "default"])
    assert edited.verdict == Verdict.VIOLATED
    assert f"input {input_id}, stream 5 (sigma estimation)" in edited.summary


def test_a_run_in_cudnn_benchmark_mode_replays_only_statistically():
    """cuDNN's benchmark mode times algorithms per process: such a run matches no
    arithmetic, not even its own, so its replay is the replication test, never a
    bit-for-bit comparison that could raise a false alarm. The heuristic mode matches
    itself; a CPU fingerprint names neither cuDNN nor a noise kernel (so CPU runs recorded
    before those keys existed still match)."""
    from harness.engine.arithmetic import KEYS, differences, fingerprint
    from harness.foundation.protocol import FORWARD_OPTIONS, CertificationProtocol

    here = fingerprint("cpu", CertificationProtocol(noise="philox-v1"), 256)
    assert set(here) == set(KEYS) - set(FORWARD_OPTIONS)  # each option only when on
    assert here["cudnn"] is None and here["noise_kernel"] is None
    older = {k: v for k, v in here.items() if k not in ("cudnn", "noise_kernel")}
    assert differences(older, here) == []
    cuda = here | {"device_type": "cuda", "cudnn": "heuristic 91002",
                   "noise_kernel": "triton 3.6.0"}  # fmt: skip
    assert differences(cuda, cuda) == []
    timed = cuda | {"cudnn": "benchmark 91002"}
    [why] = differences(timed, timed)
    assert "cuDNN timed its algorithms" in why
    assert differences(cuda, cuda | {"noise_kernel": "torch ops"}) == [
        "noise_kernel: 'triton 3.6.0' → 'torch ops'"
    ]


@pytest.mark.gpu
def test_a_cuda_run_replays_bit_for_bit(tmp_path, manager, replay_run):
    from harness.running.benchmark import parse_benchmark
    from harness.running.runner import run_benchmark

    raw = {"name": "cuda", "device": "cuda", "dataset": {"name": "ball-2", "test_count": 8},
           "model": {"architecture": "ball-N", "trainer": "none"},
           "certification": {"n0": 64, "n": 2000, "batch_size": 512}, "methods": [{"name": "cohen"}]}  # fmt: skip
    db = tmp_path / "cuda.sqlite"
    run_id = run_benchmark(
        parse_benchmark(raw), RunOptions(db=db), Progress(enabled=False), manager
    )
    result = check_replay(_audits(db, run_id, manager)["cohen", "default"])
    assert result.verdict == Verdict.SOUND and result.evidence["mode"] == "exact", result.summary
    assert result.evidence["arithmetic"]["noise_kernel"].startswith("triton")  # the fused kernel
