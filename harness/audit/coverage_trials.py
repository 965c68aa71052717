"""S1's trials (:mod:`harness.audit.coverage`): where a trial's exact classifier is
placed, and how a trial's certificates are judged against it.

A trial input x0 sits at an exact probability q of side 1 at σ_ref, the run's stored
σ(x0) (:func:`trial_quantile`): on ``linear-N`` a random hyperplane at signed distance
σ_ref·Φ⁻¹(q) (:func:`place_linear`), on ``ball-N`` a ball B(c, ρ), c = x0 + σ_ref·u,
χ²_N(ρ²/σ_ref²; 1) = q (:func:`place_ball`). A trial stands for its claim and for the
certificate the run's declared formula derives from its draws (:func:`candidates`); it is
false when either is (:func:`first_false`), underived when its claim is not what the
formula derives (:func:`underived`), and it gives the calibration test a score
(:func:`score`). :class:`Outcome` sums a family's trials.

At a diagonal scale (:mod:`harness.engine.scale`) σ_ref is the certificate's recorded
scale s: the plane sits at signed distance Φ⁻¹(q)·‖s⊙w‖₂ (P(side 1) = q at s), the ball
at c = x0 + min_i s_i·u with the radius whose mass under x0 + s∘ε is q
(:func:`~harness.mathematics.gaussian_ball.radius_for_probability`). Beside its ℓ2 balls
a trial then stands for its ellipsoids {δ : ‖Σ^{-1/2}δ‖₂ <= κ} (:func:`ellipsoids`): the
claim's κ and Φ⁻¹ of the formula's bound, the largest κ S0 accepts from the draws. On
the plane the smoothed boundary is the plane whatever the scale, so one is false iff its
class is wrong or κ·‖s⊙w‖₂ exceeds the distance to the plane (the largest w·δ on the
ellipsoid), i.e. iff the bound exceeds the exact p_A; on the ball it is searched as S4
searches a claimed ellipsoid (:mod:`harness.audit.coverage_rounds`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from scipy import stats
from scipy.special import ndtri

from harness.audit.analytic import BallClassifier, noise_spread
from harness.audit.audit import Audit
from harness.audit.ball_attacks import flip_among
from harness.certification.certify import sigma_smoothing
from harness.engine.scale import recorded_scale
from harness.foundation.certificate import ABSTAIN, Certificate
from harness.mathematics.calibration import pit_score
from harness.mathematics.gaussian_ball import radius_for_probability
from harness.mathematics.radius import Recomputed, sigma_choice_recompute
from harness.mathematics.stats import false_certificates_pvalue

QUANTILES = (0.02, 0.98)
"""Range of the exact P(side 1) at the trial input (at σ_ref) of the trials outside the
margin (:func:`trial_quantile`)."""
RELATIVE = 1e-9
"""Relative tolerance when a claim is compared with its formula's derivation (as S0)."""


@dataclass
class Outcome:
    """One sub-test's trials: false certificates, underived claims and calibration scores."""

    trials: int = 0
    certified: int = 0
    failures: int = 0
    example: dict | None = None
    underived: list[dict] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    classes: list[list[int]] = field(default_factory=list)

    def record(self, alpha: float) -> dict:
        return {"trials": self.trials, "certified": self.certified, "failures": self.failures,
                "p_value": false_certificates_pvalue(self.failures, self.trials, alpha),
                "example": self.example, "inputs": self.inputs, "classes": self.classes}  # fmt: skip


def pair_of_classes(rng: np.random.Generator, num_classes: int) -> tuple[int, int]:
    """Two distinct random classes of K: (class of side 0, class of side 1)."""
    a, b = rng.choice(num_classes, size=2, replace=False)
    return int(a), int(b)


