"""S1: coverage on base classifiers whose smoothed classifier is known exactly.

The method (its σ-provider and certifier) is rebuilt on an analytic base model in a
context made like a run's (:meth:`~harness.audit.audit.Audit.rebuild`): the
benchmark's dataset (its name, input shape, number of classes K and inputs, labelled by
the analytic model, so that a kNN σ or a fitted σ-network behaves as on the benchmark),
a recipe hash (the analytic model's content hash; its artifacts go to a temporary
folder), the run's seed and protocol at n = min(run's n, ``budget.coverage_n``) in
fp32. Its trial inputs are the run's own certified inputs (with their input ids), chosen
at random from the audit's entropy. The harness draws the trials' samples (and a
σ-smoothing's) on noise seeded from the audit's entropy, not with the context's engine,
so a method that simulates them through ``context.engine`` predicts nothing. The
analytic models are one-hot between two random classes of the K (see
:mod:`harness.audit.analytic`), so hard and soft smoothed classifiers are both exact
and share the boundary P(side 1) = 1/2.

Per trial, the exact model is placed so that the trial input x0 sits at P(side 1) = q
at σ_ref, the run's stored σ(x0): q uniform in [0.02, 0.98] for half the trials, and for
the other half in the *margin* 1/2 ± Φ⁻¹(1 − α)/√n, where n samples decide between
certifying and abstaining and between the two classes (:func:`trial_quantile`).

- **linear-N**: f = [w·x > b] with a random unit w and b such that x0 is at signed
  distance σ_ref·Φ⁻¹(q). For any σ(x) the smoothed boundary is the hyperplane, so a
  certificate (x0, R, ĉ) is false iff ĉ is wrong or R > |w·x0 − b|. This audits
  calibration: the p_A bound, its α, the radius formula.
- **ball-N**: f = [‖x − c‖ <= ρ], with c = x0 + σ_ref·u (u a random unit vector) and ρ
  with χ²_N(ρ²/σ_ref²; 1) = q, so ρ ≈ σ_ref·√N. There
  P(inside) = χ²_N(ρ²/σ²; ‖x − c‖²/σ²) moves by ~√(2N)·Δσ/σ standard deviations when σ
  changes (Súkeník et al. 2022, Thm 2.3/2.4), which is where radii computed as if σ were
  constant break. A certificate is false when a point of B(x0, R) has an exact smoothed
  prediction other than ĉ (with the method's own σ at that point), searched on rays
  from x0 (:func:`harness.audit.ball_attacks.ball_flip`), the rays along ±∇σ
  included. Memory certificates keep σ constant inside each certified ball (Alfarra et
  al., App. C) and get a fresh certifier per trial (each trial is another classifier).
  For a σ-smoothing (dual RS) σ at each point is drawn by the harness from the
  σ-estimator, and a point counts only if it flips at every level plausible there
  (:func:`harness.audit.sigma_smoothing.ball_flip`).

Each trial is judged twice: the rebuilt certifier's claim, and the certificate the
*run's* declared radius formula (the one S0 holds the run's certificates to) derives
from the trial's draws; the trial is false if either is. A formula is a pure function of
the draws and the protocol, so it cannot tell a trial from a run's input: a method that
certifies honestly only when rebuilt still has its run's formula audited. A claim that
its own formula does not derive from the harness's draws (as S0 asks) is ``violated``
outright.

**Sequential sampling.** The trials are certified under the run's sequential rule (its
n_max capped at S1's n), and their false certificates counted at the stopping time as
above; the calibration scores use each trial's first look (the one look drawn whatever
the counts). An exact sub-test computes, by dynamic programming, the largest
probability that the rule's bound ever exceeds the true p_A
(:func:`harness.audit.anytime.sequential_validity`): above α, the bound is not anytime-valid and the row is
``violated`` (no sampling, so no false alarm).

**Nulls.** (1, 2) A valid certifier issues a false certificate with probability at most
α per *trial* (per input asked about, abstentions included), so the number of false
certificates among T trials is tested against Binomial(T, α), one-sided. (3, 4) The
draws are calibrated: with ĉ the top class of a trial's selection draws (independent of
its estimation draws), the estimation count k of ĉ is Binomial(n, p_exact(ĉ)) exactly; a
randomized probability-integral transform u = F(k − 1) + V·P(k), V uniform, makes
z = Φ⁻¹(u) exactly N(0, 1), independent over trials, so the bias Σz/√m is N(0, 1) and
the dispersion Σz² is χ²_m (both two-sided). Counts the engine did not draw honestly (a
patched engine, padded votes) fail these at any n. The four sub-tests are combined by
Holm's step-down procedure at :data:`~harness.foundation.verdict.P_THRESHOLD`
(family-wise error <= the threshold); the evidence states what each detects.
"""

