"""Auditing a σ-smoothing (dual randomized smoothing, Sun et al. 2026): is σ constant where
the certificates need it?

A σ-provider that declares a :class:`~harness.engine.draws.SigmaSmoothing` has
σ(x) = levels[k(x)] with k(x) = argmax_j P(h(x + σ_v ε) = j) for its σ-estimator h.
Each of its certificates rests on k being constant on the certified ball (the paper's
local-constancy hypothesis), which the σ-smoothing certifies within
R_σ = σ_v Φ⁻¹(p_σ lower) (Cohen et al. 2019, Thm 1 on h). The checks test that
hypothesis themselves, never by asking the method:

- **The level at a point** is drawn by the harness: ``num`` samples of h at noise σ_v on
  a stream of its own (:data:`STREAM_SIGMA_PROBE`), keyed by the point's content hash
  and seeded from the audit's entropy (a plugin cannot foresee them). A Monte Carlo
  level near the estimator's decision boundary may differ from k(x1) by chance, so only
  *confident* statements are made: with Clopper–Pearson bounds at level δ for every
  level at every point, level j is *plausible* at x1 when its upper bound reaches every
  other level's lower bound; the true k(x1) is plausible unless a bound fails. A
  **confident change** from level k0 at x1 is k0 not plausible there.
- **Where to look** (the S2/S3-style search): random points inside the ball, at its edge
  and half-way, and a projected descent, from near the centre, of the estimator's
  smoothed soft score of k0, E[softmax(h(x1 + σ_v ε))_k0] (reparameterized noise from
  the audit's generator): the direction in which the level is most likely to move.

δ is :data:`FALSE_CHANGE` shared (Bonferroni) among all the bounds one search makes,
so a Monte Carlo false alarm anywhere in one audit has probability <= FALSE_CHANGE.

Used by S2 (:func:`check_regularity`: σ constant on every B(x, R_σ(x))), S3
(:func:`check_justification`: σ constant on every certified ball, which the radius
needs), and S1/S4 (:func:`ball_flip`, :func:`attack`: a counterexample counts only
if it holds at every level plausible at the point).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from harness.audit.audit import Audit, derived_seed
from harness.audit.ball_attacks import search_points
from harness.certification.certify import point_ids, sigma_smoothing
from harness.engine.draws import SigmaSmoothing
from harness.engine.precision import prepare_model
from harness.foundation.certificate import ABSTAIN
from harness.foundation.verdict import P_THRESHOLD, CheckResult, Verdict
from harness.mathematics.stats import clopper_pearson_lower_array, false_certificates_pvalue
from harness.mathematics.worstcase import xi

STREAM_SIGMA_PROBE = 7
"""Noise stream of the checks' own draws of a σ-estimator at points they choose."""

FALSE_CHANGE = 1e-4
"""Probability, per search, that some flagged change of the σ level is a Monte Carlo fluke."""

EDGE = 1 - 1e-6
"""Fraction of a radius at which points sit 'at the edge' (strictly inside the open ball)."""


