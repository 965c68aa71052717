"""The worst case between two different anisotropic Gaussians, by inverting a characteristic
function.

A certificate at x0 smoothed with P0 = N(x0, diag s0²) rests on P0(f = A) >= p (the
certificate's p_A lower bound); at x1 = x0 + δ smoothed with P1 = N(x1, diag s1²) the
least P1(f = A) over every base classifier f with that evidence is, by the
Neyman–Pearson lemma (Neyman & Pearson 1933; Súkeník et al. 2022, Lemma 2.1), P1(S_t)
for the likelihood-ratio set S_t = {z : L(z) <= t}, L = log p1 − log p0, with
P0(S_t) = p. For isotropic noise this is Súkeník et al. 2022, Thm 2.3 (a non-central χ²,
:func:`~harness.mathematics.worstcase.xi`); for diagonal noise L is a sum over the axes of
independent quadratics, a generalized χ² with no closed form, whose distribution function
is computed here numerically, with an error bound.

Per axis, in the standardized coordinate e = (z − x0)/s0 of P0 (e ~ N(0, 1)) and
u = (z − x1)/s1 of P1 (u ~ N(0, 1)), with a = s0/s1 and b = δ/s1,

    L = Σ_i log a_i + e_i²/2 − (a_i e_i − b_i)²/2          (z under P0)
      = Σ_i log a_i + (b_i + u_i)²/(2a_i²) − u_i²/2         (z under P1),

each of the form C + Σ_i A_i v_i² + B_i v_i in a standard normal v
(:func:`quadratic_terms`), whose characteristic function is (Imhof 1961)

    φ(u) = e^{iuC} Π_i (1 − 2iA_i u)^{−1/2} exp(−B_i² u² / (2(1 − 2iA_i u))),

on the principal branch: Re(1 − 2iA_i u) = 1, so log(1 − 2iA_i u) = ½ log(1 + 4A_i²u²)
− i·atan(2A_i u) is continuous in u. By Gil-Pelaez (1951), for L continuous,

    P(L <= t) = 1/2 − (1/π) ∫_0^∞ Im[e^{−iut} φ(u)] / u du.

:class:`GeneralizedChi2` integrates it in w = σu (σ the standard deviation of L, the phase
centred at its mean): the 20-point Gauss–Legendre rule on panels of [0, U] short enough
that e^{−iwz} turns by at most :data:`PANEL_TURN` radians on each, the error bound
:data:`INFLATE` times Σ|G20 − G10| over the panels (the 10-point rule's error, far above
the 20-point rule's whose value is used) plus float64 rounding, plus the tail beyond U,
bounded rigorously: for u >= U each factor of |φ| decreases in u, and for any set S of k
axes with A_i ≠ 0, (1 + 4A_i²u²)^{−1/4} <= (1 + 4A_i²U²)^{−1/4} q_i^{−1/4} (U/u)^{1/2} with
q_i = 4A_i²U²/(1 + 4A_i²U²), so ∫_U^∞ |φ|/u <= |φ(U)| Π_S q_i^{−1/4} · 2/k; with the axes
where A_i = 0, ∫_U^∞ |φ|/u <= |φ(U)|/(U² Σ B_i²). Where no such bound is small by
U = 32 (a few axes: |φ| then decays like u^{−k/2}), the tail is integrated by QUADPACK's
QAWF (Fourier integrals to infinity, :func:`scipy.integrate.quad`) once the asymptotic
linear phase of φ is taken out, its error estimate inflated likewise.

:func:`worst_case` solves P0(S_t) = p for t (Brent) and brackets the true root between
t_lo and t_hi where the bound places the computed P0 on either side of p (P0(S_t) grows
with t; Cantelli's inequality brackets it where nothing closer does), so the worst case
P1(S_t) lies between the lower bound on P1 at t_lo and the upper one at t_hi. A t more
than :data:`CANTELLI` standard deviations of L under P1 from its mean is bounded by
Cantelli's inequality instead (P1 <= 1/(1 + z²) below the mean). No randomness: the
bounds fail only if the quadrature's error estimate does.
"""

from __future__ import annotations

import cmath
import math
from dataclasses import dataclass

import numpy as np
from scipy.integrate import quad as integrate
from scipy.optimize import brentq
from scipy.special import ndtr, ndtri

