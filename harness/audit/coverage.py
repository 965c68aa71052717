"""S1: coverage on base classifiers whose smoothed classifier is known exactly.

The method (its σ-provider and certifier) is rebuilt on an analytic base model in a
context made like a run's (:meth:`~harness.audit.audit.Audit.rebuild`): the
benchmark's training split and description (its name, input shape, number of classes K
and training inputs, labelled by the analytic model, so that a kNN σ or a fitted
σ-network behaves as on the benchmark; the test split withheld, as in the run),
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

import math
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from scipy import stats
from scipy.special import ndtri

from harness.audit import sigma_smoothing as smoothed
from harness.audit.analytic import BallClassifier, LinearClassifier
from harness.audit.anytime import first_look, sequential_validity
from harness.audit.audit import Audit
from harness.audit.ball_attacks import ball_flip, sigma_and_gradient, sigma_in_ball
from harness.certification.certify import (
    certifier_label,
    certify_drawn,
    checked_sigma,
    sigma_of,
    sigma_smoothing,
)
from harness.foundation.certificate import ABSTAIN, Certificate
from harness.foundation.data import TrainingSplit
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


def _labelled(audit: Audit, model: torch.nn.Module) -> TrainingSplit:
    """The benchmark's training split and description (name, inputs, shapes, K, files), the
    inputs labelled by ``model``: what the rebuilt method sees (the test split withheld,
    as in the run)."""
    data, device = audit.context.dataset, audit.context.device
    with torch.no_grad():
        parts = [model(chunk.to(device)).argmax(1).cpu() for chunk in data.train_x.split(8192)]
    return replace(data, train_y=torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long))


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


def _judge(out: _Outcome, c: Certificate, derived: Recomputed, i: int, false, v: float,
           probabilities: np.ndarray) -> None:  # fmt: skip
    """Record one trial: false (``false(prediction, radius)`` -> example or None) for its
    claim or its formula's certificate, underived claims, and its calibration score."""
    out.trials += 1
    out.certified += c.prediction != ABSTAIN and c.radius > 0
    missing = _underived(c, derived, i)
    if missing is not None:
        out.underived.append(missing)
    for source, pred, radius in _candidates(c, derived, i):
        found = false(pred, radius)
        if found is not None:
            out.failures += 1
            out.example = out.example or {"certificate": source, "prediction": pred,
                                          "radius": radius, **found}  # fmt: skip
            break
    out.scores.append(_score(c, probabilities, v))


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


def _trials(audit: Audit, family: str, points, ids, trials: int, protocol, root: Path) -> _Outcome:
    """``trials`` certified trial inputs on fresh placements of the family's exact model,
    in rounds of distinct inputs (one rebuild of the method per round, per trial for a
    memory)."""
    device, dim = audit.context.device, points[0].numel()
    classes = audit.context.dataset.num_classes
    name = audit.method.sigma_provider
    stored_sigma = [float(c["sigma"]) for c in audit.certificates]
    model_type, place = {"linear": (LinearClassifier, _place_linear),
                         "ball": (BallClassifier, _place_ball)}[family]  # fmt: skip
    out = _Outcome()
    for r in range(math.ceil(trials / len(points))):
        purpose = f"coverage/{family}/{r}"
        rng, gen = audit.rng(purpose), audit.generator(purpose)
        chosen = rng.choice(len(points), min(trials - out.trials, len(points)), replace=False)
        pair = _pair(rng, classes)
        model = model_type(dim, one_hot=True, num_classes=classes, classes=pair).to(device)
        place(model, points[int(chosen[0])], stored_sigma[int(chosen[0])], 0.5, gen)
        dataset = _labelled(audit, model)  # by the round's first placement
        provider, certifier, context = audit.rebuild(dataset, model, protocol, root)
        draw = audit.fresh_engine(purpose, context.engine)  # the round's inputs are distinct
        out.classes.append(list(pair))
        for j, k in enumerate(chosen.tolist()):
            x0, input_id = points[k : k + 1].to(device), ids[k]
            q = trial_quantile(rng, j, protocol.estimation_cap, protocol.alpha)
            # σ_ref: the run's σ at x0, the scale at which x0 sits at P(side 1) = q
            placed = place(model, points[k], stored_sigma[k], q, gen)
            if certifier.order_dependent and j:  # a memory lives for one classifier
                provider, certifier, context = audit.rebuild(
                    dataset, model, protocol, root, context.memos
                )
            gradient = None
            if sigma_smoothing(provider) is None and family == "ball":  # σ, ∇σ in one call
                sigma, gradient = sigma_and_gradient(provider, x0)
                sigma, drawn = checked_sigma(sigma, 1, name).double().cpu().numpy(), None
            else:  # the provider's σ, or a σ-smoothing's drawn by the harness
                sigma, drawn = sigma_of(_secret(audit, context, f"{purpose}/{j}"), provider, x0,
                                        [input_id], name)  # fmt: skip
            [c] = certify_drawn(draw, protocol, certifier, x0, [input_id], sigma, drawn,
                                label=certifier_label(context, audit.method),
                                regularity=provider.regularity)  # fmt: skip
            derived = _derived(audit, [vars(c)], x0, protocol, provider)
            ball_sigma = None
            if certifier.order_dependent:  # memory certificates: σ constant in each ball
                ball_sigma = certifier.ball_sigmas([vars(c)])
            probabilities = model.class_probabilities(x0.cpu().numpy(), sigma)[0]
            out.inputs.append(input_id)
            where = {"model": f"{family}-{dim}", "input_id": input_id, "exact_p_side_1": q,
                     **placed}  # fmt: skip
            if family == "linear":  # the smoothed boundary is the plane, whatever σ
                signed = float(model.signed_distance(x0.cpu().numpy())[0])
                truth = pair[int(signed > 0)]

                def false(pred, radius, truth=truth, signed=signed, where=where):
                    if pred != truth or radius > abs(signed):
                        return {**where, "true_class": truth, "distance_to_boundary": abs(signed)}
                    return None

            elif drawn is not None:  # flips at every σ level plausible there, drawn by the harness
                smoothing, level = sigma_smoothing(provider), int(np.argmax(drawn.selection[0]))

                def false(pred, radius, x0=x0, model=model, where=where, gen=gen,
                          context=context, smoothing=smoothing, level=level,
                          search=f"{purpose}/{j}"):  # fmt: skip
                    flip = smoothed.ball_flip(audit, context, smoothing, model, x0[0], radius,
                                              pred, level, gen, search, trials)  # fmt: skip
                    if flip is None:
                        return None
                    return {**where, **{key: v for key, v in flip.items() if key != "point"}}

            else:

                def false(pred, radius, x0=x0, gradient=gradient, ball_sigma=ball_sigma,
                          input_id=input_id, provider=provider, model=model, where=where,
                          gen=gen, known=float(sigma[0])):  # fmt: skip
                    constant = ball_sigma is not None  # memory: σ constant in the ball
                    flip = ball_flip(sigma_in_ball(provider, ball_sigma, input_id), model, x0[0],
                                     radius, pred, gen, None if constant else gradient,
                                     None if constant else known)  # fmt: skip
                    if flip is None:
                        return None
                    return {**where, **{key: v for key, v in flip.items() if key != "point"}}

            _judge(out, c, derived, 0, false, _uniform(rng), probabilities)
    return out


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
