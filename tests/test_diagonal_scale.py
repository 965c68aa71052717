"""A diagonal noise scale (issue 59, items 1 and 2): a σ-provider answers σ per input
dimension, the engine draws x + σ_i·ε_i with the scalar path's ε, the certificate records
the scale and the ellipsoid it certifies, S0 and replay audit it and the other checks
refuse it (an audit never passes by default)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy.stats import beta, norm

from harness.audit.audit import BUDGETS
from harness.audit.auditor import run_checks
from harness.audit.evidence import Declaration, check_evidence, rederive
from harness.audit.replay import check_replay, judge
from harness.audit.session import audits
from harness.certification.certify import certify_drawn, checked_sigma
from harness.engine.draws import Claim
from harness.engine.noise import gaussian_noise, noise_key, noisy_batch
from harness.engine.sampling import SamplingEngine
from harness.engine.scale import (
    decode_scale,
    ellipsoid_region,
    encode_scale,
    geometric_mean,
    recorded_scale,
)
from harness.foundation.errors import ContractError, IdrsError
from harness.foundation.progress import Progress
from harness.foundation.protocol import CertificationProtocol
from harness.foundation.verdict import Verdict
from harness.reports.leaderboard.source import export_runs, read_export
from harness.running.preparation import RunOptions
from harness.store.store import ResultStore
from harness.store.storedrun import load_runs
from plugins.anisotropic.certifier import AnisotropicCertifier
from plugins.cohen.certifier import CohenCertifier

ENTROPY = int("5ca1ed", 16)
SCALE = (0.25, 0.5)
"""The fixed scale of the built-in ``anisotropic-fixed`` (σ = 0.25, ratio 2) on ``ball-2``."""


class Recording(torch.nn.Module):
    """A linear classifier that keeps a copy of every batch it is given."""

    def __init__(self, dims: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(dims, 3)
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.detach().clone())
        return self.linear(x.flatten(1))


def _batches(noise: str, sigma, x, ids, start: int = 0) -> torch.Tensor:
    """Every noisy sample an engine of scheme ``noise`` feeds the model, in order."""
    torch.manual_seed(0)
    model = Recording(x[0].numel()).eval()
    engine = SamplingEngine(model, 3, torch.device("cpu"), 96, seed=11, noise=noise)
    engine.counts(x, sigma, ids, 300, 1, start=start)
    return torch.cat(model.seen)


@pytest.mark.parametrize("noise", ["philox-v1", "block-v1"])
@pytest.mark.parametrize("shape", [(7,), (1, 4, 4), (3, 5, 2)])
def test_a_constant_scale_draws_the_scalar_samples_bit_for_bit(noise, shape):
    """A scale of c in every dimension ([B, d] or [B, *input_shape]) feeds the model
    exactly the samples of σ = c: ε is drawn as for a scalar σ and multiplied per axis."""
    x = torch.rand(4, *shape, generator=torch.Generator().manual_seed(1))
    ids = [9, 2, 700, 3]
    sigma = np.array([0.25, 0.5, 0.123456789, 1.7])
    scalar = _batches(noise, sigma, x, ids, start=5)
    flat = np.repeat(sigma[:, None], x[0].numel(), axis=1)
    for scale in (flat, flat.reshape(4, *shape), torch.from_numpy(flat).float()):
        assert torch.equal(_batches(noise, scale, x, ids, start=5), scalar)


@pytest.mark.parametrize("noise", ["philox-v1", "block-v1"])
def test_each_axis_is_scaled_by_its_own_sigma(noise):
    """At x = 0 a sample is scale·ε coordinate by coordinate, ε the noise of σ = 1."""
    x = torch.zeros(2, 6)
    scale = np.array([[0.1, 0.2, 0.4, 0.8, 1.6, 3.2], [2.0, 1.0, 0.5, 0.25, 0.125, 4.0]])
    unit = _batches(noise, np.ones(2), x, [4, 5])
    scaled = _batches(noise, scale, x, [4, 5])
    rows = torch.tensor([0] * 300 + [1] * 300)
    assert torch.equal(scaled, unit * torch.from_numpy(scale).float()[rows])


def test_the_torch_ops_take_a_scale_per_coordinate():
    x = torch.rand(3, 10)
    keys = torch.tensor([noise_key(0, 1, i) for i in range(3)])
    rows, samples = torch.tensor([2, 0, 1, 2]), torch.tensor([5, 0, 1, 99])
    sigma = torch.tensor([0.5, 1.0, 2.0])
    scalar = noisy_batch(x, sigma, keys, rows, samples, torch.empty(4, 10))
    flat = noisy_batch(x, sigma[:, None].expand(3, 10).contiguous(), keys, rows, samples,
                       torch.empty(4, 10))  # fmt: skip
    assert torch.equal(flat, scalar)
    scale = torch.linspace(0.1, 3.0, 30).view(3, 10)
    eps = gaussian_noise(keys[rows], samples, 10)
    got = noisy_batch(x, scale, keys, rows, samples, torch.empty(4, 10))
    assert torch.equal(got, torch.addcmul(x[rows], scale[rows], eps))


def test_a_scale_round_trips_and_its_geometry_has_closed_forms():
    scale = np.array([1.0, 4.0, 0.1, 1e-3], dtype=np.float32)
    assert np.array_equal(decode_scale(encode_scale(scale)), scale)
    assert len(encode_scale(np.ones(784))) == 4 * 784 * 4 // 3 + 4 - (4 * 784 * 4 // 3) % 4
    # (∏σ_i)^{1/d}: 2 for (1, 4); 2^{(a+b+c)/3} for powers of two
    assert geometric_mean(np.array([[1.0, 4.0], [2.0**-3, 2.0**6]])) == pytest.approx([2.0, 2**1.5])
    region = ellipsoid_region(np.array([0.5, 2.0, 1.0]), 1.5)
    assert region == {"kind": "ellipsoid", "factor": 1.5, "proxy_radius": pytest.approx(1.5)}
    with pytest.raises(ValueError):
        decode_scale("not base64!")


# --- the certifier ---------------------------------------------------------------------


def test_the_ball_is_cohen_at_the_smallest_axis_and_the_ellipsoid_phi_inverse(scaled_evidence):
    """Against SciPy, independently: p_A_lower = Clopper–Pearson (beta.ppf(α, k, n − k + 1)),
    the ball σ_min·Φ⁻¹(p_A_lower) (norm.ppf), the ellipsoid κ = Φ⁻¹(p_A_lower) and its
    proxy radius κ·(∏σ_i)^{1/d}."""
    scale = [[0.5, 0.25, 2.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.3, 0.3, 0.3, 0.3]]
    evidence = scaled_evidence([[60, 4, 0], [1, 99, 0], [30, 30, 40]],
                         [[9900, 100, 0], [10, 9985, 5], [3400, 3300, 3300]], scale)  # fmt: skip
    claims = AnisotropicCertifier().certify(evidence)
    for claim, (k, n), s in zip(claims[:2], [(9900, 10000), (9985, 10000)], scale, strict=False):
        p = beta.ppf(0.001, k, n - k + 1)
        assert claim.p_lower == pytest.approx(p, rel=1e-12)
        assert claim.radius == pytest.approx(min(s) * norm.ppf(p), rel=1e-12)
        assert claim.ellipsoid == pytest.approx(norm.ppf(p), rel=1e-12)
    assert claims[2].prediction == -1 and claims[2].ellipsoid is None  # abstains: no region
    certificates = list(_certificates(evidence, claims))
    expected = np.prod(np.asarray(scale[0], dtype=np.float64)) ** 0.25 * claims[0].ellipsoid
    assert certificates[0].region["proxy_radius"] == pytest.approx(expected, rel=1e-12)
    assert certificates[0].sigma == 0.25 and certificates[2].region is None


def _certificates(evidence, claims):
    from harness.certification.certify import certificate

    return [certificate(evidence, k, c, 0.001, 0.0) for k, c in enumerate(claims)]


def _protocol(**changes) -> CertificationProtocol:
    return replace(CertificationProtocol(n0=32, n=200, alpha=0.01, batch_size=64), **changes)


@pytest.mark.parametrize("rule", ["grid-place-v1", "mixture-cs-v2"])
def test_sequential_rounds_at_a_diagonal_scale(rule):
    """A scale of c on every axis draws the scalar σ = c's samples, so its sequential
    certificates are the scalar path's (looks, stops, bound and radius); an uneven scale
    is placed on the grid at its smallest axis and records its ellipsoid."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3)).eval()
    engine = SamplingEngine(model, 3, torch.device("cpu"), 64)
    x, ids = torch.rand(6, 4), list(range(6))
    protocol = _protocol(sampling="sequential", n_max=2_000, grid=(0.0, 0.1, 0.2, 0.4),
                         rule=rule)  # fmt: skip
    uniform = np.full((6, 4), 0.25, dtype=np.float32)
    scaled = list(certify_drawn(engine, protocol, AnisotropicCertifier(), x, ids, uniform))
    scalar = list(certify_drawn(engine, protocol, CohenCertifier(), x, ids, np.full(6, 0.25)))
    for a, b in zip(scaled, scalar, strict=True):
        assert (a.prediction, a.radius, a.p_lower) == (b.prediction, b.radius, b.p_lower)
        assert a.draws["base"]["looks"] == b.draws["base"]["looks"]
        assert decode_scale(a.draws["base"]["scale"]).tolist() == [0.25] * 4
    uneven = np.tile(np.array([0.5, 0.25, 1.0, 0.75], dtype=np.float32), (6, 1))
    certs = list(certify_drawn(engine, protocol, AnisotropicCertifier(), x, ids, uneven))
    assert any(cert.radius > 0 for cert in certs)
    for cert in certs:
        assert cert.sigma == 0.25 and cert.draws["base"]["looks"]
        if cert.radius > 0:  # Cohen's radius at σ_min of the harness's bound, and its ellipsoid
            kappa = norm.ppf(cert.p_lower)
            assert cert.radius == pytest.approx(0.25 * kappa, rel=1e-12)
            assert cert.region == ellipsoid_region(uneven[0], kappa)


