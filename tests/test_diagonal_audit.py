"""S2 and S3 on rows drawn at a diagonal scale (issue 59, item 5): a sound row passes, a
rigged one (a scale that changes while declared constant, quicker than declared, a radius
from the largest axis) is flagged, and what cannot be judged is an error, never a pass."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.stats import norm

from harness import hookimpl
from harness.audit.analytic import LinearClassifier
from harness.audit.audit import BUDGETS, Audit
from harness.audit.coverage import check_coverage
from harness.audit.coverage_trials import linear_trial_false
from harness.audit.justification import check_justification
from harness.audit.session import audits
from harness.audit.sigma_regularity import check_sigma_regularity
from harness.engine.scale import encode_scale
from harness.foundation.progress import Progress
from harness.foundation.regularity import Constant, Lipschitz, SemiElastic, Unregularized
from harness.foundation.verdict import Verdict
from harness.plugin.components import CertifierSpec, MethodSpec, SigmaProviderSpec
from harness.running.preparation import RunOptions
from harness.store.store import ResultStore
from plugins.anisotropic.certifier import AnisotropicCertifier
from plugins.anisotropic.fixed_scale import FixedScale

BASE = (0.25, 0.5, 1.0)
"""The scale at the origin of the test σ-providers (three input dimensions)."""
DIRECTIONS = torch.tensor([[0.6, 0.8, 0.0], [0.0, 0.6, -0.8], [1.0, 0.0, 0.0]])
"""Unit vectors u_i: axis i of a varying scale moves along u_i only."""


class Scale:
    """σ_i(x) = base_i·exp(rate·u_i·x) (semi-elastic of rate ``rate`` on every axis), or
    with ``lip`` base_i + lip·u_i·x (``lip``-Lipschitz); ``axes`` limits the change to those."""

    def __init__(self, regularity, rate=0.0, lip=0.0, axes=(0, 1, 2)) -> None:
        self.regularity = regularity
        self.rate, self.lip = rate, lip
        self.mask = torch.zeros(3, 1, dtype=torch.float64)
        self.mask[list(axes)] = 1.0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        moved = x.flatten(1).double() @ (DIRECTIONS * self.mask).T.double()
        base = torch.tensor(BASE, dtype=torch.float64, device=x.device)
        if self.lip:
            return base + self.lip * moved
        return base * torch.exp(self.rate * moved)


class FakeAudit:
    """What S2 and S3 read of an :class:`~harness.audit.audit.Audit`, with its random
    choices (the same derivation from the entropy)."""

    seed, generator, rng, subset = Audit.seed, Audit.generator, Audit.rng, Audit.subset

    def __init__(self, provider, certificates, smoothing: str = "hard") -> None:
        self.sigma_provider, self.certificates = provider, certificates
        self.inputs = torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.1, 0.2], [0.3, 0.3, 0.3]])
        self.certifier = SimpleNamespace(smoothing=smoothing, order_dependent=False)
        self.budget, self.entropy = BUDGETS["small"], 0x5CA1ED
        self.context = SimpleNamespace(device=torch.device("cpu"),
                                       engine=SimpleNamespace(batch_size=64))  # fmt: skip
        self.method = SimpleNamespace(sigma_provider="scale", name="diagonal")


P_LOWER = 0.99


def _certificates(scales, radius=None, recorded=True) -> list[dict]:
    """Certificates of the test inputs at ``scales`` [3, d]: Cohen's radius at the
    smallest axis (``radius(scale)`` instead when given)."""
    out = []
    for k, scale in enumerate(np.asarray(scales, dtype=np.float32)):
        r = float(scale.min()) * norm.ppf(P_LOWER) if radius is None else radius(scale)
        base = {"scale": encode_scale(scale)} if recorded else {}
        out.append({"input_id": k, "prediction": 1, "radius": r, "sigma": float(scale.min()),
                    "p_lower": P_LOWER, "draws": {"base": base}})  # fmt: skip
    return out


def _audit(provider, radius=None, smoothing="hard", recorded=True) -> FakeAudit:
    inputs = FakeAudit(provider, []).inputs
    scales = provider(inputs).numpy()
    return FakeAudit(provider, _certificates(scales, radius, recorded), smoothing)


# --- S2 ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "verdict"),
    [
        (Scale(Constant(0.25)), Verdict.SOUND),
        (Scale(Constant(0.25), rate=0.5, axes=(2,)), Verdict.UNJUSTIFIED),  # one axis moves
        (Scale(SemiElastic(0.5), rate=0.5), Verdict.SOUND),
        (Scale(SemiElastic(0.25), rate=0.5), Verdict.UNJUSTIFIED),
        (Scale(Lipschitz(0.2, 0.05), lip=0.2), Verdict.SOUND),
        (Scale(Lipschitz(0.1, 0.05), lip=0.2), Verdict.UNJUSTIFIED),
        (Scale(Lipschitz(0.2, 0.3), lip=0.2), Verdict.UNJUSTIFIED),  # an axis below the floor
        (Scale(Unregularized(), rate=0.5), Verdict.NOT_APPLICABLE),
    ],
)
def test_s2_holds_every_axis_of_the_scale_to_the_declared_regularity(provider, verdict):
    result = check_sigma_regularity(_audit(provider))
    assert result.verdict == verdict, result.summary
    assert "largest over the axes" in result.evidence["quotient"]
    # the quotient found never exceeds the true one of the worst axis (rate or lip, u_i unit)
    assert result.evidence["worst_quotient"] <= max(provider.rate, provider.lip) * (1 + 1e-6)
    if provider.rate or provider.lip:  # the search gets close to it (d = 3, with gradients)
        assert result.evidence["worst_quotient"] >= 0.9 * max(provider.rate, provider.lip)
        assert result.evidence["axis"] in (0, 1, 2)


def test_s2_finds_the_one_axis_that_moves():
    provider = Scale(Constant(0.25), rate=0.5, axes=(1,))
    result = check_sigma_regularity(_audit(provider))
    assert result.verdict == Verdict.UNJUSTIFIED and result.evidence["axis"] == 1


# --- S3 ------------------------------------------------------------------------------


def test_s3_covers_cohens_ball_at_the_smallest_axis_of_a_fixed_scale():
    """R = σ_min·Φ⁻¹(p_A_lower) (scipy) is exactly covered: ξ at σ_min is 1/2."""
    result = check_justification(_audit(Scale(Constant(0.25))))
    assert result.verdict == Verdict.SOUND, result.summary
    assert result.evidence["worst"]["xi"] == pytest.approx(0.5, abs=1e-9)
    assert result.evidence["varying"] == 0 and result.evidence["audited"] == 3


def test_s3_flags_a_radius_from_the_largest_axis():
    """ξ at σ_min of R = σ_max·Φ⁻¹(p) is the half-space worst case Φ(R/σ_min − Φ⁻¹(p))."""
    result = check_justification(_audit(Scale(Constant(0.25)), radius=lambda s: float(
        s.max()) * norm.ppf(P_LOWER)))  # fmt: skip
    assert result.verdict == Verdict.UNJUSTIFIED, result.summary
    first = result.evidence["first"]
    expected = norm.cdf(first["radius"] / 0.25 - norm.ppf(P_LOWER))
    assert first["xi"] == pytest.approx(expected, rel=1e-9) and expected > 0.5
    assert "σ_min·Φ⁻¹(p_A_lower)" in result.summary


def test_s3_flags_a_scale_that_moves_though_declared_constant():
    result = check_justification(_audit(Scale(Constant(0.25), rate=0.5, axes=(2,))))
    assert result.verdict == Verdict.UNJUSTIFIED, result.summary
    assert result.evidence["first"]["axis"] == 2 and "declares a constant scale" in result.summary


@pytest.mark.parametrize("regularity", [SemiElastic(0.5), Unregularized()])
def test_s3_judges_a_scale_that_moves_elsewhere_than_its_smallest_axis(regularity):
    """σ_min never changes, so the scalar ξ at σ_min would pass; the worst case of the two
    anisotropic Gaussians at the point found decides: at Cohen's radius it is just below
    1/2 (0.483, with its error bound below 1/2 too), at twice that radius far below."""
    near = check_justification(_audit(Scale(regularity, rate=0.5, axes=(2,))))
    assert near.verdict == Verdict.UNJUSTIFIED, near.summary
    assert "anisotropic Gaussians" in near.summary
    assert all(r["lower"] < 0.5 for r in near.evidence["worst_case"]["judged"])
    far = check_justification(_audit(Scale(regularity, rate=0.5, axes=(2,)),
                                     radius=lambda s: 2 * float(s.min()) * norm.ppf(P_LOWER)))  # fmt: skip
    assert far.verdict == Verdict.UNJUSTIFIED, far.summary


class FarAlongTheLongAxis:
    """σ(x) = BASE while x_2 < 1.1, then every axis grows as e^{x_2 − 1.1}: constant on the
    test inputs' balls (x_2 <= 0.3 + R, R = 0.25·Φ⁻¹(0.99) = 0.58), varying inside their
    ellipsoids, which reach 0.3 + Φ⁻¹(0.99)·1.0 = 2.63 along axis 2."""

    def __init__(self, regularity) -> None:
        self.regularity = regularity

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        grow = torch.exp(torch.relu(x.flatten(1).double()[:, 2:3] - 1.1))
        return torch.tensor(BASE, dtype=torch.float64, device=x.device) * grow


def _with_ellipsoids(audit: FakeAudit) -> FakeAudit:
    """The audit's certificates each claiming ANCER's ellipsoid, κ = Φ⁻¹(p_A_lower)."""
    for c in audit.certificates:
        c["region"] = {"kind": "ellipsoid", "factor": float(norm.ppf(P_LOWER)),
                       "proxy_radius": 0.0}  # fmt: skip
    return audit


@pytest.mark.parametrize("regularity", [Constant(0.25), Unregularized()])
def test_s3_searches_the_claimed_ellipsoid_beyond_the_ball(regularity):
    """A scale fixed on every ball passes the ball's search; inside the claimed ellipsoids
    it varies: declared constant, the row is unjustified by that; unregularized, the worst
    case of the two anisotropic Gaussians at the point found is below 1/2."""
    balls = check_justification(_audit(FarAlongTheLongAxis(regularity)))
    assert balls.verdict == Verdict.SOUND and balls.evidence["varying"] == 0, balls.summary
    result = check_justification(_with_ellipsoids(_audit(FarAlongTheLongAxis(regularity))))
    assert result.verdict == Verdict.UNJUSTIFIED, result.summary
    first = result.evidence["first"]
    assert first["region"] == "ellipsoid" and result.evidence["varying"] == 3
    if isinstance(regularity, Constant):
        assert "inside the claimed ellipsoid, beyond the ball" in result.summary
    else:
        judged = result.evidence["worst_case"]["judged"]
        assert all(r["upper"] < 0.5 and r["distance"] > 0.58 for r in judged), judged


def test_s3_refuses_what_it_cannot_read():
    audit = _audit(Scale(Constant(0.25)))
    audit.certificates[1]["draws"] = {"base": {}}  # one certificate lost its scale
    result = check_justification(audit)
    assert result.verdict == Verdict.ERROR and "record no scale" in result.summary
    soft = check_justification(_audit(Scale(Constant(0.25)), smoothing="soft"))
    assert soft.verdict == Verdict.ERROR and "soft smoothing at a diagonal scale" in soft.summary


# --- S1 ------------------------------------------------------------------------------


def test_the_exact_linear_classifier_at_a_scale_matches_a_quadrature():
    """P(w·(x + s⊙ε) > b) = Φ((w·x − b)/‖s⊙w‖₂), against SciPy's quadrature over ε_1."""
    from scipy import integrate

    model = LinearClassifier(2)
    normal = torch.tensor([0.6, 0.8], dtype=torch.float64)
    model.set_plane(normal, 0.1)
    x, scale = np.array([[0.3, 0.05], [-0.2, 0.4]]), np.array([[0.25, 0.5], [1.0, 0.1]])
    got = model.smoothed_probability(x, scale)
    for k in range(2):
        w = model.w.double().numpy()  # held in float32
        (w1, w2), (s1, s2) = w / np.linalg.norm(w), scale[k]
        gap = (0.1 - x[k] @ w) / np.linalg.norm(w)  # side 1 iff w1·s1·e1 + w2·s2·e2 > gap

        def density(e, w1=w1, w2=w2, s1=s1, s2=s2, gap=gap):  # given e_1: P(w2·s2·e2 > ...)
            return norm.pdf(e) * norm.sf((gap - w1 * s1 * e) / (w2 * s2))

        mass, _ = integrate.quad(density, -12, 12, epsabs=1e-13)
        assert got[k] == pytest.approx(mass, abs=1e-10)
    probabilities = model.class_probabilities(x, scale)
    assert probabilities[:, 1] == pytest.approx(got, rel=1e-15)


