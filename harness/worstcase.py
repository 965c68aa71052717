"""Worst-case probabilities and certified radii for input-dependent randomized smoothing.

Reference: M. Súkeník, A. Kuvshinov, S. Günnemann, "Intriguing Properties of
Input-Dependent Randomized Smoothing", ICML 2022 (arXiv:2110.05365).  Section,
theorem and appendix numbers below refer to that paper.

Setting (§2).  ``x0`` is smoothed with ``N(x0, σ0² I)``, a potential adversary
``x1`` at distance ``a = ‖x1 − x0‖`` with ``N(x1, σ1² I)``, both in ``R^N``
(``N = dim``).  By Lemma 2.1 the worst-case classifier predicts class B on a
likelihood-ratio region ``B`` with ``P0(B) = p_B``; by Thm 2.2 ``B`` is a ball
when ``σ0 > σ1`` and the complement of a ball when ``σ0 < σ1``.  Thm 2.3 writes
``ξ = P1(B)`` with non-central χ² CDFs and quantiles whose non-centrality
``σ0² a² / (σ0² − σ1²)²`` explodes as ``σ1 → σ0``; evaluating those CDFs
directly fails there (App. D), and the paper falls back on hand-tuned
thresholds.  This module uses none of that.

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

Multi-class estimates (App. B.5)
--------------------------------
App. B.5 states the theory works with any separately estimated ``p_B``.  With a
lower bound ``p_A`` on ``P0(A)`` and an upper bound ``p_B`` on every other
class, the worst case for ``x1`` is the largest ``P1(B)`` over ``P0(B) ≤ p_B``,
which is ``ξ(·, p_B)``, and the smallest ``P1(A)`` over ``P0(A) ≥ p_A``, which
is ``1 − ξ(·, 1 − p_A)`` (Lemma 2.1 / Neyman-Pearson applied to ``A^c``).  For
``p_B ≤ 1 − p_A`` the two extremal regions are disjoint level sets of the same
likelihood ratio, so they are simultaneously attainable (and for larger ``p_B``
the rule is merely conservative).  Hence ``x1`` is certified iff
``ξ(·, p_B) + ξ(·, 1 − p_A) < 1``; with ``p_B = 1 − p_A`` this is ``ξ < 1/2``
and with ``σ1 = σ0`` it gives Cohen's radius ``σ0/2 (Φ⁻¹(p_A) − Φ⁻¹(p_B))``.
The ``xi_*`` functions take ``p_b`` as the ``P0``-mass of ``B``; the certification
rule above is implemented in :func:`is_certified` and :func:`certified_radius`.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import special as sc
from scipy import stats

__all__ = [
    "certified_radius",
    "cohen_radius",
    "is_certified",
    "max_sigma_ratio",
    "min_sigma_ratio",
    "min_sigma_ratio_simple",
    "practical_sigma_ratio_threshold",
    "practical_sigma_ratio_threshold_upper",
    "xi",
    "xi_greater",
    "xi_less",
]

FloatOrArray = float | NDArray[np.float64]

# --------------------------------------------------------------------------
# numerical constants
# --------------------------------------------------------------------------
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
_BISECT_RTOL = 1e-9  # relative tolerance of the certified radius
_BISECT_ATOL_REL = 2.0**-50  # absolute floor, relative to Cohen's radius
_PROBE_LANES = 48  # multisection below this many active inputs (see _bisect_radius)
_MAX_PROBES = 15
_XI_MARGIN = 1e-10  # certification requires xi < 1/2 - margin (numerical safety)
_MAX_LOG_RATIO = 300.0  # rate * R beyond which sigma1/sigma0 = e^(+-rR) never certifies


# --------------------------------------------------------------------------
# input validation
# --------------------------------------------------------------------------
def _as_float(name: str, x: ArrayLike) -> NDArray[np.float64]:
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a real number or array of real numbers") from exc
    return arr


def _check_prob(name: str, x: ArrayLike) -> NDArray[np.float64]:
    arr = _as_float(name, x)
    if not np.all((arr >= 0.0) & (arr <= 1.0)):
        raise ValueError(f"{name} must lie in [0, 1] (got values outside that range or NaN)")
    return arr


def _check_positive(name: str, x: ArrayLike) -> NDArray[np.float64]:
    arr = _as_float(name, x)
    if not np.all(np.isfinite(arr) & (arr > 0.0)):
        raise ValueError(f"{name} must be finite and > 0 (accepted range: (0, inf))")
    return arr


def _check_nonneg(name: str, x: ArrayLike) -> NDArray[np.float64]:
    arr = _as_float(name, x)
    if not np.all(np.isfinite(arr) & (arr >= 0.0)):
        raise ValueError(f"{name} must be finite and >= 0 (accepted range: [0, inf))")
    return arr


def _check_dim(dim: ArrayLike) -> NDArray[np.int64]:
    arr = np.asarray(dim)
    if arr.dtype == np.bool_ or not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
    ):
        raise ValueError("dim must be an integer >= 1 (accepted range: 1, 2, 3, ...)")
    if np.issubdtype(arr.dtype, np.floating) and not np.all(
        np.isfinite(arr) & (arr == np.round(arr))
    ):
        raise ValueError("dim must be an integer >= 1 (accepted range: 1, 2, 3, ...)")
    if not np.all(arr >= 1):
        raise ValueError("dim must be an integer >= 1 (accepted range: 1, 2, 3, ...)")
    return arr.astype(np.int64)


def _result(x: NDArray[np.float64], scalar: bool) -> FloatOrArray:
    if scalar:
        return float(x.reshape(-1)[0])
    return x


# --------------------------------------------------------------------------
# core: probability of the ball B(m e1, m + h) under N(0, I_N), tau = 1/(1+m)
# --------------------------------------------------------------------------
@functools.cache
def _gl_nodes(n: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    x, w = np.polynomial.legendre.leggauss(n)
    return (x + 1.0) / 2.0, w / 2.0


@functools.lru_cache(maxsize=256)
def _chi2_window(k: int) -> tuple[float, float, float]:
    """sqrt of the (1e-20, 1 - 1e-20) quantiles of chi2_k and the log-density constant.

    log f_k(V) = (k/2 - 1) log(V/k) - (V - k)/2 + c0.
    """
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


def _ball_mass(
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
        sub, dsub = _ball_mass(tau[ok], h[ok], dim, outer, deriv)
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
    """Node-level part of :func:`_ball_mass` for a block of rows (kept cache-sized)."""
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


def _solve_h(
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
        p, dg = _ball_mass(tau[active], ha, dim, outer, True)
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


# --------------------------------------------------------------------------
# xi functions (Thm 2.3 evaluated through G)
# --------------------------------------------------------------------------
def _xi_core(
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
        h0[sel], conv[sel] = _solve_h(tau0[sel], np.log(target[sel]), z_ball[sel], dim, side, hs)
    if greater:
        h1 = (h0 + alpha) / s
        val, _ = _ball_mass(tau1, h1, dim, outer=False, deriv=False)
    else:
        h1 = (h0 - alpha) / s
        val, _ = _ball_mass(tau1, h1, dim, outer=True, deriv=False)
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
    a_arr = _check_nonneg("a", a)
    s0 = _check_positive("sigma0", sigma0)
    s1 = _check_positive("sigma1", sigma1)
    pa = _check_prob("p_a", p_a)
    d = _check_dim(dim)
    pb_given = p_b is not None
    pb = _check_prob("p_b", p_b) if pb_given else None
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
        val, _, conv = _xi_core(alpha[sel], s[sel], eps[sel], pb_f[sel], int(nd), greater)
        res[sel] = np.where(conv, val, np.nan)  # never silently wrong
    return _result(res.reshape(shape), scalar)


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
    s0, s1 = np.broadcast_arrays(
        _check_positive("sigma0", sigma0), _check_positive("sigma1", sigma1)
    )
    args = np.broadcast_arrays(
        _check_nonneg("a", a), s0, s1, _check_prob("p_a", p_a), _check_dim(dim)
    )
    scalar = all(np.ndim(x) == 0 for x in (a, sigma0, sigma1, p_a, dim)) and (
        p_b is None or np.ndim(p_b) == 0
    )
    pb = None if p_b is None else np.broadcast_to(_check_prob("p_b", p_b), args[0].shape)
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
    return _result(out, scalar)


def is_certified(
    a: ArrayLike,
    sigma0: ArrayLike,
    sigma1: ArrayLike,
    p_a: ArrayLike,
    dim: ArrayLike,
    p_b: ArrayLike | None = None,
) -> bool | NDArray[np.bool_]:
    """Whether ``x1`` (distance ``a``, noise ``σ1``) is certified w.r.t. ``x0`` (§2).

    Two-class rule (``p_b`` omitted): ``ξ(a) < 1/2`` (Thm 2.3).  With a separate
    upper bound ``p_b`` on the runner-up class (App. B.5): the worst-case
    ``P1(A) = 1 − ξ(a; 1 − p_a)`` must exceed the worst-case ``P1(B) = ξ(a; p_b)``,
    i.e. ``ξ(a; p_b) + ξ(a; 1 − p_a) < 1``.  ``ξ`` is ``ξ>`` or ``ξ<`` by the sign of
    ``σ0 − σ1``.
    """
    if p_b is None:
        out = np.asarray(xi(a, sigma0, sigma1, p_a, dim)) < 0.5
    else:
        pa = _check_prob("p_a", p_a)
        total = np.asarray(xi(a, sigma0, sigma1, pa, dim, p_b=p_b)) + np.asarray(
            xi(a, sigma0, sigma1, pa, dim, p_b=1.0 - pa)
        )
        out = total < 1.0
    return bool(out) if out.ndim == 0 else out


# --------------------------------------------------------------------------
# certified radius (Thm 3.2)
# --------------------------------------------------------------------------
def cohen_radius(p_a: ArrayLike, sigma0: ArrayLike, p_b: ArrayLike | None = None) -> FloatOrArray:
    """Cohen et al.'s constant-σ radius: ``σ0 Φ⁻¹(p_a)``, or ``σ0/2 (Φ⁻¹(p_a) − Φ⁻¹(p_b))``.

    Computed exactly as ``sigma0 * ndtri(p_a)`` (resp.
    ``sigma0 / 2 * (ndtri(p_a) - ndtri(p_b))``); negative values are returned as is.
    """
    pa = _check_prob("p_a", p_a)
    s0 = _check_positive("sigma0", sigma0)
    scalar = np.ndim(pa) == 0 and np.ndim(s0) == 0 and (p_b is None or np.ndim(p_b) == 0)
    if p_b is None:
        r = s0 * sc.ndtri(pa)
    else:
        r = s0 / 2 * (sc.ndtri(pa) - sc.ndtri(_check_prob("p_b", p_b)))
    return _result(np.asarray(r, dtype=np.float64), scalar)


def _condition(
    r: NDArray[np.float64],
    sigma0: NDArray[np.float64],
    rate: NDArray[np.float64],
    p_b: NDArray[np.float64],
    p_b2: NDArray[np.float64] | None,
    dim: int,
    warm: dict[str, NDArray[np.float64]],
    idx: NDArray[np.int64],
) -> NDArray[np.bool_]:
    """Thm 3.2 condition at radius r: xi>(r, σ0 e^{-rate r}) and xi<(r, σ0 e^{rate r}) below 1/2.

    With a separate p_b (App. B.5): xi(p_b) + xi(1 - p_a) < 1 for both signs
    (``p_b2`` holds ``1 - p_a``).  Non-converged quantile solves count as failure.
    """
    x = rate * r
    ok = x < _MAX_LOG_RATIO
    alpha = r / sigma0
    res = ok.copy()
    for greater in (True, False):
        sel = np.nonzero(res)[0]
        if sel.size == 0:
            break
        xs = x[sel]
        if greater:
            s = np.exp(-xs)
            eps = -np.expm1(-2.0 * xs)  # 1 - s^2
        else:
            s = np.exp(xs)
            eps = np.expm1(2.0 * xs)  # s^2 - 1
        key = "g" if greater else "l"
        total = np.zeros(sel.size)
        conv_all = np.ones(sel.size, dtype=bool)
        for pb_arr, tag in ((p_b, "b"), (p_b2, "a")):
            if pb_arr is None:
                continue
            store = warm[key + tag]
            val, h0, conv = _xi_core(alpha[sel], s, eps, pb_arr[sel], dim, greater, store[idx[sel]])
            store[idx[sel]] = np.where(conv, h0, np.nan)
            total += val
            conv_all &= conv
        limit = 1.0 if p_b2 is not None else 0.5
        res[sel] = (total < limit - _XI_MARGIN) & conv_all
    return res


def certified_radius(
    p_a: ArrayLike,
    sigma0: ArrayLike,
    rate: ArrayLike,
    dim: ArrayLike,
    p_b: ArrayLike | None = None,
) -> FloatOrArray:
    """Certified radius of Thm 3.2 for an r-semi-elastic σ(x) (``rate`` = r ≥ 0):

        CR(x0) = sup{R ≥ 0 : ξ>(R, σ0 e^{−rR}) < 1/2 and ξ<(R, σ0 e^{rR}) < 1/2}.

    With a separate ``p_b`` (App. B.5) the condition is
    ``ξ(R, ·, p_b) + ξ(R, ·, 1 − p_a) < 1`` for both signs.

    * ``rate == 0``: returns Cohen's radius exactly, ``sigma0 * ndtri(p_a)``
      (resp. ``sigma0 / 2 * (ndtri(p_a) - ndtri(p_b))``).
    * Nothing certifies (``p_a ≤ 1/2``, resp. ``p_a ≤ p_b``): 0.0.
      ``p_a == 1`` (``p_b == 0``) certifies every radius: ``inf``.
    * Otherwise bracket-and-bisect, vectorized over the whole batch, inside
      ``[0, R_Cohen]`` (plain bisection while >= 48 inputs are unresolved, a
      15-point multisection per pass below that, to cut per-call overhead): the
      result never exceeds Cohen's radius (Thm B.6, by construction: at
      ``R_Cohen`` the half-space value is already 1/2 and the worst-case ball
      is at least as bad).  Stops at a relative bracket width of 1e-9 and
      returns the lower end, a radius at which the condition was verified (with
      a 1e-10 safety margin on ``ξ``; a quantile solve that did not converge
      counts as a failure).

    Why a bracket is enough: the set of R satisfying the condition is an
    interval starting at 0.  It contains 0 (``ξ = p_B < 1/2`` there).  Let the
    condition hold at R and let R' < R, ``σ1 = σ0 e^{−rR} ≤ σ2 = σ0 e^{−rR'} ≤ σ0``.
    Thm 3.1 (contrapositive, in its strict form: ``ξ ≥ 1/2`` already forces ``x1``
    into the worst-case ball, where the homothety argument of the proof applies)
    turns ``ξ>(R, σ1) < 1/2`` into ``ξ>(R, σ2) < 1/2``, and ξ is non-decreasing in
    the distance (Lemma F.4), so ``ξ>(R', σ2) ≤ ξ>(R, σ2) < 1/2``; likewise for ξ<.
    For the App. B.5 condition the failing side need not have each term ``≥ 1/2``,
    so Thm 3.1's proof does not cover it; we assume the same monotonicity there
    (it holds on every grid we checked, see the tests).  Even if it failed, the
    returned lower end is a radius at which the condition was verified.
    """
    pa = _check_prob("p_a", p_a)
    s0 = _check_positive("sigma0", sigma0)
    rt = _check_nonneg("rate", rate)
    d = _check_dim(dim)
    pb_given = p_b is not None
    arrays = [pa, s0, rt, d] + ([_check_prob("p_b", p_b)] if pb_given else [])
    scalar = all(np.ndim(x) == 0 for x in arrays)
    bc = np.broadcast_arrays(*arrays)
    shape = bc[0].shape
    pa_f, s0_f, rt_f = (np.ascontiguousarray(x, dtype=np.float64).ravel() for x in bc[:3])
    d_f = np.ascontiguousarray(bc[3]).ravel()
    if pb_given:
        pb_f = np.ascontiguousarray(bc[4], dtype=np.float64).ravel()
        r_c = s0_f / 2 * (sc.ndtri(pa_f) - sc.ndtri(pb_f))
    else:
        pb_f = 1.0 - pa_f
        r_c = s0_f * sc.ndtri(pa_f)

    out = np.where(r_c > 0.0, r_c, 0.0)  # rate == 0: Cohen's radius, bit for bit
    search = (rt_f > 0.0) & (r_c > 0.0) & np.isfinite(r_c)
    for nd in np.unique(d_f[search]):
        sel = np.nonzero(search & (d_f == nd))[0]
        out[sel] = _bisect_radius(
            s0_f[sel],
            rt_f[sel],
            pb_f[sel],
            (1.0 - pa_f[sel]) if pb_given else None,
            r_c[sel],
            int(nd),
        )
    return _result(out.reshape(shape), scalar)


def _bisect_radius(
    sigma0: NDArray[np.float64],
    rate: NDArray[np.float64],
    p_b: NDArray[np.float64],
    p_b2: NDArray[np.float64] | None,
    r_cohen: NDArray[np.float64],
    dim: int,
) -> NDArray[np.float64]:
    """Bracketing search on [0, r_cohen] for the whole batch at once.

    Invariant: the condition holds at ``lo`` (verified, or ``lo = 0``) and fails at
    ``hi`` (verified, or ``hi = R_Cohen``).  Each pass probes ``k`` equally spaced
    interior points per input and keeps the sub-bracket around the first failing
    probe.  ``k = 1`` (plain bisection) whenever at least ``_PROBE_LANES`` inputs are
    still active; smaller batches use more probes per pass (multisection) so that a
    single input does not pay ~30 rounds of per-call overhead.
    """
    n = sigma0.shape[0]
    lo = np.zeros(n)
    hi = r_cohen.copy()
    # warm starts of the quantile solves, per input: xi>/xi< ("g"/"l") x p_b/1-p_a ("b"/"a")
    warm = {key: np.full(n, np.nan) for key in ("gb", "ga", "lb", "la")}
    atol = _BISECT_ATOL_REL * r_cohen
    active = np.arange(n)
    while active.size:
        k = max(1, min(_MAX_PROBES, _PROBE_LANES // active.size))
        frac = np.arange(1, k + 1) / (k + 1.0)
        lo_a, hi_a = lo[active], hi[active]
        probes = lo_a[:, None] + (hi_a - lo_a)[:, None] * frac  # (active, k)
        rows = np.repeat(active, k)
        cond = _condition(
            probes.ravel(),
            sigma0[rows],
            rate[rows],
            p_b[rows],
            None if p_b2 is None else p_b2[rows],
            dim,
            warm,
            rows,
        ).reshape(-1, k)
        # first failing probe (k if none fails); the bracket becomes the probes around it
        first_fail = np.where(cond.all(axis=1), k, np.argmin(cond, axis=1))
        ext = np.concatenate([lo_a[:, None], probes, hi_a[:, None]], axis=1)
        pick = np.arange(active.size)
        lo[active] = ext[pick, first_fail]
        hi[active] = ext[pick, first_fail + 1]
        width = hi[active] - lo[active]
        done = (width <= _BISECT_RTOL * lo[active]) | (width <= atol[active])
        active = active[~done]
    return lo


# --------------------------------------------------------------------------
# curse-of-dimensionality thresholds (Thm 2.4, Cor 2.5, Fig. 3)
# --------------------------------------------------------------------------
def _chernoff_rhs(
    p_a: ArrayLike, dim: ArrayLike, p_b: ArrayLike | None
) -> tuple[NDArray[np.float64], NDArray[np.int64], bool]:
    """c = -2 log(p_B)/N with p_B = 1 - p_a by default: Thm 2.4 reads log z + 1 - z < -c."""
    pa = _check_prob("p_a", p_a)
    d = _check_dim(dim)
    scalar = np.ndim(pa) == 0 and np.ndim(d) == 0 and (p_b is None or np.ndim(p_b) == 0)
    with np.errstate(divide="ignore"):
        log_pb = np.log1p(-pa) if p_b is None else np.log(_check_prob("p_b", p_b))
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
    return _result(np.exp(0.5 * t), scalar)


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
    return _result(np.asarray(ratio, dtype=np.float64), scalar)


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
    return _result(np.sqrt(np.maximum(inner, 0.0)), scalar)


def practical_sigma_ratio_threshold(p_a: ArrayLike, dim: ArrayLike) -> FloatOrArray:
    """Ratio σ1/σ0 < 1 at which ``ξ>(0) = 1/2`` (the "practical threshold" of Fig. 3).

    At ``a = 0`` the worst-case ball is centred at ``x0`` (§2, Thm 2.3 with δ = 0):
    ``ξ>(0) = χ²_N(χ²_{N,qf}(1 − p_a)/s²)``, so ``ξ>(0) = 1/2`` at
    ``s = √(χ²_{N,qf}(1 − p_a) / median(χ²_N))``.  Below it nothing certifies.
    """
    pa = _check_prob("p_a", p_a)
    d = _check_dim(dim)
    scalar = np.ndim(pa) == 0 and np.ndim(d) == 0
    pa_b, d_b = np.broadcast_arrays(pa, d)
    q = sc.chdtri(d_b, pa_b)  # upper-tail inverse: P(chi2 > q) = p_a  <=>  cdf(q) = 1 - p_a
    med = sc.chdtri(d_b, 0.5)
    return _result(np.sqrt(q / med), scalar)


def practical_sigma_ratio_threshold_upper(p_a: ArrayLike, dim: ArrayLike) -> FloatOrArray:
    """Ratio σ1/σ0 > 1 at which ``ξ<(0) = 1/2`` (upper analogue of Fig. 3's curve).

    ``ξ<(0) = 1 − χ²_N(χ²_{N,qf}(p_a)/s²)``, which equals 1/2 at
    ``s = √(χ²_{N,qf}(p_a) / median(χ²_N))``.  Above it nothing certifies.
    """
    pa = _check_prob("p_a", p_a)
    d = _check_dim(dim)
    scalar = np.ndim(pa) == 0 and np.ndim(d) == 0
    pa_b, d_b = np.broadcast_arrays(pa, d)
    q = sc.chdtri(d_b, 1.0 - pa_b)  # P(chi2 > q) = 1 - p_a
    med = sc.chdtri(d_b, 0.5)
    return _result(np.sqrt(q / med), scalar)