from __future__ import annotations

import copy
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from scipy import stats
from scipy.special import ndtri

from harness.audit import sigma_smoothing as smoothed
from harness.audit.analytic import BallClassifier, LinearClassifier, PlacementWithheld
from harness.audit.anytime import first_look, sequential_validity
from harness.audit.audit import Audit
from harness.audit.ball_attacks import ball_flip, flip_among, search_points, sigma_in_ball
from harness.audit.sigma_calls import calls_of, sigma_and_gradients, sigma_in_calls
from harness.certification.certify import (
    certifier_label,
    certify_drawn,
    checked_sigma,
    sigma_of,
    sigma_smoothing,
)
from harness.foundation.certificate import ABSTAIN, Certificate
from harness.foundation.data import Dataset
from harness.foundation.protocol import CertificationProtocol
from harness.foundation.verdict import P_THRESHOLD, CheckResult, Verdict
from harness.mathematics.calibration import (
    calibration_power,
    calibration_pvalues,
    detectable_rate,
    pit_score,
)
from harness.mathematics.radius import Recomputed, sigma_choice_recompute
from harness.mathematics.stats import false_certificates_pvalue, holm_rejections
from harness.plugin.remote import RemoteSigmaProvider

NAME = "coverage"
QUANTILES = (0.02, 0.98)
"""Range of the exact P(side 1) at the trial input (at σ_ref) of the trials outside the
margin (:func:`trial_quantile`)."""
RELATIVE = 1e-9
"""Relative tolerance when a claim is compared with its formula's derivation (as S0)."""
SUBTESTS = 4
"""linear and ball false certificates, calibration bias and dispersion (Holm family)."""


def coverage_protocol(audit: Audit) -> CertificationProtocol:
    """The run's protocol at n = min(run's n, ``budget.coverage_n``) (sequential: the same
    rule with n_max capped alike), in fp32 (the analytic models are exact in fp32 only)."""
    run, cap = audit.context.protocol, audit.budget.coverage_n
    capped = {"n_max": min(run.estimation_cap, cap)} if run.sampling == "sequential" else {}
    return replace(run, n=min(run.n, cap), precision="fp32", **capped)


@dataclass
class _Outcome:
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


def _labelled(audit: Audit, model: torch.nn.Module) -> Dataset:
    """The benchmark's dataset (name, inputs, shapes, K, files) labelled by ``model``."""
    data, device = audit.context.dataset, audit.context.device

    def labels(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            parts = [model(chunk.to(device)).argmax(1).cpu() for chunk in x.split(8192)]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)

    return replace(data, train_y=labels(data.train_x), test_y=labels(data.test_x))


def _secret(audit: Audit, context, purpose: str):
    """``context`` whose seed (of the harness's σ-smoothing draws) comes from the audit's
    entropy."""
    return replace(context, seed=audit.seed(f"{purpose}/sigma-smoothing"))


def _pair(rng: np.random.Generator, num_classes: int) -> tuple[int, int]:
    """Two distinct random classes of K: (class of side 0, class of side 1)."""
    a, b = rng.choice(num_classes, size=2, replace=False)
    return int(a), int(b)


def _derived(audit: Audit, rows: list[dict], x: torch.Tensor, protocol, provider) -> Recomputed:
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


def _candidates(c: Certificate, derived: Recomputed, i: int) -> list[tuple[str, int, float]]:
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


def _underived(c: Certificate, derived: Recomputed, i: int) -> dict | None:
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
    return None


def _score(c: Certificate, probabilities: np.ndarray, v: float) -> float:
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