def _trial(kappa, bound, p_lower=0.9, radius=0.01):
    """A linear trial at scale (0.25, 0.5), x0 on side 1 at distance 0.3 from the plane:
    its certificate (ball ``radius``, ellipsoid ``kappa``) and the formula's derivation."""
    model = LinearClassifier(2, one_hot=True, num_classes=3, classes=(2, 0))
    normal = torch.tensor([0.6, 0.8], dtype=torch.float64)
    x0 = torch.tensor([[0.5, 0.5]])
    model.set_plane(normal, float(x0[0].double() @ normal) - 0.3)
    scale = np.array([0.25, 0.5], dtype=np.float32)
    region = None if kappa is None else {"kind": "ellipsoid", "factor": kappa}
    c = SimpleNamespace(input_id=7, prediction=0, radius=radius, p_lower=p_lower, region=region,
                        draws={"base": {"scale": encode_scale(scale)}})  # fmt: skip
    derived = SimpleNamespace(prediction=np.array([0]), radius=np.array([radius]),
                              bound=np.array([bound]))  # fmt: skip
    return c, derived, model, x0


def test_an_ellipsoid_is_false_iff_it_reaches_the_plane():
    """The ellipsoid {‖Σ^{-1/2}δ‖ <= κ} keeps the class iff κ·‖s⊙w‖ <= the margin, i.e.
    iff Φ(κ) <= the exact p_A (scipy): the claim's κ, and Φ⁻¹ of the formula's bound."""
    reach = float(np.hypot(0.25 * 0.6, 0.5 * 0.8))  # ‖s⊙w‖
    p_exact = norm.cdf(0.3 / reach)
    for kappa, bound, source in ((0.3 / reach * (1 + 1e-6), 0.5, "claim ellipsoid"),
                                 (None, p_exact + 1e-6, "formula ellipsoid")):  # fmt: skip
        c, derived, model, x0 = _trial(kappa, bound)
        false = linear_trial_false(c, derived, model, (2, 0), x0, {})
        assert false is not None and false["certificate"] == source, false
        assert false["ellipsoid_reach"] > false["distance_to_boundary"] == pytest.approx(0.3)
    for kappa, bound in ((0.3 / reach * (1 - 1e-6), 0.5), (None, p_exact - 1e-6)):
        c, derived, model, x0 = _trial(kappa, bound)
        assert linear_trial_false(c, derived, model, (2, 0), x0, {}) is None
    c, derived, model, x0 = _trial(0.1, 0.6, radius=0.0)  # an ellipsoid, and no ball
    c.prediction, derived.prediction = 2, np.array([2])  # of the other class: false however small
    false = linear_trial_false(c, derived, model, (2, 0), x0, {})
    assert false["certificate"] == "claim ellipsoid" and false["true_class"] == 0


