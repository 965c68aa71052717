"""S1's rounds of trials (:mod:`harness.audit.coverage`): the method rebuilt on an exact
classifier per round, certifying each trial input at σ asked for the whole round at once
or trial by trial.

A round's trial inputs are distinct; its exact model is placed anew for each trial
(:mod:`harness.audit.coverage_trials`). σ is asked at all the round's trial inputs at
once (with ∇σ on the ball), then at all the flip rays of their certificates, in calls of
the run's batch size (:mod:`harness.audit.sigma_calls`), while the model's placement is
withheld (:meth:`harness.audit.analytic.BallClassifier.withheld`): a σ that completes did
not read the model (:func:`_together`). A σ that reads it is a σ of each trial's
classifier and is asked trial by trial (:func:`_one_by_one`), as are a memory's (a fresh
method per trial), a σ-smoothing's (drawn by the harness per trial) and a σ-provider's
in a plugin host (which holds the model as last sent). Both ways draw the same
placements, rays and noise from the audit's entropy.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from harness.audit import sigma_smoothing as smoothed
from harness.audit.analytic import BallClassifier, LinearClassifier, PlacementWithheld
from harness.audit.audit import Audit
from harness.audit.ball_attacks import ball_flip, flip_among, search_points, sigma_in_ball
from harness.audit.coverage_trials import (
    Outcome,
    Trial,
    candidates,
    derived_by_formula,
    first_false,
    flip_example,
    linear_false,
    pair_of_classes,
    place_ball,
    place_linear,
    trial_quantile,
    uniform,
)
from harness.audit.sigma_calls import calls_of, sigma_and_gradients, sigma_in_calls
from harness.certification.certify import (
    certifier_label,
    certify_drawn,
    checked_sigma,
    sigma_of,
    sigma_smoothing,
)
from harness.foundation.data import TrainingSplit
from harness.plugin.hosting.remote import RemoteSigmaProvider


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
    quantile q and uniform V (drawn in the order q, V of trial 0, q, V of trial 1, …), and
    the round's generator of placements and flip rays."""

    audit: Audit
    family: str
    purpose: str
    chosen: list[int]
    pair: tuple[int, int]
    model: torch.nn.Module
    place: Callable
    dataset: TrainingSplit
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
        quantiles, uniforms = [], []
        for j in range(len(chosen)):
            quantiles.append(trial_quantile(rng, j, protocol.estimation_cap, protocol.alpha))
            uniforms.append(uniform(rng))
        left -= len(chosen)
        yield _Round(audit, family, purpose, chosen, pair, model, place, dataset, provider,
                     certifier, context, draw, quantiles, uniforms, gen, trials)  # fmt: skip


def run_trials(
    audit: Audit, family: str, points, ids, trials: int, protocol, root: Path
) -> Outcome:
    """``trials`` certified trial inputs on fresh placements of the family's exact model,
    in rounds of distinct inputs (one rebuild of the method per round, per trial for a
    memory). A round asks σ of all its trials at once (:func:`_together`) unless σ reads
    the exact model (each trial is then another base classifier) or the method is a
    memory or a σ-smoothing: then trial by trial (:func:`_one_by_one`); both draw the same
    placements, points and noise from the audit's entropy."""
    out = Outcome()
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
    derived = derived_by_formula(audit, [vars(c)], x0, protocol, provider)
    return c, derived, rnd.model.class_probabilities(x0.cpu().numpy(), sigma)[0]


def _one_by_one(rnd: _Round, points, ids, protocol, root: Path) -> list[Trial]:
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
            false = linear_false(rnd.model, rnd.pair, x0, where)
        elif drawn is not None:  # flips at every σ level plausible there, drawn by the harness
            smoothing, level = sigma_smoothing(provider), int(np.argmax(drawn.selection[0]))

            def false(pred, radius, x0=x0, where=where, context=context, smoothing=smoothing,
                      level=level, search=f"{rnd.purpose}/{j}"):  # fmt: skip
                return flip_example(smoothed.ball_flip(audit, context, smoothing, model, x0[0],
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
                return flip_example(flip, where)

        out.append(Trial(input_id, c, derived, first_false(c, derived, false), probabilities,
                          rnd.uniforms[j]))  # fmt: skip
    return out


def _together(rnd: _Round, points, ids, protocol) -> list[Trial] | None:
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
    out: list[Trial] = []
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
        """The first certificate with a flip (as :func:`first_false`), and the generator's
        state to resume from when rays after it were drawn (else None)."""
        for ray in self.rays:
            sigma = np.concatenate([[self.center_sigma], ray.sigma])
            flip = flip_among(self.model, self.center, ray.points, sigma, ray.prediction)
            if flip is not None:
                example = {"certificate": ray.source, "prediction": ray.prediction,
                           "radius": ray.radius, **flip_example(flip, self.where)}  # fmt: skip
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
    trial = Trial(input_id, c, derived, None, probabilities, rnd.uniforms[j])
    if rnd.family == "linear":
        trial.false = first_false(c, derived, linear_false(rnd.model, rnd.pair, x0, where))
        return trial, None
    rays = []
    for source, pred, radius in candidates(c, derived, 0):
        found = search_points(rnd.model, x0[0], radius, gradient, rnd.gen)
        rays.append(_Rays(source, pred, radius, found, rnd.gen.get_state()))
    return trial, _BallSearch(copy.deepcopy(rnd.model), x0[0], float(sigma[0]), where, rays)
