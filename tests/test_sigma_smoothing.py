"""A σ-smoothing drawn by the harness: σ(x) = levels[ĉ_σ], its α share, R_σ caps the radius.

A plugin written here against the public API declares a ``SigmaSmoothing`` (a fixed
two-level σ-estimator: level 1 where x_1 > 0); the harness draws its selection and
estimation samples (streams 4 and 5), sets σ, gives the certifier the α left, and S0
re-derives the σ level and R_σ from those draws.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from scipy.stats import beta, norm

from harness import (
    ABSTAIN,
    COHEN,
    CertifierSpec,
    Claim,
    Constant,
    HardSmoothingCertifier,
    MethodSpec,
    SigmaProviderSpec,
    SigmaSmoothing,
    cohen_radius,
    hookimpl,
)
from harness.audit.evidence import check_evidence
from harness.audit.session import audits
from harness.engine.sampling import SamplingEngine
from harness.foundation.progress import Progress
from harness.foundation.verdict import Verdict
from harness.running.benchmark import parse_benchmark
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark
from harness.store.store import ResultStore

LEVELS, NOISE, SHARE = (0.2, 0.4), 0.5, 0.0004


class Halfspace(torch.nn.Module):
    """Logits (0, 50·x_1): level 1 where x_1 > 0."""

    def forward(self, x):
        first = 50.0 * x.flatten(1)[:, 0]
        return torch.stack([torch.zeros_like(first), first], dim=1)


class Chosen:
    regularity = Constant(LEVELS[0])  # not read for σ: the harness draws the smoothing

    def __init__(self):
        self.smoothing = SigmaSmoothing(Halfspace(), NOISE, LEVELS, SHARE)

    def __call__(self, x):
        raise AssertionError("the harness draws a σ-smoothing; it never calls the provider")


class Capped(HardSmoothingCertifier):
    """Cohen's claim at the α left, capped at R_σ, abstaining where R_σ = 0 (what a dual-RS
    certificate claims: without a certified σ level there is no claim at all)."""

    radius_formula = COHEN

    def radius(self, p_lower, sigma):
        return cohen_radius(p_lower, sigma)

    def certify(self, evidence):
        claims = super().certify(evidence)
        drawn = evidence.sigma_draws
        out = []
        for k, claim in enumerate(claims):
            top = int(np.argmax(drawn.selection[k]))
            count, n = int(drawn.estimation[k, top]), drawn.n
            p = beta.ppf(drawn.alpha, count, n - count + 1) if count else 0.0
            r_sigma = NOISE * norm.ppf(p) if p > 0.5 else 0.0
            if not claim.radius:
                out.append(claim)
            elif r_sigma > 0:
                out.append(Claim(claim.prediction, min(claim.radius, r_sigma), claim.p_lower,
                                 claim.predict))  # fmt: skip
            else:
                out.append(Claim(ABSTAIN, 0.0, claim.p_lower, claim.predict))
        return out


class Uncapped(Capped):
    """Forgets R_σ."""

    def certify(self, evidence):
        return HardSmoothingCertifier.certify(self, evidence)


class FullAlpha(Capped):
    """Spends the whole α on its own bound (the σ-smoothing's share not subtracted)."""

    def certify(self, evidence):
        from dataclasses import replace

        return super().certify(replace(evidence, alpha=evidence.alpha + SHARE))


def _plugin():
    module = types.ModuleType("sigma_smoothing_test")
    certifiers = {"capped": Capped, "uncapped": Uncapped, "full-alpha": FullAlpha}

    @hookimpl
    def idrs_register_sigma_providers(register):
        register(SigmaProviderSpec("chosen", lambda context, params: Chosen()))

    @hookimpl
    def idrs_register_certifiers(register):
        for name, cls in certifiers.items():
            register(CertifierSpec(name, lambda c, p, s, cls=cls: cls()))

    @hookimpl
    def idrs_register_methods(register):
        for name in certifiers:
            register(MethodSpec(f"smoothed-{name}", "chosen", name))

    module.idrs_register_sigma_providers = idrs_register_sigma_providers
    module.idrs_register_certifiers = idrs_register_certifiers
    module.idrs_register_methods = idrs_register_methods
    return module


@pytest.fixture
def run(tmp_path, manager):
    manager.register(_plugin(), name="sigma-smoothing-test")
    raw = {
        "name": "sigma-smoothing", "seed": 3,
        "dataset": {"name": "ball-2", "test_count": 16},
        "model": {"architecture": "ball-N", "trainer": "none"},
        "certification": {"n0": 50, "n": 2000, "alpha": 0.001, "batch_size": 4096},
        "methods": [{"name": f"smoothed-{m}"} for m in ("capped", "uncapped", "full-alpha")],
    }  # fmt: skip
    db = tmp_path / "r.sqlite"
    # on the CPU: the tests below redraw its noise (block-v1) and rely on its draws (an
    # input whose σ level is not certified); a CUDA run draws philox-v1
    run_id = run_benchmark(
        parse_benchmark(raw), RunOptions(db=db, device="cpu"), Progress(enabled=False), manager
    )
    store = ResultStore(db)
    try:
        found = {a.method.name: a for a in audits(store, run_id, RunOptions(db=db),
                                                  Progress(enabled=False), manager)}  # fmt: skip
    finally:
        store.close()
    return found


def test_sigma_is_the_level_the_harness_draws_choose(run):
    audit = run["smoothed-capped"]
    x = audit.inputs
    ids = [c["input_id"] for c in audit.certificates]
    protocol = audit.context.protocol  # the run's noise scheme, on its device
    engine = SamplingEngine(Halfspace(), 2, audit.context.device, 4096, seed=3,
                            noise=protocol.noise)  # fmt: skip
    selection = engine.counts(x, np.full(len(x), NOISE), ids, 50, 4)  # stream 4, redrawn here
    for cert, counts in zip(audit.certificates, selection, strict=True):
        assert cert["sigma"] == LEVELS[int(np.argmax(counts))]
        drawn = cert["draws"]["sigma"]
        assert drawn["selection"] == counts.tolist() and drawn["alpha"] == SHARE
        assert drawn["levels"] == list(LEVELS) and drawn["sigma"] == NOISE
    assert {c["sigma"] for c in audit.certificates} == set(LEVELS)  # both sides of x_1 = 0


def test_the_certifier_gets_the_alpha_left_and_s0_caps_at_r_sigma(run):
    capped = check_evidence(run["smoothed-capped"])
    assert capped.verdict == Verdict.SOUND, capped.summary
    assert capped.evidence["sigma_smoothing_alpha"] == SHARE
    row = next(c for c in run["smoothed-capped"].certificates if c["prediction"] >= 0)
    base = row["draws"]["base"]
    top = int(np.argmax(base["selection"]))
    k, n = base["estimation"][top], base["n"]
    assert row["p_lower"] == pytest.approx(beta.ppf(0.001 - SHARE, k, n - k + 1), rel=1e-12)
    uncapped = check_evidence(run["smoothed-uncapped"])
    assert uncapped.verdict == Verdict.VIOLATED
    beyond, uncertified = 0, 0  # R_σ by scipy from each certificate's σ draws
    for row in run["smoothed-uncapped"].certificates:
        sigma_draws = row["draws"]["sigma"]
        k = max(sigma_draws["estimation"][int(np.argmax(sigma_draws["selection"]))], 1e-300)
        p = beta.ppf(SHARE, k, 2000 - k + 1)
        r_sigma = NOISE * norm.ppf(p) if p > 0.5 else 0.0
        beyond += row["radius"] > r_sigma * (1 + 1e-9)
        uncertified += row["prediction"] >= 0 and r_sigma == 0
    assert beyond > 0 and uncertified > 0
    assert uncapped.evidence["mismatches"] == {"R_σ": beyond, "σ certified": uncertified}
    full = check_evidence(run["smoothed-full-alpha"])
    assert full.verdict == Verdict.VIOLATED and full.evidence["first"]["quantity"] == "bound"


def test_a_boards_exact_rederivation_expects_an_abstention_where_r_sigma_is_0(run):
    """``leaderboard --verify`` re-derives with ``exact``: a certificate whose σ level is not
    certified (R_σ = 0, by scipy) must abstain, and one edited into a class does not verify."""
    from harness.audit.evidence import Declaration, rederive

    audit = run["smoothed-capped"]
    rows = [dict(r) for r in audit.certificates]
    uncertified = []
    for k, row in enumerate(rows):
        sigma_draws = row["draws"]["sigma"]
        count = sigma_draws["estimation"][int(np.argmax(sigma_draws["selection"]))]
        p_sigma = beta.ppf(SHARE, count, 2000 - count + 1) if count else 0.0
        if not p_sigma > 0.5:
            uncertified.append(k)
    assert uncertified and all(rows[k]["prediction"] == ABSTAIN for k in uncertified)
    x, protocol, declared = audit.inputs.cpu(), audit.context.protocol, Declaration.of(audit)
    assert rederive(rows, x, protocol, declared, exact=True).verdict == Verdict.SOUND
    edited = dict(
        rows[uncertified[0]],
        prediction=int(np.argmax(rows[uncertified[0]]["draws"]["base"]["selection"])),
    )
    rows[uncertified[0]] = edited
    result = rederive(rows, x, protocol, declared, exact=True)
    assert (
        result.verdict == Verdict.VIOLATED and result.evidence["first"]["quantity"] == "σ certified"
    )
