"""Searches inside a certified ball, shared by S4 (:mod:`harness.audit.counterexamples`),
the coverage check and the empirical attack: σ at the ball's points, the exact flip on
the analytic ``ball-N`` model, ℓ2 PGD on the smoothed classifier, and the fresh Monte
Carlo estimate that confirms a candidate (Súkeník et al. 2022, App. C). At a diagonal
scale (:mod:`harness.engine.scale`) each accepts one scale per point, and the flip search
and PGD also search a certified ellipsoid (Eiras et al., ANCER, TMLR 2022, Thm 1)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from harness.mathematics.gaussian_ball import ball_mass
from harness.mathematics.stats import (
    clopper_pearson_lower_array,
    clopper_pearson_upper,
    hoeffding_lower,
    hoeffding_upper,
)


def search_points(
    model, center: torch.Tensor, radius: float, gradient: torch.Tensor | None,
    gen: torch.Generator,
) -> torch.Tensor:  # fmt: skip
    """The points of B(center, radius) a flip search examines, [P, *center.shape], float32
    on the CPU: the center, then in 2-D every angle of a 48-gon at 8 fractions of the
    radius; in more dimensions (each σ evaluation may be a costly search) 10 rays at the
    full radius (just inside the open ball): towards and away from the ball classifier's
    centre, along ± ``gradient`` (flattened; where σ grows or shrinks fastest) and their
    sums with the radial rays, and random directions from ``gen``."""
    dim = center.numel()
    flat = center.flatten().double().cpu()
    if dim == 2:
        angles = torch.linspace(0, 2 * math.pi, 49, dtype=torch.float64)[:-1]
        directions = torch.stack([torch.cos(angles), torch.sin(angles)], dim=1)
        fractions = torch.linspace(0, 1, 9, dtype=torch.float64)[1:]
    else:
        fractions = torch.tensor([1.0], dtype=torch.float64)
        offset = flat - model.center.double().cpu()
        radial = offset / offset.norm().clamp_min(1e-12)
        rays = [radial, -radial]
        if gradient is not None:
            g = gradient / gradient.norm().clamp_min(1e-12)
            rays += [g, -g, g + radial, g - radial, -g + radial, -g - radial]
        rays = torch.stack([r / r.norm().clamp_min(1e-12) for r in rays])
        rand = torch.randn(10 - len(rays), dim, generator=gen, dtype=torch.float64)
        directions = torch.cat([rays, rand / rand.norm(dim=1, keepdim=True)])
    fractions[-1] = 1 - 1e-6
    points = (flat + radius * fractions[:, None, None] * directions[None]).reshape(-1, dim)
    return torch.cat([flat[None], points]).float().view(-1, *center.shape)


def ellipsoid_points(
    model, center: torch.Tensor, axes: np.ndarray, gradient: torch.Tensor | None,
    gen: torch.Generator,
) -> torch.Tensor:  # fmt: skip
    """The points of the open ellipsoid {center + δ : ‖δ / axes‖₂ < 1} (semi-axes ``axes``
    [d], κ·σ_i of a certified region) a flip search examines, as :func:`search_points`
    (float32 on the CPU, the center first): each of its directions carried to the same
    fraction of the ellipsoid's extent along it, then ± the four longest axes just inside;
    a point that float32 rounding puts outside is dropped."""
    axes = np.asarray(axes, dtype=np.float64).reshape(-1)
    flat = center.flatten().double().cpu()
    unit = search_points(model, center, 1.0, gradient, gen).double().reshape(-1, len(axes)) - flat
    lengths = unit.norm(dim=1, keepdim=True)
    ax = torch.from_numpy(axes)
    extent = 1 / (unit / lengths.clamp_min(1e-300) / ax).norm(dim=1, keepdim=True)
    deltas = [unit[1:] * extent[1:]]  # a direction at fraction f of the ball: f of the extent
    longest = torch.from_numpy(np.argsort(axes)[::-1][:4].copy())
    along = torch.zeros(len(longest), len(axes), dtype=torch.float64)
    along[torch.arange(len(longest)), longest] = (1 - 1e-6) * ax[longest]
    deltas += [along, -along]
    points = (flat + torch.cat(deltas)).float()
    inside = (((points.double() - flat) / ax).norm(dim=1) < 1).numpy()
    return torch.cat([flat[None].float(), points[inside]]).view(-1, *center.shape)


def flip_among(
    model, center: torch.Tensor, points: torch.Tensor, sigma: np.ndarray, prediction: int,
    centres: np.ndarray | None = None,
) -> dict | None:  # fmt: skip
    """The first of ``points`` (of a ball around ``center``) whose exact smoothed prediction
    on the ball classifier ``model`` at σ ``sigma`` (one per point) is not ``prediction``,
    with its σ, exact P(inside) and distance to the center; or None.

    ``sigma`` [P, d] is a diagonal scale per point (:mod:`harness.engine.scale`): P(inside)
    is then bounded (:func:`~harness.mathematics.gaussian_ball.ball_mass`) and a point
    counts only where both bounds lie on the other side of 1/2; its ``sigma`` is the
    smallest axis and ``scale_max`` the largest. ``centres`` [P, d]: the noise centre
    μ at each point (:mod:`harness.engine.centre`), the smoothing then that of x + μ."""
    sigma = np.asarray(sigma, dtype=np.float64)
    if sigma.ndim > 1:
        return _scaled_flip(model, center, points, sigma, prediction, centres)
    at = points if centres is None else points + torch.from_numpy(centres).view_as(points)
    inside = model.smoothed_probability(at.numpy(), sigma)
    flipped = np.nonzero(np.where(inside > 0.5, model.classes[1], model.classes[0]) != prediction)[
        0
    ]
    if not len(flipped):
        return None
    k = int(flipped[0])
    flat = center.flatten().double().cpu()
    return {"point": points[k].flatten().tolist(), "sigma": float(sigma[k]), "exact_p_inside": float(inside[k]),
            "distance": float((points[k].double().flatten() - flat).norm())}  # fmt: skip


def _scaled_flip(
    model, center, points, scale: np.ndarray, prediction: int, centres: np.ndarray | None = None
) -> dict | None:  # fmt: skip
    """:func:`flip_among` at a diagonal scale per point ([P, d]), on bounds of P(inside)."""
    flat = points.double().reshape(len(points), -1).numpy()
    mean = flat if centres is None else flat + np.asarray(centres, dtype=np.float64)
    lower, upper = ball_mass(mean - model.center.double().cpu().numpy(), scale, model.radius)
    # a point counts only where both bounds say which side of 1/2 it is on
    answer = np.where(lower > 0.5, model.classes[1], model.classes[0])
    flipped = np.nonzero(((lower > 0.5) | (upper < 0.5)) & (answer != prediction))[0]
    if not len(flipped):
        return None
    k = int(flipped[0])
    distance = float(np.linalg.norm(flat[k] - center.double().cpu().numpy().reshape(-1)))
    return {"point": flat[k].tolist(), "sigma": float(scale[k].min()),
            "scale_max": float(scale[k].max()), "exact_p_inside": float(lower[k] + upper[k]) / 2,
            "exact_p_inside_bounds": [float(lower[k]), float(upper[k])], "distance": distance}  # fmt: skip


STREAM_CONFIRM = 3
"""Noise stream of the fresh Monte Carlo estimates that confirm attack candidates (on
an engine whose seed comes from the audit's entropy)."""


def pgd_on_smoothed(
    model: torch.nn.Module,
    x0: torch.Tensor,
    target: torch.Tensor,
    radius: torch.Tensor,
    sigma_at: Callable[[torch.Tensor], torch.Tensor],
    steps: int,
    samples: int,
    gen: torch.Generator,
    start: torch.Tensor | None = None,
    axes: torch.Tensor | None = None,
    centre_at: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """ℓ2 PGD on the smoothed classifier: points of the balls B(x0_i, radius_i) where class
    ``target_i`` of the mean softmax over ``samples`` noise draws loses the most.

    Each of ``steps`` steps descends the log-margin log p_target − log max_{c≠target} p_c
    of E[softmax(f(x + σ(x)ε))] (the differentiable surrogate of both smoothings, as in
    Salman et al. 2019, §3) by 2.5·radius/steps along the normalized gradient, then
    projects strictly inside the open ball. ``sigma_at(x)`` gives σ at the iterates (it
    may carry a gradient), one per point or a diagonal scale [B, d] (the noise x + σ_i·ε_i);
    the walk starts at ``start`` (default ``x0``).

    With ``axes`` [B, d] (semi-axes, e.g. κ·σ_i of a certified ellipsoid; a ball's radius
    in every axis) the walk is in the whitened coordinates u = (x − x0)/axes instead:
    steps of 2.5/steps along the normalized gradient in u, projected strictly inside
    ‖u‖ < 1, so each iterate lies in its open ellipsoid.

    ``centre_at(x)``, given, is the noise centre μ at the iterates (:mod:`harness.engine.
    centre`): the noise is then drawn at x + μ(x) (μ taken as constant in the gradient
    unless it carries one).
    """
    device = x0.device
    shape = (-1,) + (1,) * (x0.dim() - 1)
    x1 = (x0 if start is None else start).clone()
    step = 2.5 * radius / max(steps, 1)
    for _ in range(steps):
        x1 = x1.detach().requires_grad_(True)
        with torch.enable_grad():
            sigma = sigma_at(x1)
            eps = torch.randn((samples, *x1.shape), generator=gen).to(device)
            mean = x1 if centre_at is None else x1 + centre_at(x1).view_as(x1)
            noisy = (mean[None] + noise_scale(sigma, x1) * eps).reshape(-1, *x1.shape[1:])
            probs = torch.softmax(model(noisy), dim=-1).view(samples, len(x1), -1).mean(0)
            own = probs.gather(1, target[:, None]).squeeze(1)
            other = probs.scatter(1, target[:, None], -1.0).max(dim=1).values
            margin = torch.log(own.clamp_min(1e-12)) - torch.log(other.clamp_min(1e-12))
            (grad,) = torch.autograd.grad(margin.sum(), x1)
        with torch.no_grad():
            if axes is not None:
                x1 = _whitened_step(x0, x1, grad, axes, steps)
                continue
            g = grad.flatten(1)
            g = g / g.norm(dim=1, keepdim=True).clamp_min(1e-12)
            x1 = x1 - step.view(shape) * g.view_as(x1)
            delta = (x1 - x0).flatten(1)
            # strictly inside the open certified ball
            scale = ((1 - 1e-6) * radius / delta.norm(dim=1).clamp_min(1e-12)).clamp(max=1.0)
            x1 = x0 + (delta * scale[:, None]).view_as(x0)
    return x1.detach()


def noise_scale(sigma: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """σ (float32) shaped to multiply noise [samples, *x.shape]: one σ per point [B], or a
    diagonal scale [B, d] or [B, *input_shape] coordinate by coordinate."""
    if sigma.dim() <= 1:
        return sigma.float().view(1, -1, *(1,) * (x.dim() - 1))
    return sigma.float().reshape(1, *x.shape)


def _whitened_step(x0, x1, grad, axes: torch.Tensor, steps: int) -> torch.Tensor:
    """One PGD step of :func:`pgd_on_smoothed` in u = (x − x0)/axes, projected to ‖u‖ < 1."""
    axes = axes.to(x0.device, torch.float32).reshape(len(x0), -1)
    g = grad.flatten(1) * axes
    g = g / g.norm(dim=1, keepdim=True).clamp_min(1e-12)
    u = (x1 - x0).flatten(1) / axes - (2.5 / max(steps, 1)) * g
    u = u * ((1 - 1e-6) / u.norm(dim=1, keepdim=True).clamp_min(1e-12)).clamp(max=1.0)
    return x0 + (u * axes).view_as(x0)


def confirm_other_class(
    engine, x: torch.Tensor, sigma: torch.Tensor, ids: list[int], target: list[int], num: int,
    level: float, soft: bool, stream: int = STREAM_CONFIRM,
) -> list[dict | None]:  # fmt: skip
    """Fresh Monte Carlo at each point ``x_k`` (σ ``sigma_k``, noise of input ``ids_k`` in
    ``stream``): does another class beat ``target_k``?

    Per point, an upper bound on the target's probability (or mean output, for soft
    smoothing: Hoeffding) and a lower bound for every other class, each at ``level``
    (Clopper–Pearson for counts); a point is confirmed when some other class's lower bound
    exceeds the target's upper bound, so the smoothed classifier there (argmax) is not
    the target. Returns per point None or the winning class with both bounds.
    """
    classes = engine.num_classes
    if soft:
        means = np.stack([s.means for s in engine.soft_stats(x, sigma, ids, num, stream)])
    else:
        counts = engine.counts(x, sigma, ids, num, stream)
    out: list[dict | None] = []
    for k, t in enumerate(target):
        others = [j for j in range(classes) if j != t]
        if soft:
            upper = float(hoeffding_upper(means[k, t], num, level))
            lowers = hoeffding_lower(means[k, others], num, level)
        else:
            upper = clopper_pearson_upper(int(counts[k, t]), num, level)
            lowers = clopper_pearson_lower_array(
                counts[k, others], np.full(len(others), num), level
            )
        best = int(np.argmax(lowers))
        out.append(
            {"winning_class": others[best], "lower_bound_winning_class": float(lowers[best]),
             "upper_bound_certified_class": upper}
            if lowers[best] > upper
            else None
        )  # fmt: skip
    return out
