"""S4, S5 and the empirical attack on rows drawn at a diagonal scale (issue 59, item 5).

The σ-provider is ``fixed-scale`` on two input dimensions (σ_0 = 0.25, σ_1 = 0.5); on the
analytic ``linear-N`` model f(x) = [x_0 > 0] the boundary's normal is the small axis, so
the smoothed classifier at any Gaussian noise is f itself and the true robust ℓ2 radius
of x is |x_0| (scipy says how far a claim exceeds it). A sound row passes; a certifier
that claims the ball of the LARGEST axis, or an ellipsoid twice as wide, is caught by a
concrete point inside the claim, confirmed by fresh Monte Carlo or (on ``ball-2``) by the
exact smoothed probability, which scipy's quadrature recomputes.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy import integrate, stats
from scipy.special import ndtri

from harness import hookimpl
from harness.audit.analytic import BallClassifier
from harness.audit.audit import BUDGETS
from harness.audit.counterexamples import check_counterexamples
from harness.audit.coverage_trials import place_ball
from harness.audit.ellipsoid_intersections import meeting_ellipsoids
from harness.audit.empirical import STRENGTHS, attack_row
from harness.audit.order import check_order
from harness.audit.session import audits
from harness.foundation.certificate import ABSTAIN
from harness.foundation.progress import Progress
from harness.foundation.verdict import Verdict
from harness.mathematics.gaussian_ball import (
    UndecidedMass,
    ball_mass,
    ball_probability,
    radius_for_probability,
)
from harness.plugin.components import CertifierSpec, MethodSpec
from harness.plugin.manager import PluginManager
from harness.running.benchmark import parse_benchmark
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark
from harness.store.store import ResultStore
from plugins.anisotropic.certifier import AnisotropicCertifier

ENTROPY = int("d1a6", 16)
SCALE = {"sigma": 0.25, "ratio": 2.0}  # fixed-scale on 2-D: axes (0.25, 0.5)


class LargestAxis(AnisotropicCertifier):
    """Rigged: the ball of the largest axis, κ·σ_max (twice the sound κ·σ_min here)."""

    def certify(self, evidence):
        claims = super().certify(evidence)
        top = evidence.scale.max(axis=1)
        return [c if c.prediction == ABSTAIN else replace(c, radius=float(c.ellipsoid * top[k]))
                for k, c in enumerate(claims)]  # fmt: skip


class WideEllipsoid(AnisotropicCertifier):
    """Rigged: the sound ball, and an ellipsoid of κ twice Φ⁻¹(p_A_lower)."""

    def certify(self, evidence):
        return [c if c.prediction == ABSTAIN else replace(c, ellipsoid=2 * c.ellipsoid)
                for c in super().certify(evidence)]  # fmt: skip


class Rigged:
    @hookimpl
    def idrs_register_certifiers(self, register):
        register(CertifierSpec("largest-axis", lambda context, params, provider: LargestAxis()))
        register(CertifierSpec("wide-ellipsoid", lambda context, params, provider: WideEllipsoid()))

    @hookimpl
    def idrs_register_methods(self, register):
        register(MethodSpec("sound-scale", "fixed-scale", "anisotropic", SCALE))
        register(MethodSpec("largest-axis", "fixed-scale", "largest-axis", SCALE))
        register(MethodSpec("wide-ellipsoid", "fixed-scale", "wide-ellipsoid", SCALE))
        register(MethodSpec("scale-memory", "fixed-scale", "memory",
                            {**SCALE, "memory_certifier": "anisotropic"}))  # fmt: skip
        register(MethodSpec("largest-axis-memory", "fixed-scale", "memory",
                            {**SCALE, "memory_certifier": "largest-axis"}))  # fmt: skip


def _run(folder, model: str, methods: list[str]):
    """A run of ``methods`` on ball-2 (24 inputs) with the analytic ``model``; (db, run id)."""
    raw = {
        "name": "diagonal-s4", "seed": 3, "shard_size": 8,
        "dataset": {"name": "ball-2", "test_count": 24},
        "model": {"architecture": model, "trainer": "none"},
        "certification": {"n0": 64, "n": 1000, "alpha": 0.001, "batch_size": 256},
        "radii": [0.05 * k for k in range(1, 21)],
        "methods": [{"name": m} for m in methods],
    }  # fmt: skip
    db = folder / "runs.sqlite"
    with PluginManager(third_party=False) as manager:
        manager.register(Rigged(), name="rigged-diagonal")
        run_id = run_benchmark(parse_benchmark(raw), RunOptions(db=db), Progress(enabled=False),
                               manager)  # fmt: skip
        store = ResultStore(db)
        try:
            found = audits(store, run_id, RunOptions(db=db), Progress(enabled=False), manager,
                           budget=BUDGETS["small"], entropy=ENTROPY)  # fmt: skip
            return {a.method.name: a for a in found}
        finally:
            store.close()


@pytest.fixture(scope="module")
def linear(tmp_path_factory):
    folder = tmp_path_factory.mktemp("linear")
    return _run(folder, "linear-N", ["sound-scale", "largest-axis", "wide-ellipsoid"])


@pytest.fixture(scope="module")
def ball(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("ball"), "ball-N",
                ["sound-scale", "largest-axis", "wide-ellipsoid", "scale-memory",
                 "largest-axis-memory"])  # fmt: skip


def _by_id(audit):
    return {int(c["input_id"]): (c, x) for c, x in zip(audit.certificates, audit.inputs,
                                                       strict=True)}  # fmt: skip


# --- the exact ball mass at a diagonal scale ------------------------------------------


def _quadrature(offset, scale, radius) -> float:
    """P(‖offset + scale∘ε‖ < radius) in 2-D by scipy's quadrature over ε_0."""
    m0, m1 = offset
    s0, s1 = scale

    def inner(u):
        half = np.sqrt(max(radius**2 - (m0 + s0 * u) ** 2, 0.0))
        return stats.norm.pdf(u) * (
            stats.norm.cdf((half - m1) / s1) - stats.norm.cdf((-half - m1) / s1)
        )

    lo, hi = (-radius - m0) / s0, (radius - m0) / s0
    return integrate.quad(inner, lo, hi, epsabs=1e-13, epsrel=1e-12, limit=200)[0]


