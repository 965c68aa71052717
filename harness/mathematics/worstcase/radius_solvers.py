"""Certified radii: Cohen's constant-σ radius and the semi-elastic radius of Thm 3.2.

Reference: M. Súkeník, A. Kuvshinov, S. Günnemann, "Intriguing Properties of
Input-Dependent Randomized Smoothing", ICML 2022 (arXiv:2110.05365).  ``x1`` at
distance ``R`` from ``x0`` is certified when the worst-case probabilities ξ
(:mod:`harness.mathematics.worstcase.xi`) leave class A the majority; the certified radius is the
largest such ``R``, found by bisection.

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
from harness.mathematics.worstcase.xi import xi, xi_arrays

_BISECT_RTOL = 1e-9  # relative tolerance of the certified radius
_BISECT_ATOL_REL = 2.0**-50  # absolute floor, relative to Cohen's radius
_PROBES = 3  # interior probes per input and pass (see _bisect_radius)
_XI_MARGIN = 1e-10  # certification requires xi < 1/2 - margin (numerical safety)
_MAX_LOG_RATIO = 300.0  # rate * R beyond which sigma1/sigma0 = e^(+-rR) never certifies
_THRESHOLD_LOG_WIDTH = 1e-9  # bracket width on log(1 - p_A) of semi_elastic_threshold


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
        pa = check_prob("p_a", p_a)
        total = np.asarray(xi(a, sigma0, sigma1, pa, dim, p_b=p_b)) + np.asarray(
            xi(a, sigma0, sigma1, pa, dim, p_b=1.0 - pa)
        )
        out = total < 1.0
    return bool(out) if out.ndim == 0 else out


def cohen_radius(p_a: ArrayLike, sigma0: ArrayLike, p_b: ArrayLike | None = None) -> FloatOrArray:
    """Cohen et al.'s constant-σ radius: ``σ0 Φ⁻¹(p_a)``, or ``σ0/2 (Φ⁻¹(p_a) − Φ⁻¹(p_b))``.

    Computed exactly as ``sigma0 * ndtri(p_a)`` (resp.
    ``sigma0 / 2 * (ndtri(p_a) - ndtri(p_b))``); negative values are returned as is.
    """
    pa = check_prob("p_a", p_a)
    s0 = check_positive("sigma0", sigma0)
    scalar = np.ndim(pa) == 0 and np.ndim(s0) == 0 and (p_b is None or np.ndim(p_b) == 0)
    if p_b is None:
        r = s0 * sc.ndtri(pa)
    else:
        r = s0 / 2 * (sc.ndtri(pa) - sc.ndtri(check_prob("p_b", p_b)))
    return as_result(np.asarray(r, dtype=np.float64), scalar)


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
            val, h0, conv = xi_arrays(
                alpha[sel], s, eps, pb_arr[sel], dim, greater, store[idx[sel]]
            )
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
      ``[0, R_Cohen]`` (a 3-point multisection per pass: half the passes of a
      bisection, the same probes for an input whatever else is in the batch): the
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
    pa = check_prob("p_a", p_a)
    s0 = check_positive("sigma0", sigma0)
    rt = check_nonneg("rate", rate)
    d = check_dim(dim)
    pb_given = p_b is not None
    arrays = [pa, s0, rt, d] + ([check_prob("p_b", p_b)] if pb_given else [])
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
    return as_result(out.reshape(shape), scalar)


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
    probe, ``k`` = :data:`_PROBES` for every input, so that an input's probes, and its
    radius, are the same bits alone as in any batch: the certifier solves a shard or a
    round's stopped inputs, S0 a row's certificates at once, and S0 compares the two
    (a k that grew as fewer inputs stayed active made them differ by up to 10⁻⁸).
    """
    n = sigma0.shape[0]
    lo = np.zeros(n)
    hi = r_cohen.copy()
    # warm starts of the quantile solves, per input: xi>/xi< ("g"/"l") x p_b/1-p_a ("b"/"a")
    warm = {key: np.full(n, np.nan) for key in ("gb", "ga", "lb", "la")}
    atol = _BISECT_ATOL_REL * r_cohen
    active = np.arange(n)
    while active.size:
        k = _PROBES
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


def semi_elastic_threshold(
    radius: ArrayLike, sigma0: ArrayLike, rate: ArrayLike, dim: int
) -> NDArray[np.float64]:
    """The least p_A at which Thm 3.2 certifies distance ``radius`` (the condition of
    :func:`certified_radius` at R = radius): where a bound on p_A reaches the radius.

    The condition is monotone in p_A (a smaller p_B = 1 − p_A lowers ξ). With
    u = log(1 − p_A), it fails at Cohen's u = log Φ(−R/σ0) (never enough for rate > 0,
    Thm B.6); steps of 1, 2, 4, … below it find a u where it holds (down to
    1 − p_A = 10⁻³⁰⁰), and bisection narrows that bracket to a width of
    :data:`_THRESHOLD_LOG_WIDTH` (a relative 10⁻⁹ on 1 − p_A). The returned value is one at
    which the condition was verified. Each row is solved on its own (the same value
    whatever else is in the batch). ``rate == 0`` and ``radius == 0`` give Cohen's Φ(R/σ0)
    exactly; a radius not certified even at p_A = 1 − 10⁻³⁰⁰ gives ``inf`` (never reached).
    """
    r, s0, rt = (np.asarray(v, dtype=np.float64) for v in np.broadcast_arrays(radius, sigma0, rate))
    shape = r.shape
    r, s0, rt = r.ravel(), s0.ravel(), rt.ravel()
    out = sc.ndtr(r / s0)
    search = np.nonzero((rt > 0) & (r > 0))[0]
    if search.size == 0:
        return out.reshape(shape)
    floor = np.log(1e-300)
    hi = np.log(sc.ndtr(-r[search] / s0[search]))  # log(1 − p): fails here
    warm = {key: np.full(search.size, np.nan) for key in ("gb", "ga", "lb", "la")}

    def holds(log_q: NDArray[np.float64], rows: NDArray[np.int64]) -> NDArray[np.bool_]:
        at = search[rows]
        return _condition(r[at], s0[at], rt[at], np.exp(log_q), None, int(dim), warm, rows)

    step = np.ones(search.size)
    lo = np.maximum(hi - step, floor)
    ok = np.zeros(search.size, dtype=bool)
    rows = np.arange(search.size)
    while rows.size:  # expand the bracket below Cohen's until the condition holds
        ok[rows] = holds(lo[rows], rows)
        rows = rows[~ok[rows] & (lo[rows] > floor)]
        hi[rows], step[rows] = lo[rows], 2 * step[rows]
        lo[rows] = np.maximum(hi[rows] - step[rows], floor)
    rows = np.flatnonzero(ok)
    while rows.size:
        mid = (lo[rows] + hi[rows]) / 2
        holds_mid = holds(mid, rows)
        lo[rows] = np.where(holds_mid, mid, lo[rows])
        hi[rows] = np.where(holds_mid, hi[rows], mid)
        rows = rows[hi[rows] - lo[rows] > _THRESHOLD_LOG_WIDTH]
    out[search] = np.where(ok, -np.expm1(lo), np.inf)
    return out.reshape(shape)