class Wide(AnisotropicCertifier):
    """The anisotropic certificate with its ellipsoid claimed 1.5 times as wide."""

    def certify(self, evidence):
        return [c if c.ellipsoid is None else replace(c, ellipsoid=1.5 * c.ellipsoid)
                for c in super().certify(evidence)]  # fmt: skip


class WidePlugins:
    """``scaled-sound`` and ``scaled-wide``: the fixed scale (0.25, 0.5) of ``FixedScale`` with the
    anisotropic certificate, and with :class:`Wide`."""

    @hookimpl
    def idrs_register_sigma_providers(self, register):
        register(SigmaProviderSpec("scaled", lambda context, params: FixedScale(0.25, 2.0)))

    @hookimpl
    def idrs_register_certifiers(self, register):
        register(CertifierSpec("wide", lambda context, params, provider: Wide()))

    @hookimpl
    def idrs_register_methods(self, register):
        register(MethodSpec("scaled-sound", "scaled", "anisotropic", {}))
        register(MethodSpec("scaled-wide", "scaled", "wide", {}))


class ReadsTheModel(FixedScale):
    """``FixedScale(0.25, 2.0)`` that evaluates the base model first (and discards it): a σ
    of each trial's classifier, which S1 asks trial by trial."""

    def __init__(self, model) -> None:
        super().__init__(0.25, 2.0)
        self.model = model

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.model(x)
        return super().__call__(x)