@pytest.mark.parametrize("offset,scale,radius", [
    ((0.3, -0.4), (0.25, 0.5), 1.0), ((1.2, 0.1), (0.1, 0.9), 1.0), ((0.0, 0.0), (0.3, 0.3), 0.5),
    ((2.0, 2.0), (0.25, 0.5), 1.0), ((0.99, 0.0), (0.02, 0.02), 1.0),
    ((0.99, 0.01), (0.02, 0.03), 1.0),  # c_0 = e^-1225: below float64's range
    ((5.0, 0.0), (0.1, 0.2), 1.0),  # χ²'s tail alone
])  # fmt: skip
def test_the_ball_mass_bounds_hold_the_quadrature_and_the_noncentral_chi2(offset, scale, radius):
    """Ruben's series (and χ²'s tail, far from the sphere) bounds P(inside) within 1e-9 of
    an independent quadrature, and of the noncentral χ² at one σ."""
    (lower,), (upper,) = ball_mass(np.array([offset]), np.array([scale]), radius)
    assert upper - lower < 1e-9
    truth = _quadrature(offset, scale, radius)
    assert lower - 1e-10 <= truth <= upper + 1e-10
    if scale[0] == scale[1]:
        exact = stats.ncx2.cdf(
            radius**2 / scale[0] ** 2, 2, np.sum(np.square(offset)) / scale[0] ** 2
        )
        assert lower - 1e-10 <= exact <= upper + 1e-10


@pytest.mark.parametrize("offset,scale,radius", [
    ((0.999, 0.0), (1e-3, 2e-3), 1.0), ((0.5, 0.3), (4e-3, 2e-3), 0.583),
])  # fmt: skip
def test_a_ball_mass_out_of_the_series_reach_is_bounded_by_the_inversion(offset, scale, radius):
    """Near the sphere at a tiny scale (10⁵ terms and more): the inversion's bounds, within
    1e-9, hold a quadrature over one axis that solves the other exactly."""
    (m0, m1), (s0, s1) = offset, scale

    def given(v):  # P over the narrow axis 0, given the wide axis 1 at v
        half = np.sqrt(max(radius**2 - (m1 + s1 * v) ** 2, 0.0))
        return stats.norm.pdf(v) * (
            stats.norm.cdf((half - m0) / s0) - stats.norm.cdf((-half - m0) / s0)
        )

    truth = integrate.quad(given, -12, 12, epsabs=1e-14, epsrel=1e-12, limit=400, points=[0.0])[0]
    (lower,), (upper,) = ball_mass(np.array([offset]), np.array([scale]), radius)
    assert upper - lower < 1e-9 and lower - 1e-10 <= truth <= upper + 1e-10
    r = radius_for_probability(np.array(offset), np.array(scale), truth)
    assert r == pytest.approx(radius, rel=1e-7)


