"""The probability of a ball under the standard Gaussian: the ``G(τ, h)`` of ξ.

Reference: M. Súkeník, A. Kuvshinov, S. Günnemann, "Intriguing Properties of
Input-Dependent Randomized Smoothing", ICML 2022 (arXiv:2110.05365); the worst-case
probabilities ξ of Thm 2.3 (:mod:`harness.mathematics.worstcase.xi`) are masses of balls
evaluated here.

Numerical formulation
---------------------
Everything is done in standardized coordinates (``σ0 = 1`` for ``P0``, or
``σ1 = 1`` for ``P1``), where only ``s = σ1/σ0``, ``α = a/σ0``, ``p_B`` and
``N`` matter.  For ``Z ~ N(0, I_N)`` and a ball with centre ``m e1`` (``m ≥ 0``)
and radius ``ρ = m + h`` define

    G(τ, h) = P(‖Z − m e1‖ ≤ m + h),   τ = 1 / (1 + m) ∈ [0, 1].

``h`` is the signed distance from the origin to the near side of the sphere and
``τ`` is a bounded curvature-like parameter: ``τ = 1`` is a ball centred at the
origin, ``τ → 0`` is the half-space ``{z1 ≥ −h}`` (``G → Φ(h)``), which is
reached continuously.  Conditioning on ``V = ‖Z_⊥‖² ~ χ²_{N−1}`` gives

    G = E[ Φ(m + w) − Φ(m − w) ; V ≤ ρ² ],   w = √(ρ² − V),

with the cancellation-free forms
``m − w = (τV − h(2(1 − τ) + τh)) / ((1 − τ) + τw)`` and
``m + w = ((1 − τ) + τw)/τ``, valid for every ``τ ∈ (0, 1]`` (``τ`` is clamped
at 1e-100, i.e. ``m ≤ 1e100``; the deviation from the exact half-space is then
``O(N/m)``, far below double precision).  The remaining one-dimensional
integral is written in polar form ``√V = ρ sin θ``, ``w = ρ cos θ`` with the
rational substitution ``t = tan(θ/2)``: the integrand is then analytic, with no
square-root singularity at ``V = ρ²`` or at ``V = 0``, and no trigonometric
function is evaluated.  It is computed by composite Gauss-Legendre quadrature
with fixed node counts (4 panels × 24 nodes) on the part of the ``χ²_{N−1}``
law holding all but 1e-20 of its mass on either side, with panel breaks at the
``χ²`` mode and where ``w = m ± 5.5`` (the band in which ``Φ(m − w)`` switches
from 1 to 0).  The density is evaluated in log space (any ``N``; tested up to
1e7).  The complement ``1 − G`` has its own integrand (``Φ(m − w) + Φ(−m − w)``
plus ``P(V > ρ²)``), so both tails are relatively accurate, and ``∂G/∂h``
comes from the same nodes.

"""

from __future__ import annotations

import functools
import math

import numpy as np
from numpy.typing import NDArray
from scipy import special as sc

_TAU_MIN = 1e-100  # clamp of the curvature parameter (centre distance <= 1e100)
_RHO_MIN = 1e-150  # balls with smaller radius are treated as empty
_WINDOW_TAIL = 1e-20  # chi2_{N-1} mass left out on each side of the quadrature window
_N_NODES = 24  # Gauss-Legendre nodes per panel
_TRANSITION = 5.5  # panel breaks where w = m +- _TRANSITION
_U_TERM_M = 12.0  # Phi(-(m + w)) <= Phi(-m) is dropped when m >= this
_NEWTON_ACCEPT = 1e-5  # |log P - log p| below which one final Newton step is exact enough
_NEWTON_MAXIT = 100

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_CHUNK_ELEMS = 6144  # node-level work is done in blocks of about this many elements


