"""S4: concrete counterexamples to certificates (Súkeník et al. 2022, App. C).

Each certificate holds with probability >= 1 − α per input it is asked about, so a
sound method may issue a few false ones; each kind of counterexample (a)–(c) below is
counted and tested against Binomial(trials, α) (one-sided; trials = the certificates
examined, abstentions included), and the p-values of the sub-tests that ran are combined
by Holm's step-down procedure at :data:`~harness.foundation.verdict.P_THRESHOLD`
(family-wise error <= the threshold, over the sub-tests that ran). The method is
``violated`` when a sub-test is rejected. (d) is a flag, not a test. One false
certificate among m trials has p >= 1 − (1 − α)^m >= α, so with α >= the threshold at
least two are needed; the evidence states the fewest confirmed violations that would be
significant.

(a) Two certified inputs with different predictions whose certified balls intersect:
a point in both balls would have to be classified as both, so one certificate is false.
(b) On the analytic ``ball-N`` base model: a point inside a certified ball whose exact
smoothed prediction (with the method's σ at that point) differs from the certified one.
(c) An ℓ2 PGD attack on the smoothed classifier inside each certified ball among
``budget.audited_inputs`` certificates drawn at random from the audit's entropy (as is
the attack's noise), along a path of ``budget.attack_steps`` points (the certified
input, then one per step; σ asked at each), σ(x1) recomputed by the method at the
path's end x1, every candidate confirmed by
a fresh Monte Carlo estimate (noise seeded from the audit's entropy) whose
Clopper–Pearson upper bound on the certified class is below another class's lower
bound. The confirmations err jointly with probability <= :data:`CONFIRMATION_ERROR`,
which is added to the attack's p-value (:func:`attack_pvalue`).
(d) Memory-based certifiers (``order_dependent``) are flagged ``order-dependent`` and
not attacked; S5 (:mod:`harness.audit.order`) replays their input orders.

For a σ-smoothing (dual RS, Sun et al. 2026), σ at a point is the harness's draw of the
σ-estimator, and (b) and (c) count a point only if it is a counterexample at every σ
level plausible there (:mod:`harness.audit.sigma_smoothing`).

At a diagonal scale (:mod:`harness.engine.scale`) the regions of (a) are the claimed
ellipsoids, a ball where none is claimed (:mod:`harness.audit.ellipsoid_intersections`); (b) and (c)
judge the smoothed classifier at each point at the scale σ answers there (for a memory,
the scale of the ball's own entry), and a certificate that claims an ellipsoid is also
searched inside it (:mod:`harness.audit.scaled_regions`), counted once per certificate.
Around a noise centre (:mod:`harness.engine.centre`) the smoothed classifier at a point x1
draws at x1 + μ(x1): (b) and (c) ask the centre at every point beside σ, and (c) confirms
a candidate with the fresh noise drawn there; (a) needs no noise at all.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from harness.audit import sigma_smoothing as smoothed
from harness.audit.analytic import BallClassifier
from harness.audit.audit import Audit
from harness.audit.ball_attacks import ellipsoid_points, flip_among, search_points
from harness.audit.ball_intersections import intersecting_pairs, intersections  # noqa: F401
from harness.audit.certificate_attacks import (
    CONFIRMATION_ERROR,
    attack_certificates,
    attack_pvalue,
)
from harness.audit.scaled_regions import (
    as_drawn,
    ellipsoid_axes,
    memory_ball_scales,
    whitened_norm,
)
from harness.audit.sigma_calls import (
    calls_of,
    centre_asker,
    sigma_and_gradients,
    sigma_in_calls,
)
from harness.certification.certify import sigma_smoothing
from harness.engine.scale import drawn_with_scale
from harness.foundation.certificate import ABSTAIN, unlabelled
from harness.foundation.verdict import P_THRESHOLD, CheckResult, Verdict
from harness.mathematics.stats import (
    false_certificates_pvalue,
    holm_rejections,
)

NAME = "counterexamples"


def _minimal_count(trials: int, alpha: float, threshold: float) -> int | None:
    """Fewest confirmed violations among ``trials`` that give p < ``threshold``, or None."""
    for k in range(1, trials + 1):
        if attack_pvalue(k, trials, alpha) < threshold:
            return k
    return None


def check_counterexamples(audit: Audit) -> CheckResult:
    certs = audit.certificates
    gen = audit.generator(f"{NAME}/flips")
    alpha = audit.context.protocol.alpha
    evidence: dict = {"null": "Binomial(trials, α) per sub-test, trials = certificates examined "
                              "(abstentions included)"}  # fmt: skip
    tests: dict[str, tuple[float, str]] = {}
    pairs = intersections(certs, audit.inputs)
    pairs["trials"] = len(certs)
    pairs["p_value"] = false_certificates_pvalue(pairs.get("false_at_least", 0), len(certs), alpha)
    evidence["intersections"] = pairs
    if pairs["count"] and pairs.get("regions") == "ellipsoids":
        e = pairs["example"]
        tests["intersections"] = (pairs["p_value"], (
            f"{pairs['count']} pairs of certified regions (ellipsoids, or balls where none is "
            f"claimed) with different predictions intersect (at least {pairs['false_at_least']} "
            f"false certificates), e.g. inputs {e['inputs'][0]} and {e['inputs'][1]} at distance "
            f"{e['distance']:.10g}: a point inside both (its larger whitened norm "
            f"{math.sqrt(e['witness_depth']):.6g} < 1)"))  # fmt: skip
    elif pairs["count"]:
        e = pairs["example"]
        tests["intersections"] = (pairs["p_value"], (
            f"{pairs['count']} pairs of certified balls with different predictions intersect "
            f"(at least {pairs['false_at_least']} false certificates), e.g. inputs {e['inputs'][0]} "
            f"and {e['inputs'][1]} at distance {e['distance']:.10g} < {e['radii'][0]:.10g} + "
            f"{e['radii'][1]:.10g}"))  # fmt: skip
    else:
        tests["intersections"] = (pairs["p_value"], "")
    model = audit.context.model  # as trained; its exact smoothing is that of fp32 arithmetic
    soft = audit.certifier.smoothing == "soft"
    rounded = audit.context.protocol.precision in ("bf16", "fp16")
    if isinstance(model, BallClassifier) and rounded:
        evidence["exact_flips"] = (f"not applicable: the run certified the ball classifier in "
                                   f"{audit.context.protocol.precision}, whose rounded boundary "
                                   "has no closed-form smoothing")  # fmt: skip
    elif isinstance(model, BallClassifier) and soft and not model.one_hot:
        evidence["exact_flips"] = ("not applicable: the base model's softmax is not one-hot, so "
                                   "the soft smoothed classifier has no closed form")  # fmt: skip
    elif isinstance(model, BallClassifier):
        memory = audit.certifier.order_dependent
        ball_sigma = None
        if memory:
            rows = unlabelled(certs)
            ball_sigma = (memory_ball_scales(audit.certifier, rows) if drawn_with_scale(certs)
                          else audit.certifier.ball_sigmas(rows))  # fmt: skip
        flip_at = _smoothed_flip(audit, gen, len(certs))
        certified = [(c, x) for c, x in zip(certs, audit.inputs, strict=True)
                     if c["prediction"] != ABSTAIN and c["radius"] > 0]  # fmt: skip
        found = ([flip_at(c, x) for c, x in certified] if flip_at
                 else _exact_flips(audit, model, certified, ball_sigma, gen))  # fmt: skip
        flips = [{"input_id": c["input_id"], "radius": c["radius"], **flip}
                 for (c, _), flip in zip(certified, found, strict=True) if flip is not None]  # fmt: skip
        p_flips = false_certificates_pvalue(len(flips), len(certs), alpha)
        evidence["exact_flips"] = {"count": len(flips), "trials": len(certs), "p_value": p_flips,
                                   "examples": flips[:3]}  # fmt: skip
        message = ""
        if flips:
            f = flips[0]
            message = (
                f"{len(flips)} certified balls contain a point with another exact smoothed prediction, e.g. "
                f"input {f['input_id']} {_where(f, 6)}, σ there "
                f"{f['sigma']:.6g}, exact P(inside) {f['exact_p_inside']:.6g}"
            )
        tests["exact_flips"] = (p_flips, message)
    flags = []
    if audit.certifier.order_dependent:
        flags.append("order-dependent")
        evidence["attack"] = "not applicable: memory certificates depend on the order of inputs"
    else:
        confirmed, attacked, audited = attack_certificates(audit)
        p_attack = attack_pvalue(len(confirmed), len(audited), alpha)
        evidence["attack"] = {
            "audited": len(audited),
            "inputs": audited,
            "attacked": attacked,
            "confirmed": len(confirmed),
            "p_value": p_attack,
            "confirmation_error": CONFIRMATION_ERROR,
            "examples": confirmed[:3],
        }
        message = ""
        if confirmed:
            c = confirmed[0]
            message = (
                f"PGD found {len(confirmed)} confirmed points, e.g. input {c['input_id']}: {_where(c, 10)}, "
                f"σ {c['sigma_at_point']:.4g}, class "
                f"{c['winning_class']} (>= {c['lower_bound_winning_class']:.6g}) beats the certified class "
                f"{c['certified_class']} (<= {c['upper_bound_certified_class']:.6g}), {c['samples']} fresh samples"
            )
        tests["attack"] = (p_attack, message)
    names = list(tests)
    rejected = holm_rejections([tests[k][0] for k in names], P_THRESHOLD)
    if isinstance(evidence["attack"], dict):  # at Holm's smallest level, over the sub-tests run
        evidence["attack"]["minimal_significant_count"] = _minimal_count(
            evidence["attack"]["audited"], alpha, P_THRESHOLD / len(names)
        )
    if drawn_with_scale(certs):  # what was judged of the scale's regions, and what was not
        claimed = sum(ellipsoid_axes(c) is not None for c in certs)
        evidence["diagonal_scale"] = (
            f"g drawn at the scale σ answers at each point; {claimed} claimed ellipsoids searched "
            "beside the balls ((b), (c)); pairs of ellipsoids not intersected (only their balls)"
        )
    evidence["correction"] = (
        f"Holm over {len(names)} sub-tests ({', '.join(names)}) at {P_THRESHOLD:g}"
    )
    found = [
        f"{tests[k][1]} (p = {tests[k][0]:.3g})" for k, r in zip(names, rejected, strict=True) if r
    ]
    if found:
        return CheckResult(NAME, Verdict.VIOLATED, "; ".join(found), evidence, flags)
    seen = [k for k in names if tests[k][1]]
    summary = "no counterexample found" if not seen else (
        "false certificates no more frequent than α allows (" + ", ".join(seen) + ")"
    )  # fmt: skip
    return CheckResult(NAME, Verdict.SOUND, f"{summary}; {evidence['correction']}", evidence, flags)


def _exact_flips(
    audit: Audit, model: BallClassifier, certified: list[tuple[dict, torch.Tensor]],
    ball_sigma: dict[int, float | np.ndarray] | None, gen: torch.Generator,
) -> list[dict | None]:  # fmt: skip
    """(b) in every certified ball (:func:`~harness.audit.ball_attacks.search_points`, each
    ball's point whose exact smoothed prediction is another class, or None), σ asked in
    few calls (:mod:`harness.audit.sigma_calls`): at the centers with their gradients
    (in more than 2-D: the rays along ±∇σ), then at every ball's search points at once.
    Memory certificates (``ball_sigma``) keep σ constant in each ball: no query.

    At a diagonal scale σ is the scale answered at each point (held in float32, as drawn)
    and a certificate that claims an ellipsoid is also searched inside it
    (:func:`~harness.audit.ball_attacks.ellipsoid_points`, asked in the same call; a flip
    there is marked ``"region": "ellipsoid"``)."""
    if not certified:
        return []
    device, provider, batch = audit.context.device, audit.sigma_provider, calls_of(audit)
    centers = torch.stack([x for _, x in certified]).to(device)
    planar = centers[0].numel() == 2  # every angle of a polygon: no rays along ∇σ
    gradients: list[torch.Tensor | None] = [None] * len(certified)
    center_sigma = None
    if ball_sigma is not None:
        center_sigma = np.array([ball_sigma[c["input_id"]] for c, _ in certified])
    elif not planar:
        asked, gradients = sigma_and_gradients(provider, centers, batch)
        center_sigma = as_drawn(asked.double().cpu().numpy())
    points = [search_points(model, x, c["radius"], g, gen)
              for (c, _), x, g in zip(certified, centers, gradients, strict=True)]  # fmt: skip
    centre = centre_asker(audit, " at a point inside a certified ball")
    rest = [p if center_sigma is None else p[1:] for p in points]  # the center's σ is known
    axes = [ellipsoid_axes(c) for c, _ in certified]
    regions = [None if a is None else ellipsoid_points(model, x, a, g, gen)[1:]
               for a, x, g in zip(axes, centers, gradients, strict=True)]  # fmt: skip
    asked_at = rest + [r for r in regions if r is not None]
    if ball_sigma is not None:
        values = [np.repeat(center_sigma[k][None], len(r), axis=0) for k, r in enumerate(rest)]
        values += [np.repeat(center_sigma[k][None], len(r), axis=0)
                   for k, r in enumerate(regions) if r is not None]  # fmt: skip
    else:
        with torch.no_grad():
            flat = sigma_in_calls(provider, torch.cat(asked_at).to(device), batch)
        values = np.split(as_drawn(flat.double().cpu().numpy()),
                          np.cumsum([len(r) for r in asked_at])[:-1])  # fmt: skip
    region_sigma = iter(values[len(rest) :])
    found = []
    for k, ((c, _), x) in enumerate(zip(certified, centers, strict=True)):
        sigma = (
            values[k] if center_sigma is None else np.concatenate([[center_sigma[k]], values[k]])
        )
        flip = flip_among(model, x, points[k], sigma, c["prediction"],
                          None if centre is None else centre(points[k]))  # fmt: skip
        if regions[k] is not None:
            inner = flip_among(model, x, regions[k], next(region_sigma), c["prediction"],
                               None if centre is None else centre(regions[k]))  # fmt: skip
            if flip is None and inner is not None:
                delta = torch.tensor(inner["point"]) - x.flatten().double().cpu()
                norm = float(whitened_norm(delta[None], torch.from_numpy(axes[k])[None])[0])
                flip = {**inner, "region": "ellipsoid", "whitened_norm": norm}
        found.append(flip)
    return found


def _smoothed_flip(audit: Audit, gen: torch.Generator, searches: int):
    """For a σ-smoothing (dual RS), the exact-flip search of one stored certificate at the
    σ levels the harness draws (:func:`harness.audit.sigma_smoothing.ball_flip`);
    None for any other σ-provider."""
    smoothing = sigma_smoothing(audit.sigma_provider)
    if smoothing is None:
        return None

    def flip(c: dict, x: torch.Tensor):
        level = int(np.argmax(c["draws"]["sigma"]["selection"]))
        return smoothed.ball_flip(audit, audit.context, smoothing, audit.context.model,
                                  x.to(audit.context.device), c["radius"], c["prediction"], level,
                                  gen, f"counterexamples/flip/{c['input_id']}", searches)  # fmt: skip

    return flip


def _where(found: dict, digits: int) -> str:
    """Where a message says a counterexample lies: in the ball, or in the claimed ellipsoid
    (``whitened_norm`` = ‖Σ^{-1/2}δ‖/κ)."""
    if found.get("region") == "ellipsoid":
        return (f"inside its claimed ellipsoid (‖Σ^-1/2 δ‖/κ = {found['whitened_norm']:.{digits}g} "
                f"< 1) at distance {found['distance']:.{digits}g}")  # fmt: skip
    return f"at distance {found['distance']:.{digits}g} < radius {found['radius']:.{digits}g}"
