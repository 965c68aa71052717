"""The worst-case probabilities ξ of Súkeník et al. (2022), Thm 2.3, through ``G(τ, h)``.

Reference: M. Súkeník, A. Kuvshinov, S. Günnemann, "Intriguing Properties of
Input-Dependent Randomized Smoothing", ICML 2022 (arXiv:2110.05365).  ``G(τ, h)`` is
the probability of the ball ``B(m e1, m + h)``, ``τ = 1/(1 + m)``, under ``N(0, I_N)``
(:mod:`harness.mathematics.worstcase.ballmass`); ``s = σ1/σ0`` and ``α = a/σ0``.

With ``ε = 1 − s²`` (computed as ``(σ0 − σ1)(σ0 + σ1)/σ0²`` without
cancellation):

* ``ξ>`` (``s < 1``): ``B`` is the ball of centre ``α/ε`` (``τ0 = ε/(ε + α)``).
  Solve ``G(τ0, h0) = p_B`` for ``h0``; in ``P1`` coordinates the same ball has
  ``τ1 = ε/(ε + α s)`` and ``h1 = (h0 + α)/s``, and ``ξ> = G(τ1, h1)``.
* ``ξ<`` (``s > 1``): ``A = B^c`` is the ball of centre ``−α/|ε|``
  (``τ0 = |ε|/(|ε| + α)``).  Solve ``1 − G(τ0, h0) = p_B``; then
  ``τ1 = |ε|/(|ε| + α s)``, ``h1 = (h0 − α)/s`` and ``ξ< = 1 − G(τ1, h1)``.

As ``ε → 0`` both reduce continuously to Cohen's half-space,
``ξ → Φ(α + Φ⁻¹(p_B)) = Φ(a/σ0 − Φ⁻¹(1 − p_B))``; at ``σ1 == σ0`` exactly that
closed form is returned.  The quantile step is a safeguarded Newton iteration on
``log G`` (resp. ``log(1 − G)``); ``G`` is log-concave in ``h`` by the
Prékopa-Leindler inequality (the balls ``B(m e1, m + h)`` are Minkowski-affine
in ``h``), so Newton converges monotonically for ``ξ>``; a bracket with
bisection fallback protects the general case.  ``G`` is relatively accurate to
~1e-8 down to ``G = 1e-12`` (limited by the 1e-20 window), and ``ξ`` is
absolutely accurate to ~1e-11 (measured against a 40-digit mpmath evaluation of
Thm 2.3 and against a 300-node version of this quadrature).

The curse-of-dimensionality thresholds (Thm 2.4, Cor. 2.5, Fig. 3) bound the ratio
σ1/σ0 beyond which ξ reaches 1/2 at any distance.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import special as sc

from harness.mathematics.worstcase.arguments import (
    FloatOrArray,
    as_result,
    check_dim,
    check_nonneg,
    check_positive,
    check_prob,
)
from harness.mathematics.worstcase.ballmass import ball_mass, solve_ball_offset


def xi_arrays(
    alpha: NDArray[np.float64],
    s: NDArray[np.float64],
    eps: NDArray[np.float64],
    p_b: NDArray[np.float64],
    dim: int,
    greater: bool,
    h_start: NDArray[np.float64] | None = None,
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_]]:
    """xi for one dimension; ``eps = |1 - s^2| > 0`` (computed by the caller).

    Returns (xi, h0, converged).  Requires 0 < p_b < 1.
    """
    tau0 = eps / (eps + alpha)
    tau1 = eps / (eps + alpha * s)
    # Solve P0(B) = p_b on the side whose target is <= 1/2 (accurate log-space Newton).
    # For xi> B is the ball (side "in"); for xi< B is the complement (side "out").
    flip = p_b > 0.5
    target = np.where(flip, 1.0 - p_b, p_b)
    outer_side = flip if greater else ~flip
    z_ball = sc.ndtri(p_b) if greater else -sc.ndtri(p_b)  # Phi^-1(P0(ball))
    h0 = np.empty_like(alpha)
    conv = np.empty(alpha.shape, dtype=bool)
    for side in (False, True):
        sel = outer_side == side
        if not np.any(sel):
            continue
        hs = None if h_start is None else h_start[sel]
        h0[sel], conv[sel] = solve_ball_offset(
            tau0[sel], np.log(target[sel]), z_ball[sel], dim, side, hs
        )
    if greater:
        h1 = (h0 + alpha) / s
        val, _ = ball_mass(tau1, h1, dim, outer=False, deriv=False)
    else:
        h1 = (h0 - alpha) / s
        val, _ = ball_mass(tau1, h1, dim, outer=True, deriv=False)
    return np.clip(val, 0.0, 1.0), h0, conv


def _xi_public(
    a: ArrayLike,
    sigma0: ArrayLike,
    sigma1: ArrayLike,
    p_a: ArrayLike,
    dim: ArrayLike,
    p_b: ArrayLike | None,
    greater: bool,
) -> FloatOrArray:
    a_arr = check_nonneg("a", a)
    s0 = check_positive("sigma0", sigma0)
    s1 = check_positive("sigma1", sigma1)
    pa = check_prob("p_a", p_a)
    d = check_dim(dim)
    pb_given = p_b is not None
    pb = check_prob("p_b", p_b) if pb_given else None
    arrays = [a_arr, s0, s1, pa, d] + ([pb] if pb_given else [])
    scalar = all(np.ndim(x) == 0 for x in arrays)
    bc = np.broadcast_arrays(*arrays)
    shape = bc[0].shape
    a_f, s0_f, s1_f, pa_f = (np.ascontiguousarray(x, dtype=np.float64).ravel() for x in bc[:4])
    d_f = np.ascontiguousarray(bc[4]).ravel()
    if greater and np.any(s1_f > s0_f):
        raise ValueError("xi_greater requires sigma1 <= sigma0 (use xi_less for sigma1 > sigma0)")
    if not greater and np.any(s1_f < s0_f):
        raise ValueError("xi_less requires sigma1 >= sigma0 (use xi_greater for sigma1 < sigma0)")
    pb_f = np.ascontiguousarray(bc[5], dtype=np.float64).ravel() if pb_given else 1.0 - pa_f

    alpha = a_f / s0_f
    s = s1_f / s0_f
    # |1 - s^2| without cancellation: sigma0 - sigma1 is exact for sigma1 in [sigma0/2, 2 sigma0]
    eps = np.abs((s0_f - s1_f) * (s0_f + s1_f)) / (s0_f * s0_f)
    res = np.empty_like(alpha)

    # sigma1 == sigma0: Cohen's half-space, Phi(a/sigma0 - Phi^-1(1 - p_b))
    half = eps == 0.0
    if np.any(half):
        if pb_given:
            res[half] = sc.ndtr(alpha[half] + sc.ndtri(pb_f[half]))
        else:
            res[half] = sc.ndtr(alpha[half] - sc.ndtri(pa_f[half]))
    trivial = ~half & ((pb_f <= 0.0) | (pb_f >= 1.0))
    res[trivial] = np.where(pb_f[trivial] <= 0.0, 0.0, 1.0)
    rest = ~half & ~trivial
    for nd in np.unique(d_f[rest]):
        sel = rest & (d_f == nd)
        val, _, conv = xi_arrays(alpha[sel], s[sel], eps[sel], pb_f[sel], int(nd), greater)
        res[sel] = np.where(conv, val, np.nan)  # never silently wrong
    return as_result(res.reshape(shape), scalar)


def xi_greater(
    a: ArrayLike,
    sigma0: ArrayLike,
    sigma1: ArrayLike,
    p_a: ArrayLike,
    dim: ArrayLike,
    p_b: ArrayLike | None = None,
) -> FloatOrArray:
    """Worst-case class-B probability ``ξ>(a) = P1(B)`` at ``x1`` for ``σ1 ≤ σ0`` (Thm 2.3).

    ``B`` is the ball of Thm 2.2 (centre ``x0 + σ0²/(σ0² − σ1²) δ``) with
    ``P0(B) = p_b`` (default ``p_b = 1 − p_a``), i.e.

        ξ>(a) = χ²_N(σ1² a²/(σ0² − σ1²)², σ0²/σ1² · χ²_{N,qf}(σ0² a²/(σ0² − σ1²)², p_b)).

    ``x1`` at distance ``a`` is certified w.r.t. ``x0`` iff ``ξ> < 1/2`` (with a
    separate ``p_b``, App. B.5: iff ``ξ>(p_b) + ξ>(1 − p_a) < 1``).  At
    ``σ1 == σ0`` the half-space limit ``Φ(a/σ0 − Φ⁻¹(p_a))`` (resp.
    ``Φ(a/σ0 + Φ⁻¹(p_b))``) is returned.  Evaluated by the curvature-parametrized
    quadrature of the module docstring; continuous through ``σ1 → σ0``.
    Vectorized: all arguments broadcast; ``dim`` is an integer ``N ≥ 1``.
    """
    return _xi_public(a, sigma0, sigma1, p_a, dim, p_b, greater=True)


def xi_less(
    a: ArrayLike,
    sigma0: ArrayLike,
    sigma1: ArrayLike,
    p_a: ArrayLike,
    dim: ArrayLike,
    p_b: ArrayLike | None = None,
) -> FloatOrArray:
    """Worst-case class-B probability ``ξ<(a) = P1(B)`` at ``x1`` for ``σ1 ≥ σ0`` (Thm 2.3).

    ``B`` is the complement of the ball of Thm 2.2 (centre
    ``x0 − σ0²/(σ1² − σ0²) δ``) with ``P0(B) = p_b`` (default ``1 − p_a``):

        ξ<(a) = 1 − χ²_N(σ1² a²/(σ1² − σ0²)², σ0²/σ1² · χ²_{N,qf}(σ0² a²/(σ1² − σ0²)², 1 − p_b)).

    Certification rule and ``σ1 == σ0`` limit as in :func:`xi_greater`.
    """
    return _xi_public(a, sigma0, sigma1, p_a, dim, p_b, greater=False)


def xi(
    a: ArrayLike,
    sigma0: ArrayLike,
    sigma1: ArrayLike,
    p_a: ArrayLike,
    dim: ArrayLike,
    p_b: ArrayLike | None = None,
) -> FloatOrArray:
    """``ξ>`` where ``σ1 ≤ σ0`` and ``ξ<`` where ``σ1 > σ0`` (Thm 2.3), element-wise."""
    s0, s1 = np.broadcast_arrays(check_positive("sigma0", sigma0), check_positive("sigma1", sigma1))
    args = np.broadcast_arrays(check_nonneg("a", a), s0, s1, check_prob("p_a", p_a), check_dim(dim))
    scalar = all(np.ndim(x) == 0 for x in (a, sigma0, sigma1, p_a, dim)) and (
        p_b is None or np.ndim(p_b) == 0
    )
    pb = None if p_b is None else np.broadcast_to(check_prob("p_b", p_b), args[0].shape)
    if pb is not None:
        args = np.broadcast_arrays(*args, pb)
        pb = args[5]
    out = np.empty(args[0].shape)
    le = args[2] <= args[1]
    for mask, greater in ((le, True), (~le, False)):
        if np.any(mask):
            out[mask] = _xi_public(
                args[0][mask],
                args[1][mask],
                args[2][mask],
                args[3][mask],
                args[4][mask],
                None if pb is None else pb[mask],
                greater,
            )
    return as_result(out, scalar)


# --------------------------------------------------------------------------
# curse-of-dimensionality thresholds (Thm 2.4, Cor 2.5, Fig. 3)
# --------------------------------------------------------------------------
def _chernoff_rhs(
    p_a: ArrayLike, dim: ArrayLike, p_b: ArrayLike | None
) -> tuple[NDArray[np.float64], NDArray[np.int64], bool]:
    """c = -2 log(p_B)/N with p_B = 1 - p_a by default: Thm 2.4 reads log z + 1 - z < -c."""
    pa = check_prob("p_a", p_a)
    d = check_dim(dim)
    scalar = np.ndim(pa) == 0 and np.ndim(d) == 0 and (p_b is None or np.ndim(p_b) == 0)
    with np.errstate(divide="ignore"):
        log_pb = np.log1p(-pa) if p_b is None else np.log(check_prob("p_b", p_b))
    log_pb, d_b = np.broadcast_arrays(log_pb, d)
    return -2.0 * log_pb / d_b, d_b, scalar


def _solve_expm1_minus(c: NDArray[np.float64], negative: bool) -> NDArray[np.float64]:
    """Root t of e^t - 1 - t = c (c > 0), t < 0 if ``negative`` else t > 0.

    Brackets: for t < 0, -1 - c <= t <= -sqrt(2c); for t > 0, 0 < t <= sqrt(2c).
    Each root is found by Brent's method on the bracket.
    """
    from scipy.optimize import brentq

    flat = c.ravel()
    res = np.empty_like(flat)
    for i, ci in enumerate(flat):
        if ci == 0.0:
            res[i] = 0.0
        elif not np.isfinite(ci):
            res[i] = -np.inf if negative else np.inf
        else:
            f = lambda t, ci=ci: np.expm1(t) - t - ci  # noqa: E731
            r2 = math.sqrt(2.0 * ci)
            a, b = (-1.0 - ci, -r2) if negative else (0.0, r2)
            if f(b) == 0.0:
                res[i] = b
            else:
                res[i] = brentq(f, a, b, xtol=1e-300, rtol=1e-15, maxiter=500)
    return res.reshape(c.shape)


def min_sigma_ratio(p_a: ArrayLike, dim: ArrayLike, p_b: ArrayLike | None = None) -> FloatOrArray:
    """Theoretical lower threshold for σ1/σ0 (Thm 2.4 part 1, Table 1).

    The largest ratio ``ρ < 1`` with ``log ρ² + 1 − ρ² = 2 log(1 − p_a)/N``; for
    ``σ1/σ0`` below it, ``x1`` is not certified w.r.t. ``x0`` at any distance
    (``ξ>(0) > 1/2``).  Solved as ``e^t − 1 − t = −2 log(1 − p_a)/N`` for
    ``t = log ρ² < 0`` with Brent's method.  With ``p_b`` (App. B.5),
    ``1 − p_a`` is replaced by ``p_b``.
    """
    c, _, scalar = _chernoff_rhs(p_a, dim, p_b)
    t = _solve_expm1_minus(np.asarray(c, dtype=np.float64), negative=True)
    return as_result(np.exp(0.5 * t), scalar)


def max_sigma_ratio(p_a: ArrayLike, dim: ArrayLike, p_b: ArrayLike | None = None) -> FloatOrArray:
    """Theoretical upper threshold for σ1/σ0 (Thm 2.4 part 2).

    With ``z = (σ1/σ0)² (N − 1)/N``, the theorem's condition is
    ``log z + 1 − z < 2 log(1 − p_a)/N``; its Chernoff step needs ``z > 1``, so
    the threshold is ``ρ = √(z* N/(N − 1))`` with ``z* > 1`` the root of
    ``log z + 1 − z = 2 log(1 − p_a)/N``.  Above it ``ξ<(0) > 1/2`` and nothing
    is certified.  For ``N = 1`` the theorem gives no bound (returns ``inf``).
    With ``p_b`` (App. B.5), ``1 − p_a`` is replaced by ``p_b``.
    """
    c, d_b, scalar = _chernoff_rhs(p_a, dim, p_b)
    t = _solve_expm1_minus(np.asarray(c, dtype=np.float64), negative=False)
    with np.errstate(divide="ignore"):
        ratio = np.where(
            d_b > 1, np.exp(0.5 * t) * np.sqrt(d_b / np.maximum(d_b - 1.0, 1.0)), np.inf
        )
    return as_result(np.asarray(ratio, dtype=np.float64), scalar)


def min_sigma_ratio_simple(
    p_a: ArrayLike, dim: ArrayLike, p_b: ArrayLike | None = None
) -> FloatOrArray:
    """Corollary 2.5 (one-sided simpler bound): ``√(1 − 2 √(−log(1 − p_a)/N))``.

    If ``σ1/σ0`` is below this, ``x1`` is not certified.  It is never larger than
    :func:`min_sigma_ratio`.  Returns 0.0 where the square root's argument is
    negative (the corollary is then vacuous).  With ``p_b``, ``1 − p_a`` → ``p_b``.
    """
    c, _, scalar = _chernoff_rhs(p_a, dim, p_b)
    inner = 1.0 - np.sqrt(2.0 * np.asarray(c, dtype=np.float64))
    return as_result(np.sqrt(np.maximum(inner, 0.0)), scalar)


def practical_sigma_ratio_threshold(p_a: ArrayLike, dim: ArrayLike) -> FloatOrArray:
    """Ratio σ1/σ0 < 1 at which ``ξ>(0) = 1/2`` (the "practical threshold" of Fig. 3).

    At ``a = 0`` the worst-case ball is centred at ``x0`` (§2, Thm 2.3 with δ = 0):
    ``ξ>(0) = χ²_N(χ²_{N,qf}(1 − p_a)/s²)``, so ``ξ>(0) = 1/2`` at
    ``s = √(χ²_{N,qf}(1 − p_a) / median(χ²_N))``.  Below it nothing certifies.
    """
    pa = check_prob("p_a", p_a)
    d = check_dim(dim)
    scalar = np.ndim(pa) == 0 and np.ndim(d) == 0
    pa_b, d_b = np.broadcast_arrays(pa, d)
    q = sc.chdtri(d_b, pa_b)  # upper-tail inverse: P(chi2 > q) = p_a  <=>  cdf(q) = 1 - p_a
    med = sc.chdtri(d_b, 0.5)
    return as_result(np.sqrt(q / med), scalar)


def practical_sigma_ratio_threshold_upper(p_a: ArrayLike, dim: ArrayLike) -> FloatOrArray:
    """Ratio σ1/σ0 > 1 at which ``ξ<(0) = 1/2`` (upper analogue of Fig. 3's curve).

    ``ξ<(0) = 1 − χ²_N(χ²_{N,qf}(p_a)/s²)``, which equals 1/2 at
    ``s = √(χ²_{N,qf}(p_a) / median(χ²_N))``.  Above it nothing certifies.
    """
    pa = check_prob("p_a", p_a)
    d = check_dim(dim)
    scalar = np.ndim(pa) == 0 and np.ndim(d) == 0
    pa_b, d_b = np.broadcast_arrays(pa, d)
    q = sc.chdtri(d_b, 1.0 - pa_b)  # P(chi2 > q) = 1 - p_a
    med = sc.chdtri(d_b, 0.5)
    return as_result(np.sqrt(q / med), scalar)
