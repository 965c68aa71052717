"""S3 at a diagonal scale that changes inside the ball: the Neyman–Pearson worst case of
two anisotropic Gaussians computed by inverting the characteristic function, held to exact
computations (1-D, 2-D by a conditional quadrature, and Súkeník et al. 2022, Thm 2.3,
when one scale is a multiple of the other), and the check on σ-providers answering a
scale [B, 1, 28, 28]."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.optimize import brentq
from scipy.stats import norm

from harness.mathematics.worstcase import xi
from harness.mathematics.worstcase.anisotropic import (
    normal_worst_case,
    quadratic_terms,
    worst_case,
)


def exact_worst_case_1d(delta: float, s0: float, s1: float, p: float) -> float:
    """min P1(A) over A with P0(A) >= p, P0 = N(0, s0²), P1 = N(delta, s1²), from scratch:
    log p1 − log p0 = qa·z² + qb·z + qc, so S_t is an interval, its complement or a
    half-line, whose masses are differences of Φ; t solved by bisection."""
    qa, qb = 1 / (2 * s0**2) - 1 / (2 * s1**2), delta / s1**2
    qc = np.log(s0 / s1) - delta**2 / (2 * s1**2)

    def mass(t: float, mean: float, s: float) -> float:
        if qa == 0:
            edge = (t - qc) / qb
            return norm.cdf((edge - mean) / s) if qb > 0 else norm.sf((edge - mean) / s)
        disc = qb**2 - 4 * qa * (qc - t)
        if disc <= 0:
            return 0.0 if qa > 0 else 1.0
        r1, r2 = sorted(((-qb - np.sqrt(disc)) / (2 * qa), (-qb + np.sqrt(disc)) / (2 * qa)))
        inside = norm.cdf((r2 - mean) / s) - norm.cdf((r1 - mean) / s)
        return inside if qa > 0 else 1 - inside

    t = brentq(lambda t: mass(t, 0.0, s0) - p, -200, 200, xtol=1e-13)
    return float(mass(t, delta, s1))


def _assert_holds(worst, exact: float) -> None:
    """The computed worst case within 1e-6 of the exact one, which its bounds hold."""
    assert worst.lower <= exact <= worst.upper, (worst, exact)
    assert worst.upper - worst.lower < 2e-6 and abs(worst.value - exact) < 1e-6


@pytest.mark.parametrize(
    ("delta", "s0", "s1", "p"),
    [(0.3, 0.5, 0.6, 0.9), (0.3, 0.5, 0.4, 0.9), (0.2, 0.5, 0.5, 0.99), (0.0, 0.5, 0.8, 0.8),
     (-0.4, 0.3, 0.25, 0.95)],
)  # fmt: skip
def test_the_exact_one_dimensional_worst_case(delta, s0, s1, p):
    """One axis: |φ| decays like u^{-1/2}, so the tail is QAWF's (a fixed scale: Gaussian)."""
    exact = exact_worst_case_1d(delta, s0, s1, p)
    _assert_holds(worst_case(np.array([delta]), np.array([s0]), np.array([s1]), p), exact)
    if s0 == s1:  # a fixed scale: Cohen's worst case Φ(Φ⁻¹(p) − |δ|/σ)
        assert exact == pytest.approx(norm.cdf(norm.ppf(p) - abs(delta) / s0), abs=1e-9)


def _quadratic_mass(qa: float, qb: float, r: float) -> float:
    """P(qa·v² + qb·v <= r), v ~ N(0, 1): an interval, its complement or a half-line."""
    if qa == 0:
        return norm.cdf(r / qb) if qb > 0 else norm.sf(r / qb)
    disc = qb * qb + 4 * qa * r
    if disc <= 0:
        return 0.0 if qa > 0 else 1.0
    r1, r2 = sorted(((-qb - np.sqrt(disc)) / (2 * qa), (-qb + np.sqrt(disc)) / (2 * qa)))
    inside = norm.cdf(r2) - norm.cdf(r1)
    return inside if qa > 0 else 1 - inside


