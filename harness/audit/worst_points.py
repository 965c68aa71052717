"""S3's least worst cases inside the certified balls at a diagonal scale, and a descent
toward them that asks the σ-provider only at points.

At x1 = x0 + δ in a ball drawn at a recorded scale Σ0 = diag(s0²) around a recorded centre
μ(x0) (:mod:`harness.engine.centre`; μ ≡ 0 without one), the noise N(x1 + μ(x1), Σ(x1)) is
told apart from N(x0 + μ(x0), Σ0) through the shift Δ = δ + μ(x1) − μ(x0) and the two
scales. :class:`Candidates` keeps, per ball, the point where the class-A worst case is
least: exact where the scale is the recorded one (ANCER, Eiras et al. 2022, Thm 1:
Φ(Φ⁻¹(p_A_lower) − ‖Σ0^{-1/2}Δ‖₂)), else its normal approximation
(:func:`~harness.mathematics.worstcase.anisotropic.normal_worst_case`), which only ranks
points: :mod:`harness.audit.scale_justification` judges the point kept.

The scale search's projected ascent climbs the change of log σ_i with the σ-provider's
gradient. It has none to climb where the σ-provider answers without a graph (a σ computed
by a search; UCAN's generators, asked in no-grad mode as its code asks them), and the
centre's move is not what it climbs in any case. There :func:`descend` lowers the worst
case itself from the least point found, in lock-step over the balls, each step asking,
per ball,

- the point where the fixed-scale worst case of the last shift would be least were the
  centre held there: the exponent ‖Σ0^{-1/2}(δ + m)‖₂ with m = μ(x1) − μ(x0) held rises
  fastest along Σ0^{-1}Δ, and on the sphere ‖δ‖ = R the step δ ← R·Σ0^{-1}Δ/‖Σ0^{-1}Δ‖₂
  is a power iteration toward its largest value;
- ``pairs`` antithetic probes x1 ± h·u (u uniform on the sphere of radius h), a step h
  that halves after a step that found no lower point in the ball (the simplest form of
  Rechenberg's step-size rule);
- three points x1 − t·h·g/‖g‖₂, t in :data:`SLOPE_STEPS`, along the slope the probes estimate,
  g = Σ_u (v(x1 + h·u) − v(x1 − h·u))·u (Nesterov & Spokoiny 2017's two-point estimate,
  up to its scale);

all projected into the ball after float32 rounding
(:func:`~harness.audit.ball_rounding.inside_radius`). The least point over every step is
what S3 judges: a descent that finds nothing lower leaves the verdict of the searched
points as it was.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.special import ndtr, ndtri

from harness.audit.ball_rounding import inside_radius
from harness.audit.sigma_calls import sigma_in_calls
from harness.engine.centre import centre_change
from harness.mathematics.worstcase.anisotropic import normal_worst_case

SCALE_SLACK = 1e-6
"""Relative slack on a scale (or a centre) compared with the recorded one (float32)."""

PAIRS = 3
"""Antithetic probes per ball and step of :func:`descend`."""
SLOPE_STEPS = (0.5, 1.0, 2.0)
"""Where :func:`descend` asks along the estimated slope, in steps h."""
SETTLED = 0.25
"""A ball whose least value is below this is left alone by :func:`descend`: a point of it
is already far below 1/2 (where the scale varies, the computed worst case still judges
it)."""


class Candidates:
    """Per audited ball, among the points of the search: where the scale varies, the one
    whose normal approximation of the worst case is least, the point the computed worst
    case judges; where it does not, the least exact fixed-scale worst case
    Φ(Φ⁻¹(p_A_lower) − ‖Σ0^{-1/2}Δ‖₂) (ANCER Thm 1, tight for a fixed Σ). Around recorded
    centres ``centre0`` [B, d] (asked at the points by ``centre``), Δ is the shift of the
    noise's mean δ + μ(x1) − μ(x0), and ``moved`` the largest relative change of the centre
    seen in each ball. ``least``/``point``/``shift``: the least of either value seen per
    ball, where, and its Δ (the start of :func:`descend`)."""

    def __init__(
        self, x0: torch.Tensor, scale0: np.ndarray, p_lower: np.ndarray,
        centre0: np.ndarray | None = None, centre=None,
    ) -> None:  # fmt: skip
        self.flat = x0.flatten(1).double().cpu().numpy()
        self.scale0, self.p_lower = scale0, p_lower
        self.approx, self.fixed = np.full(len(scale0), np.inf), np.full(len(scale0), np.inf)
        self.delta, self.scale = np.zeros_like(scale0), scale0.copy()
        self.centre0, self.centre = centre0, centre
        self.moved = np.zeros(len(scale0))
        self.distance, self.fixed_distance = np.zeros(len(scale0)), np.zeros(len(scale0))
        self.least, self.point = np.full(len(scale0), np.inf), self.flat.copy()
        self.shift = np.zeros_like(scale0)
        self.kept: list[tuple[np.ndarray, ...]] = []

    def _present(self) -> tuple[np.ndarray, ...]:
        """Each ball's present candidate where the scale varies: (approximation, shift,
        scale, distance)."""
        return self.approx, self.delta, self.scale, self.distance

    def keep(self) -> None:
        """Keep each ball's present candidate where the scale varies, to be judged beside
        the later one (a lower normal approximation is not always a lower worst case)."""
        self.kept.append(tuple(v.copy() for v in self._present()))

    def candidates(self, ball: int) -> list[tuple[float, np.ndarray, np.ndarray, float]]:
        """The distinct points of ``ball`` to judge where the scale varies (approximation,
        shift, scale, distance): those kept and the present candidate."""
        found = []
        for approx, delta, scale, distance in [*self.kept, self._present()]:
            seen = any(np.array_equal(delta[ball], d) and np.array_equal(scale[ball], s)
                       for _, d, s, _ in found)  # fmt: skip
            if np.isfinite(approx[ball]) and not seen:
                found.append((float(approx[ball]), delta[ball], scale[ball], float(distance[ball])))
        return found

    def see(self, points: torch.Tensor, scales: torch.Tensor, balls: np.ndarray) -> np.ndarray:
        """Points [P, d] of the search, the scales [P, d] answered there, their balls [P];
        returns the value of each point (the exact worst case at a fixed scale, else its
        normal approximation)."""
        flat = points.detach().double().cpu().numpy()
        delta = flat - self.flat[balls]
        distance = np.linalg.norm(delta, axis=1)
        if self.centre0 is not None:
            mu0, mu1 = self.centre0[balls], self.centre(points.detach())
            shift, change = mu1 - mu0, centre_change(mu1, mu0)
            np.maximum.at(self.moved, balls, change)
            delta = delta + np.where((change > SCALE_SLACK)[:, None], shift, 0.0)
        s0, s1 = self.scale0[balls], scales.detach().double().cpu().numpy()
        moved = np.abs(np.log(s1) - np.log(s0)).max(axis=1) > np.log1p(SCALE_SLACK)
        approx = np.where(moved, normal_worst_case(delta, s0, s1, self.p_lower[balls]), np.inf)
        fixed = ndtr(ndtri(self.p_lower[balls]) - np.linalg.norm(delta / s0, axis=1))
        for row in _lowest(np.where(moved, np.inf, fixed), balls, self.fixed):
            self.fixed[balls[row]], self.fixed_distance[balls[row]] = fixed[row], distance[row]
        for row in _lowest(approx, balls, self.approx):
            ball = balls[row]
            self.approx[ball], self.delta[ball], self.scale[ball] = approx[row], delta[row], s1[row]
            self.distance[ball] = distance[row]
        value = np.where(moved, approx, fixed)
        for row in _lowest(value, balls, self.least):
            ball = balls[row]
            self.least[ball], self.point[ball], self.shift[ball] = value[row], flat[row], delta[row]
        return value


def _lowest(values: np.ndarray, balls: np.ndarray, best: np.ndarray) -> np.ndarray:
    """The rows of ``values`` [P] that are the lowest of their ball (``balls`` [P]; the
    first of equals) and below that ball's ``best`` so far."""
    order = np.argsort(values, kind="stable")
    _, first = np.unique(balls[order], return_index=True)
    rows = order[first]
    return rows[values[rows] < best[balls[rows]]]