RULES = tuple(np.polynomial.legendre.leggauss(n) for n in (20, 10))
"""Gauss–Legendre nodes and weights on [−1, 1]: the rule used and the one it is checked by."""
PANEL_TURN = 2.0
"""Radians e^{−iwz} (and the phase of the standardized φ, about 1 per unit w) turn over at
most on one panel, which both rules resolve to far below the bounds sought."""
REACH = (8.0, 12.0, 16.0, 24.0, 32.0)
"""Candidate ends U of the panels in w = σu: the first whose tail bound is below TAIL."""
TAIL = 1e-13
INFLATE = 10.0
"""Factor on the quadrature error estimates (QUADPACK's are estimates, not bounds)."""
CANTELLI = 10.0
"""Beyond this many standard deviations from the mean, Cantelli's inequality bounds P1."""
MAX_REACH = 64.0
"""Largest |t − mean|/σ the P0 root is searched to before Cantelli's bracket is used."""
CHUNK = 256
"""Nodes evaluated at a time ([CHUNK, d] float64: 1.6 MB at d = 784)."""


def quadratic_terms(
    delta: np.ndarray, s0: np.ndarray, s1: np.ndarray
) -> tuple[tuple[np.ndarray, np.ndarray, float], tuple[np.ndarray, np.ndarray, float]]:
    """L = C + Σ_i A_i v_i² + B_i v_i with v ~ N(0, I) under P0 and under P1: ((A, B, C)
    under P0, (A, B, C) under P1), for one displacement ``delta`` and scales ``s0``,
    ``s1`` [d] (float64; C summed over the axes)."""
    delta, s0, s1 = (np.asarray(v, dtype=np.float64).reshape(-1) for v in (delta, s0, s1))
    a, b = s0 / s1, delta / s1
    log_a = float(np.sum(np.log(s0) - np.log(s1)))
    under0 = ((1.0 - a * a) / 2.0, a * b, log_a - float(np.sum(b * b)) / 2.0)
    under1 = (
        (1.0 / (a * a) - 1.0) / 2.0,
        b / (a * a),
        log_a + float(np.sum(b * b / (a * a))) / 2.0,
    )
    return under0, under1