@pytest.mark.parametrize(
    ("delta", "s0", "s1", "p"),
    [((0.5, 0.3), (0.4, 0.6), (0.41, 0.58), 0.99), ((1.0, 0.2), (0.5, 0.6), (0.52, 0.61), 0.95),
     ((0.3, -0.1), (0.3, 0.6), (0.25, 0.7), 0.9)],
)  # fmt: skip
def test_the_exact_two_dimensional_worst_case(delta, s0, s1, p):
    """Two axes whose scales move apart (ANCER's rows on cone-2): P(L <= t) given v_2 is a
    one-dimensional mass, integrated over v_2 by adaptive quadrature."""
    delta, s0, s1 = (np.array(v) for v in (delta, s0, s1))

    def cdf(terms, t: float) -> float:
        (a1, a2), (b1, b2), c = terms

        def inner(v: float) -> float:
            return norm.pdf(v) * _quadratic_mass(a1, b1, t - c - a2 * v * v - b2 * v)

        return quad(inner, -12, 12, limit=500, epsabs=1e-10, epsrel=1e-10)[0]

    under0, under1 = quadratic_terms(delta, s0, s1)
    exact = cdf(under1, brentq(lambda t: cdf(under0, t) - p, -100, 100, xtol=1e-14))
    _assert_holds(worst_case(delta, s0, s1, p), exact)


@pytest.mark.parametrize("c", [0.97, 1.0, 1.03, 1.1])
def test_a_multiple_of_the_scale_is_sukeniks_non_central_chi2(c):
    """s1 = c·s0: whitened by s0 it is isotropic, σ0 = 1, σ1 = c at distance ‖δ/s0‖, where
    the worst case is 1 − ξ (Súkeník et al. 2022, Thm 2.3; the harness's quadrature), at
    50 and at 784 axes."""
    rng = np.random.default_rng(3)
    dim = 50
    s0 = rng.uniform(0.2, 0.6, dim)
    delta = rng.standard_normal(dim)
    delta *= 0.25 / np.linalg.norm(delta)
    exact = 1 - float(xi(np.linalg.norm(delta / s0), 1.0, c, 0.99, dim))
    _assert_holds(worst_case(delta, s0, c * s0, 0.99), exact)
    big, step = np.tile(s0, 16)[:784], np.tile(delta, 16)[:784] / 4
    exact = 1 - float(xi(np.linalg.norm(step / big), 1.0, c, 0.99, 784))
    _assert_holds(worst_case(step, big, c * big, 0.99), exact)
    # the normal approximation, which only ranks points, is close at d = 784
    approx = normal_worst_case(step, big, c * big, np.array([0.99]))[0]
    assert approx == pytest.approx(exact, abs=0.03)


def test_a_worst_case_far_below_one_half_is_bounded_below_it():
    """784 axes each 10% wider at x1: the sets are told apart (Thm 2.4's curse)."""
    s0 = np.full(784, 0.25)
    worst = worst_case(np.zeros(784), s0, 1.1 * s0, 0.99)
    assert worst.upper < 0.2


def test_a_scale_changing_by_a_few_percent_near_the_edge_is_placed_exactly():
    """ANCER's rows: 1–3 % changes at 784 axes near the ball's edge, the worst case within
    a hundredth of 1/2, placed on its side by a bound far tighter (Monte Carlo could not)."""
    rng = np.random.default_rng(1)
    for p, change in [(0.99, 0.02), (0.999, 0.01), (0.9999, 0.03)]:
        s0 = rng.uniform(0.2, 0.6, 784)
        s1 = s0 * np.exp(change * rng.standard_normal(784))
        delta = np.zeros(784)
        delta[np.argmin(s0)] = 0.98 * s0.min() * norm.ppf(p)
        worst = worst_case(delta, s0, s1, p)
        assert worst.lower <= worst.value <= worst.upper and worst.upper - worst.lower < 1e-6
        assert 0.4 < worst.value < 0.6


def test_equal_gaussians_give_p_exactly():
    worst = worst_case(np.zeros(4), np.ones(4), np.ones(4), 0.9)
    assert worst.lower == worst.value == worst.upper == 0.9