def _uniform(rng: np.random.Generator) -> float:
    """V of the randomized transform, uniform in (0, 1)."""
    return min(max(float(rng.random()), 1e-15), 1 - 1e-15)


def _first_false(c: Certificate, derived: Recomputed, false) -> dict | None:
    """The trial's first false certificate (its claim, then its formula's; asked in that
    order until one is false: ``false(prediction, radius)`` -> example or None), as the
    evidence's example, or None."""
    for source, pred, radius in _candidates(c, derived, 0):
        found = false(pred, radius)
        if found is not None:
            return {"certificate": source, "prediction": pred, "radius": radius, **found}
    return None


@dataclass
class _Trial:
    """One certified trial, ready to be recorded: its certificate, the formula's derivation
    from its draws, its first false certificate (or None), the exact class probabilities
    at its input and V of its calibration score."""

    input_id: int
    certificate: Certificate
    derived: Recomputed
    false: dict | None
    probabilities: np.ndarray
    v: float

    def judge(self, out: _Outcome) -> None:
        """Record it: false certificates, underived claims, its calibration score."""
        c = self.certificate
        out.inputs.append(self.input_id)
        out.trials += 1
        out.certified += c.prediction != ABSTAIN and c.radius > 0
        missing = _underived(c, self.derived, 0)
        if missing is not None:
            out.underived.append(missing)
        if self.false is not None:
            out.failures += 1
            out.example = out.example or self.false
        out.scores.append(_score(c, self.probabilities, self.v))


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


def _place_linear(model, x0: torch.Tensor, s: float, q: float, gen) -> dict:
    """A random hyperplane at signed distance σ_ref·Φ⁻¹(q) from x0 (P(side 1) = q at σ_ref)."""
    normal = torch.randn(model.w.numel(), generator=gen, dtype=torch.float64)
    normal /= normal.norm()
    distance = s * float(ndtri(q))
    model.set_plane(normal, float(x0.flatten().double() @ normal) - distance)
    return {"distance": distance}


def _place_ball(model, x0: torch.Tensor, s: float, q: float, gen) -> dict:
    """A ball B(c, ρ), c = x0 + σ_ref·u (u a random unit vector), χ²_N(ρ²/σ_ref²; 1) = q."""
    u = torch.randn(model.dim, generator=gen, dtype=torch.float64)
    radius = s * math.sqrt(stats.ncx2.ppf(q, model.dim, 1.0))
    model.set_ball(x0.flatten().double() + s * u / u.norm(), radius)
    return {"ball_radius": radius}


@dataclass
class _Round:
    """One round of trials on one exact model: distinct trial inputs (``chosen``, indices of
    the audit's inputs), the pair of classes, the method rebuilt on the model (labelled by
    the round's first placement), the harness's engine for the trials' draws, each trial's
    quantile q and uniform V (drawn in the order q, V of trial 0, q, V of trial 1, …), and
    the round's generator of placements and flip rays."""

    audit: Audit
    family: str
    purpose: str
    chosen: list[int]
    pair: tuple[int, int]
    model: torch.nn.Module
    place: Callable
    dataset: Dataset
    provider: object
    certifier: object
    context: object
    draw: object
    quantiles: list[float]
    uniforms: list[float]
    gen: torch.Generator
    searches: int  # the family's trials (a σ-smoothing's flip searches share their error)


def _rounds(audit: Audit, family: str, points, trials: int, protocol, root: Path):
    """The rounds of ``trials`` trials of a family, each drawn from the audit's entropy
    as the round begins (a round needs the trials before it: how many are left)."""
    classes, dim = audit.context.dataset.num_classes, points[0].numel()
    stored_sigma = [float(c["sigma"]) for c in audit.certificates]
    model_type, place = {"linear": (LinearClassifier, _place_linear),
                         "ball": (BallClassifier, _place_ball)}[family]  # fmt: skip
    left = trials
    for r in range(math.ceil(trials / len(points))):
        purpose = f"coverage/{family}/{r}"
        rng, gen = audit.rng(purpose), audit.generator(purpose)
        chosen = rng.choice(len(points), min(left, len(points)), replace=False).tolist()
        pair = _pair(rng, classes)
        model = model_type(dim, one_hot=True, num_classes=classes, classes=pair)
        model = model.to(audit.context.device)
        place(model, points[chosen[0]], stored_sigma[chosen[0]], 0.5, gen)
        dataset = _labelled(audit, model)  # by the round's first placement
        provider, certifier, context = audit.rebuild(dataset, model, protocol, root)
        draw = audit.fresh_engine(purpose, context.engine)  # the round's inputs are distinct
        quantiles, uniforms = [], []
        for j in range(len(chosen)):
            quantiles.append(trial_quantile(rng, j, protocol.estimation_cap, protocol.alpha))
            uniforms.append(_uniform(rng))
        left -= len(chosen)
        yield _Round(audit, family, purpose, chosen, pair, model, place, dataset, provider,
                     certifier, context, draw, quantiles, uniforms, gen, trials)  # fmt: skip


