"""P(‖m + s∘ε‖₂ < r), ε ~ N(0, I): a ball's mass under anisotropic Gaussian noise, bounded.

The exact smoothed classifier of the analytic ball model at a diagonal scale
(:mod:`harness.engine.scale`): the sample x + s∘ε falls in B(c, r) iff
Q = Σ_i s_i² (ε_i + m_i/s_i)² < r², m = x − c, a positive combination of noncentral χ²₁
variables. Ruben (1962, "Probability content of regions under spherical normal
distributions, IV", Ann. Math. Statist. 33) writes its law as a mixture of central
χ² laws: with β <= min_i s_i², γ_i = 1 − β/s_i² ∈ [0, 1) and μ_i = m_i/s_i,

    P(Q < q) = Σ_k c_k F_{χ²(d + 2k)}(q/β),   c_k >= 0,   Σ_k c_k = 1,

where Σ_k c_k z^k = Π_i (β/s_i²)^{1/2} (1 − γ_i z)^{-1/2} exp(½ μ_i² (z − 1)/(1 − γ_i z)),
so (k + 1)c_{k+1} = Σ_{r<=k} a_{k−r} c_r with
a_k = ½ Σ_i γ_i^{k+1} + ½ Σ_i μ_i²(1 − γ_i)(k + 1)γ_i^k. Every term is non-negative and
each F <= 1, so the sum of the first K terms is a lower bound and adding the mass
1 − Σ_{k<K} c_k not yet summed gives an upper bound: an interval that holds exactly (up
to float64 rounding), never an approximation taken as exact. At one σ (s_i all equal)
γ = 0 and the mixture is the noncentral χ² law. The terms are kept in a scale of their
own, so that a c_0 far below float64's range does not vanish.
"""

from __future__ import annotations

import numpy as np
from scipy.special import gammainc
from scipy.stats import chi2

TOLERANCE = 1e-12
"""Mass not yet summed at which the series stops."""
ROUNDING = 1e-12
"""Widening of both bounds for float64 rounding of the sums."""
MAX_TERMS = 40_000
"""Terms summed at most (a point whose series needs more is left undecided: [0, 1])."""


def ball_mass(
    offset: np.ndarray, scale: np.ndarray, radius: float
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Bounds (lower, upper) [P] on P(‖offset_p + scale_p∘ε‖₂ < radius), ε ~ N(0, I), for
    each of P points (``offset`` = x − c and ``scale`` [P, d], every axis > 0), the
    series of the points summed together until each has TOLERANCE mass left.

    A point whose distance to the sphere exceeds what σ_max·‖ε‖ reaches but with
    probability TOLERANCE (χ²_d's tail) is bounded by that tail alone. Otherwise the
    convolution Σ_r a_{k−r} c_r is carried in O(d) per term: with S_i(k) = Σ_r γ_i^{k−r} c_r
    = γ_i S_i(k−1) + c_k and T_i(k) = Σ_r (k − r + 1)γ_i^{k−r} c_r = γ_i T_i(k−1) + S_i(k),
    it is ½ Σ_i γ_i S_i(k) + ½ Σ_i μ_i²(1 − γ_i) T_i(k)."""
    s2 = np.atleast_2d(np.asarray(scale, dtype=np.float64)) ** 2
    m2 = np.atleast_2d(np.asarray(offset, dtype=np.float64)) ** 2
    dims = s2.shape[1]
    lower, upper = np.zeros(len(s2)), np.ones(len(s2))
    # far outside or deep inside: the tail of σ_max·‖ε‖ decides alone
    gap = np.sqrt(m2.sum(axis=1)) - radius
    tail = chi2.sf(gap**2 / s2.max(axis=1), dims)
    outside, inside = (gap > 0) & (tail < TOLERANCE), (gap < 0) & (tail < TOLERANCE)
    upper[outside], lower[inside] = tail[outside], 1 - tail[inside]
    rest = ~(outside | inside)
    # the mixture's mean index, Ψ'(1) = ½ Σ_i (γ_i + μ_i²)/(1 − γ_i): a point whose series
    # would need more terms than MAX_TERMS allows stays undecided, [0, 1], at no cost
    ratio = s2 / s2.min(axis=1, keepdims=True)  # 1/(1 − γ_i)
    mean_terms = 0.5 * ((ratio - 1) + m2 / s2 * ratio).sum(axis=1)
    rest &= mean_terms < MAX_TERMS / 2
    if np.any(rest):
        lower[rest], upper[rest] = _series(m2[rest], s2[rest], radius)
    return np.maximum(lower - ROUNDING, 0.0), np.minimum(upper + ROUNDING, 1.0)


def _series(m2: np.ndarray, s2: np.ndarray, radius: float) -> tuple[np.ndarray, np.ndarray]:
    """Ruben's series (the module's docstring) for P points: (lower, upper) before rounding."""
    mu2 = m2 / s2
    dims = s2.shape[1]
    beta = s2.min(axis=1, keepdims=True)
    gamma = 1.0 - beta / s2
    x = radius**2 / beta[:, 0] / 2
    # c_k = exp(log_scale)·c: the recursion is linear, so c (with S and T) is renormalized
    # whenever the sum grows large, and a c_0 far below float64's range does not vanish
    log_scale = 0.5 * np.log(beta / s2).sum(axis=1) - 0.5 * mu2.sum(axis=1)
    c = np.ones(len(s2))
    S, T = np.zeros_like(s2), np.zeros_like(s2)
    total, lower = c.copy(), c * gammainc(dims / 2, x)
    k = 0
    while np.any(1.0 - total * np.exp(log_scale) > TOLERANCE) and k + 1 < MAX_TERMS:
        S = gamma * S + c[:, None]
        T = gamma * T + S
        c = (0.5 * (gamma * S).sum(axis=1) + 0.5 * (mu2 * (1 - gamma) * T).sum(axis=1)) / (k + 1)
        k += 1
        total += c
        lower += c * gammainc(dims / 2 + k, x)
        big = total > 1e100
        if np.any(big):
            norm = total[big]
            c[big], S[big], T[big], lower[big] = (c[big] / norm, S[big] / norm[:, None],
                                                  T[big] / norm[:, None], lower[big] / norm)  # fmt: skip
            log_scale[big] += np.log(norm)
            total[big] = 1.0
    weight = np.exp(log_scale)
    lower, left = lower * weight, np.maximum(1.0 - total * weight, 0.0)
    return lower, lower + left