# --- S4 ---------------------------------------------------------------------------------


def test_s4_passes_a_sound_diagonal_row_and_attacks_its_balls_and_ellipsoids(linear):
    result = check_counterexamples(linear["sound-scale"])
    assert result.verdict == Verdict.SOUND, result.summary
    attack = result.evidence["attack"]
    assert attack["attacked"] > 0 and attack["confirmed"] == 0
    assert result.evidence["intersections"]["count"] == 0


def test_s4_finds_the_largest_axis_ball_broken_along_the_small_axis(linear):
    """The rigged ball of κ·σ_max is twice the true radius |x_0| (scipy: Φ⁻¹ of the exact
    p_A times σ_0); PGD walks along x_0, the small axis, across the boundary, and fresh
    Monte Carlo confirms the other class there."""
    audit = linear["largest-axis"]
    result = check_counterexamples(audit)
    assert result.verdict == Verdict.VIOLATED, result.summary
    examples = result.evidence["attack"]["examples"]
    assert examples and "PGD found" in result.summary
    rows = _by_id(audit)
    for e in examples:
        c, x = rows[e["input_id"]]
        truth = 0.25 * stats.norm.ppf(stats.norm.cdf(abs(float(x[0])) / 0.25))  # = |x_0|
        assert e["distance"] < c["radius"] and e["distance"] > truth
        assert c["radius"] > 1.5 * truth
        assert e["winning_class"] != c["prediction"] == int(float(x[0]) > 0)
        assert e["sigma_at_point"] == pytest.approx(0.25) and e["scale_max_at_point"] == 0.5


def test_s4_finds_a_point_of_the_claimed_ellipsoid_outside_the_true_one(linear):
    """A sound ball with an ellipsoid twice too wide: a search inside the ellipsoid
    (whitened PGD) finds the counterexample, marked as the ellipsoid's; the ellipsoids also
    meet across the boundary where the sound balls do not."""
    from harness.audit.ball_intersections import intersections

    audit = linear["wide-ellipsoid"]
    result = check_counterexamples(audit)
    assert result.verdict == Verdict.VIOLATED, result.summary
    assert result.evidence["intersections"]["regions"] == "ellipsoids"
    assert result.evidence["intersections"]["count"] > 0
    balls = [{k: v for k, v in c.items() if k != "region"} for c in audit.certificates]
    assert intersections(balls, audit.inputs)["count"] == 0
    examples = result.evidence["attack"]["examples"]
    assert examples and all(e["region"] == "ellipsoid" for e in examples)
    rows = _by_id(audit)
    for e in examples:
        c, x = rows[e["input_id"]]
        assert e["whitened_norm"] < 1 and e["distance"] > abs(float(x[0]))
        assert c["region"]["factor"] == pytest.approx(2 * ndtri(c["p_lower"]))


def test_s4_on_ball_2_judges_each_point_at_its_scale_exactly(ball):
    """On the ball classifier (b) bounds the exact smoothed probability at the scale asked
    at each point: the sound row has no flip, the largest-axis ball and the wide ellipsoid
    do, and scipy's quadrature agrees with the reported P(inside)."""
    sound = check_counterexamples(ball["sound-scale"])
    assert sound.verdict == Verdict.SOUND, sound.summary
    assert sound.evidence["exact_flips"]["count"] == 0
    for method, region in (("largest-axis", None), ("wide-ellipsoid", "ellipsoid")):
        audit = ball[method]
        flips = check_counterexamples(audit).evidence["exact_flips"]
        assert flips["count"] > 0, method
        center = audit.context.model.center.double().numpy()
        rows = _by_id(audit)
        for f in flips["examples"]:
            c, _ = rows[f["input_id"]]
            assert f.get("region") == region
            inside = _quadrature(np.array(f["point"]) - center, (0.25, 0.5), 1.0)
            lower, upper = f["exact_p_inside_bounds"]
            assert lower - 1e-9 <= inside <= upper + 1e-9
            assert (inside > 0.5) != (c["prediction"] == audit.context.model.classes[1])