def test_only_a_certifier_for_a_diagonal_scale_certifies_one():
    x = torch.rand(2, 2)
    engine = SamplingEngine(torch.nn.Linear(2, 3).eval(), 3, torch.device("cpu"), 64)
    scale = np.array([SCALE, SCALE])
    with pytest.raises(ContractError, match="does not declare `diagonal_scale = True`"):
        list(certify_drawn(engine, _protocol(), CohenCertifier(), x, [0, 1], scale,
                           label="certifier 'cohen'"))  # fmt: skip

    class Pretends(CohenCertifier):  # an ellipsoid at one σ per input
        def certify(self, evidence):
            return [replace(c, ellipsoid=1.0) for c in super().certify(evidence)]

    with pytest.raises(ContractError, match="ellipsoid on evidence drawn at one σ"):
        list(certify_drawn(engine, _protocol(), Pretends(), x, [0, 1], np.array([0.5, 0.5])))


def test_a_bad_scale_is_the_providers_fault():
    scale = torch.tensor([[0.5, -1.0], [0.5, 0.5]])
    with pytest.raises(IdrsError, match=r"'scaled' returned σ = -1 .*entry 0"):
        checked_sigma(scale, 2, "scaled", dims=2)
    with pytest.raises(IdrsError, match=r"expected \(2,\) or a diagonal scale \(2, 3\)"):
        checked_sigma(torch.ones(2, 2), 2, "scaled", dims=3)
    with pytest.raises(IdrsError, match=r"expected \(2,\)$"):  # where a scale is not accepted
        checked_sigma(torch.ones(2, 2), 2, "scaled")