def derived_by_formula(
    audit: Audit, rows: list[dict], x: torch.Tensor, protocol, provider
) -> Recomputed:
    """The run's declared formula on the trials' draws (as S0 derives the run's): with a
    σ-smoothing, at the α it leaves, and capped at R_σ."""
    smoothing = sigma_smoothing(provider)
    spent = 0.0 if smoothing is None else float(smoothing.alpha)
    out = audit.certifier.radius_formula.derive(
        rows, x.detach().cpu(), replace(protocol, alpha=protocol.alpha - spent), provider.regularity
    )
    if smoothing is None:
        return out
    cap = sigma_choice_recompute([r["draws"]["sigma"] for r in rows], protocol, spent).radius
    return replace(out, radius=np.minimum(np.asarray(out.radius, dtype=np.float64), cap))


def candidates(c: Certificate, derived: Recomputed, i: int) -> list[tuple[str, int, float]]:
    """The certificates a trial stands for: the claim and the formula's, where they certify
    (the formula's only where the claim's ball of the same class does not contain it)."""
    out = []
    claimed = c.prediction != ABSTAIN and c.radius > 0
    if claimed:
        out.append(("claim", int(c.prediction), float(c.radius)))
    pred, radius = int(derived.prediction[i]), float(derived.radius[i])
    if pred != ABSTAIN and radius > 0 and not (claimed and pred == c.prediction
                                                and radius <= c.radius):  # fmt: skip
        out.append(("formula", pred, radius))
    return out


def underived(c: Certificate, derived: Recomputed, i: int) -> dict | None:
    """The claim's first quantity that its formula does not derive (as S0), or None."""
    bound, pred, radius = (
        float(derived.bound[i]),
        int(derived.prediction[i]),
        float(derived.radius[i]),
    )
    if not c.p_lower <= bound * (1 + RELATIVE):
        return {"input_id": c.input_id, "quantity": "bound", "claimed": c.p_lower, "derived": bound}
    if c.prediction != ABSTAIN and c.prediction != pred:
        return {"input_id": c.input_id, "quantity": "prediction", "claimed": c.prediction,
                "derived": pred}  # fmt: skip
    if not c.radius <= radius * (1 + RELATIVE):
        return {
            "input_id": c.input_id,
            "quantity": "radius",
            "claimed": c.radius,
            "derived": radius,
        }
    kappa = float(ndtri(bound)) if bound > 0.5 else 0.0
    if c.region is not None and not c.region["factor"] <= kappa * (1 + RELATIVE):
        return {"input_id": c.input_id, "quantity": "ellipsoid", "claimed": c.region["factor"],
                "derived": kappa}  # fmt: skip
    return None


def ellipsoids(c: Certificate, derived: Recomputed, i: int) -> list[tuple[str, int, float]]:
    """The ellipsoids a trial drawn at a diagonal scale stands for, as (source, class, κ):
    the claim's, and Φ⁻¹(the formula's bound), the largest S0 accepts from its draws
    (where the claim's of the same class does not contain it); none at one σ."""
    if recorded_scale(c.draws) is None:
        return []
    out = []
    claimed = c.prediction != ABSTAIN and c.region is not None and c.region["factor"] > 0
    if claimed:
        out.append(("claim ellipsoid", int(c.prediction), float(c.region["factor"])))
    pred, bound = int(derived.prediction[i]), float(derived.bound[i])
    kappa = float(ndtri(bound)) if pred != ABSTAIN and bound > 0.5 else 0.0
    if kappa > 0 and not (claimed and pred == c.prediction and kappa <= c.region["factor"]):
        out.append(("formula ellipsoid", pred, kappa))
    return out


def score(c: Certificate, probabilities: np.ndarray, v: float) -> float:
    """The calibration score of a trial's estimation draws (:func:`pit_score`) at the top
    class of its selection draws; soft draws of a one-hot model are counts divided by n."""
    base = c.draws["base"]
    n = int(base["n"])
    top = int(np.argmax(base["selection"]))
    k = base["estimation"][top]
    if base.get("looks"):  # sequential: the first look, drawn whatever the counts
        n, k = int(base["looks"][0]["n"]), base["looks"][0]["counts"][top]
    k = int(k) if base["kind"] == "hard" else round(float(k) * n)
    return pit_score(k, n, float(probabilities[top]), v)