def _trials(audit: Audit, family: str, points, ids, trials: int, protocol, root: Path) -> _Outcome:
    """``trials`` certified trial inputs on fresh placements of the family's exact model,
    in rounds of distinct inputs (one rebuild of the method per round, per trial for a
    memory). A round asks σ of all its trials at once (:func:`_together`) unless σ reads
    the exact model (each trial is then another base classifier) or the method is a
    memory or a σ-smoothing: then trial by trial (:func:`_one_by_one`); both draw the same
    placements, points and noise from the audit's entropy."""
    out = _Outcome()
    for rnd in _rounds(audit, family, points, trials, protocol, root):
        out.classes.append(list(rnd.pair))
        start = rnd.gen.get_state()
        judged = _together(rnd, points, ids, protocol) if _placement_free(rnd) else None
        if judged is None:  # σ read the model: a σ of another classifier per trial
            rnd.gen.set_state(start)
            judged = _one_by_one(rnd, points, ids, protocol, root)
        for trial in judged:
            trial.judge(out)
    return out


def _placement_free(rnd: _Round) -> bool:
    """Whether σ of the round's trials may be asked at once: not for a σ-smoothing (the
    harness draws its σ per trial), a memory (a fresh method per trial) or a σ-provider
    in a plugin host (which may hold the model as it was last sent)."""
    return (sigma_smoothing(rnd.provider) is None and not rnd.certifier.order_dependent
            and not isinstance(getattr(rnd.provider, "uncounted", rnd.provider),
                               RemoteSigmaProvider))  # fmt: skip


def _trial_input(rnd: _Round, points, ids, j: int):
    """Trial ``j``'s input [1, *shape] on the device, its id, and its placement (drawn)."""
    k = rnd.chosen[j]
    stored = float(rnd.audit.certificates[k]["sigma"])
    # σ_ref: the run's σ at x0, the scale at which x0 sits at P(side 1) = q
    placed = rnd.place(rnd.model, points[k], stored, rnd.quantiles[j], rnd.gen)
    where = {"model": f"{rnd.family}-{points[0].numel()}", "input_id": ids[k],
             "exact_p_side_1": rnd.quantiles[j], **placed}  # fmt: skip
    return points[k : k + 1].to(rnd.audit.context.device), ids[k], where


def _certified(rnd: _Round, provider, certifier, context, x0, input_id: int, sigma, drawn,
               protocol):  # fmt: skip
    """The trial's certificate at σ (the harness's draws), the formula's derivation from
    its draws and the exact class probabilities at its input."""
    audit = rnd.audit
    [c] = certify_drawn(rnd.draw, protocol, certifier, x0, [input_id], sigma, drawn,
                        label=certifier_label(context, audit.method),
                        regularity=provider.regularity)  # fmt: skip
    derived = _derived(audit, [vars(c)], x0, protocol, provider)
    return c, derived, rnd.model.class_probabilities(x0.cpu().numpy(), sigma)[0]


def _linear_false(rnd: _Round, x0, where: dict):
    """``false(prediction, radius)`` of a linear trial: the smoothed boundary is the plane,
    whatever σ."""
    signed = float(rnd.model.signed_distance(x0.cpu().numpy())[0])
    truth = rnd.pair[int(signed > 0)]

    def false(pred, radius):
        if pred != truth or radius > abs(signed):
            return {**where, "true_class": truth, "distance_to_boundary": abs(signed)}
        return None

    return false


