"""S3's derivative-free descent of the worst case inside a certified ball at a diagonal
scale (harness/audit/worst_points.py), against the closed form of a linear centre.

At a fixed scale s0 (σ_0 the smallest) with the centre μ(x) = a·x_j·e_0, the noise's mean
moves by Δ = Mδ, M = I + a·e_0e_jᵀ, at x1 = x0 + δ, and the class-A worst case there is
Φ(Φ⁻¹(p) − ‖Mδ/s0‖₂) (ANCER Thm 1), least over ‖δ‖ <= R at R·‖diag(1/s0)·M‖₂ (the
largest singular value, numpy's SVD). At R = σ_0·Φ⁻¹(p) a constant centre leaves the
ball exactly covered; the random points and the ends of the smallest axis (the scale
search) see nothing below 1/2 there, the descent does.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import ndtr, ndtri

from harness.audit.scale_justification import scale_deviation
from harness.audit.worst_points import Candidates, descend

DIM, BALLS, P, J = 64, 6, 0.99, 5
RAMP = np.linspace(0.1, 0.4, DIM)
RADIUS = RAMP[0] * ndtri(P)


def _searched(a: float, steps: int):
    gen = torch.Generator().manual_seed(0)
    x0 = torch.rand(BALLS, DIM, generator=gen)

    def centre(x: torch.Tensor) -> np.ndarray:
        x = x.reshape(len(x), -1).double()
        out = torch.zeros_like(x)
        out[:, 0] = a * x[:, J]
        return out.numpy()

    def scale(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(RAMP).float().expand(len(x), DIM)

    scale0 = np.tile(RAMP, (BALLS, 1))
    found = Candidates(x0, scale0, np.full(BALLS, P), centre(x0), centre)
    radius = torch.full((BALLS,), RADIUS, dtype=torch.float32)
    scale_deviation(scale, x0, radius, torch.from_numpy(scale0), 10, gen, 4096, found.see)
    searched = found.least.copy()
    lowering, change, _ = descend(scale, found, np.full(BALLS, RADIUS), steps,
                                  torch.Generator().manual_seed(1), 4096, x0)  # fmt: skip
    return x0, found, searched, lowering, change


@pytest.mark.parametrize("a", [0.5, 2.0])
def test_the_descent_finds_a_moving_centre_the_search_misses(a):
    x0, found, searched, lowering, change = _searched(a, steps=20)
    assert searched.min() >= 0.5 - 1e-9  # the random points and the axis ends: covered
    assert lowering > 0 and (change < np.log1p(1e-6)).all()  # the scale (float32) never moved
    assert (found.least < 0.5 - 0.01).all()
    # the value kept is the closed form at the point kept, recomputed here
    delta = found.point - x0.double().numpy()
    assert (np.linalg.norm(delta, axis=1) <= RADIUS).all()
    shift = delta.copy()
    shift[:, 0] += a * delta[:, J]
    exact = ndtr(ndtri(P) - np.linalg.norm(shift / RAMP, axis=1))
    np.testing.assert_allclose(found.least, exact, rtol=1e-5)
    matrix = np.eye(DIM)
    matrix[0, J] += a
    optimum = ndtr(ndtri(P) - RADIUS * np.linalg.svd(matrix / RAMP[:, None], compute_uv=False)[0])
    assert (found.least >= optimum - 1e-9).all()


def test_the_descent_raises_no_alarm_where_the_centre_is_constant():
    """a = 0: ANCER's bound holds with equality at R, so nothing inside is below 1/2."""
    _, found, _, _, _ = _searched(0.0, steps=20)
    assert (found.least >= 0.5 - 1e-9).all()


def test_the_search_s_candidate_is_judged_beside_the_descent_s():
    """A lower normal approximation is not always a lower worst case: the candidate kept
    before the descent stays among those judged, once each."""
    x0 = torch.zeros(1, 3)
    found = Candidates(x0, np.ones((1, 3)), np.array([0.9]))
    varied = torch.tensor([[1.0, 1.0, 2.0]])
    found.see(torch.tensor([[0.1, 0.0, 0.0]]), varied, np.array([0]))
    found.keep()
    found.see(torch.tensor([[1.0, 0.0, 0.0]]), varied, np.array([0]))
    found.keep()  # the same candidate again: judged once
    listed = found.candidates(0)
    assert [np.round(c[1], 6).tolist() for c in listed] == [[0.1, 0, 0], [1, 0, 0]]
    assert listed[1][0] < listed[0][0]  # the later one ranks lower


def test_lowest_is_each_balls_first_least_value_below_its_best():
    """``_lowest`` against a plain loop over the rows: per ball the first of its least
    values, kept only where it is below that ball's best so far."""
    from harness.audit.worst_points import _lowest

    rng = np.random.default_rng(0)
    values = rng.integers(0, 6, 200).astype(float)
    values[rng.random(200) < 0.1] = np.inf
    balls = rng.integers(0, 12, 200)
    best = rng.integers(0, 8, 12).astype(float)
    expected = {}
    for row, (value, ball) in enumerate(zip(values, balls, strict=True)):
        if value < best[ball] and (ball not in expected or value < values[expected[ball]]):
            expected[ball] = row
    assert sorted(_lowest(values, balls, best)) == sorted(expected.values())