class ReadingPlugins:
    """``scaled-reading``: the fixed scale of ``scaled-sound``, asked of a σ that reads the model."""

    @hookimpl
    def idrs_register_sigma_providers(self, register):
        register(SigmaProviderSpec("reading", lambda context, params: ReadsTheModel(context.model)))

    @hookimpl
    def idrs_register_methods(self, register):
        register(MethodSpec("scaled-reading", "reading", "anisotropic", {}))


class FarPlugins:
    """``scaled-far``: a fixed scale whose axes are 10⁴ apart (0.01, 100), out of the reach
    of Ruben's series for a ball's mass."""

    @hookimpl
    def idrs_register_sigma_providers(self, register):
        register(SigmaProviderSpec("far", lambda context, params: FixedScale(0.01, 1e4)))

    @hookimpl
    def idrs_register_methods(self, register):
        register(MethodSpec("scaled-far", "far", "anisotropic", {}))


def _audited(db, run_id: str, manager) -> dict:
    """The audits of a stored run's rows by method name, at the small budget and a fixed
    entropy."""
    store = ResultStore(db)
    try:
        return {a.method.name: a for a in audits(store, run_id, RunOptions(db=db),
                Progress(enabled=False), manager, budget=BUDGETS["small"], entropy=0x5CA1ED)}  # fmt: skip
    finally:
        store.close()