def normal_worst_case(
    delta: np.ndarray, s0: np.ndarray, s1: np.ndarray, p_lower: np.ndarray
) -> np.ndarray:  # fmt: skip
    """The worst case P1(S_t) with L taken normal under P0 and P1 (its exact means and
    variances; central limit over the axes), for rows [P, d] of ``delta``, ``s0``, ``s1``
    and ``p_lower`` [P]: an approximation that ranks candidate points, never a verdict."""
    delta, s0, s1 = (np.atleast_2d(np.asarray(v, dtype=np.float64)) for v in (delta, s0, s1))
    a, b = s0 / s1, delta / s1
    log_a = np.log(s0).sum(axis=1) - np.log(s1).sum(axis=1)
    a0, b0 = (1.0 - a * a) / 2.0, a * b
    a1, b1 = (1.0 / (a * a) - 1.0) / 2.0, b / (a * a)
    mean0 = log_a - (b * b).sum(axis=1) / 2.0 + a0.sum(axis=1)
    mean1 = log_a + (b * b / (a * a)).sum(axis=1) / 2.0 + a1.sum(axis=1)
    var0 = (2.0 * a0 * a0 + b0 * b0).sum(axis=1)
    var1 = (2.0 * a1 * a1 + b1 * b1).sum(axis=1)
    t = mean0 + np.sqrt(var0) * ndtri(np.asarray(p_lower, dtype=np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (t - mean1) / np.sqrt(var1)
    return np.where(var1 > 0, ndtr(z), np.where(t >= mean1, 1.0, 0.0))


class GeneralizedChi2:
    """P(L <= mean + z·sd) for L = C + Σ_i A_i v_i² + B_i v_i, v ~ N(0, I), and a bound on
    its error, by Gil-Pelaez inversion (module docstring), for |z| up to ``reach``."""

    def __init__(self, terms: tuple[np.ndarray, np.ndarray, float], reach: float) -> None:
        quad, lin = (np.asarray(v, dtype=np.float64).reshape(-1) for v in terms[:2])
        used = (quad != 0) | (lin != 0)
        self.quad, self.lin = quad[used], lin[used]
        self.mean, self.sd = _moments(terms)
        if not self.sd > 0:
            raise ValueError("L is constant (P1 = P0): its distribution function is a step")
        self.reach, self._stripped = float(reach), {}
        ends = [(end, self._tail_bound(end)) for end in REACH]
        end, self.tail = next(((e, b) for e, b in ends if b <= TAIL), (REACH[0], None))
        width = PANEL_TURN / (self.reach + 1.0)
        edges = np.linspace(0.0, end, math.ceil(end / width) + 1)
        self.end, self.half = end, (edges[1] - edges[0]) / 2
        mids = (edges[:-1] + edges[1:]) / 2
        self.w = [mids[:, None] + self.half * x[None, :] for x, _ in RULES]
        self.weights = [self.half * wt for _, wt in RULES]
        self.psi, bound = [], []
        for w in self.w:
            psi, size = self._psi(w.ravel())
            self.psi.append(psi.reshape(w.shape))
            bound.append(size.reshape(w.shape))
        # float64 rounding: each ψ to (len + 4)·eps times its phase and log-modulus sizes
        eps = np.finfo(np.float64).eps
        size = bound[0] + self.w[0] * self.reach + 1.0
        self.rounding = float(np.sum(self.weights[0] * np.abs(self.psi[0]) / self.w[0]
                                     * (len(self.quad) + 4) * eps * size)) / np.pi  # fmt: skip

    def _log_psi(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """log ψ at u [n] (ψ(u) = φ(u)·e^{−iu·mean}) as its real and imaginary parts, and
        the sizes of the terms summed (for the rounding bound)."""
        re, im, size = (np.zeros(len(u)) for _ in range(3))
        a, b2 = self.quad[None, :], self.lin[None, :] ** 2
        for start in range(0, len(u), CHUNK):
            v = u[start : start + CHUNK, None]
            s = 4.0 * a * a * v * v
            real = np.log1p(s) / 4.0 + b2 * v * v / (2.0 * (1.0 + s))
            imag = np.arctan(2.0 * a * v) / 2.0 - a * v - a * b2 * v**3 / (1.0 + s)
            part = slice(start, start + len(v))
            re[part], im[part] = -real.sum(axis=1), imag.sum(axis=1)
            size[part] = real.sum(axis=1) + np.abs(imag).sum(axis=1)
        return re, im, size

    def _psi(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """ψ at w = σu [n] and the sizes of the terms of its logarithm."""
        re, im, size = self._log_psi(w / self.sd)
        return np.exp(re + 1j * im), size

    def _tail_bound(self, end: float) -> float:
        """A bound on (1/π) ∫_end^∞ |ψ(w)|/w dw (module docstring), inf where none."""
        u = end / self.sd
        log_size = self._log_psi(np.array([u]))[0][0]
        s = 4.0 * self.quad**2 * u * u
        q = np.sort(s[s > 0] / (1.0 + s[s > 0]))[::-1]
        options = [np.inf]
        if len(q):
            k = np.arange(1, len(q) + 1)
            options.append(float(np.min(np.log(2.0 / k) - np.cumsum(np.log(q)) / 4.0)))
        gauss = float(np.sum(self.lin[self.quad == 0] ** 2))
        if gauss > 0:
            options.append(-math.log(gauss * u * u))
        return math.exp(log_size + min(options)) / math.pi

    def cdf(self, z: float) -> tuple[float, float]:
        """(P(L <= mean + z·sd) computed, a bound on its error), |z| <= reach."""
        panels = []
        for w, weights, psi in zip(self.w, self.weights, self.psi, strict=True):
            panels.append(np.sum(weights * np.imag(np.exp(-1j * w * z) * psi) / w, axis=1))
        integral = float(panels[0].sum())
        error = INFLATE * float(np.abs(panels[0] - panels[1]).sum()) / np.pi + self.rounding
        if self.tail is not None:
            error += self.tail
        else:
            tail, tail_error = self._qawf(z)
            integral, error = integral + tail, error + INFLATE * tail_error / np.pi
        return 0.5 - integral / np.pi, error

    def _qawf(self, z: float) -> tuple[float, float]:
        """∫_end^∞ Im[e^{−iwz} ψ(w)]/w dw by QUADPACK (QAWF) and its error estimate: per
        axis with A ≠ 0, −B²u²/(2(1 − 2iAu)) = −iuB²/(4A) + iuB²/(4A(1 − 2iAu)), so ψ =
        e^{iwω} g(w) with ω = −(Σ A + Σ B²/(4A))/σ and g free of any phase rate at
        infinity: a Fourier integral at the frequency z − ω."""
        nonzero = self.quad != 0
        omega = -(np.sum(self.quad) + np.sum(self.lin[nonzero] ** 2 / (4 * self.quad[nonzero])))
        nu = z - float(omega) / self.sd
        a, b2 = self.quad[nonzero], self.lin[nonzero] ** 2
        gauss = float(np.sum(self.lin[~nonzero] ** 2))
        seen = self._stripped  # g(w)/w at the abscissae asked so far (both weights ask them)

        def g(w: float) -> complex:  # log ψ less iwω: no phase rate at infinity
            if w not in seen:
                u = w / self.sd
                s = 4.0 * a * a * u * u
                re = -np.sum(np.log1p(s) / 4.0 + b2 * u * u / (2.0 * (1.0 + s))) - gauss * u * u / 2
                im = np.sum(np.arctan(2.0 * a * u) / 2.0 + u * b2 / (4.0 * a * (1.0 + s)))
                seen[w] = cmath.exp(complex(re, im)) / w
            return seen[w]

        if abs(nu) < 1e-6:
            value, err = integrate(lambda w: (np.exp(-1j * nu * w) * g(w)).imag, self.end,
                                   np.inf, limit=200)  # fmt: skip
            return value, err
        cos, cos_err = integrate(lambda w: g(w).imag, self.end, np.inf, weight="cos",
                                 wvar=abs(nu), limlst=100)  # fmt: skip
        sin, sin_err = integrate(lambda w: g(w).real, self.end, np.inf, weight="sin",
                                 wvar=abs(nu), limlst=100)  # fmt: skip
        return cos - math.copysign(1.0, nu) * sin, cos_err + sin_err


def _moments(terms: tuple[np.ndarray, np.ndarray, float]) -> tuple[float, float]:
    """Mean C + Σ A and standard deviation (Σ 2A² + B²)^{1/2} of C + Σ A v² + B v."""
    quad, lin, const = terms
    return float(const + np.sum(quad)), float(np.sqrt(np.sum(2 * quad**2 + lin**2)))


@dataclass(frozen=True)
class WorstCase:
    """The worst case min P1(f = A) over f with P0(f = A) >= p: ``value`` computed, and
    ``lower`` <= worst case <= ``upper`` (the quadrature's and the root's errors)."""

    value: float
    lower: float
    upper: float


def worst_case(delta: np.ndarray, s0: np.ndarray, s1: np.ndarray, p_lower: float) -> WorstCase:
    """The worst case at x1 = x0 + ``delta`` smoothed at ``s1`` of a certificate at x0
    smoothed at ``s0`` with P0(f = A) >= ``p_lower`` in (0, 1) (module docstring), or the
    trivial bounds [0, 1] where t lies beyond :data:`MAX_REACH` standard deviations. L is
    continuous unless P1 = P0 (then it is 0 and the worst case p, returned as such)."""
    p = float(p_lower)
    if not 0 < p < 1:
        raise ValueError(f"p_lower must lie in (0, 1) for a worst case, got {p}")
    under0, under1 = quadratic_terms(delta, s0, s1)
    if not (np.any(under0[0]) or np.any(under0[1])):
        return WorstCase(p, p, p)
    # Cantelli: P0(L <= mean − kσ) <= 1/(1 + k²) and P0(L <= mean + kσ) >= k²/(1 + k²)
    safe_lo, safe_hi = -math.sqrt((1 - p) / p), math.sqrt(p / (1 - p))
    hi = min(safe_hi, 2 * abs(float(ndtri(p))) + 4)
    while True:
        law0 = GeneralizedChi2(under0, max(hi, -safe_lo))
        if hi >= min(safe_hi, MAX_REACH) or law0.cdf(hi)[0] >= p:
            break
        hi = min(2 * hi, safe_hi, MAX_REACH)

    def gap(z: float) -> float:
        return law0.cdf(z)[0] - p

    if not (gap(safe_lo) < 0 < gap(hi)):  # the root out of reach: nothing is shown
        return WorstCase(0.5, 0.0, 1.0)
    root = brentq(gap, safe_lo, hi, xtol=1e-13)
    lo, up = safe_lo, (hi if law0.cdf(hi)[0] - law0.cdf(hi)[1] >= p else safe_hi)
    steps = max(law0.cdf(root)[1], 1e-13 * (1 + abs(root))) * 4.0 ** np.arange(24)
    for step in steps:
        if root - step > lo:
            computed, error = law0.cdf(root - step)
            if computed + error <= p:
                lo = root - step
                break
    for step in steps:
        if root + step < min(up, hi):
            computed, error = law0.cdf(root + step)
            if computed - error >= p:
                up = root + step
                break
    mean1, sd1 = _moments(under1)
    z1 = [(law0.mean + z * law0.sd - mean1) / sd1 for z in (lo, root, up)]
    law1 = GeneralizedChi2(under1, min(CANTELLI, max(abs(z) for z in z1)))

    def bounds(z: float) -> tuple[float, float]:
        if z < -CANTELLI:
            return 0.0, 1 / (1 + z * z)
        if z > CANTELLI:
            return z * z / (1 + z * z), 1.0
        computed, error = law1.cdf(z)
        return max(0.0, computed - error), min(1.0, computed + error)

    value = law1.cdf(z1[1])[0] if abs(z1[1]) <= CANTELLI else sum(bounds(z1[1])) / 2
    return WorstCase(min(1.0, max(0.0, value)), bounds(z1[0])[0], bounds(z1[2])[1])