def _flip_example(flip: dict | None, where: dict) -> dict | None:
    return None if flip is None else {**where, **{k: v for k, v in flip.items() if k != "point"}}


def _one_by_one(rnd: _Round, points, ids, protocol, root: Path) -> list[_Trial]:
    """The round's trials one at a time, each judged before the next is placed: σ at the
    trial input (with ∇σ on the ball), then at the flip rays of each certificate."""
    audit, model, gen = rnd.audit, rnd.model, rnd.gen
    name = audit.method.sigma_provider
    provider, certifier, context = rnd.provider, rnd.certifier, rnd.context
    out = []
    for j in range(len(rnd.chosen)):
        x0, input_id, where = _trial_input(rnd, points, ids, j)
        if certifier.order_dependent and j:  # a memory lives for one classifier
            provider, certifier, context = audit.rebuild(rnd.dataset, model, protocol, root,
                                                         context.memos)  # fmt: skip
        gradient = None
        if sigma_smoothing(provider) is None and rnd.family == "ball":  # σ, ∇σ in one call
            sigma, [gradient] = sigma_and_gradients(provider, x0, 1)
            sigma, drawn = checked_sigma(sigma, 1, name).double().cpu().numpy(), None
        else:  # the provider's σ, or a σ-smoothing's drawn by the harness
            sigma, drawn = sigma_of(_secret(audit, context, f"{rnd.purpose}/{j}"), provider, x0,
                                    [input_id], name)  # fmt: skip
        c, derived, probabilities = _certified(rnd, provider, certifier, context, x0, input_id,
                                               sigma, drawn, protocol)  # fmt: skip
        if rnd.family == "linear":
            false = _linear_false(rnd, x0, where)
        elif drawn is not None:  # flips at every σ level plausible there, drawn by the harness
            smoothing, level = sigma_smoothing(provider), int(np.argmax(drawn.selection[0]))

            def false(pred, radius, x0=x0, where=where, context=context, smoothing=smoothing,
                      level=level, search=f"{rnd.purpose}/{j}"):  # fmt: skip
                return _flip_example(smoothed.ball_flip(audit, context, smoothing, model, x0[0],
                                                        radius, pred, level, gen, search,
                                                        rnd.searches), where)  # fmt: skip

        else:
            ball_sigma = certifier.ball_sigmas([vars(c)]) if certifier.order_dependent else None

            def false(pred, radius, x0=x0, gradient=gradient, ball_sigma=ball_sigma,
                      input_id=input_id, provider=provider, where=where,
                      known=float(sigma[0])):  # fmt: skip
                constant = ball_sigma is not None  # memory: σ constant in the ball
                flip = ball_flip(sigma_in_ball(provider, ball_sigma, input_id), model, x0[0],
                                 radius, pred, gen, None if constant else gradient,
                                 None if constant else known)  # fmt: skip
                return _flip_example(flip, where)

        out.append(_Trial(input_id, c, derived, _first_false(c, derived, false), probabilities,
                          rnd.uniforms[j]))  # fmt: skip
    return out