# --- a run, its store, its export and its audit -----------------------------------------


@pytest.fixture
def diagonal_run(tmp_path, manager, replay_run):
    """The built-in ``anisotropic-fixed`` on ``ball-2``: its ramp there is :data:`SCALE`."""
    return replay_run(tmp_path, manager, ["anisotropic-fixed"], n=400, count=8)


def _audit(db, run_id, manager):
    store = ResultStore(db)
    try:
        (audit,) = audits(store, run_id, RunOptions(db=db), Progress(enabled=False), manager,
                          budget=BUDGETS["small"], entropy=ENTROPY)  # fmt: skip
        return audit
    finally:
        store.close()


@pytest.mark.slow
def test_a_diagonal_row_is_stored_exported_rederived_and_replayed(
    tmp_path, manager, diagonal_run, scaled_evidence
):
    db, run_id = diagonal_run
    (run,) = load_runs(db, [run_id])
    certified = [c for c in run.certificates if c.prediction != -1]
    assert certified, "the fixed scale certifies some ball-2 inputs"
    for c in run.certificates:
        assert c.sigma == min(SCALE)
        assert np.array_equal(recorded_scale(c.draws), np.asarray(SCALE, dtype=np.float32))
        assert (c.region is None) == (c.prediction == -1)
    for c in certified:
        kappa = norm.ppf(c.p_lower)
        assert c.radius == pytest.approx(min(SCALE) * kappa, rel=1e-12)
        assert c.region["factor"] == pytest.approx(kappa, rel=1e-12)
        assert c.region["proxy_radius"] == pytest.approx(np.sqrt(0.25 * 0.5) * kappa, rel=1e-12)
    # the export carries the region column and reads back the same certificates
    export = tmp_path / "board.run.json"
    export.write_text(export_runs([run]))
    (back,) = read_export(export)
    assert [c.region for c in back.certificates] == [c.region for c in run.certificates]
    assert [c.draws for c in back.certificates] == [c.draws for c in run.certificates]
    audit = _audit(db, run_id, manager)
    s0 = check_evidence(audit)
    assert s0.verdict == Verdict.SOUND, s0.summary
    exact = rederive([c.as_dict() for c in back.certificates], audit.inputs, audit.context.protocol,
                     Declaration.of(audit), exact=True)  # fmt: skip
    assert exact.verdict == Verdict.SOUND, exact.summary
    replayed = check_replay(audit)
    assert replayed.verdict == Verdict.SOUND, replayed.summary
    assert replayed.evidence["mode"] == "exact"
    assert replayed.evidence["sigma"]["scale"]["alone_vs_stored"] == [0.0] * 8