@pytest.mark.slow
def test_s1_audits_a_diagonal_row_on_the_plane_with_its_ellipsoids(tmp_path, manager, replay_run):
    manager.register(WidePlugins(), name="wide-plugins")
    db, run_id = replay_run(tmp_path, manager, ["scaled-sound", "scaled-wide"], n=400, count=8)
    found = _audited(db, run_id, manager)
    sound = check_coverage(found["scaled-sound"])
    assert sound.verdict == Verdict.SOUND, sound.summary
    assert "Holm over 4" in sound.evidence["correction"]
    assert sound.evidence["linear-2"]["certified"] > 0 and sound.evidence["ball-2"]["certified"] > 0
    wide = check_coverage(found["scaled-wide"])
    assert wide.verdict == Verdict.VIOLATED, wide.summary
    assert wide.evidence["underived"]["examples"][0]["quantity"] == "ellipsoid"
    linear = wide.evidence["linear-2"]  # the wide ellipsoids reach the plane: false, counted
    assert linear["failures"] > 0 and linear["example"]["certificate"] == "claim ellipsoid"
    ball = wide.evidence["ball-2"]  # and hold a point the exact ball mass at its scale flips
    assert ball["failures"] > 0 and ball["example"]["region"] == "ellipsoid"
    low, high = ball["example"]["exact_p_inside_bounds"]
    assert high - low < 1e-9 and ball["example"]["exact_p_inside"] < 0.5