def _together(rnd: _Round, points, ids, protocol) -> list[_Trial] | None:
    """The round's trials with σ asked at once (calls of the run's batch,
    :mod:`harness.audit.sigma_calls`) while the exact model's placement is withheld
    (:meth:`~harness.audit.analytic.BallClassifier.withheld`), so that σ is known not to
    depend on it: at every trial input (with ∇σ on the ball), then at the flip rays of
    every certificate. None when σ reads the model.

    The placements and rays are drawn as :func:`_one_by_one` draws them: a trial's rays
    for its formula's certificate are drawn only when its claim has no flip, so when the
    claim's rays find one, the trials after it are placed again from where the generator
    stood after the claim's rays (one more query for their rays; none for a sound
    method, whose formula certifies what it claims)."""
    audit, model, provider = rnd.audit, rnd.model, rnd.provider
    batch = calls_of(audit)
    x0 = points[torch.tensor(rnd.chosen)].to(audit.context.device)
    try:
        with model.withheld():
            if rnd.family == "ball":
                sigma, gradients = sigma_and_gradients(provider, x0, batch)
            else:
                with torch.no_grad():
                    sigma, gradients = sigma_in_calls(provider, x0, batch), [None] * len(x0)
    except PlacementWithheld:
        return None
    sigma = checked_sigma(sigma.detach(), len(x0), audit.method.sigma_provider)
    sigma = sigma.double().cpu().numpy()
    out: list[_Trial] = []
    while len(out) < len(rnd.chosen):
        placed = [_placed_trial(rnd, points, ids, j, sigma[j : j + 1], gradients[j], protocol)
                  for j in range(len(out), len(rnd.chosen))]  # fmt: skip
        rays = [ray for _, search in placed if search is not None for ray in search.rays]
        if rays:  # σ at every ray's points but the center (known) in one query
            try:
                with model.withheld(), torch.no_grad():
                    asked = torch.cat([ray.points[1:] for ray in rays]).to(x0.device)
                    values = sigma_in_calls(provider, asked, batch).double().cpu().numpy()
            except PlacementWithheld:
                return None
            parts = np.split(values, np.cumsum([len(ray.points) - 1 for ray in rays])[:-1])
            for ray, part in zip(rays, parts, strict=True):
                ray.sigma = part
        for trial, search in placed:
            out.append(trial)
            if search is not None:
                trial.false, resume = search.first_false()
                if resume is not None:  # rays drawn that one at a time are not: place again
                    rnd.gen.set_state(resume)
                    break
    return out


@dataclass
class _Rays:
    """A certificate's flip search on the ball: its source, prediction and radius, the
    points (center first), σ at the others (once asked) and the generator's state after
    its rays were drawn."""

    source: str
    prediction: int
    radius: float
    points: torch.Tensor
    after: torch.Tensor
    sigma: np.ndarray | None = None


@dataclass
class _BallSearch:
    """A ball trial's flip searches, judged once σ is known at their points: the model as
    placed for the trial, the trial input, σ there, the example's fields."""

    model: BallClassifier
    center: torch.Tensor
    center_sigma: float
    where: dict
    rays: list[_Rays]

    def first_false(self) -> tuple[dict | None, torch.Tensor | None]:
        """The first certificate with a flip (as :func:`_first_false`), and the generator's
        state to resume from when rays after it were drawn (else None)."""
        for ray in self.rays:
            sigma = np.concatenate([[self.center_sigma], ray.sigma])
            flip = flip_among(self.model, self.center, ray.points, sigma, ray.prediction)
            if flip is not None:
                example = {"certificate": ray.source, "prediction": ray.prediction,
                           "radius": ray.radius, **_flip_example(flip, self.where)}  # fmt: skip
                later = not torch.equal(ray.after, self.rays[-1].after)
                return example, ray.after if later else None
        return None, None


def _placed_trial(rnd: _Round, points, ids, j: int, sigma: np.ndarray, gradient, protocol):
    """Trial ``j`` placed and certified at its σ: (the trial, None) for a linear trial,
    judged; (the trial, its flip searches, the rays of each certificate drawn) on the
    ball."""
    x0, input_id, where = _trial_input(rnd, points, ids, j)
    c, derived, probabilities = _certified(rnd, rnd.provider, rnd.certifier, rnd.context, x0,
                                           input_id, sigma, None, protocol)  # fmt: skip
    trial = _Trial(input_id, c, derived, None, probabilities, rnd.uniforms[j])
    if rnd.family == "linear":
        trial.false = _first_false(c, derived, _linear_false(rnd, x0, where))
        return trial, None
    rays = []
    for source, pred, radius in _candidates(c, derived, 0):
        found = search_points(rnd.model, x0[0], radius, gradient, rnd.gen)
        rays.append(_Rays(source, pred, radius, found, rnd.gen.get_state()))
    return trial, _BallSearch(copy.deepcopy(rnd.model), x0[0], float(sigma[0]), where, rays)