@functools.cache
def _gl_nodes(n: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    x, w = np.polynomial.legendre.leggauss(n)
    return (x + 1.0) / 2.0, w / 2.0


@functools.lru_cache(maxsize=256)
def _chi2_window(k: int) -> tuple[float, float, float]:
    """sqrt of the (1e-20, 1 - 1e-20) quantiles of chi2_k and the log-density constant.

    log f_k(V) = (k/2 - 1) log(V/k) - (V - k)/2 + c0.
    """
    from scipy import stats  # (here: harness/README.md, "What a process imports as it starts")

    v_lo = float(stats.chi2.ppf(_WINDOW_TAIL, k))
    v_hi = float(stats.chi2.isf(_WINDOW_TAIL, k))
    c0 = (k / 2.0 - 1.0) * math.log(k) - k / 2.0 - (k / 2.0) * math.log(2.0) - sc.gammaln(k / 2.0)
    return math.sqrt(v_lo), math.sqrt(v_hi), float(c0)


def _half_tan_from_sin(r: NDArray[np.float64]) -> NDArray[np.float64]:
    """tan(theta/2) for sin(theta) = r, theta in [0, pi/2]."""
    r = np.minimum(np.maximum(r, 0.0), 1.0)
    return r / (1.0 + np.sqrt((1.0 - r) * (1.0 + r)))


def _half_tan_from_cos(q: NDArray[np.float64]) -> NDArray[np.float64]:
    """tan(theta/2) for cos(theta) = q, theta in [0, pi/2]."""
    q = np.minimum(np.maximum(q, 0.0), 1.0)
    return np.sqrt((1.0 - q) / (1.0 + q))


def ball_mass(
    tau: NDArray[np.float64],
    h: NDArray[np.float64],
    dim: int,
    outer: bool,
    deriv: bool,
) -> tuple[NDArray[np.float64], NDArray[np.float64] | None]:
    """P = G(tau, h) (``outer=False``) or 1 - G(tau, h) (``outer=True``) and dG/dh.

    ``tau``, ``h``: 1-D arrays of equal length; ``dim`` = N.  Returns ``(P, dG)``
    where ``dG = dG/dh >= 0`` (so ``d(1 - G)/dh = -dG``), ``None`` unless ``deriv``.
    """
    tau = np.maximum(tau, _TAU_MIN)
    one_m = 1.0 - tau
    trho = one_m + tau * h  # tau * rho
    n_rows = tau.shape[0]
    out = np.empty(n_rows)
    dout = np.zeros(n_rows) if deriv else None
    empty = ~(trho > _RHO_MIN * tau)  # rho <= 1e-150: empty ball (mass < 1e-150)
    if np.any(empty):
        out[empty] = 1.0 if outer else 0.0
    ok = ~empty
    if not np.any(ok):
        return out, dout
    if not np.all(ok):
        sub, dsub = ball_mass(tau[ok], h[ok], dim, outer, deriv)
        out[ok] = sub
        if deriv:
            dout[ok] = dsub  # type: ignore[index]
        return out, dout

    small_m = one_m < _U_TERM_M * tau  # m < _U_TERM_M: keep the Phi(-(m + w)) terms
    k = dim - 1
    if k == 0:
        # N = 1: the ball is the interval [m - rho, m + rho] = [-h, 2m + h].
        upper = (one_m + trho) / tau  # 2m + h
        val = sc.ndtr(-h) + sc.ndtr(-upper) if outer else sc.ndtr(h) - sc.ndtr(-upper)
        if deriv:
            dout = (np.exp(-0.5 * h * h) + np.exp(-0.5 * upper * upper)) * _INV_SQRT_2PI
        return val, dout

    y_lo, y_hi, c0 = _chi2_window(k)
    rho = trho / tau
    t_lo = _half_tan_from_sin(y_lo / rho)
    t_hi = _half_tan_from_sin(y_hi / rho)
    # panel breaks: the chi2 mode (sqrt(V) = sqrt(k)) and w = m +- _TRANSITION
    inner = np.stack(
        [
            _half_tan_from_sin(math.sqrt(k) / rho),
            _half_tan_from_cos((one_m + _TRANSITION * tau) / trho),
            _half_tan_from_cos((one_m - _TRANSITION * tau) / trho),
        ],
        axis=1,
    )
    inner = np.sort(np.clip(inner, t_lo[:, None], t_hi[:, None]), axis=1)
    a = np.concatenate([t_lo[:, None], inner], axis=1)  # (rows, panels)
    b = np.concatenate([inner, t_hi[:, None]], axis=1)
    width = b - a
    good = width > 0.0
    a = np.where(good, a, 0.5)  # keep degenerate panels away from t = 0, 1
    width = np.where(good, width, 0.0)

    val = np.empty(n_rows)
    dval = np.empty(n_rows) if deriv else None
    lin = h * (one_m + trho)  # m - w = (tau V - lin) / (1 - tau + tau w)
    step = max(1, _CHUNK_ELEMS // (a.shape[1] * _N_NODES))
    for r0 in range(0, n_rows, step):
        sl = slice(r0, min(r0 + step, n_rows))
        v_, d_ = _ball_kernel(
            a[sl], width[sl], rho[sl], tau[sl], one_m[sl], lin[sl], small_m[sl], k, c0, outer, deriv
        )
        val[sl] = v_
        if deriv:
            dval[sl] = d_  # type: ignore[index]
    if outer:
        inside = rho < y_hi  # P(V > rho^2) is negligible otherwise
        if np.any(inside):
            val[inside] += sc.chdtrc(k, rho[inside] ** 2)
    return val, dval


def _ball_kernel(
    a: NDArray[np.float64],
    width: NDArray[np.float64],
    rho: NDArray[np.float64],
    tau: NDArray[np.float64],
    one_m: NDArray[np.float64],
    lin: NDArray[np.float64],
    small_m: NDArray[np.bool_],
    k: int,
    c0: float,
    outer: bool,
    deriv: bool,
) -> tuple[NDArray[np.float64], NDArray[np.float64] | None]:
    """Node-level part of :func:`ball_mass` for a block of rows (kept cache-sized)."""
    n_rows = a.shape[0]
    x, wt = _gl_nodes(_N_NODES)
    t = (a[:, :, None] + width[:, :, None] * x).reshape(n_rows, -1)
    w0 = (width[:, :, None] * wt).reshape(n_rows, -1)
    inv = t * t
    cq = 1.0 - inv  # (1 - t^2)
    inv += 1.0
    np.reciprocal(inv, out=inv)  # 1 / (1 + t^2)
    cq *= inv  # cos(theta)
    rho_c = rho[:, None]
    y = t * inv
    y *= 2.0 * rho_c  # rho sin(theta)
    w = cq * rho_c  # rho cos(theta)
    v = y * y
    # log chi2_k density, centred at V = k to limit cancellation
    logf = np.log(v * (1.0 / k))
    logf *= 0.5 * k - 1.0
    logf -= 0.5 * (v - k)
    logf += c0
    wts = np.exp(logf, out=logf)
    # f(V) dV = f(V) 2 y w dtheta,  dtheta = 2 dt / (1 + t^2)
    wts *= y
    wts *= w
    wts *= inv
    wts *= 4.0 * w0
    tau_c = tau[:, None]
    den = w * tau_c
    den += one_m[:, None]  # tau (m + w)
    lower = v * tau_c
    lower -= lin[:, None]
    lower /= den  # m - w
    g = sc.ndtr(lower) if outer else sc.ndtr(-lower)
    if deriv:
        dg = lower * lower
        dg *= -0.5
        np.exp(dg, out=dg)
    if np.any(small_m):
        upper = den[small_m] / tau_c[small_m]  # m + w
        if outer:
            g[small_m] += sc.ndtr(-upper)
        else:
            g[small_m] -= sc.ndtr(-upper)
        if deriv:
            dg[small_m] += np.exp(-0.5 * upper * upper)
    val = np.einsum("ij,ij->i", wts, g)
    if not deriv:
        return val, None
    # dG/drho = E[(phi(m - w) + phi(m + w)) rho / w ; V <= rho^2],  rho / w = 1 / cos(theta)
    dg /= cq
    return val, np.einsum("ij,ij->i", wts, dg) * _INV_SQRT_2PI


def _initial_h(tau: NDArray[np.float64], z: NDArray[np.float64], dim: int) -> NDArray[np.float64]:
    """Starting value for ``G(tau, h) = Phi(z)``: Patnaik's two-moment fit of the
    non-central chi2 with a Wilson-Hilferty quantile, written so that the half-space
    limit (h -> z as tau -> 0) is reproduced without cancellation."""
    tau = np.maximum(tau, _TAU_MIN)
    m = (1.0 - tau) / tau
    lam = m * m
    n_f = float(dim)
    nl = n_f + lam
    nu = nl * (nl / (n_f + 2.0 * lam))
    c = 2.0 / (9.0 * nu)
    d = np.maximum(-c + z * np.sqrt(c), -0.95)
    t_val = n_f + nl * d * (3.0 + d * (3.0 + d))  # rho^2 - m^2
    rho2 = np.maximum(lam + t_val, 1e-300)
    rho = np.sqrt(rho2)
    h = np.where(lam + t_val > 0.0, t_val / (rho + m), -m + rho)
    h = np.where(tau <= 1e-30, z, h)
    return np.maximum(h, -m + 1e-9 * (1.0 + m))


def solve_ball_offset(
    tau: NDArray[np.float64],
    log_p: NDArray[np.float64],
    z: NDArray[np.float64],
    dim: int,
    outer: bool,
    h_start: NDArray[np.float64] | None = None,
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """Solve log P(tau, h) = log_p for h, where P = G (outer=False) or 1 - G (outer=True).

    Safeguarded Newton iteration on log P with a shrinking bracket.  Returns the
    solution and a flag array telling which entries converged.
    """
    n = tau.shape[0]
    tau_c = np.maximum(tau, _TAU_MIN)
    m = (1.0 - tau_c) / tau_c
    h = _initial_h(tau, z, dim)
    if h_start is not None:
        h = np.where(np.isfinite(h_start), h_start, h)
    lo = -m.copy()
    hi = np.full(n, np.inf)
    h = np.where(h > lo, h, lo + 1e-9 * (1.0 + m))
    converged = np.zeros(n, dtype=bool)
    active = np.arange(n)
    for _ in range(_NEWTON_MAXIT):
        if active.size == 0:
            break
        ha = h[active]
        p, dg = ball_mass(tau[active], ha, dim, outer, True)
        with np.errstate(divide="ignore", invalid="ignore"):
            psi = np.log(p) - log_p[active]
            dpsi = (-dg if outer else dg) / p  # type: ignore[operator]
            step = -psi / dpsi
        need_up = (psi > 0.0) if outer else (psi < 0.0)
        lo_a = np.where(need_up, np.maximum(lo[active], ha), lo[active])
        hi_a = np.where(need_up, hi[active], np.minimum(hi[active], ha))
        lo[active] = lo_a
        hi[active] = hi_a
        cand = ha + np.clip(step, -8.0, 8.0)
        bad = ~np.isfinite(cand) | (cand <= lo_a) | (cand >= hi_a)
        if np.any(bad):
            narrow = np.isfinite(lo_a) & np.isfinite(hi_a) & (hi_a - lo_a < 16.0)
            fallback = np.where(
                narrow,
                0.5 * (lo_a + hi_a),
                np.where(need_up, ha + 4.0, np.maximum(ha - 4.0, 0.5 * (lo_a + ha))),
            )
            cand = np.where(bad, fallback, cand)
        done = (np.abs(psi) <= _NEWTON_ACCEPT) & ~bad
        done |= (hi_a - lo_a) <= 1e-13 * (1.0 + np.abs(ha))
        h[active] = cand
        converged[active[done]] = True
        active = active[~done]
    return h, converged
