"""S4 (a) at a diagonal scale: pairs of claimed ellipsoids with different predictions that
intersect.

A certificate drawn at a diagonal scale may claim the ellipsoid E = {x : ‖(x − c)/a‖₂ < 1}
with semi-axes a = κ·σ_i of its recorded scale (Eiras et al., ANCER, TMLR 2022, Thm 1);
one that claims none claims its ℓ2 ball, the ellipsoid with every semi-axis its radius.
A point in two such regions of different predictions would have to be classified as both,
so at least one of the two certificates is false, as for two balls
(:mod:`harness.audit.ball_intersections`).

Whether two axis-aligned ellipsoids meet is a convex problem, decided here through its
dual: with q_k(x) = ‖(x − c_k)/a_k‖₂²,

    min_x max(q_1, q_2) = max_{λ∈[0,1]} f(λ),
    f(λ) = min_x (1 − λ) q_1(x) + λ q_2(x) = Σ_i d_i² λ(1 − λ) / (λ a_1i² + (1 − λ) a_2i²),

d = c_1 − c_2, the minimum reached at x_i(λ) = ((1 − λ) c_1i/a_1i² + λ c_2i/a_2i²) /
((1 − λ)/a_1i² + λ/a_2i²) (the separating-ellipsoids test of Gilitschenski & Hanebeck
2012, for diagonal shapes). f is concave (a minimum of functions affine in λ), so a
golden-section search finds its maximum; for two balls it is ‖d‖²/(R_1 + R_2)², the ball
test's. A pair is counted only through a witness: the point x(λ) at the λ found, which must
lie strictly inside both ellipsoids when evaluated directly, so rounding in the search can
miss a pair but never count one that does not meet.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.spatial.distance import cdist

GOLDEN_STEPS = 80
"""Golden-section steps on λ ∈ [0, 1] (the bracket shrinks by 0.618 each: below 1e-16)."""
MARGIN = 1e-9
"""A witness counts when max(q_1, q_2) < 1 − MARGIN: strictly inside both open ellipsoids."""


def dual_value(lam: np.ndarray, d2: np.ndarray, a1: np.ndarray, a2: np.ndarray) -> np.ndarray:
    """f(λ) per pair: ``lam`` [P], ``d2`` the squared centre differences [P, d], ``a1``,
    ``a2`` the squared semi-axes [P, d]."""
    lam = lam[:, None]
    return (d2 * lam * (1 - lam) / (lam * a1 + (1 - lam) * a2)).sum(axis=1)


def witness(lam: np.ndarray, c1: np.ndarray, c2: np.ndarray, a1: np.ndarray,
            a2: np.ndarray) -> np.ndarray:  # fmt: skip
    """x(λ) per pair [P, d]: the minimizer of (1 − λ) q_1 + λ q_2 (``a1``, ``a2`` squared)."""
    w1, w2 = (1 - lam)[:, None] / a1, lam[:, None] / a2
    return (w1 * c1 + w2 * c2) / (w1 + w2)


def best_lambda(d2: np.ndarray, a1: np.ndarray, a2: np.ndarray) -> np.ndarray:
    """The λ ∈ [0, 1] maximizing the concave f per pair, by golden-section search."""
    ratio = (math.sqrt(5) - 1) / 2
    lo, hi = np.zeros(len(d2)), np.ones(len(d2))
    for _ in range(GOLDEN_STEPS):
        left, right = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        rising = dual_value(left, d2, a1, a2) < dual_value(right, d2, a1, a2)
        lo, hi = np.where(rising, left, lo), np.where(rising, hi, right)
    return (lo + hi) / 2


def meeting_ellipsoids(
    centres: np.ndarray, axes: np.ndarray, predictions: np.ndarray
) -> list[tuple[int, int, float]]:
    """Pairs (i, j), i < j, of different predictions whose open ellipsoids (``centres``
    [B, d], semi-axes ``axes`` [B, d] > 0) share a witness point, with max(q_1, q_2) there,
    deepest first."""
    centres, axes = np.asarray(centres, np.float64), np.asarray(axes, np.float64)
    reach = axes.max(axis=1)
    gaps = cdist(centres, centres)
    near = (gaps < reach[:, None] + reach[None, :]) & (predictions[:, None] != predictions[None, :])
    i, j = np.nonzero(np.triu(near, k=1))
    found: list[tuple[int, int, float]] = []
    for lo in range(0, len(i), 1024):  # [P, d] arrays a chunk at a time
        a, b = i[lo : lo + 1024], j[lo : lo + 1024]
        c1, c2, a1, a2 = centres[a], centres[b], axes[a] ** 2, axes[b] ** 2
        lam = best_lambda((c1 - c2) ** 2, a1, a2)
        x = witness(lam, c1, c2, a1, a2)
        depth = np.maximum(((x - c1) ** 2 / a1).sum(axis=1), ((x - c2) ** 2 / a2).sum(axis=1))
        inside = depth < 1 - MARGIN
        found += [(int(p), int(q), float(v)) for p, q, v in zip(a[inside], b[inside],
                                                               depth[inside], strict=True)]  # fmt: skip
    return sorted(found, key=lambda pair: pair[2])