@pytest.mark.slow
def test_s0_finds_a_scale_or_a_region_that_its_draws_do_not_derive(manager, diagonal_run):
    db, run_id = diagonal_run
    audit = _audit(db, run_id, manager)
    k = next(i for i, c in enumerate(audit.certificates) if c["prediction"] != -1)

    def verdict(edit) -> tuple[Verdict, dict]:
        rows = [dict(r) for r in audit.certificates]
        rows[k] = json.loads(json.dumps(rows[k]))
        edit(rows[k])
        result = rederive(rows, audit.inputs, audit.context.protocol, Declaration.of(audit))
        return result.verdict, result.evidence.get("first", {})

    def wider(row):
        row["region"]["factor"] *= 1.01

    def larger(row):
        row["region"]["proxy_radius"] *= 1.01

    def rescaled(row):  # a smaller scale recorded: σ is no longer its smallest axis
        row["draws"]["base"]["scale"] = encode_scale(np.array([0.2, 0.5]))

    def no_scale(row):  # a region at one σ
        del row["draws"]["base"]["scale"]

    for edit, quantity in ((wider, "ellipsoid"), (larger, "proxy radius"), (rescaled, "scale"),
                           (no_scale, "region")):  # fmt: skip
        found, first = verdict(edit)
        assert found == Verdict.VIOLATED and first["quantity"] == quantity, (edit, first)


@pytest.mark.slow
def test_checks_without_diagonal_support_refuse_the_row(tmp_path, manager, diagonal_run):
    """A check without diagonal support refuses a diagonal row: an error naming the
    missing support, never a pass. S0, S1, S2, S3, S4 and replay pass the fixed scale,
    S5 does not apply and the empirical attack is stored (tests/test_diagonal_audit.py
    holds S1–S3 to rigged ones, tests/test_diagonal_counterexamples.py S4, S5 and the
    attack)."""
    db, run_id = diagonal_run
    results = run_checks(db, run_id, RunOptions(db=db), Progress(enabled=False), manager,
                         entropy=ENTROPY)  # fmt: skip
    verdicts = {r.check: r for r in results["anisotropic-fixed", "default"]}
    supported = {"evidence", "replay", "coverage", "sigma-regularity", "worst-case-justification",
                 "counterexamples"}  # fmt: skip
    for name in supported:
        assert verdicts[name].verdict == Verdict.SOUND, (name, verdicts[name].summary)
    assert verdicts["memory-order"].verdict == Verdict.NOT_APPLICABLE
    refused = {name for name, r in verdicts.items() if r.verdict == Verdict.ERROR}
    assert not refused & supported
    for name in refused:
        assert "does not support a diagonal noise scale" in verdicts[name].summary
        assert name in verdicts[name].summary
    (run,) = load_runs(db, [run_id])
    (row,) = run.rows()
    assert row.verdict == ("not-verified" if refused else "sound")
    assert [a.method for a in run.attacks] == ["anisotropic-fixed"]


def test_replay_holds_every_axis_of_the_scale_to_the_tolerance():
    stored = 0.25
    evidence = {"inputs": [7], "mode": "exact", "replayed": {}, "fresh": {}, "u": [[0.5], [0.5]],
                "sigma": {"alone": [stored], "batch": [stored], "order": [0],
                          "scale": {"alone_vs_batch": [0.0], "alone_vs_stored": [1e-3]}}}  # fmt: skip
    verdict, summary, detail = judge(evidence, {7: {"sigma": stored, "draws": {}}})
    assert verdict == Verdict.VIOLATED and detail["mismatch"]["quantity"] == "scale"
    assert "diagonal scale recomputed alone vs stored" in summary
    evidence["sigma"]["scale"]["alone_vs_stored"] = [None]  # strict JSON's inf: not compared
    assert judge(evidence, {7: {"sigma": stored, "draws": {}}})[0] == Verdict.VIOLATED