@pytest.mark.slow
def test_s1_trial_by_trial_judges_a_diagonal_row_as_all_at_once(
    tmp_path, manager, replay_run, monkeypatch
):  # fmt: skip
    """A scale that reads the model is asked trial by trial; its S1 draws the same
    placements, rays and noise as the scale asked for a whole round at once, so both
    families' trials, certificates and false certificates are the same."""
    from harness.audit import coverage_rounds

    one_by_one, rounds = coverage_rounds._one_by_one, []
    monkeypatch.setattr(coverage_rounds, "_one_by_one",
                        lambda rnd, *args: rounds.append(rnd.family) or one_by_one(rnd, *args))  # fmt: skip
    manager.register(WidePlugins(), name="wide-plugins")
    manager.register(ReadingPlugins(), name="reading-plugins")
    db, run_id = replay_run(tmp_path, manager, ["scaled-sound", "scaled-reading"], n=400, count=8)
    found = _audited(db, run_id, manager)
    together = check_coverage(found["scaled-sound"])
    assert not rounds
    alone = check_coverage(found["scaled-reading"])
    assert set(rounds) == {"linear", "ball"}
    assert together.verdict == alone.verdict == Verdict.SOUND, alone.summary
    for family in ("linear-2", "ball-2"):
        assert alone.evidence[family] == together.evidence[family]
    assert together.evidence["ball-2"]["certified"] > 0


@pytest.mark.slow
def test_s1_says_ball_n_is_not_run_where_the_ball_mass_is_out_of_reach(
    tmp_path, manager, replay_run
):  # fmt: skip
    """A scale whose ball mass Ruben's series cannot bound to 1e-9: the linear trials and
    the calibration still judge, and the evidence and summary say why ball-2 did not run."""
    manager.register(FarPlugins(), name="far-plugins")
    db, run_id = replay_run(tmp_path, manager, ["scaled-far"], n=400, count=8)
    result = check_coverage(_audited(db, run_id, manager)["scaled-far"])
    assert result.verdict == Verdict.SOUND, result.summary
    assert result.evidence["ball-2"].startswith("not run: the ball's mass under a diagonal")
    assert "ratio 1e+04" in result.summary and "Holm over 3" in result.evidence["correction"]
    assert result.evidence["linear-2"]["trials"] > 0


def test_the_exact_engine_draws_at_a_scale_as_at_its_spread_along_the_normal():
    """The method's own Monte Carlo on S1's exact classifiers: at a scale s the linear
    model's classes are those of one σ = ‖s⊙w‖₂ (the same keyed uniforms, the same p)."""
    from harness.audit.analytic import noise_spread
    from harness.engine.exact import ExactSampling

    model = LinearClassifier(2, one_hot=True, num_classes=3, classes=(1, 2))
    model.set_plane(torch.tensor([0.6, 0.8]), 0.2)
    engine = ExactSampling(model, model.class_probabilities, 3, torch.device("cpu"), seed=3)
    x, scale = torch.tensor([[0.3, 0.1], [0.0, 0.4]]), np.array([[0.25, 0.5], [1.0, 0.125]])
    w = model.w.double().numpy()
    spread = noise_spread(scale, w / np.linalg.norm(w))
    counts = engine.counts(x, scale, [4, 9], 500, 1)
    assert np.array_equal(counts, engine.counts(x, spread, [4, 9], 500, 1))
    assert counts[:, 0].sum() == 0 and counts.sum() == 1000


# --- S2 and S3 on σ-providers answering [B, 1, 28, 28] --------------------------------

SHAPE = (1, 28, 28)


class ImageScale:
    """σ(x) [B, 1, 28, 28]: base·exp(rate·w·x) on the axes in ``mask`` (w a unit vector)."""

    def __init__(self, regularity, rate: float = 0.0, axes: slice = slice(None)) -> None:
        self.regularity, self.rate = regularity, rate
        gen = torch.Generator().manual_seed(11)
        self.base = 0.2 + 0.3 * torch.rand(784, generator=gen, dtype=torch.float64)
        w = torch.randn(784, generator=gen, dtype=torch.float64)
        self.w = w / w.norm()
        self.mask = torch.zeros(784, dtype=torch.float64)
        self.mask[axes] = 1.0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        moved = x.flatten(1).double() @ self.w
        scale = self.base * torch.exp(self.rate * moved[:, None] * self.mask)
        return scale.view(len(x), *SHAPE)