def level_bounds(counts: np.ndarray, num: int, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Clopper–Pearson (lower, upper) bounds [P, K] at level ``delta`` on each level's
    probability from ``counts`` [P, K] over ``num`` samples (upper(k) = 1 − lower(n − k))."""
    counts = np.asarray(counts, dtype=np.int64)
    total = np.full(counts.shape, num)
    lower = clopper_pearson_lower_array(counts, total, delta)
    upper = 1.0 - clopper_pearson_lower_array(num - counts, total, delta)
    return lower, upper


def plausible_levels(counts: np.ndarray, num: int, delta: float) -> np.ndarray:
    """[P, K] booleans: level j is plausible at a point when its upper bound reaches the
    largest lower bound there. If all 2·K bounds of a point hold (probability >= 1 − 2Kδ),
    the smoothed estimator's own choice argmax_j p_j is plausible."""
    lower, upper = level_bounds(counts, num, delta)
    return upper >= lower.max(axis=1, keepdims=True)


def level_counts(
    audit: Audit, smoothing: SigmaSmoothing, points: torch.Tensor, num: int, purpose: str,
    context=None,
) -> np.ndarray:  # fmt: skip
    """The σ-estimator's class counts [P, K] at ``points`` over ``num`` samples at its noise
    σ_v, drawn by the harness on :data:`STREAM_SIGMA_PROBE`, seeded from the audit's
    entropy and ``purpose``, keyed by each point's content hash. ``context``: the build
    context whose protocol and device to use (default: the audit's)."""
    from harness.engine.sampling import SamplingEngine

    context = context or audit.context
    engine = SamplingEngine(
        prepare_model(smoothing.model, context.protocol), len(smoothing.levels), context.device,
        context.engine.batch_size, derived_seed(audit.entropy, purpose), noise=context.engine.noise,
    )  # fmt: skip
    sigma = np.full(len(points), float(smoothing.noise))
    return engine.counts(points, sigma, point_ids(points), num, STREAM_SIGMA_PROBE)


def soft_score(
    smoothing: SigmaSmoothing, x: torch.Tensor, level: torch.Tensor, samples: int,
    gen: torch.Generator,
) -> torch.Tensor:  # fmt: skip
    """E[softmax(h(x_i + σ_v ε))_level_i] over ``samples`` draws (differentiable in x)."""
    eps = torch.randn((samples, *x.shape), generator=gen).to(x.device)
    noisy = (x[None] + float(smoothing.noise) * eps).flatten(0, 1)
    probs = torch.softmax(smoothing.model(noisy).float(), dim=-1).view(samples, len(x), -1)
    return probs.mean(0).gather(1, level.view(-1, 1))[:, 0]


def ball_candidates(
    smoothing: SigmaSmoothing, x0: torch.Tensor, level: torch.Tensor, radius: torch.Tensor,
    steps: int, samples: int, gen: torch.Generator,
) -> torch.Tensor:  # fmt: skip
    """Points [B, M, *shape] inside each B(x0_i, radius_i) where level_i may be lost:
    4 random directions at the edge, 2 half-way, and the end and the lowest-score point
    of a projected descent of :func:`soft_score` (steps of radius/4, from near x0)."""
    flat = x0.flatten(1).float()
    dim = flat.shape[1]
    r = radius.float().to(flat.device)[:, None]
    found = []
    for fraction in (EDGE, EDGE, EDGE, EDGE, 0.5, 0.5):
        d = torch.randn(flat.shape, generator=gen).to(flat.device)
        found.append(flat + fraction * r * d / d.norm(dim=1, keepdim=True))
    x1 = flat + 1e-3 * r * torch.randn(flat.shape, generator=gen).to(flat.device) / math.sqrt(dim)
    best, best_score = x1.clone(), torch.full((len(flat),), math.inf, device=flat.device)
    for _ in range(steps):
        x1 = x1.detach().requires_grad_(True)
        with torch.enable_grad():
            score = soft_score(smoothing, x1.view_as(x0), level, samples, gen)
            (grad,) = torch.autograd.grad(score.sum(), x1)
        with torch.no_grad():
            lower = score.detach() < best_score
            best[lower], best_score[lower] = x1.detach()[lower], score.detach()[lower]
            g = grad / grad.norm(dim=1, keepdim=True).clamp_min(1e-12)
            delta = x1 - r / 4 * g - flat
            delta *= (EDGE * r / delta.norm(dim=1, keepdim=True).clamp_min(1e-12)).clamp(max=1.0)
            x1 = flat + delta
    found += [x1.detach(), best]
    return torch.stack(found, dim=1).view(len(x0), len(found), *x0.shape[1:])


@dataclass
class Constancy:
    """What a search found per input: ``changed`` (a confident change of the level),
    ``margin`` (largest lower bound of another level minus the upper bound of k0, over
    the points; > 0 is a confident change), the ``distance`` and the ``plausible`` levels
    at that point, ``points`` probed per input, ``samples`` per point and ``delta``."""

    changed: np.ndarray
    margin: np.ndarray
    distance: np.ndarray
    plausible: list[list[int]]
    points: int
    samples: int
    delta: float


def probe_constancy(
    audit: Audit, smoothing: SigmaSmoothing, x0: torch.Tensor, level: np.ndarray,
    radius: np.ndarray, purpose: str,
) -> Constancy:  # fmt: skip
    """Search each ball B(x0_i, radius_i) for a point where the σ level is confidently not
    level_i (:func:`ball_candidates`, then the harness's draws at every candidate)."""
    budget, device = audit.budget, audit.context.device
    gen = audit.generator(purpose)
    x0 = x0.to(device, torch.float32)
    level_t = torch.as_tensor(level, dtype=torch.long, device=device)
    radius_t = torch.as_tensor(radius, dtype=torch.float32, device=device)
    candidates = ball_candidates(smoothing, x0, level_t, radius_t, budget.ascent_steps,
                                 budget.attack_samples, gen)  # fmt: skip
    count, per = candidates.shape[:2]
    points = candidates.flatten(0, 1)
    num = 16 * budget.attack_samples
    classes = len(smoothing.levels)
    delta = FALSE_CHANGE / max(1, 2 * count * per * classes)
    counts = level_counts(audit, smoothing, points, num, purpose)
    lower, upper = level_bounds(counts, num, delta)
    own = np.repeat(np.asarray(level, dtype=np.int64), per)
    others = lower.copy()
    others[np.arange(len(own)), own] = -np.inf
    margin = (others.max(axis=1) - upper[np.arange(len(own)), own]).reshape(count, per)
    worst = margin.argmax(axis=1)
    plausible = upper >= lower.max(axis=1, keepdims=True)
    chosen = np.arange(count) * per + worst
    distance = (candidates[np.arange(count), worst] - x0).flatten(1).norm(dim=1)
    return Constancy(margin.max(axis=1) > 0, margin.max(axis=1), distance.double().cpu().numpy(),
                     [np.flatnonzero(plausible[k]).tolist() for k in chosen], per, num, delta)  # fmt: skip


def stored_sigma_certificates(audit: Audit) -> tuple[np.ndarray, np.ndarray]:
    """Per stored certificate: the level k̂ its σ draws chose and R_σ re-derived from them
    as check S0 derives it (Cohen's formula on the σ draws at the σ-smoothing's α share;
    0 where the bound is <= 1/2). Raises if a certificate has no σ draws."""
    from harness.foundation.errors import IdrsError
    from harness.mathematics.radius import sigma_choice_recompute

    smoothing = sigma_smoothing(audit.sigma_provider)
    records = [(r.get("draws") or {}).get("sigma") for r in audit.certificates]
    missing = [r["input_id"] for r, rec in zip(audit.certificates, records, strict=True) if not rec]
    if missing:
        raise IdrsError(f"{len(missing)} certificates (e.g. input {missing[0]}) carry no draws "
                        "of their σ-smoothing; check S0 reports them")  # fmt: skip
    if not records:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    derived = sigma_choice_recompute(records, audit.context.protocol, smoothing.alpha)
    top = np.array([int(np.argmax(rec["selection"])) for rec in records], dtype=np.int64)
    return top, np.asarray(derived.radius, dtype=np.float64)


def _verdict_of_count(name: str, flagged: int, trials: int, searched: int, alpha: float,
                      what: str, evidence: dict) -> CheckResult:  # fmt: skip
    """``unjustified`` when ``flagged`` of ``trials`` audited certificates are too many for
    Binomial(trials, ``alpha``) at P_THRESHOLD; ``searched``: the balls actually searched."""
    p = false_certificates_pvalue(flagged, trials, alpha)
    evidence.update(flagged=flagged, trials=trials, searched=searched, p_value=p,
                    null=f"Binomial(trials, α_σ = {alpha:g}), one-sided, at {P_THRESHOLD:g}")  # fmt: skip
    if p < P_THRESHOLD:
        return CheckResult(name, Verdict.UNJUSTIFIED, f"{flagged}/{trials} {what} (p = {p:.3g})",
                           evidence)  # fmt: skip
    if flagged:
        summary = f"{flagged}/{trials} {what}, no more than α_σ allows (p = {p:.3g})"
    else:
        summary = (f"no confident change of the σ level in the {searched} balls searched "
                   f"({trials} certificates audited)")  # fmt: skip
    return CheckResult(name, Verdict.SOUND, summary, evidence)


def _describe(smoothing: SigmaSmoothing) -> str:
    levels = ", ".join(f"{v:g}" for v in smoothing.levels)
    return (f"σ-smoothing: levels ({levels}) chosen by an estimator smoothed at σ_v = "
            f"{smoothing.noise:g}, α_σ = {smoothing.alpha:g}")  # fmt: skip


def _example(audit: Audit, rows: list[int], found: Constancy, radius: np.ndarray, k: int) -> dict:
    levels = sigma_smoothing(audit.sigma_provider).levels
    return {"input_id": audit.certificates[rows[k]]["input_id"], "radius": float(radius[k]),
            "sigma0": float(audit.certificates[rows[k]]["sigma"]),
            "distance": float(found.distance[k]), "margin": float(found.margin[k]),
            "plausible_sigma": [levels[j] for j in found.plausible[k]]}  # fmt: skip


def check_regularity(audit: Audit, name: str) -> CheckResult:
    """S2 for a σ-smoothing: the level k̂ constant on B(x, R_σ(x)) for the certificates
    with R_σ > 0 among ``audited_inputs`` drawn at random from the audit's entropy (what the σ-smoothing certifies, whatever
    the base classifier does). Certificates with a confident change are counted against
    Binomial(audited, α_σ) (each σ-certificate fails with probability <= α_σ);
    ``unjustified`` when rejected at :data:`~harness.foundation.verdict.P_THRESHOLD`."""
    smoothing = sigma_smoothing(audit.sigma_provider)
    level, r_sigma = stored_sigma_certificates(audit)
    picked = audit.subset(f"{name}/sigma-smoothing", len(level), audit.budget.audited_inputs)
    audited = len(picked)
    rows = [int(k) for k in picked if r_sigma[k] > 0]
    evidence: dict = {"declared": _describe(smoothing), "audited": audited,
                      "with_r_sigma": len(rows), "false_alarm": FALSE_CHANGE}  # fmt: skip
    if not rows:
        return _verdict_of_count(name, 0, audited, 0, smoothing.alpha, "", evidence)
    found = probe_constancy(audit, smoothing, audit.inputs[torch.tensor(rows)], level[rows],
                            r_sigma[rows], "sigma-regularity/sigma-smoothing")  # fmt: skip
    k = int(np.argmax(found.margin))
    evidence.update(points_per_ball=found.points, samples=found.samples, delta=found.delta,
                    worst=_example(audit, rows, found, r_sigma[rows], k))  # fmt: skip
    return _verdict_of_count(name, int(found.changed.sum()), audited, len(rows), smoothing.alpha,
                             "balls B(x, R_σ) in which the σ level confidently changes", evidence)  # fmt: skip


TOLERANCE = 1e-9
"""ξ = 1/2 exactly at Cohen's radius; allow rounding, never more (as S3)."""


def check_justification(audit: Audit, name: str) -> CheckResult:
    """S3 for a σ-smoothing: each certified ball B(x0, R) among ``audited_inputs``
    certificates drawn at random from the audit's entropy searched for a point where the σ level confidently differs from σ0's. Where
    it does, Súkeník et al.'s ξ(R, σ0, σ1, p_A_lower) (Thm 2.3) is evaluated at every
    level σ1 still plausible there; if it reaches 1/2 at all of them (for a soft
    certifier: wherever the level changes), no proof covers R.
    Those certificates are counted against Binomial(audited, α_σ) (the σ level changes
    inside a certified ball only when its σ-certificate failed). Every audited radius
    must also satisfy ξ(R, σ0, σ0, p_A_lower) < 1/2 (hard smoothing: Cohen's radius at σ0)."""
    smoothing = sigma_smoothing(audit.sigma_provider)
    certs = audit.certificates
    level, _ = stored_sigma_certificates(audit)
    picked = audit.subset(f"{name}/sigma-smoothing", len(certs), audit.budget.audited_inputs)
    audited = len(picked)
    rows = [int(k) for k in picked if certs[k]["prediction"] != ABSTAIN and certs[k]["radius"] > 0]
    evidence: dict = {"declared": _describe(smoothing), "audited": audited,
                      "certified": len(rows), "false_alarm": FALSE_CHANGE}  # fmt: skip
    if not rows:
        return _verdict_of_count(name, 0, audited, 0, smoothing.alpha, "", evidence)
    radius = np.array([certs[k]["radius"] for k in rows])
    sigma0 = np.array([certs[k]["sigma"] for k in rows])
    p_lower = np.array([certs[k]["p_lower"] for k in rows])
    dim = int(audit.inputs[0].numel())
    hard = audit.certifier.smoothing == "hard"  # ξ is the worst case of hard smoothing
    at_sigma0 = (
        np.asarray(xi(radius, sigma0, sigma0, p_lower, dim)) if hard else np.zeros(len(rows))
    )
    beyond = np.flatnonzero(~(at_sigma0 < 0.5 + TOLERANCE))
    if len(beyond):
        k = int(beyond[0])
        evidence["beyond_cohen"] = {"input_id": certs[rows[k]]["input_id"], "radius": float(radius[k]),
                                    "sigma0": float(sigma0[k]), "xi": float(at_sigma0[k])}  # fmt: skip
        return CheckResult(name, Verdict.UNJUSTIFIED,
                           f"{len(beyond)}/{len(rows)} radii exceed Cohen's radius at σ0, e.g. input "
                           f"{certs[rows[k]]['input_id']}: ξ(R, σ0, σ0) = {at_sigma0[k]:.10g} >= 1/2",
                           evidence)  # fmt: skip
    found = probe_constancy(audit, smoothing, audit.inputs[torch.tensor(rows)], level[rows], radius,
                            "worst-case-justification/sigma-smoothing")  # fmt: skip
    levels = np.asarray(smoothing.levels, dtype=np.float64)
    unproven = np.zeros(len(rows), dtype=bool)
    for k in np.flatnonzero(found.changed):
        if not hard:
            unproven[k] = True
            continue
        sigma1 = levels[found.plausible[k]]
        values = np.asarray(xi(np.full(len(sigma1), radius[k]), np.full(len(sigma1), sigma0[k]),
                               sigma1, np.full(len(sigma1), p_lower[k]), dim))  # fmt: skip
        unproven[k] = bool(np.all(values >= 0.5 - TOLERANCE))
    k = int(np.argmax(found.margin))
    evidence.update(points_per_ball=found.points, samples=found.samples, delta=found.delta,
                    changed=int(found.changed.sum()), worst=_example(audit, rows, found, radius, k))  # fmt: skip
    return _verdict_of_count(name, int(unproven.sum()), audited, len(rows), smoothing.alpha,
                             "certified balls contain a point where the σ level confidently "
                             "changes and ξ >= 1/2", evidence)  # fmt: skip


def ball_flip(
    audit: Audit, context, smoothing: SigmaSmoothing, model, center: torch.Tensor, radius: float,
    prediction: int, level: int, gen: torch.Generator, purpose: str, searches: int,
) -> dict | None:  # fmt: skip
    """A point of B(center, radius) whose exact smoothed prediction on the ball classifier
    ``model`` (``model.classes[inside]``) differs from ``prediction`` at *every* σ level
    plausible there (the harness's draws of the σ-estimator under ``context``'s protocol;
    bounds at a level that keeps the false-alarm probability of all ``searches`` such
    searches <= FALSE_CHANGE), or None. The estimator is drawn only at points where some
    level flips (elsewhere no level can make a counterexample).

    Points as :func:`harness.audit.ball_attacks.search_points` (in more than 2-D the rays
    follow ± the gradient of the estimator's smoothed soft score of ``level``)."""
    flat = center.flatten().double().cpu()
    gradient = None
    if center.numel() != 2:
        x = center.detach().float()[None].requires_grad_(True)
        with torch.enable_grad():
            score = soft_score(smoothing, x, torch.tensor([level], device=x.device),
                               audit.budget.attack_samples, gen)  # fmt: skip
            (grad,) = torch.autograd.grad(score.sum(), x)
        gradient = grad.flatten().double().cpu()
    points = search_points(model, center, radius, gradient, gen)
    levels = np.asarray(smoothing.levels, dtype=np.float64)
    classes = np.asarray(model.classes)
    inside = np.stack([model.smoothed_probability(points.numpy(), np.full(len(points), v))
                       for v in levels], axis=1)  # fmt: skip
    flips = classes[(inside > 0.5).astype(int)] != prediction  # [points, levels], exact
    # only where some level flips can the σ level decide (the estimator is drawn there)
    candidates = np.flatnonzero(flips.any(axis=1))
    if not len(candidates):
        return None
    num = 16 * audit.budget.attack_samples
    counts = level_counts(audit, smoothing, points[candidates].to(center.device), num, purpose,
                          context)  # fmt: skip
    delta = FALSE_CHANGE / (2 * max(1, searches) * len(points) * len(levels))
    plausible = plausible_levels(counts, num, delta)
    flipped = np.all(flips[candidates] | ~plausible, axis=1)  # at every plausible level
    hits = np.flatnonzero(flipped)
    if not len(hits):
        return None
    k, at = int(hits[0]), int(candidates[hits[0]])
    j = int(np.flatnonzero(plausible[k])[0])
    return {"point": points[at].flatten().tolist(),
            "sigma": [float(levels[i]) for i in np.flatnonzero(plausible[k])],
            "exact_p_inside": float(inside[at, j]),
            "distance": float((points[at].double().flatten() - flat).norm())}  # fmt: skip


def plausible_at(
    audit: Audit, smoothing: SigmaSmoothing, x: torch.Tensor, num: int, error: float,
    purpose: str,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The σ levels and which of them are plausible [P, K] at each point of ``x`` by
    ``num`` of the harness's draws of the σ-estimator (seeded from the audit's entropy and
    ``purpose``), with bounds at a level that keeps the probability that the true level is
    missed anywhere <= ``error``."""
    counts = level_counts(audit, smoothing, x, num, purpose)
    delta = error / (2 * max(1, len(x)) * len(smoothing.levels))
    return np.asarray(smoothing.levels, dtype=np.float64), plausible_levels(counts, num, delta)