def test_a_row_drawn_at_one_sigma_exports_as_before():
    """No certificate with a region: no ``region`` column, the export's text unchanged."""
    from harness.store.storedrun import StoredCertificate, StoredRun

    row = {"run_id": "r" * 64, "recipe_hash": "h", "finished": "2026",
           "config": {"methods": [{"name": "cohen", "settings": [{}]}]}}  # fmt: skip
    certs = [StoredCertificate("cohen", "default", i, 0, 0, 0, 0.5, 0.25, 0.1, p_lower=0.9,
                               alpha=0.001, evidence={}, draws={}) for i in range(2)]  # fmt: skip
    assert '"region"' not in export_runs([StoredRun(row, certs, [], [])])
    certs[1] = replace(certs[1], region={"kind": "ellipsoid", "factor": 1.0, "proxy_radius": 0.3})
    text = export_runs([StoredRun(row, certs, [], [])])
    assert '"region":[null,{"factor":1.0,"kind":"ellipsoid","proxy_radius":0.3}]' in text


def test_the_worst_order_keeps_an_ellipsoid_only_where_it_left_the_certificate():
    """A memory row scored at its worst order: the recorded ellipsoid stays beside a
    certificate the order left as recorded, and goes where it changed the radius or class
    (the memory keeps a region only on certificates it leaves unchanged)."""
    from harness.reports.leaderboard.board import at_order, region_metrics
    from harness.store.storedrun import StoredCertificate

    region = {"kind": "ellipsoid", "factor": 1.0, "proxy_radius": 0.4}
    certs = [StoredCertificate("ancer-memory", "s", i, 3, 3, 3, 0.5, 0.25, 0.1, region=region)
             for i in range(4)]  # fmt: skip
    order = {"input_id": [3, 2, 1, 0], "prediction": [3, 3, 3, 1], "radius": [0.5, 0.2, 0.5, 0.5]}
    replayed = at_order(certs, order)
    assert [c.region for c in replayed] == [None, region, None, region]
    assert [(c.prediction, c.radius) for c in replayed] == [(1, 0.5), (3, 0.5), (3, 0.2), (3, 0.5)]
    assert region_metrics(replayed) == {"claimed": 2, "inputs": 4, "median": 0.4, "mean": 0.2}


# --- the fused CUDA kernel, compiled here ----------------------------------------------


INTERPRETED = """
import torch
from harness.engine.noise import ROUNDING, _noisy_batch_triton, _probe_kernel, gaussian_noise, noise_key
g = torch.Generator().manual_seed(0)
for dim in (785, 2, 12):
    x = torch.rand(3, dim, generator=g); scale = torch.rand(3, dim, generator=g) + 0.5
    key = torch.tensor([noise_key(0, 1, i) for i in range(3)])
    rows = torch.tensor([0, 2, 1, 1, 0]); samples = torch.tensor([0, 7, 123456, 3, 2**31 + 5])
    got = _noisy_batch_triton(x, scale, key, rows, samples, torch.empty(5, dim))
    eps = gaussian_noise(key[rows], samples, dim)
    error = ((got - x[rows]) / scale[rows] - eps).abs() / (1 + eps.abs())
    print(float(error.max() / ROUNDING))
print(_probe_kernel(torch.device("cpu")))
"""


@pytest.mark.slow
def test_the_diagonal_kernel_matches_the_torch_ops_in_the_interpreter():
    triton = pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", INTERPRETED], capture_output=True, text=True,
                            env=env, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert all(float(line) <= 1 for line in lines[:3]), lines
    assert lines[3] == f"triton {triton.__version__}"  # the probe checks both kernels


def test_an_ellipsoid_claim_needs_a_certified_class(scaled_evidence):
    evidence = scaled_evidence([[10, 0, 0]], [[5, 5, 0]], [SCALE])
    claim = Claim(-1, 0.0, 0.3, ellipsoid=0.5)
    from harness.certification.certify import checked_claims

    with pytest.raises(ContractError, match="0 when abstaining"):
        checked_claims([claim], 1, "certifier 'x'", 3, scaled=evidence.scale is not None)


