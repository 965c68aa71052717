"""A noise centre (issue 59, UCAN's μ(x)): a σ-provider answers μ(x) beside a diagonal scale,
the harness draws the samples of x at x + μ(x), records μ with the draws, replays it, and
every check audits the smoothed classifier whose noise moves with μ: a constant centre is
sound, a centre that follows the classifier's boundary is caught."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import binom, norm

from harness import CertifierSpec, MethodSpec, SigmaProviderSpec, hookimpl
from harness.audit.auditor import run_checks
from harness.audit.replay import judge, sigma_record
from harness.certification.certify import certify_drawn
from harness.engine.centre import (
    centre_deviation,
    checked_centre,
    decode_centre,
    recorded_centre,
    request_centres,
    shifted,
)
from harness.engine.draws import Draws
from harness.engine.sampling import SamplingEngine
from harness.foundation.errors import ContractError, IdrsError, ParameterError
from harness.foundation.progress import Progress
from harness.foundation.protocol import CertificationProtocol
from harness.foundation.verdict import Verdict
from harness.running.preparation import RunOptions
from harness.store.storedrun import load_runs
from plugins.anisotropic.certifier import AnisotropicCertifier
from plugins.anisotropic.fixed_scale import FixedScale, ShiftedScale
from plugins.cohen.certifier import CohenCertifier

ENTROPY = int("ce47e", 16)
SHIFT = (0.1, 0.1)
"""The constant centre of the built-in ``anisotropic-shifted`` (its default offset) on ``ball-2``."""


class LinearModel(torch.nn.Module):
    """f(x) = [w·x > b] as the logits (0, w·x − b)."""

    def __init__(self, w: torch.Tensor, b: float) -> None:
        super().__init__()
        self.w, self.b = w, b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        margin = x.flatten(1) @ self.w - self.b
        return torch.stack([torch.zeros_like(margin), margin], dim=1)


def _protocol(**changes) -> CertificationProtocol:
    return CertificationProtocol(**{"n0": 64, "n": 4000, "alpha": 0.001, **changes})


# --- the engine and the record ---------------------------------------------------------


def test_the_samples_of_x_are_drawn_at_x_plus_the_centre():
    """P(class 1) of the linear f under x + μ + s⊙ε is Φ((w·(x + μ) − b)/‖s⊙w‖₂) (a closed
    form, not the engine): the estimation counts agree within a two-sided binomial test,
    and are those of the same scale drawn at the shifted input without a centre, bit for
    bit (the input's own keys)."""
    w, b = torch.tensor([1.0, -2.0, 0.5]), 0.1
    engine = SamplingEngine(LinearModel(w, b), 2, torch.device("cpu"), 256, seed=3)
    x = torch.tensor([[0.2, 0.1, -0.3], [-0.4, 0.0, 0.9]])
    scale = np.array([[0.3, 0.2, 0.5], [0.25, 0.25, 0.25]], dtype=np.float32)
    centre = np.array([[0.5, -0.1, 0.2], [0.0, 0.3, -0.6]], dtype=np.float32)
    protocol = _protocol()
    certs = list(certify_drawn(engine, protocol, AnisotropicCertifier(), x, [4, 9], scale,
                               centre=centre))  # fmt: skip
    plain = list(certify_drawn(engine, protocol, AnisotropicCertifier(),
                               x + torch.from_numpy(centre), [4, 9],
                               scale))  # fmt: skip
    for k, (c, p) in enumerate(zip(certs, plain, strict=True)):
        assert np.array_equal(recorded_centre(c.draws), centre[k])
        assert c.counts_estimation == p.counts_estimation
        assert c.counts_selection == p.counts_selection
        mean = x[k].double().numpy() + centre[k]
        exact = norm.cdf((mean @ w.double().numpy() - b) / np.linalg.norm(scale[k] * w.numpy()))
        ones = c.counts_estimation[1]
        tail = min(binom.cdf(ones, protocol.n, exact), binom.sf(ones - 1, protocol.n, exact))
        assert 2 * tail > 1e-4, (k, ones / protocol.n, exact)
    drawn = Draws.from_records([c.draws["base"] for c in certs])
    assert np.array_equal(drawn.centre, centre)
    assert "centre" not in plain[0].draws["base"]  # a row without a centre records as before


@pytest.mark.parametrize("rule", ["grid-place-v1", "mixture-cs-v2"])
def test_sequential_rounds_are_drawn_around_the_centre(rule):
    """Under sequential sampling the rounds are drawn at x + μ: every look, the bound and
    the radius are those of the same scale drawn at the shifted inputs, and each
    certificate records its centre."""
    torch.manual_seed(0)
    engine = SamplingEngine(torch.nn.Linear(4, 3).eval(), 3, torch.device("cpu"), 64)
    x, ids = torch.rand(6, 4), list(range(6))
    protocol = CertificationProtocol(n0=32, n=200, alpha=0.01, batch_size=64,
                                     sampling="sequential", n_max=2_000,
                                     grid=(0.0, 0.1, 0.2, 0.4), rule=rule)  # fmt: skip
    scale = np.tile(np.float32([0.5, 0.25, 1.0, 0.75]), (6, 1))
    centre = (np.arange(24, dtype=np.float32).reshape(6, 4) - 12) / 40
    centred = list(certify_drawn(engine, protocol, AnisotropicCertifier(), x, ids, scale,
                                 centre=centre))  # fmt: skip
    shifted_x = x + torch.from_numpy(centre)
    plain = list(certify_drawn(engine, protocol, AnisotropicCertifier(), shifted_x, ids, scale))
    assert any(c.radius > 0 for c in centred) and any(c.prediction == -1 for c in centred)
    for a, b in zip(centred, plain, strict=True):  # in the order the inputs stopped
        assert (a.input_id, a.prediction, a.radius, a.p_lower) == (
            b.input_id, b.prediction, b.radius, b.p_lower)  # fmt: skip
        assert a.draws["base"]["looks"] == b.draws["base"]["looks"]
        assert np.array_equal(recorded_centre(a.draws), centre[a.input_id])


def test_a_centre_is_drawn_with_a_scale_and_certified_by_a_certifier_that_declares_it():
    engine = SamplingEngine(LinearModel(torch.ones(2), 0.0), 2, torch.device("cpu"), 64)
    x, centre = torch.zeros(2, 2), np.full((2, 2), 0.1, dtype=np.float32)
    scale = np.full((2, 2), 0.5, dtype=np.float32)
    with pytest.raises(ContractError, match="does not declare `centred = True`"):
        list(certify_drawn(engine, _protocol(), replace_diagonal(CohenCertifier()), x, [0, 1],
                           scale, centre=centre))  # fmt: skip
    with pytest.raises(ContractError, match="a centre is drawn with a diagonal scale"):
        list(certify_drawn(engine, _protocol(), AnisotropicCertifier(), x, [0, 1],
                           np.array([0.5, 0.5]), centre=centre))  # fmt: skip


def replace_diagonal(certifier):
    """``certifier`` declaring a diagonal scale, and nothing about a centre."""
    certifier.diagonal_scale = True
    return certifier


def test_a_bad_centre_is_the_providers_fault():
    x = torch.zeros(2, 1, 2)
    with pytest.raises(IdrsError, match=r"'mover' returned a centre of shape \(2, 3\)"):
        checked_centre(torch.zeros(2, 3), x, "mover")
    with pytest.raises(IdrsError, match=r"'mover' returned a centre of nan .*input 1, dimension 0"):
        checked_centre(torch.tensor([[0.0, 0.0], [math.nan, 0.0]]), x, "mover")
    with pytest.raises(IdrsError, match=r"type torch\.int64"):
        checked_centre(torch.zeros(2, 2, dtype=torch.int64), x, "mover")
    held = checked_centre(torch.full((2, 1, 2), 0.1, dtype=torch.float64), x, "mover")
    assert held.dtype == np.float32 and held.shape == (2, 2)
    assert torch.equal(shifted(x, held), torch.full((2, 1, 2), np.float32(0.1)))


def test_replay_requests_and_deviations_of_a_centre():
    """A request's centres decode as recorded (0 for an input drawn without one); a centre
    is compared relative to its largest entry, 0 where both are 0, inf for other shapes;
    and replay's judge holds it to the tolerance."""
    text = Draws("hard", 1, 1, np.ones(1), np.ones((1, 2)), np.ones((1, 2)),
                 scale=np.ones((1, 2), np.float32),
                 centre=np.float32([[0.5, -2.0]])).record(0)["centre"]  # fmt: skip
    assert np.array_equal(decode_centre(text), np.float32([0.5, -2.0]))
    assert np.array_equal(request_centres([text, None], 2), np.float32([[0.5, -2.0], [0, 0]]))
    assert centre_deviation(np.zeros(3), np.zeros(3)) == 0.0
    assert centre_deviation(np.array([1.0, 2.0]), np.array([1.0, 4.0])) == pytest.approx(0.5)
    assert centre_deviation(np.zeros(2), np.zeros(3)) == math.inf

    def answers(value):
        return lambda index: np.full((len(index), 2), value)

    record = sigma_record(lambda index: np.full(len(index), 0.25), np.array([0]), [None],
                          answers(0.5), [text])  # fmt: skip
    assert record["centre"]["alone_vs_batch"] == [0.0]
    assert record["centre"]["alone_vs_stored"] == [pytest.approx(1.25)]  # max|a − b| / max|b|
    evidence = {"inputs": [7], "mode": "exact", "replayed": {}, "sigma": record}
    verdict, summary, detail = judge(evidence, {7: {"sigma": 0.25, "draws": {}}})
    assert verdict == Verdict.VIOLATED and "its centre recomputed alone vs stored" in summary
    assert detail["mismatch"]["quantity"] == "centre"


# --- runs of a constant centre and of a rigged one, audited -------------------------------


class Pulled(FixedScale):
    """The fixed scale with a centre that pulls every input 0.6 away from the ball
    classifier's boundary, along the radius (rigged: the centre follows the classifier,
    so p_A at x is that of a point 0.6 further from the boundary)."""

    def __init__(self, model) -> None:
        super().__init__(0.25, 2.0)
        self.model = model

    def centre(self, x: torch.Tensor) -> torch.Tensor:
        c = self.model.center.to(x.device, x.dtype)
        offset = x.flatten(1) - c
        distance = offset.norm(dim=1, keepdim=True).clamp_min(1e-9)
        side = torch.sign(distance - self.model.radius)  # +1 outside, −1 inside
        return (0.6 * side * offset / distance).reshape(x.shape)


class CentredPlugins:
    """The rigged method above, with the built-in ``anisotropic`` certifier."""

    @hookimpl
    def idrs_register_sigma_providers(self, register):
        register(SigmaProviderSpec("pulled-scale", lambda context, params: Pulled(context.model)))

    @hookimpl
    def idrs_register_certifiers(self, register):
        register(CertifierSpec("centred-anisotropic",
                               lambda context, params, provider: AnisotropicCertifier()))  # fmt: skip

    @hookimpl
    def idrs_register_methods(self, register):
        register(MethodSpec("pulled-scale", "pulled-scale", "centred-anisotropic", {}))


@pytest.fixture(scope="module")
def centred_run(tmp_path_factory, replay_run):
    from harness.plugin.manager import PluginManager

    folder = tmp_path_factory.mktemp("centred")
    with PluginManager(third_party=False) as manager:
        manager.register(CentredPlugins(), name="centred-test")
        db, run_id = replay_run(folder, manager, ["anisotropic-shifted", "pulled-scale"], n=400,
                                count=8)  # fmt: skip
        results = run_checks(db, run_id, RunOptions(db=db), Progress(enabled=False), manager,
                             entropy=ENTROPY)  # fmt: skip
    return db, run_id, results


@pytest.mark.slow
def test_a_constant_centre_is_recorded_replayed_and_sound(centred_run):
    db, run_id, results = centred_run
    (run,) = load_runs(db, [run_id])
    rows = [c for c in run.certificates if c.method == "anisotropic-shifted"]
    assert rows and all(np.array_equal(recorded_centre(c.draws), np.float32(SHIFT)) for c in rows)
    verdicts = {r.check: r for r in results["anisotropic-shifted", "default"]}
    for name in ("evidence", "replay", "coverage", "worst-case-justification", "counterexamples"):
        assert verdicts[name].verdict == Verdict.SOUND, (name, verdicts[name].summary)
    assert "bit for bit" in verdicts["replay"].summary
    with pytest.raises(ParameterError, match="offset"):
        ShiftedScale(0.25, 2.0, math.nan)


@pytest.mark.slow
def test_a_centre_that_follows_the_classifier_is_caught(centred_run):
    """S3 finds the noise's mean moving by more than δ inside the balls (unjustified) and
    S4 a point of a claimed ball whose exact smoothed class, with the centre asked there,
    is another (violated)."""
    _, _, results = centred_run
    verdicts = {r.check: r for r in results["pulled-scale", "default"]}
    assert verdicts["evidence"].verdict == Verdict.SOUND  # its claims are derived right
    s3 = verdicts["worst-case-justification"]
    assert s3.verdict == Verdict.UNJUSTIFIED, s3.summary
    assert s3.evidence["first"]["centre_deviation"] > 1e-3
    s4 = verdicts["counterexamples"]
    assert s4.verdict == Verdict.VIOLATED, s4.summary
    assert s4.evidence["exact_flips"]["count"] > 0