def _image_audit(provider, fraction: float = 1.0) -> FakeAudit:
    """Three 28×28 inputs certified at the scale answered there, radius ``fraction`` of
    Cohen's at the smallest axis."""
    inputs = torch.rand(3, *SHAPE, generator=torch.Generator().manual_seed(2))
    scales = provider(inputs).reshape(3, -1).numpy()
    certs = _certificates(scales, radius=lambda s: fraction * float(s.min()) * norm.ppf(P_LOWER))
    audit = FakeAudit(provider, certs)
    audit.inputs = inputs
    return audit


def test_s2_reads_a_scale_answered_as_images():
    """The error once seen on UCAN rows: a [B, 1, 28, 28] scale against [B] distances."""
    assert check_sigma_regularity(_image_audit(ImageScale(Constant(0.2)))).verdict == Verdict.SOUND
    moving = check_sigma_regularity(_image_audit(ImageScale(SemiElastic(0.1), rate=0.5)))
    assert moving.verdict == Verdict.UNJUSTIFIED, moving.summary
    assert 0 <= moving.evidence["axis"] < 784
    free = check_sigma_regularity(_image_audit(ImageScale(Unregularized(), rate=0.5)))
    assert free.verdict == Verdict.NOT_APPLICABLE


def test_s3_keeps_a_fixed_scale_sound_whatever_its_declaration():
    for regularity in (Constant(0.2), Unregularized()):
        result = check_justification(_image_audit(ImageScale(regularity)))
        assert result.verdict == Verdict.SOUND, result.summary
        assert result.evidence["varying"] == 0 and "worst_case" not in result.evidence


def test_s3_flags_a_scale_that_grows_along_many_axes_inside_the_ball():
    """Every axis of an Unregularized scale changes inside the ball: the worst case of the
    two Gaussians is far below 1/2 at the point found, which its bound shows."""
    result = check_justification(_image_audit(ImageScale(Unregularized(), rate=2.0)))
    assert result.verdict == Verdict.UNJUSTIFIED, result.summary
    judged = result.evidence["worst_case"]["judged"]
    assert len(judged) == 3 and all(r["upper"] < 0.5 for r in judged)
    assert "anisotropic Gaussians" in result.summary


def test_s3_passes_a_scale_that_barely_moves_well_inside_its_ball():
    """A change of at most ~1% inside a ball of half Cohen's radius: the worst case, shown
    above 1/2 at the point judged, covers it (as the scalar S3 passes an Unregularized σ
    whose exact worst case is below 1/2)."""
    result = check_justification(_image_audit(ImageScale(Unregularized(), rate=0.01), 0.5))
    assert result.verdict == Verdict.SOUND, result.summary
    assert all(r["lower"] >= 0.5 for r in result.evidence["worst_case"]["judged"])


def test_s3_judges_the_points_of_a_varying_ball_where_the_scale_is_fixed_exactly():
    """Axis 1 moves along (0, 0.6, −0.8) only: at the ends of the smallest axis (0) the
    scale is the recorded one, where ANCER's worst case at 1.5 Cohen's radius is exact."""
    audit = _audit(Scale(Unregularized(), rate=0.5, axes=(1,)),
                   radius=lambda s: 1.5 * float(s.min()) * norm.ppf(P_LOWER))  # fmt: skip
    result = check_justification(audit)
    assert result.verdict == Verdict.UNJUSTIFIED, result.summary
    assert "ANCER's exact worst case" in result.summary
    expected = norm.cdf(norm.ppf(P_LOWER) * (1 - 1.5))
    assert f"{expected:.6g}"[:5] in result.summary