@pytest.mark.slow
def test_a_board_of_a_diagonal_row_verifies_and_replays(tmp_path, manager, diagonal_run, capsys):
    """``leaderboard --verify`` re-derives the scale and the region from the export and
    ``--replay`` re-draws at the recorded scales; an export whose region was widened
    does not verify."""
    import argparse

    from harness.reports.leaderboard import add_leaderboard_parser
    from harness.reports.leaderboard.render import write_board
    from harness.reports.leaderboard.verify import verify_board

    db, run_id = diagonal_run
    store = ResultStore(db)
    try:
        audit = _audit(db, run_id, manager)
        for check in (check_evidence, check_replay):
            store.add_check(run_id, audit.method.name, audit.setting, check(audit), "small")
    finally:
        store.close()
    board = tmp_path / "board" / "b.md"
    (run,) = load_runs(db, [run_id])
    write_board([run], board)
    assert verify_board(board, notes=[]) == []
    # the regions section: the ellipsoids of the correctly classified inputs, never ranked
    proxies = [c.region["proxy_radius"] for c in run.certificates
               if c.region is not None and c.prediction == c.label]  # fmt: skip
    line = next(x for x in board.read_text().splitlines() if x.startswith("| anisotropic-fixed")
                and f"{len(proxies)} of {len(run.certificates)}" in x)  # fmt: skip
    assert f"| {np.median(proxies):.3f} | {sum(proxies) / len(run.certificates):.3f} |" in line
    parser = argparse.ArgumentParser()
    add_leaderboard_parser(parser.add_subparsers())
    args = parser.parse_args(["leaderboard", "--verify", str(board), "--replay", "3",
                              "--device", "cpu", "--entropy", "5ca1ed"])  # fmt: skip
    assert args.handler(args) == 0
    out = capsys.readouterr().out
    assert "3/3 inputs agreed bit for bit" in out
    assert "σ not recomputed" not in out  # every axis of the scale recomputed and held too
    export = board.with_suffix(".run.json")
    data = json.loads(export.read_text())
    regions = data["runs"][0]["certificates"][0]["columns"]["region"]
    k = next(i for i, region in enumerate(regions) if region is not None)
    regions[k]["factor"] *= 1.01
    export.write_text(json.dumps(data))
    assert verify_board(board, notes=[]) != []


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("method", ["anisotropic-fixed", "ancer-memory"])
def test_a_sequential_diagonal_row_is_audited_by_every_check(tmp_path, manager, method):
    """Under sequential sampling a diagonal row draws its rounds at its scale: S0 re-derives
    its looks and stops, replay re-draws them bit for bit at the scale, S1 tests the rule's
    bound and S2–S4 judge the scale; the fixed scale passes every check and the memory is
    order-dependent, as at fixed n (no check refuses either row)."""
    from harness.running.benchmark import parse_benchmark
    from harness.running.runner import run_benchmark

    raw = {"name": "sequential-scale", "seed": 0, "shard_size": 4,
           "dataset": {"name": "ball-2", "test_count": 8},
           "model": {"architecture": "ball-N", "trainer": "none"},
           "certification": {"n0": 64, "n": 4000, "alpha": 0.001, "batch_size": 256,
                             "sampling": "sequential", "n_max": 4000},
           "methods": [{"name": method}]}  # fmt: skip
    db = tmp_path / "runs.sqlite"
    run_id = run_benchmark(parse_benchmark(raw), RunOptions(db=db), Progress(enabled=False),
                           manager)  # fmt: skip
    (run,) = load_runs(db, [run_id])
    for c in run.certificates:
        assert c.draws["base"]["looks"] and recorded_scale(c.draws) is not None
    results = run_checks(db, run_id, RunOptions(db=db), Progress(enabled=False), manager,
                         entropy=ENTROPY)  # fmt: skip
    verdicts = {r.check: r for r in results[method, "default"]}
    assert not [r.summary for r in verdicts.values() if r.verdict == Verdict.ERROR]
    assert "sequential bound" in verdicts["coverage"].summary
    assert verdicts["replay"].evidence["mode"] == "exact"
    for name in ("evidence", "replay", "coverage", "counterexamples"):
        assert verdicts[name].verdict == Verdict.SOUND, (name, verdicts[name].summary)
    order = Verdict.ORDER_DEPENDENT if method == "ancer-memory" else Verdict.NOT_APPLICABLE
    assert verdicts["memory-order"].verdict == order