def test_s4_flags_a_diagonal_memory_row_and_searches_its_balls_at_their_scale(ball):
    """A memory's balls keep the scale of their own entry (its ``ball_sigmas`` rule): the
    sound memory has no exact flip, the one over the largest-axis ball has."""
    result = check_counterexamples(ball["scale-memory"])
    assert "order-dependent" in result.flags
    assert result.evidence["exact_flips"]["count"] == 0, result.summary
    assert result.verdict == Verdict.SOUND
    rigged = check_counterexamples(ball["largest-axis-memory"])
    assert rigged.verdict == Verdict.VIOLATED and rigged.evidence["exact_flips"]["count"] > 0
    assert rigged.evidence["attack"].startswith("not applicable")


# --- S5 ---------------------------------------------------------------------------------


def test_s5_replays_a_memory_over_an_anisotropic_certifier(ball):
    audit = ball["scale-memory"]
    assert any(c.get("region") for c in audit.certificates)
    result = check_order(audit)
    assert result.verdict == Verdict.ORDER_DEPENDENT, result.summary
    assert result.evidence["orders"] == audit.budget.orders
    assert "ellipsoids are not replayed" in result.evidence["regions"]
    worst = result.evidence["worst_order"]
    assert sorted(worst["input_id"]) == sorted(int(c["input_id"]) for c in audit.certificates)
    assert result.evidence["acr"]["min"] <= result.evidence["acr"]["max"]


# --- the empirical attack ----------------------------------------------------------------


def _contradicted(audit, result) -> list[int]:
    """Inputs the attack broke at a radius their certificate claims, with the label certified."""
    broken = {int(i): r for i, r in result["broken"].items()}
    return [int(c["input_id"]) for c in audit.certificates
            if c["prediction"] == c["label"] != ABSTAIN
            and broken.get(int(c["input_id"]), np.inf) < c["radius"]]  # fmt: skip


def test_the_attack_draws_at_the_scale_and_breaks_only_the_rigged_claims(linear):
    """The attack's confirmations at Σ(x') break no sound certificate; they break the
    largest-axis balls inside their claimed radius (beyond the true |x_0|)."""
    sound = attack_row(linear["sound-scale"], STRENGTHS["small"])
    assert not _contradicted(linear["sound-scale"], sound)
    assert sound["broken"]  # beyond the certified radii only
    for example in sound["examples"]:
        assert example["sigma_at_point"] == pytest.approx(0.25)
        assert example["scale_max_at_point"] == 0.5
    rigged = attack_row(linear["largest-axis"], STRENGTHS["small"])
    assert _contradicted(linear["largest-axis"], rigged)


def test_a_check_without_diagonal_support_still_refuses_the_row(linear):
    """Every registered check now audits a diagonal row; one registered without
    ``diagonal=True`` is refused: an error naming the missing support, never a pass."""
    from harness.audit.session import _checked_run
    from harness.plugin.components import CheckSpec

    def passes(audit):  # would pass anything, were it run
        raise AssertionError("a check without diagonal support ran on a diagonal row")

    result = _checked_run(CheckSpec("scalar-only", passes, "one σ only"), linear["sound-scale"],
                          Progress(enabled=False))  # fmt: skip
    assert result.verdict == Verdict.ERROR
    assert "does not support a diagonal noise scale" in result.summary
    assert "scalar-only" in result.summary


# --- S4 (a): claimed ellipsoids that meet --------------------------------------------------


