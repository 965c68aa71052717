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

The series needs about ½ Σ_i (s_i²/β − 1) terms: a scale whose axes lie orders of
magnitude apart (ratio 30 over 784 axes already needs 10⁵) is out of its reach. There
Q = Σ m_i² + Σ_i s_i² v_i² + 2 m_i s_i v_i, v ~ N(0, I), is a quadratic form whose
distribution function is inverted from its characteristic function with an error bound
(Gil-Pelaez; :class:`~harness.mathematics.worstcase.anisotropic.GeneralizedChi2`, the
inversion S3's worst case rests on): bounds that fail only if QUADPACK's error
estimate, inflated tenfold, does.
"""

from __future__ import annotations

import numpy as np
from scipy.special import gammainc
from scipy.stats import chi2

from harness.mathematics.worstcase.anisotropic import GeneralizedChi2

TOLERANCE = 1e-12
"""Mass not yet summed at which the series stops."""
ROUNDING = 1e-12
"""Widening of both bounds for float64 rounding of the sums."""
MAX_TERMS = 40_000
"""Terms summed at most (a point whose series needs more is bounded by the inversion)."""
EXACT_WIDTH = 1e-9
"""Widest interval :func:`ball_probability` answers by its midpoint (the probability to
within 5e-10: far inside what n <= 10^7 Monte Carlo samples can tell, 1.6e-4 at p = 1/2)."""


class UndecidedMass(ValueError):
    """A ball's mass whose bounds stay wider than :data:`EXACT_WIDTH` by both methods."""


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
    series = rest & _within_reach(m2, s2)
    if np.any(series):
        weights, beta, left = _mixture(m2[series], s2[series])
        lower[series] = _mixture_cdf(weights, beta, dims, radius)
        upper[series] = lower[series] + left
    offset = np.atleast_2d(np.asarray(offset, dtype=np.float64))
    scale = np.atleast_2d(np.asarray(scale, dtype=np.float64))
    for k in np.nonzero(rest & (upper - lower > TOLERANCE))[0]:  # out of the series' reach
        cdf = _inverted(offset[k], scale[k], (radius, radius))
        lower[k], upper[k] = cdf(radius)
    return np.maximum(lower - ROUNDING, 0.0), np.minimum(upper + ROUNDING, 1.0)


def _inverted(offset: np.ndarray, scale: np.ndarray, radii: tuple[float, float]):
    """r -> bounds (lower, upper) on P(Q < r²) of one point (``offset``, ``scale`` [d]) for
    r in [radii[0], radii[1]], by inverting Q's characteristic function (the module's
    docstring): Q = C + Σ A_i v_i² + B_i v_i, A = s², B = 2ms, C = Σ m², whose mean is
    C + Σ A and variance Σ 2A² + B²."""
    a, b, c = scale**2, 2.0 * offset * scale, float(np.sum(offset**2))
    mean, sd = c + float(np.sum(a)), float(np.sqrt(np.sum(2.0 * a * a + b * b)))
    reach = max(abs(r * r - mean) / sd for r in radii) + 1.0
    law = GeneralizedChi2((a, b, c), reach)

    def cdf(r: float) -> tuple[float, float]:
        p, error = law.cdf((r * r - law.mean) / law.sd)
        return max(p - error, 0.0), min(p + error, 1.0)

    return cdf


def _within_reach(m2: np.ndarray, s2: np.ndarray) -> np.ndarray:
    """Whether each point's series ends within MAX_TERMS: its mean index Ψ'(1) =
    ½ Σ_i (γ_i + μ_i²)/(1 − γ_i) below MAX_TERMS/2 (else the inversion bounds it)."""
    ratio = s2 / s2.min(axis=1, keepdims=True)  # 1/(1 − γ_i)
    return 0.5 * ((ratio - 1) + m2 / s2 * ratio).sum(axis=1) < MAX_TERMS / 2


def _mixture(m2: np.ndarray, s2: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ruben's weights c_k [P, K] of P points (the module's docstring), summed together
    until each has TOLERANCE mass left (or MAX_TERMS), with β [P] and the mass not summed
    [P]: the weights do not depend on the radius, so one series serves every radius."""
    mu2 = m2 / s2
    beta = s2.min(axis=1, keepdims=True)
    gamma = 1.0 - beta / s2
    # c_k = exp(log_scale)·c: the recursion is linear, so c (with S and T) is renormalized
    # whenever the sum grows large, and a c_0 far below float64's range does not vanish
    log_scale = 0.5 * np.log(beta / s2).sum(axis=1) - 0.5 * mu2.sum(axis=1)
    c = np.ones(len(s2))
    S, T = np.zeros_like(s2), np.zeros_like(s2)
    total, terms, k = c.copy(), [c * np.exp(log_scale)], 0
    while np.any(1.0 - total * np.exp(log_scale) > TOLERANCE) and k + 1 < MAX_TERMS:
        S = gamma * S + c[:, None]
        T = gamma * T + S
        c = (0.5 * (gamma * S).sum(axis=1) + 0.5 * (mu2 * (1 - gamma) * T).sum(axis=1)) / (k + 1)
        k += 1
        total += c
        terms.append(c * np.exp(log_scale))
        big = total > 1e100
        if np.any(big):
            norm = total[big]
            c[big], S[big], T[big] = c[big] / norm, S[big] / norm[:, None], T[big] / norm[:, None]
            log_scale[big] += np.log(norm)
            total[big] = 1.0
    left = np.maximum(1.0 - total * np.exp(log_scale), 0.0)
    return np.stack(terms, axis=1), beta[:, 0], left


def _series_bounds(offset: np.ndarray, scale: np.ndarray):
    """r -> bounds (lower, upper) on the mass of one point by Ruben's series, its weights
    summed once; None where the series is out of reach or does not reach TOLERANCE."""
    m2, s2 = offset[None] ** 2, scale[None] ** 2
    if not _within_reach(m2, s2)[0]:
        return None
    weights, beta, left = _mixture(m2, s2)
    if left[0] > TOLERANCE:
        return None

    def bounds(r: float) -> tuple[float, float]:
        low = float(_mixture_cdf(weights, beta, len(scale), r)[0])
        return low, low + float(left[0])

    return bounds


def _mixture_cdf(weights: np.ndarray, beta: np.ndarray, dims: int, radius: float) -> np.ndarray:
    """Σ_k c_k F_{χ²(d + 2k)}(radius²/β) [P]: the mass of the summed terms (a lower bound)."""
    orders = dims / 2 + np.arange(weights.shape[1])
    return np.sum(weights * gammainc(orders[None], (radius**2 / beta / 2)[:, None]), axis=1)


def ball_probability(offset: np.ndarray, scale: np.ndarray, radius: float) -> np.ndarray:
    """P(‖offset_p + scale_p∘ε‖₂ < radius) [P] to within :data:`EXACT_WIDTH`: the midpoint
    of :func:`ball_mass`'s bounds; :class:`UndecidedMass` where they are wider."""
    lower, upper = ball_mass(offset, scale, radius)
    wide = np.nonzero(upper - lower > EXACT_WIDTH)[0]
    if len(wide):
        k = int(wide[0])
        raise _undecided(np.asarray(scale)[k], lower[k], upper[k])
    return (lower + upper) / 2


def _undecided(scale: np.ndarray, lower: float, upper: float) -> UndecidedMass:
    """The error of a mass bounded only to [lower, upper] at ``scale`` [d]."""
    low, high = float(np.min(scale)), float(np.max(scale))
    return UndecidedMass(
        f"the ball's mass under a diagonal scale (axes from {low:.3g} to {high:.3g}, ratio "
        f"{high / low:.3g}) is bounded only to [{lower:.6g}, {upper:.6g}]"
    )


def radius_for_probability(offset: np.ndarray, scale: np.ndarray, q: float) -> float:
    """The radius r with P(‖offset + scale∘ε‖₂ < r) = q (one point: ``offset``, ``scale``
    [d]), by Brent's method on the midpoint of the mass's bounds (Ruben's weights summed
    once, or the inversion built once where the series cannot reach), increasing in r:
    bracketed by 0 and ‖offset‖ + max_i s_i·√(χ²_d's 1 − 10⁻¹⁴ quantile), where the mass
    exceeds q; :class:`UndecidedMass` where the bounds are wider than
    :data:`EXACT_WIDTH`."""
    from scipy.optimize import brentq

    if not 0.0 < q < 1.0:
        raise ValueError(f"a ball's mass q = {q} must lie in (0, 1)")
    offset = np.asarray(offset, dtype=np.float64).reshape(-1)
    scale = np.asarray(scale, dtype=np.float64).reshape(-1)
    top = float(np.linalg.norm(offset)) + float(scale.max()) * np.sqrt(chi2.isf(1e-14, len(scale)))
    bounds = _series_bounds(offset, scale) or _inverted(offset, scale, (0.0, top))
    radius = float(brentq(lambda r: sum(bounds(r)) / 2 - q, 0.0, top, xtol=1e-13,
                          rtol=4 * np.finfo(float).eps))  # fmt: skip
    low, high = bounds(radius)
    if high - low > EXACT_WIDTH:
        raise _undecided(scale, low, high)
    return radius