def uniform(rng: np.random.Generator) -> float:
    """V of the randomized transform, uniform in (0, 1)."""
    return min(max(float(rng.random()), 1e-15), 1 - 1e-15)


def first_false(c: Certificate, derived: Recomputed, false) -> dict | None:
    """The trial's first false certificate (its claim, then its formula's; asked in that
    order until one is false: ``false(prediction, radius)`` -> example or None), as the
    evidence's example, or None."""
    for source, pred, radius in candidates(c, derived, 0):
        found = false(pred, radius)
        if found is not None:
            return {"certificate": source, "prediction": pred, "radius": radius, **found}
    return None


@dataclass
class Trial:
    """One certified trial, ready to be recorded: its certificate, the formula's derivation
    from its draws, its first false certificate (or None), the exact class probabilities
    at its input and V of its calibration score."""

    input_id: int
    certificate: Certificate
    derived: Recomputed
    false: dict | None
    probabilities: np.ndarray
    v: float

    def judge(self, out: Outcome) -> None:
        """Record it: false certificates, underived claims, its calibration score."""
        c = self.certificate
        out.inputs.append(self.input_id)
        out.trials += 1
        out.certified += c.prediction != ABSTAIN and c.radius > 0
        missing = underived(c, self.derived, 0)
        if missing is not None:
            out.underived.append(missing)
        if self.false is not None:
            out.failures += 1
            out.example = out.example or self.false
        out.scores.append(score(c, self.probabilities, self.v))


def trial_quantile(rng: np.random.Generator, trial: int, n: int, alpha: float) -> float:
    """The exact probability of side 1 at a trial input (at σ_ref): even trials uniform in
    :data:`QUANTILES`; odd trials in the *margin* 1/2 ± Φ⁻¹(1 − α)/√n, where an estimate
    of n samples decides between certifying and abstaining and between the two classes
    (where a certifier that rescues abstentions or picks its class from the estimation
    samples acts)."""
    if trial % 2 == 0:
        return float(rng.uniform(*QUANTILES))
    width = min(float(ndtri(1 - alpha)) / math.sqrt(n), 0.5 - QUANTILES[0])
    return float(rng.uniform(0.5 - width, 0.5 + width))


def place_linear(model, x0: torch.Tensor, s, q: float, gen) -> dict:
    """A random hyperplane at signed distance σ_ref·Φ⁻¹(q) from x0 (P(side 1) = q at σ_ref);
    at a recorded scale s [d], Φ⁻¹(q)·‖s⊙w‖₂."""
    normal = torch.randn(model.w.numel(), generator=gen, dtype=torch.float64)
    normal /= normal.norm()
    spread = noise_spread(np.asarray(s, dtype=np.float64)[None], normal.numpy())
    distance = float(np.reshape(spread, -1)[0]) * float(ndtri(q))
    model.set_plane(normal, float(x0.flatten().double() @ normal) - distance)
    return {"distance": distance}


def place_ball(model, x0: torch.Tensor, s, q: float, gen) -> dict:
    """A ball B(c, ρ), c = x0 + σ_ref·u (u a random unit vector), χ²_N(ρ²/σ_ref²; 1) = q;
    at a recorded scale s [d], c = x0 + min_i s_i·u and ρ the radius whose mass under
    x0 + s∘ε is q (:func:`~harness.mathematics.gaussian_ball.radius_for_probability`)."""
    u = torch.randn(model.dim, generator=gen, dtype=torch.float64)
    u /= u.norm()
    if np.ndim(s) == 0:
        radius = s * math.sqrt(stats.ncx2.ppf(q, model.dim, 1.0))
        model.set_ball(x0.flatten().double() + s * u, radius)
        return {"ball_radius": radius}
    scale = np.asarray(s, dtype=np.float64).reshape(-1)
    step = float(scale.min())
    radius = radius_for_probability(-step * u.numpy(), scale, q)
    model.set_ball(x0.flatten().double() + step * u, radius)
    return {"ball_radius": radius}