def test_ellipsoids_with_equal_axes_meet_as_balls_do():
    """Every semi-axis R: the dual's maximum is ‖d‖²/(R_1 + R_2)², so two regions meet
    exactly when ‖d‖ < R_1 + R_2 (the ball test)."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(40, 6))
    radii = rng.uniform(0.5, 2.5, size=40)
    preds = np.arange(40) % 3
    found = {(i, j) for i, j, _ in meeting_ellipsoids(centres, np.repeat(radii[:, None], 6, 1),
                                                      preds)}  # fmt: skip
    gaps = np.linalg.norm(centres[:, None] - centres[None], axis=2)
    truth = {(i, j) for i in range(40) for j in range(i + 1, 40)
             if preds[i] != preds[j] and gaps[i, j] < (radii[i] + radii[j]) * (1 - 1e-6)}  # fmt: skip
    near = {(i, j) for i in range(40) for j in range(i + 1, 40)
            if abs(gaps[i, j] - radii[i] - radii[j]) < 1e-6 * gaps[i, j]}  # fmt: skip
    assert truth and truth <= found <= truth | near


def test_the_dual_is_the_least_larger_whitened_norm_scipy_finds():
    """max_λ f(λ) = min_x max(q_1, q_2), the latter minimized by SLSQP; each witness lies
    in both ellipsoids, and disjoint ellipsoids give none."""
    from scipy.optimize import minimize

    from harness.audit.ellipsoid_intersections import best_lambda, dual_value

    rng = np.random.default_rng(1)
    for _ in range(12):
        c1, c2 = rng.normal(size=4), rng.normal(size=4)
        a1, a2 = rng.uniform(0.3, 1.5, size=4), rng.uniform(0.3, 1.5, size=4)
        q = [
            lambda x, c=c, a=a: float(np.sum((x - c) ** 2 / a**2)) for c, a in ((c1, a1), (c2, a2))
        ]
        primal = minimize(lambda z: z[-1], np.r_[(c1 + c2) / 2, 10.0], method="SLSQP",
                          constraints=[{"type": "ineq", "fun": lambda z, f=f: z[-1] - f(z[:-1])}
                                       for f in q], options={"ftol": 1e-12, "maxiter": 500})  # fmt: skip
        d2, s1, s2 = ((c1 - c2) ** 2)[None], (a1**2)[None], (a2**2)[None]
        dual = float(dual_value(best_lambda(d2, s1, s2), d2, s1, s2)[0])
        assert dual == pytest.approx(primal.fun, rel=1e-6, abs=1e-9)
        pairs = meeting_ellipsoids(np.stack([c1, c2]), np.stack([a1, a2]), np.array([0, 1]))
        assert bool(pairs) is (dual < 1 - 1e-6) or abs(dual - 1) < 1e-6
        for _, _, depth in pairs:
            assert depth < 1 and depth == pytest.approx(dual, rel=1e-6)


def test_s4_counts_ellipsoids_that_meet_though_their_balls_do_not():
    """Two thin ellipsoids along the axis joining their centres meet while their smallest-
    axis balls are far apart: the intersections sub-test counts the pair (regions
    'ellipsoids'), and a row without regions is judged by its balls as before."""
    from harness.audit.ball_intersections import intersections
    from harness.engine.scale import encode_scale

    def row(k, prediction, factor):
        scale = np.array([1.0, 0.1, 0.1], dtype=np.float32)
        return {"input_id": k, "prediction": prediction, "radius": 0.1 * factor,
                "draws": {"base": {"scale": encode_scale(scale)}},
                "region": {"kind": "ellipsoid", "factor": factor}}  # fmt: skip

    inputs = torch.tensor([[0.0, 0.0, 0.0], [1.5, 0.0, 0.0]])
    meeting = intersections([row(0, 0, 1.0), row(1, 1, 1.0)], inputs)
    assert meeting["regions"] == "ellipsoids" and meeting["count"] == 1
    assert meeting["false_at_least"] == 1 and meeting["example"]["witness_depth"] < 1
    apart = intersections([row(0, 0, 0.7), row(1, 1, 0.7)], inputs)  # 0.7 + 0.7 < 1.5
    assert apart["count"] == 0
    balls = [{k: v for k, v in row(i, i, 1.0).items() if k != "region"} for i in (0, 1)]
    assert intersections(balls, inputs)["count"] == 0 and "regions" not in intersections(
        balls, inputs
    )


# --- S1's ball-N at a diagonal scale ----------------------------------------------------


@pytest.mark.parametrize("offset,scale,q", [
    ((0.3, -0.4), (0.25, 0.5), 0.3), ((1.2, 0.1), (0.1, 0.9), 0.97), ((0.2, 0.0), (0.3, 0.3), 0.5),
    ((-0.1, 0.05), (0.02, 0.4), 0.02),
])  # fmt: skip
def test_the_radius_of_a_ball_mass_holds_the_quadrature(offset, scale, q):
    """radius_for_probability inverts the mass: the quadrature at its radius is q (and at
    equal axes the radius is the noncentral χ²'s quantile)."""
    radius = radius_for_probability(np.array(offset), np.array(scale), q)
    assert _quadrature(offset, scale, radius) == pytest.approx(q, abs=1e-8)
    if scale[0] == scale[1]:
        nc = np.sum(np.square(offset)) / scale[0] ** 2
        assert radius == pytest.approx(scale[0] * np.sqrt(stats.ncx2.ppf(q, 2, nc)), rel=1e-8)


def test_the_ball_classifier_at_a_diagonal_scale_is_the_quadrature():
    """The exact smoothed ball classifier at a scale per point (plain and per input), and
    its placement at a trial quantile: what the quadrature gives."""
    model = BallClassifier(2, one_hot=True, num_classes=3, classes=(2, 0))
    model.set_ball(torch.tensor([0.4, -0.2]), 0.9)
    x = np.array([[0.1, 0.3], [1.0, -0.5]])
    scale = np.array([[0.25, 0.5], [0.6, 0.1]])
    held = model.center.double().numpy()  # float32, as the model holds it
    truth = [_quadrature(x[k] - held, scale[k], 0.9) for k in range(2)]
    assert model.smoothed_probability(x, scale) == pytest.approx(truth, abs=1e-9)
    placements = [(torch.tensor([0.4, -0.2]), 0.9), (torch.tensor([1.5, 0.0]), 0.7)]
    with model.per_input(torch.from_numpy(x).float(), placements):
        rows = model.class_probabilities(x.astype(np.float32), scale)
    routed = [_quadrature(x[0].astype(np.float32) - held, scale[0], 0.9),
              _quadrature(x[1].astype(np.float32) - np.array([1.5, 0.0]), scale[1], 0.7)]  # fmt: skip
    assert rows[:, 0] == pytest.approx(routed, abs=1e-9)  # class of "inside"
    assert np.allclose(rows.sum(axis=1), 1.0) and np.all(rows[:, 1] == 0.0)
    x0 = torch.tensor([0.2, 0.7])
    placed = place_ball(model, x0, np.array([0.3, 0.05]), 0.8, torch.Generator().manual_seed(3))
    center = model.center.double().numpy()
    assert np.linalg.norm(x0.numpy() - center) == pytest.approx(0.05, rel=1e-6)  # min_i s_i
    got = _quadrature(x0.double().numpy() - center, (0.3, 0.05), placed["ball_radius"])
    assert got == pytest.approx(0.8, abs=1e-6)  # the center held in float32


def test_the_inversion_and_the_series_agree_on_many_uneven_axes(monkeypatch):
    """At d = 60 with axes 6 apart the series and the inversion (forced: a series of 2 terms)
    bound the same masses, each within 1e-9, for points inside, near and outside the sphere."""
    import harness.mathematics.gaussian_ball as gaussian_ball

    rng = np.random.default_rng(4)
    scale = np.repeat(0.1 * np.exp(rng.uniform(-0.9, 0.9, size=(1, 60))), 3, axis=0)
    offset = rng.normal(size=(3, 60)) * np.array([[0.02], [0.08], [0.12]])
    radius = float(np.sqrt(np.sum(scale[0] ** 2)) * 1.05)
    series = ball_mass(offset, scale, radius)
    monkeypatch.setattr(gaussian_ball, "MAX_TERMS", 2)
    inverted = ball_mass(offset, scale, radius)
    for lower, upper in (series, inverted):
        assert np.all(upper - lower < 1e-9)
    assert np.all(series[0] <= inverted[1] + 1e-12) and np.all(inverted[0] <= series[1] + 1e-12)
    assert series[0].min() > 0.01 and series[0].max() < 0.99  # not decided by a tail alone


def test_a_ball_mass_bounded_no_closer_than_1e_9_is_an_error_not_a_value(monkeypatch):
    """Where neither method bounds the mass to 1e-9, the exact classifier raises, naming the axes."""
    import harness.mathematics.gaussian_ball as gaussian_ball

    monkeypatch.setattr(gaussian_ball, "EXACT_WIDTH", 1e-13)  # tighter than either reaches
    model = BallClassifier(2)
    model.set_ball(torch.tensor([0.0, 0.0]), 1.0)
    with pytest.raises(UndecidedMass, match="ratio 2"):
        model.smoothed_probability(np.array([[0.999, 0.0]]), np.array([[1e-3, 2e-3]]))
    with pytest.raises(UndecidedMass):
        ball_probability(np.array([[0.999, 0.0]]), np.array([[1e-3, 2e-3]]), 1.0)