def check_coverage(audit: Audit) -> CheckResult:
    alpha, budget = audit.context.protocol.alpha, audit.budget
    protocol = coverage_protocol(audit)
    run_n = audit.context.protocol.estimation_cap
    n = protocol.estimation_cap
    scored_n = first_look(protocol)  # the samples each calibration score rests on
    points = audit.inputs.float().cpu()
    ids = [int(c["input_id"]) for c in audit.certificates]
    dim = points[0].numel()
    half = max(1, budget.coverage_trials // 2)
    names = (f"linear-{dim}", f"ball-{dim}")
    with tempfile.TemporaryDirectory(prefix="idrs-bench-s1-") as root:
        outcomes = [_trials(audit, family, points, ids, half, protocol, Path(root))
                    for family in ("linear", "ball")]  # fmt: skip
    scores = np.array([z for o in outcomes for z in o.scores])
    p_bias, p_dispersion = calibration_pvalues(scores)
    level = P_THRESHOLD / SUBTESTS  # the smallest level Holm's procedure tests at
    detect = calibration_power(len(scores), scored_n, level)
    evidence: dict = {
        "alpha": alpha, "dimension": dim, "classes": audit.context.dataset.num_classes,
        "n": n, "run_n": run_n, "n0": protocol.n0,
        "null": "false certificates: Binomial(trials, α), one-sided; calibration: randomized "
                "PIT scores of the estimation counts against Binomial(n, p_exact), bias "
                "Σz/√m ~ N(0, 1) and dispersion Σz² ~ χ²_m, two-sided",
        "correction": f"Holm over {SUBTESTS} sub-tests at {P_THRESHOLD:g}",
        "power": f"{half} trials per false-certificate sub-test flag a false-certificate rate "
                 f">= {detectable_rate(half, alpha, level):.3g}; the calibration of "
                 f"{len(scores)} trials a shift of the counts by >= {detect['count_shift']:.2%} "
                 f"of n or a variance inflated by >= {detect['variance_factor']:.3g}x "
                 "(each with probability 0.9)",
    }  # fmt: skip
    if n < run_n:
        evidence["sensitivity"] = (
            f"S1 certifies at n = {n:,} of the run's {run_n:,}: a shift of the counts "
            f"by a fraction of n is seen at {math.sqrt(n / run_n):.3g}x the z it has "
            "at the run's n, and trial certificates have the wider bounds of the smaller n"
        )
    for name, outcome in zip(names, outcomes, strict=True):
        evidence[name] = outcome.record(alpha)
    evidence["calibration"] = {"trials": len(scores), "bias": float(np.sum(scores) / math.sqrt(
        max(len(scores), 1))), "dispersion": float(np.sum(np.square(scores))),
        "p_bias": p_bias, "p_dispersion": p_dispersion}  # fmt: skip
    pvalues = [evidence[name]["p_value"] for name in names] + [p_bias, p_dispersion]
    rejected = holm_rejections(pvalues, P_THRESHOLD)
    summary = [
        f"{name}: {evidence[name]['failures']}/{evidence[name]['trials']} trials give a false "
        f"certificate (p = {p:.3g}{', rejected' if r else ''})"
        for name, p, r in zip(names, pvalues[:2], rejected[:2], strict=True)
    ]
    cal = evidence["calibration"]
    summary.append(
        f"calibration of {len(scores)} trials' counts at n = {scored_n:,}: bias "
        f"{cal['bias']:.3g} (p = {p_bias:.3g}{', rejected' if rejected[2] else ''}), dispersion "
        f"{cal['dispersion']:.4g} on {len(scores)} df (p = {p_dispersion:.3g}"
        f"{', rejected' if rejected[3] else ''})"
    )
    underived = [u for o in outcomes for u in o.underived]
    evidence["underived"] = {"count": len(underived), "examples": underived[:3]}
    if underived:
        u = underived[0]
        summary.insert(0, f"{len(underived)} trial claims not derived from the harness's draws by "
                          f"the declared formula, e.g. input {u['input_id']}: {u['quantity']} "
                          f"{u['claimed']!r} claimed, {u['derived']!r} derived")  # fmt: skip
    invalid = None
    if protocol.sampling == "sequential":
        evidence["sequential"] = sequential_validity(audit, protocol)
        invalid = next(
            (w for w in evidence["sequential"]["rules"] if w["ratio_to_alpha"] > 1 + RELATIVE), None
        )
        summary.append(evidence["sequential"]["summary"])
    verdict = Verdict.VIOLATED if any(rejected) or underived or invalid else Verdict.SOUND
    return CheckResult(NAME, verdict, "; ".join(summary) + f"; {evidence['power']}", evidence)
