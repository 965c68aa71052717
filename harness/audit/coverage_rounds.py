"""S1's rounds of trials (:mod:`harness.audit.coverage`): the method rebuilt on an exact
classifier per round, certifying each trial input at σ asked for the whole round at once
or trial by trial.

A round's trial inputs are distinct; its exact model is placed anew for each trial
(:mod:`harness.audit.coverage_trials`), every placement drawn as the round begins, and
each trial's flip rays from a generator of its own, so no trial's draws depend on what
another's certificate was. σ is asked at all the round's trial inputs at once (with ∇σ
on the ball), then at all the flip rays of their certificates, in calls of the run's
batch size (:mod:`harness.audit.sigma_calls`) (:func:`_together`): first with the
model's placement withheld (:meth:`harness.audit.analytic.LinearClassifier.withheld`:
a σ that completes did not read the model), else with each trial input's own
placement (:meth:`~harness.audit.analytic.LinearClassifier.per_input`: a σ that reads
the model through :func:`harness.outputs_for_inputs` reads its trial's classifier). A
σ that reads the model otherwise is a σ of each trial's classifier and is asked trial by
trial (:func:`_one_by_one`), as are a σ-smoothing's (drawn by the harness per trial) and
a σ-provider's in a plugin host (which holds the model as last sent). A memory is built
afresh for each trial (each trial is another classifier). Both ways draw the same
placements, rays and noise from the audit's entropy.

Around a noise centre (:mod:`harness.engine.centre`) a trial is certified with the samples
drawn at x0 + μ(x0), its exact probabilities are those of that noise, a linear trial's
truth is the plane's side of x0 + μ(x0) (the certificate judged for the noise it was drawn
with; how μ varies inside the ball is S3's and S4's), and a ball trial's flips are judged
at each point with the centre asked there, as σ is.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from harness.audit import sigma_smoothing as smoothed
from harness.audit.analytic import BallClassifier, LinearClassifier, PlacementWithheld
from harness.audit.audit import Audit
from harness.audit.ball_attacks import ellipsoid_points, search_points
from harness.audit.coverage_trials import (
    BallSearch,
    FlipRays,
    Outcome,
    Trial,
    candidates,
    derived_by_formula,
    ellipsoids,
    first_false,
    flip_example,
    linear_trial_false,
    pair_of_classes,
    place_ball,
    place_linear,
    trial_quantile,
    uniform,
)
from harness.audit.scaled_regions import as_drawn, memory_ball_scales
from harness.audit.sigma_calls import (
    calls_of,
    centre_in_calls,
    sigma_and_gradients,
    sigma_in_calls,
)
from harness.certification.certify import (
    certifier_label,
    certify_drawn,
    checked_sigma,
    sigma_of,
    sigma_smoothing,
)
from harness.engine.centre import centre_of, recorded_centre, shifted
from harness.engine.scale import as_scale, recorded_scale
from harness.foundation.data import TrainingSplit
from harness.plugin.hosting.in_harness.remote import RemoteSigmaProvider


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


@dataclass
class _Round:
    """One round of trials on one exact model: distinct trial inputs (``chosen``, indices of
    the audit's inputs), the pair of classes, the method rebuilt on the model (labelled by
    the round's first placement), the harness's engine for the trials' draws, each trial's
    quantile q and uniform V (drawn in the order q, V of trial 0, q, V of trial 1, …) and
    placement (drawn from the round's generator in trial order: the example's fields and
    the model's :meth:`~harness.audit.analytic.LinearClassifier.placement`)."""

    audit: Audit
    family: str
    purpose: str
    chosen: list[int]
    pair: tuple[int, int]
    model: torch.nn.Module
    dataset: TrainingSplit
    provider: object
    certifier: object
    context: object
    draw: object
    quantiles: list[float]
    uniforms: list[float]
    placements: list[tuple[dict, tuple[torch.Tensor, float]]]
    searches: int  # the family's trials (a σ-smoothing's flip searches share their error)

    def rays(self, j: int) -> torch.Generator:
        """Trial ``j``'s generator of flip rays."""
        return self.audit.generator(f"{self.purpose}/rays/{j}")


def _reference(certificate: dict):
    """σ_ref of a trial input: the run's σ there, or the scale it recorded (its draws')."""
    scale = recorded_scale(certificate.get("draws"))
    return float(certificate["sigma"]) if scale is None else scale


def _rounds(audit: Audit, family: str, points, trials: int, protocol, root: Path):
    """The rounds of ``trials`` trials of a family, each drawn from the audit's entropy
    as the round begins (a round needs the trials before it: how many are left)."""
    classes, dim = audit.context.dataset.num_classes, points[0].numel()
    stored_sigma = [_reference(c) for c in audit.certificates]
    model_type, place = {"linear": (LinearClassifier, place_linear),
                         "ball": (BallClassifier, place_ball)}[family]  # fmt: skip
    left = trials
    for r in range(math.ceil(trials / len(points))):
        purpose = f"coverage/{family}/{r}"
        rng, gen = audit.rng(purpose), audit.generator(purpose)
        chosen = rng.choice(len(points), min(left, len(points)), replace=False).tolist()
        pair = pair_of_classes(rng, classes)
        model = model_type(dim, one_hot=True, num_classes=classes, classes=pair)
        model = model.to(audit.context.device)
        place(model, points[chosen[0]], stored_sigma[chosen[0]], 0.5, gen)
        dataset = _labelled(audit, model)  # by the round's first placement
        provider, certifier, context = audit.rebuild(dataset, model, protocol, root)
        draw = audit.fresh_engine(purpose, context.engine)  # the round's inputs are distinct
        quantiles, uniforms, placements = [], [], []
        for j in range(len(chosen)):
            quantiles.append(trial_quantile(rng, j, protocol.estimation_cap, protocol.alpha))
            uniforms.append(uniform(rng))
        for j, k in enumerate(chosen):
            # σ_ref: the run's σ (or scale) at x0, at which x0 sits at P(side 1) = q
            placed = place(model, points[k], stored_sigma[k], quantiles[j], gen)
            placements.append((placed, model.placement()))
        left -= len(chosen)
        yield _Round(audit, family, purpose, chosen, pair, model, dataset, provider, certifier,
                     context, draw, quantiles, uniforms, placements, trials)  # fmt: skip


def run_trials(
    audit: Audit, family: str, points, ids, trials: int, protocol, root: Path
) -> Outcome:
    """``trials`` certified trial inputs on fresh placements of the family's exact model,
    in rounds of distinct inputs (one rebuild of the method per round, per trial for a
    memory). A round asks σ of all its trials at once (:func:`_together`) unless σ reads
    the exact model other than through :func:`harness.outputs_for_inputs` (each trial is
    then another base classifier), is a σ-smoothing's or is served by a plugin host: then
    trial by trial (:func:`_one_by_one`); both draw the same placements, points and noise
    from the audit's entropy."""
    out = Outcome()
    for rnd in _rounds(audit, family, points, trials, protocol, root):
        out.classes.append(list(rnd.pair))
        judged = _together(rnd, points, ids, protocol, root) if _batched(rnd) else None
        if judged is None:  # σ read the model: a σ of another classifier per trial
            judged = _one_by_one(rnd, points, ids, protocol, root)
        for trial in judged:
            trial.judge(out)
    return out


def _batched(rnd: _Round) -> bool:
    """Whether σ of the round's trials may be asked at once: not for a σ-smoothing (the
    harness draws its σ per trial) or a σ-provider in a plugin host (which may hold the
    model as it was last sent)."""
    return (sigma_smoothing(rnd.provider) is None
            and not isinstance(getattr(rnd.provider, "uncounted", rnd.provider),
                               RemoteSigmaProvider))  # fmt: skip


def _trial_input(rnd: _Round, points, ids, j: int):
    """Trial ``j``'s input [1, *shape] on the device, its id, and the example's fields, with
    the model placed for it."""
    k = rnd.chosen[j]
    placed, placement = rnd.placements[j]
    rnd.model.set_placement(placement)
    where = {"model": f"{rnd.family}-{points[0].numel()}", "input_id": ids[k],
             "exact_p_side_1": rnd.quantiles[j], **placed}  # fmt: skip
    return points[k : k + 1].to(rnd.audit.context.device), ids[k], where


def _method_for(rnd: _Round, j: int, method, protocol, root: Path):
    """The (σ-provider, certifier, context) that certifies trial ``j``: the round's, or
    for a memory (which lives for one classifier) one built afresh for every trial."""
    if not rnd.certifier.order_dependent or not j:
        return method
    return rnd.audit.rebuild(rnd.dataset, rnd.model, protocol, root, method[2].memos)


def _certified(rnd: _Round, provider, certifier, context, x0, input_id: int, sigma, drawn,
               protocol):  # fmt: skip
    """The trial's certificate at σ (the harness's draws; around the σ-provider's centre
    μ(x0) where it answers one, :mod:`harness.engine.centre`), the formula's derivation
    from its draws and the exact class probabilities at its input (of the noise drawn
    there, at x0 + μ(x0))."""
    audit = rnd.audit
    centre = centre_of(provider, x0, audit.method.sigma_provider, " at a trial input")
    [c] = certify_drawn(rnd.draw, protocol, certifier, x0, [input_id], sigma, drawn,
                        label=certifier_label(context, audit.method),
                        regularity=provider.regularity, centre=centre)  # fmt: skip
    derived = derived_by_formula(audit, [vars(c)], x0, protocol, provider)
    at = shifted(x0, centre).cpu().numpy()
    return c, derived, rnd.model.class_probabilities(at, sigma)[0]


def _one_by_one(rnd: _Round, points, ids, protocol, root: Path) -> list[Trial]:
    """The round's trials one at a time, each judged before the next: σ at the trial input
    (with ∇σ on the ball), then at the flip rays of each certificate."""
    audit = rnd.audit
    name = audit.method.sigma_provider
    method = (rnd.provider, rnd.certifier, rnd.context)
    out = []
    for j in range(len(rnd.chosen)):
        placed = _trial_input(rnd, points, ids, j)
        x0, input_id, _ = placed
        method = _method_for(rnd, j, method, protocol, root)
        provider, _, context = method
        if sigma_smoothing(provider) is not None:  # σ drawn by the harness per point
            out.append(_smoothed_trial(rnd, method, placed, j, protocol))
            continue
        gradient = None
        if rnd.family == "ball":  # σ, ∇σ in one call
            sigma, [gradient] = sigma_and_gradients(provider, x0, 1)
            sigma = held_sigma(checked_sigma(sigma, 1, name, dims=x0[0].numel()), 1)
        else:
            sigma, _ = sigma_of(context, provider, x0, [input_id], name)
        trial, search = _placed_trial(rnd, method, placed, j, sigma, gradient, protocol)
        if search is not None:
            for ray in search.rays:
                if ray.sigma is None:
                    with torch.no_grad():
                        ray.sigma = as_drawn(provider(ray.points[1:].to(x0.device)).double()
                                             .cpu().numpy())  # fmt: skip
                if search.center_centre is not None:
                    ray.centres = centre_of(provider, ray.points[1:].to(x0.device), name,
                                            " inside a certified ball")  # fmt: skip
            trial.false = search.first_false()
        out.append(trial)
    return out


def _smoothed_trial(rnd: _Round, method, placed, j: int, protocol) -> Trial:
    """Trial ``j`` of a σ-smoothing (dual RS): σ drawn by the harness at the trial input,
    and on the ball flips at every σ level plausible at a point, drawn there."""
    audit, model = rnd.audit, rnd.model
    x0, input_id, where = placed
    provider, certifier, context = method
    sigma, drawn = sigma_of(_secret(audit, context, f"{rnd.purpose}/{j}"), provider, x0,
                            [input_id], audit.method.sigma_provider)  # fmt: skip
    c, derived, probabilities = _certified(rnd, provider, certifier, context, x0, input_id,
                                           sigma, drawn, protocol)  # fmt: skip
    if rnd.family == "linear":
        false = linear_trial_false(c, derived, model, rnd.pair, x0, where)
        return Trial(input_id, c, derived, false, probabilities, rnd.uniforms[j])
    smoothing, level = sigma_smoothing(provider), int(np.argmax(drawn.selection[0]))
    gen, search = rnd.rays(j), f"{rnd.purpose}/{j}"

    def false(pred, radius):
        return flip_example(smoothed.ball_flip(audit, context, smoothing, model, x0[0], radius,
                                               pred, level, gen, search, rnd.searches), where)  # fmt: skip

    return Trial(input_id, c, derived, first_false(c, derived, false), probabilities,
                 rnd.uniforms[j])  # fmt: skip


def held_sigma(sigma: torch.Tensor, count: int) -> np.ndarray:
    """σ answered for ``count`` points as a run holds it: float64 [count], or a diagonal
    scale [count, d] in float32 (:func:`harness.engine.scale.as_scale`)."""
    if sigma.dim() > 1:
        return as_scale(sigma.detach().to("cpu", torch.float32).numpy(), count)
    return sigma.detach().double().cpu().numpy()


def _asked(rnd: _Round, routed: bool, points: torch.Tensor, trial: list[int]):
    """Where σ is asked at ``points``: with the model's placement withheld, or (``routed``)
    with each point's classifier that of its trial (``trial``, indices of the round's)."""
    if not routed:
        return rnd.model.withheld()
    return rnd.model.per_input(points, [rnd.placements[j][1] for j in trial])


def _together(rnd: _Round, points, ids, protocol, root: Path) -> list[Trial] | None:
    """The round's trials with σ asked at once (calls of the run's batch,
    :mod:`harness.audit.sigma_calls`): at every trial input (with ∇σ on the ball), then
    at the flip rays of every certificate; with the exact model's placement withheld
    (:meth:`~harness.audit.analytic.LinearClassifier.withheld`: σ does not depend on it),
    else with each point's classifier its trial's
    (:meth:`~harness.audit.analytic.LinearClassifier.per_input`). None when σ reads the
    model either way."""
    audit, provider = rnd.audit, rnd.provider
    batch, trials = calls_of(audit), list(range(len(rnd.chosen)))
    x0 = points[torch.tensor(rnd.chosen)].to(audit.context.device)
    for routed in (False, True):
        try:
            with _asked(rnd, routed, x0, trials):
                if rnd.family == "ball":
                    sigma, gradients = sigma_and_gradients(provider, x0, batch)
                else:
                    with torch.no_grad():
                        sigma, gradients = sigma_in_calls(provider, x0, batch), [None] * len(x0)
            break
        except PlacementWithheld:
            continue
    else:
        return None
    sigma = held_sigma(checked_sigma(sigma.detach(), len(x0), audit.method.sigma_provider,
                                     dims=x0[0].numel()), len(x0))  # fmt: skip
    method, out, searches = (rnd.provider, rnd.certifier, rnd.context), [], []
    for j in trials:
        placed = _trial_input(rnd, points, ids, j)
        method = _method_for(rnd, j, method, protocol, root)
        trial, search = _placed_trial(rnd, method, placed, j, sigma[j : j + 1], gradients[j],
                                      protocol)  # fmt: skip
        out.append(trial)
        searches.append(search)
    rays = [(j, ray) for j, search in enumerate(searches) if search is not None
            for ray in search.rays if ray.sigma is None]  # fmt: skip
    if rays:  # σ at every ray's points but the center (known) in one query
        asked = torch.cat([ray.points[1:] for _, ray in rays]).to(x0.device)
        owners = [j for j, ray in rays for _ in range(len(ray.points) - 1)]
        try:
            with _asked(rnd, routed, asked, owners), torch.no_grad():
                values = as_drawn(sigma_in_calls(provider, asked, batch).double().cpu().numpy())
        except PlacementWithheld:
            return None
        parts = np.split(values, np.cumsum([len(ray.points) - 1 for _, ray in rays])[:-1])
        for (_, ray), part in zip(rays, parts, strict=True):
            ray.sigma = part
    centred = [(j, ray) for j, search in enumerate(searches)
               if search is not None and search.center_centre is not None
               for ray in search.rays]  # fmt: skip
    if centred:  # the centre at every ray's points but the center (recorded) in one query
        asked = torch.cat([ray.points[1:] for _, ray in centred]).to(x0.device)
        owners = [j for j, ray in centred for _ in range(len(ray.points) - 1)]
        try:
            with _asked(rnd, routed, asked, owners), torch.no_grad():
                values = centre_in_calls(provider, asked, batch, audit.method.sigma_provider,
                                         " inside a certified ball")  # fmt: skip
        except PlacementWithheld:
            return None
        parts = np.split(values, np.cumsum([len(ray.points) - 1 for _, ray in centred])[:-1])
        for (_, ray), part in zip(centred, parts, strict=True):
            ray.centres = part
    for trial, search in zip(out, searches, strict=True):
        if search is not None:
            trial.false = search.first_false()
    return out


def _placed_trial(rnd: _Round, method, placed, j: int, sigma: np.ndarray, gradient, protocol):
    """Trial ``j`` (``placed``: :func:`_trial_input`) certified at its σ by ``method``:
    (the trial, None) for a linear trial, judged; (the trial, its flip searches: the rays
    of each certificate drawn from the trial's generator) on the ball, at a diagonal
    scale its ellipsoids' too (:func:`~harness.audit.ball_attacks.ellipsoid_points`). A
    memory keeps σ (its scale) constant in its ball (its rays' σ)."""
    x0, input_id, where = placed
    provider, certifier, context = method
    c, derived, probabilities = _certified(rnd, provider, certifier, context, x0, input_id,
                                           sigma, None, protocol)  # fmt: skip
    trial = Trial(input_id, c, derived, None, probabilities, rnd.uniforms[j])
    centre = recorded_centre(c.draws)  # μ(x0): the linear truth is that of x0 + μ(x0)
    if rnd.family == "linear":
        trial.false = linear_trial_false(c, derived, rnd.model, rnd.pair, shifted(x0, centre),
                                         where)  # fmt: skip
        return trial, None
    scale = recorded_scale(c.draws)
    memory = None
    if certifier.order_dependent:
        rows = [vars(c)]
        memory = memory_ball_scales(certifier, rows) if scale is not None \
            else certifier.ball_sigmas(rows)  # fmt: skip
    constant = memory is not None  # σ constant in the ball: no rays along ∇σ
    center_sigma = memory[input_id] if constant else sigma[0]
    if scale is None:
        center_sigma = float(center_sigma)
    gen, rays = rnd.rays(j), []
    toward = None if constant else gradient
    for source, pred, radius in candidates(c, derived, 0):
        rays.append(FlipRays(source, pred, radius, search_points(rnd.model, x0[0], radius, toward,
                                                              gen)))  # fmt: skip
    for source, pred, kappa in ellipsoids(c, derived, 0):
        found = ellipsoid_points(rnd.model, x0[0], kappa * scale.astype(np.float64), toward, gen)
        rays.append(FlipRays(source, pred, kappa, found, region="ellipsoid"))
    if constant:
        for ray in rays:
            ray.sigma = np.repeat(np.asarray(center_sigma)[None], len(ray.points) - 1, axis=0)
    return trial, BallSearch(copy.deepcopy(rnd.model), x0[0], center_sigma, where, rays, centre)