def descend(
    scale, candidates: Candidates, radius: np.ndarray, steps: int, gen: torch.Generator,
    batch: int, like: torch.Tensor, pairs: int = PAIRS,
) -> tuple[int, np.ndarray, np.ndarray]:  # fmt: skip
    """Lower each ball's least worst case from ``candidates``' least point by ``steps``
    steps of the module's descent (``scale``: the σ-provider as a scale [B, d], asked
    without a graph in calls of ``batch`` points shaped and placed as the inputs ``like``),
    leaving alone the balls whose least value is already below :data:`SETTLED`; returns how
    many steps found a lower point in some ball, and the largest
    max_i |log σ_i(x1) − log s0_i| its points found in each ball, with its axis."""
    flat = torch.from_numpy(candidates.flat)
    count, dim = flat.shape
    reach = inside_radius(flat.float(), torch.from_numpy(radius).float()).double()
    step = reach / 4
    lowering, change, axis = 0, np.zeros(count), np.zeros(count, dtype=np.int64)

    def ask(deltas: torch.Tensor, live: np.ndarray) -> torch.Tensor:
        """The values at x0 + the ``deltas`` [k·L, d] of the ``live`` balls (k per ball,
        ball-major), projected into the balls."""
        owner = np.tile(live, len(deltas) // len(live))
        limit = reach[owner] / deltas.norm(dim=1).clamp_min(1e-300)
        points = flat[owner] + deltas * limit.clamp(max=1.0)[:, None]
        points = points.to(like.device, torch.float32)
        with torch.no_grad():
            scales = sigma_in_calls(scale, points.view(-1, *like.shape[1:]), batch)
        gap = np.abs(np.log(scales.double().cpu().numpy()) - np.log(candidates.scale0[owner]))
        for row in np.flatnonzero(gap.max(axis=1) > change[owner]):
            if gap[row].max() > change[owner[row]]:
                change[owner[row]], axis[owner[row]] = gap[row].max(), int(gap[row].argmax())
        value = candidates.see(points, scales, owner)
        return torch.from_numpy(np.nan_to_num(value, posinf=1.0)).view(-1, len(live))

    for _ in range(steps):
        live = np.flatnonzero(candidates.least >= SETTLED)
        if not len(live):
            break
        before = candidates.least.copy()
        start = torch.from_numpy(candidates.point[live] - candidates.flat[live])
        pull = torch.from_numpy(candidates.shift[live] / candidates.scale0[live] ** 2)
        h = step[live]
        toward = reach[live, None] * pull / pull.norm(dim=1, keepdim=True).clamp_min(1e-300)
        u = torch.randn((pairs, len(live), dim), generator=gen, dtype=torch.float64)
        u = u * (h[None, :, None] / u.norm(dim=2, keepdim=True))
        value = ask(torch.cat([toward[None], start + u, start - u]).view(-1, dim), live)
        slope = ((value[1 : 1 + pairs] - value[1 + pairs :])[:, :, None] * u).sum(dim=0)
        down = -slope / slope.norm(dim=1, keepdim=True).clamp_min(1e-300)
        ask(torch.cat([start + t * h[:, None] * down for t in SLOPE_STEPS]), live)
        lower = torch.from_numpy(candidates.least < before)
        lowering += bool(lower.any())
        step = torch.where(lower, step, step / 2)
    return lowering, change, axis