def linear_false(model, pair: tuple[int, int], x0: torch.Tensor, where: dict):
    """``false(prediction, radius)`` of a trial on the placed ``linear-N`` ``model``
    between the classes ``pair``: the smoothed boundary is the plane, whatever σ."""
    signed = float(model.signed_distance(x0.cpu().numpy())[0])
    truth = pair[int(signed > 0)]

    def false(pred, radius):
        if pred != truth or radius > abs(signed):
            return {**where, "true_class": truth, "distance_to_boundary": abs(signed)}
        return None

    return false


def linear_trial_false(c: Certificate, derived: Recomputed, model, pair: tuple[int, int],
                       x0: torch.Tensor, where: dict) -> dict | None:  # fmt: skip
    """The first false certificate of a ``linear-N`` trial (:func:`first_false`), then of
    its ellipsoids at a diagonal scale (:func:`ellipsoids`), or None."""
    false = first_false(c, derived, linear_false(model, pair, x0, where))
    if false is not None:
        return false
    scale = recorded_scale(c.draws)
    signed = float(model.signed_distance(x0.cpu().numpy())[0])
    truth = pair[int(signed > 0)]
    for source, pred, kappa in ellipsoids(c, derived, 0):
        w = model.w.double().cpu().numpy()
        reach = kappa * float(noise_spread(scale[None], w / np.linalg.norm(w))[0])
        if pred != truth or reach > abs(signed):
            return {"certificate": source, "prediction": pred, "ellipsoid": kappa, **where,
                    "true_class": truth, "distance_to_boundary": abs(signed),
                    "ellipsoid_reach": reach}  # fmt: skip
    return None


def flip_example(flip: dict | None, where: dict) -> dict | None:
    return None if flip is None else {**where, **{k: v for k, v in flip.items() if k != "point"}}


@dataclass
class FlipRays:
    """A certificate's flip search: its source, prediction and radius (of an ellipsoid: κ,
    ``region`` "ellipsoid"), the points (center first) and σ at the others (once asked;
    a memory's: its ball's σ or scale), and the noise centre at them where the σ-provider
    answers one (:mod:`harness.engine.centre`)."""

    source: str
    prediction: int
    radius: float
    points: torch.Tensor
    sigma: np.ndarray | None = None
    region: str | None = None
    centres: np.ndarray | None = None


@dataclass
class BallSearch:
    """A ball trial's flip searches, judged once σ is known at their points: the model as
    placed for the trial, the trial input, σ there (a scale [d] at a diagonal scale), the
    example's fields, and the centre recorded there (None: centred at x)."""

    model: BallClassifier
    center: torch.Tensor
    center_sigma: float | np.ndarray
    where: dict
    rays: list[FlipRays]
    center_centre: np.ndarray | None = None

    def first_false(self) -> dict | None:
        """The first certificate with a flip, as :func:`first_false` (the ℓ2 balls, then
        the ellipsoids at a diagonal scale; around a noise centre, each point's noise drawn
        at the point plus the centre asked there)."""
        for ray in self.rays:
            sigma = np.concatenate([[self.center_sigma], ray.sigma])
            centres = None
            if self.center_centre is not None:
                centres = np.concatenate([self.center_centre[None], ray.centres])
            flip = flip_among(self.model, self.center, ray.points, sigma, ray.prediction,
                              centres)  # fmt: skip
            if flip is not None:
                size = ({"radius": ray.radius} if ray.region is None
                        else {"ellipsoid": ray.radius, "region": ray.region})  # fmt: skip
                return {"certificate": ray.source, "prediction": ray.prediction, **size,
                        **flip_example(flip, self.where)}  # fmt: skip
        return None
