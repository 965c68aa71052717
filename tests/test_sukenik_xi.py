"""Tests for harness.mathematics.worstcase (Súkeník et al. 2022, §2-§3, App. B.5/B.6/F).

Every numerical check compares against an independent computation:

* an mpmath reference (``_mp_*`` below) that evaluates Thm 2.3 literally in the
  paper's (non-centrality, argument) parametrisation: the non-central chi-square
  CDF and density as one-dimensional integrals over ``V ~ chi2_{N-1}`` with
  mpmath's tanh-sinh quadrature in 20+ significant digits (precision raised with
  the non-centrality, so ``sqrt(x - v) - sqrt(lam)`` is computed directly without
  any reformulation), and the quantile by a safeguarded Newton iteration.  The
  reference itself is validated against ``scipy.stats.ncx2``, the Poisson-mixture
  series and the closed-form half-space limit;
* mpmath root-finding for the thresholds of Thm 2.4, Cor. 2.5 and Fig. 3;
* closed forms (Cohen's radius, half-space limit).
"""

from __future__ import annotations

import functools
import math

import mpmath
import numpy as np
import pytest
from scipy import special as sc
from scipy import stats

from harness.mathematics.worstcase import (
    certified_radius,
    cohen_radius,
    is_certified,
    max_sigma_ratio,
    min_sigma_ratio,
    min_sigma_ratio_simple,
    practical_sigma_ratio_threshold,
    practical_sigma_ratio_threshold_upper,
    xi,
    xi_greater,
    xi_less,
)

mp = mpmath.mp

# --------------------------------------------------------------------------
# mpmath reference (independent evaluation path)
# --------------------------------------------------------------------------


def _dps_for(lam, n: int) -> int:
    """Working precision: 20 significant digits (30 for n <= 3, where it is cheap)
    plus the digits eaten by the cancellation in sqrt(x - v) - sqrt(lam)."""
    return 18 + math.ceil(math.log10(1.0 + float(lam)) / 2.0)


def _mp_cdf_pdf(n: int, lam, x):
    """(P(||Z + mu e1||^2 <= x), its x-derivative) for Z ~ N(0, I_n), mu^2 = lam.

    Conditioning on V = ||Z_perp||^2 ~ chi2_{n-1}:
        F(x)  = int_0^x f(v) [Phi(r - mu) - Phi(-r - mu)] dv,         r = sqrt(x - v)
        F'(x) = int_0^x f(v) [phi(r - mu) + phi(r + mu)] / (2 r) dv,
    integrated in u = sqrt(v); both are packed into one complex-valued tanh-sinh
    quadrature.
    """
    lam = mpmath.mpf(lam)
    x = mpmath.mpf(x)
    mu = mpmath.sqrt(lam)
    if x <= 0:
        return mpmath.mpf(0), mpmath.mpf(0)
    if n == 1:
        r = mpmath.sqrt(x)
        cdf = mpmath.ncdf(r - mu) - mpmath.ncdf(-r - mu)
        pdf = (mpmath.npdf(r - mu) + mpmath.npdf(r + mu)) / (2 * r)
        return cdf, pdf
    k = n - 1
    hk = mpmath.mpf(k) / 2
    logc = -hk * mpmath.log(2) - mpmath.loggamma(hk)

    def integrand(u):  # v = u^2, dv = 2u du (removes the v^(k/2-1) endpoint singularity)
        v = u * u
        if v <= 0 or v >= x:
            return mpmath.mpc(0)
        r = mpmath.sqrt(x - v)
        dens = 2 * mpmath.exp((k - 1) * mpmath.log(u) - v / 2 + logc)
        cdf = mpmath.ncdf(r - mu) - mpmath.ncdf(-r - mu)
        pdf = (mpmath.npdf(r - mu) + mpmath.npdf(r + mu)) / (2 * r)
        return mpmath.mpc(dens * cdf, dens * pdf)

    sd = mpmath.sqrt(2 * k)
    lo = max(mpmath.mpf(0), k - 14 * sd - 60)  # chi2_k mass outside [lo, hi] is < 1e-30
    hi = min(x, k + 14 * sd + 60)
    if hi <= lo:
        return mpmath.mpf(0), mpmath.mpf(0)
    pts = {lo, hi}
    for j in (-8, 0, 8):
        v = k + j * sd
        if lo < v < hi:
            pts.add(v)
    for c in (-6, 0, 6):  # where Phi(r - mu) switches
        if mu + c > 0:
            v = x - (mu + c) ** 2
            if lo < v < hi:
                pts.add(v)
    res = mpmath.quad(integrand, [mpmath.sqrt(v) for v in sorted(pts)])
    return res.real, res.imag


def _mp_quantile(n: int, lam, target):
    """x with F(x) = target: Newton in q = sqrt(x) - sqrt(lam), kept inside a bracket.

    Started from scipy's double-precision quantile where that is available (moderate
    non-centrality), else from the normal approximation (which is excellent in the
    near-half-space regime of huge non-centrality)."""
    lam = mpmath.mpf(lam)
    target = mpmath.mpf(target)
    mu = mpmath.sqrt(lam)
    x0 = None
    if lam < 1e6:
        with np.errstate(all="ignore"):
            t = float(target)
            guess = stats.chi2.ppf(t, n) if lam == 0 else stats.ncx2.ppf(t, n, float(lam))
        if np.isfinite(guess) and guess > 0:
            x0 = mpmath.mpf(guess)
    if x0 is None:
        z = mpmath.sqrt(2) * mpmath.erfinv(2 * target - 1)
        x0 = lam + n + z * mpmath.sqrt(2 * n + 4 * lam)
    q = mpmath.sqrt(x0) - mu if x0 > 0 else -mu / 2 + mpmath.mpf("0.5")
    q_lo, q_hi = -mu, mpmath.inf
    for _ in range(200):
        x = (mu + q) ** 2
        cdf, pdf = _mp_cdf_pdf(n, lam, x)
        diff = cdf - target
        if diff < 0:
            q_lo = max(q_lo, q)
        else:
            q_hi = min(q_hi, q)
        slope = pdf * 2 * (mu + q)
        step = -diff / slope if slope > 0 else mpmath.mpf(1)
        new = q + max(min(step, mpmath.mpf(4)), mpmath.mpf(-4))
        if not (q_lo < new < q_hi):
            new = (q_lo + q_hi) / 2 if q_hi != mpmath.inf else q + 4
        if abs(new - q) < mpmath.mpf(10) ** -9 * (1 + abs(q)):  # quadratic: next error ~1e-18
            q = new
            break
        q = new
    else:  # pragma: no cover - reference failure
        raise RuntimeError("mpmath quantile did not converge")
    return (mu + q) ** 2


@functools.cache
def _mp_xi(a: float, s0: float, s1: float, p_b: float, n: int, greater: bool) -> float:
    """Thm 2.3 literally, in mpmath:

    xi> = chi2_N(s1^2 a^2/(s0^2-s1^2)^2, s0^2/s1^2 * chi2qf_N(s0^2 a^2/(s0^2-s1^2)^2, p_b))
    xi< = 1 - chi2_N(s1^2 a^2/(s1^2-s0^2)^2, s0^2/s1^2 * chi2qf_N(s0^2 a^2/(s1^2-s0^2)^2, 1-p_b))
    """
    with mpmath.workdps(60):  # exact for the binary inputs: no cancellation in s0^2 - s1^2
        a_, s0_, s1_ = mpmath.mpf(a), mpmath.mpf(s0), mpmath.mpf(s1)
        d2 = (s0_**2 - s1_**2) ** 2
        lam0 = s0_**2 * a_**2 / d2
        lam1 = s1_**2 * a_**2 / d2
    with mpmath.workdps(_dps_for(lam0, n)):
        target = mpmath.mpf(p_b) if greater else 1 - mpmath.mpf(p_b)
        x0 = _mp_quantile(n, lam0, target)
        val, _ = _mp_cdf_pdf(n, lam1, x0 * s0_**2 / s1_**2)
        return float(val if greater else 1 - val)


@functools.cache
def _mp_xi_at_zero(s: float, p_b: float, n: int, greater: bool) -> float:
    """a = 0: the ball is centred at x0 and everything is a central chi2 (Thm 2.3, delta = 0)."""
    with mpmath.workdps(30):
        target = mpmath.mpf(p_b) if greater else 1 - mpmath.mpf(p_b)
        q = _central_quantile(n, target)
        val = _mp_chi2_cdf(n, q / mpmath.mpf(s) ** 2)
        return float(val if greater else 1 - val)


def _mp_chi2_cdf(n: int, x):
    """Central chi2_n CDF with mpmath's regularized incomplete gamma function
    (upper-tail form above the mean, where the lower series converges slowly)."""
    half = mpmath.mpf(n) / 2
    if x / 2 <= half:
        return mpmath.gammainc(half, 0, x / 2, regularized=True)
    return 1 - mpmath.gammainc(half, x / 2, mpmath.inf, regularized=True)


def _central_quantile(n: int, target):
    """chi2_n quantile: Newton on mpmath's regularized lower gamma function, started
    from scipy's double-precision value (so gammainc is only evaluated in the bulk)."""
    half = mpmath.mpf(n) / 2
    target = mpmath.mpf(target)
    lognorm = half * mpmath.log(2) + mpmath.loggamma(half)
    x = mpmath.mpf(stats.chi2.ppf(float(target), n))
    for _ in range(100):
        f = _mp_chi2_cdf(n, x) - target
        dens = mpmath.exp((half - 1) * mpmath.log(x) - x / 2 - lognorm)
        step = f / dens
        x_new = x - step if x - step > 0 else x / 2
        if abs(x_new - x) < mpmath.mpf(10) ** -25 * x:
            return x_new
        x = x_new
    raise RuntimeError("central chi2 quantile did not converge")  # pragma: no cover


def _mp_poisson_cdf(n: int, lam: float, x: float):
    """Non-central chi2 CDF by its Poisson-mixture series (small lam only)."""
    lam = mpmath.mpf(lam)
    x = mpmath.mpf(x)
    terms = int(lam / 2 + 40 * math.sqrt(lam / 2 + 1) + 60)
    return mpmath.fsum(
        mpmath.exp(-lam / 2 + j * mpmath.log(lam / 2) - mpmath.loggamma(j + 1))
        * mpmath.gammainc(mpmath.mpf(n) / 2 + j, 0, x / 2, regularized=True)
        for j in range(terms)
    )


# --------------------------------------------------------------------------
# the reference is itself correct
# --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "n, lam, x",
    [
        (1, 2.0, 3.0),
        (2, 1.0, 3.0),
        (10, 5.0, 12.0),
        (784, 100.0, 900.0),
        (3072, 400.0, 3400.0),
        (3072, 40.0, 3000.0),
    ],
)
def test_reference_cdf_matches_scipy(n, lam, x):
    with mpmath.workdps(_dps_for(lam, n)):
        cdf, _ = _mp_cdf_pdf(n, lam, x)
    assert float(cdf) == pytest.approx(stats.ncx2.cdf(x, n, lam), abs=1e-13)


def test_reference_cdf_matches_poisson_series_and_density():
    with mpmath.workdps(25):
        for n, lam, x in [(2, 3.0, 4.0), (5, 10.0, 9.0)]:
            cdf, pdf = _mp_cdf_pdf(n, lam, x)
            assert abs(cdf - _mp_poisson_cdf(n, lam, x)) < 1e-18
            num = (
                _mp_cdf_pdf(n, lam, x + mpmath.mpf("1e-8"))[0]
                - _mp_cdf_pdf(n, lam, x - mpmath.mpf("1e-8"))[0]
            ) / (mpmath.mpf("2e-8"))
            assert abs(pdf - num) < 1e-12
            assert float(pdf) == pytest.approx(stats.ncx2.pdf(x, n, lam), rel=1e-12)


def test_reference_xi_matches_half_space_limit():
    # ratio 1 - 1e-12: the worst-case ball is practically Cohen's half-space
    for n, a, p_a in [(784, 1.0, 0.9), (2, 0.3, 0.99)]:
        ref = _mp_xi(a, 1.0, 1.0 - 1e-12, 1.0 - p_a, n, True)
        assert ref == pytest.approx(sc.ndtr(a - sc.ndtri(p_a)), abs=1e-8)


def test_reference_at_zero_matches_general_reference():
    # a -> 0 of the general (non-central) reference equals the central-chi2 one
    assert _mp_xi(1e-9, 1.0, 0.99, 0.1, 784, True) == pytest.approx(
        _mp_xi_at_zero(0.99, 0.1, 784, True), abs=1e-9
    )


# --------------------------------------------------------------------------
# xi vs the mpmath reference
# --------------------------------------------------------------------------
_RATIOS = [0.5, 0.9, 0.999, 0.99999, 1.0 - 1e-9]
_P_AS = [0.6, 0.9, 0.999, 0.999999]
_DIMS = [2, 784, 3072, 150528]


def _cases():
    """One (a, p_a) per (dim, ratio, side), cycling through distances and probabilities.

    Distances are multiples of sigma0 * (1 - ratio) ("small", i.e. inside the
    region where the non-centrality is moderate) and absolute ones ("moderate")."""
    out = []
    i = 0
    for n in _DIMS:
        for ratio in _RATIOS:
            for greater in (True, False):
                p_a = _P_AS[i % 4]
                kind = i % 3
                i += 1
                if kind == 0:
                    a = 0.0
                elif kind == 1:
                    a = 3.0 * (1.0 - ratio)  # small
                else:
                    a = 0.35  # moderate
                out.append((n, ratio, a, p_a, greater))
    return out


@pytest.mark.parametrize("n, ratio, a, p_a, greater", _cases())
def test_xi_matches_mpmath(n, ratio, a, p_a, greater):
    sigma0 = 0.7
    sigma1 = sigma0 * ratio if greater else sigma0 / ratio
    func = xi_greater if greater else xi_less
    got = func(a * sigma0, sigma0, sigma1, p_a, n)
    if a == 0.0:
        ref = _mp_xi_at_zero(sigma1 / sigma0, 1.0 - p_a, n, greater)
    else:
        ref = _mp_xi(a, 1.0, sigma1 / sigma0, 1.0 - p_a, n, greater)
    assert abs(got - ref) <= 1e-6
    assert isinstance(got, float)


@pytest.mark.parametrize(
    "n, ratio, a, p_b, greater",
    [
        (784, 0.95, 0.5, 0.02, True),
        (3072, 1.0 / 0.999, 0.2, 1e-4, False),
        (1, 0.8, 0.7, 0.05, True),
        (1, 1.25, 0.4, 0.3, False),
    ],
)
def test_xi_with_separate_p_b_matches_mpmath(n, ratio, a, p_b, greater):
    func = xi_greater if greater else xi_less
    got = func(a, 1.0, ratio, 0.5, n, p_b=p_b)
    assert abs(got - _mp_xi(a, 1.0, ratio, p_b, n, greater)) <= 1e-6


def test_xi_dim_one_closed_form():
    # N = 1: B is an interval; P0(B) = p_b fixes it, P1(B) follows from Phi directly.
    a, s, p_b = 0.4, 0.7, 0.1
    eps = 1 - s * s
    c = a / eps  # centre of B (sigma0 = 1 units)
    from scipy.optimize import brentq

    r = brentq(lambda r: sc.ndtr(c + r) - sc.ndtr(c - r) - p_b, 0.0, 50.0, xtol=1e-15)
    ref = sc.ndtr((c + r - a) / s) - sc.ndtr((c - r - a) / s)
    assert xi_greater(a, 1.0, s, 1 - p_b, 1) == pytest.approx(ref, abs=1e-10)


# --------------------------------------------------------------------------
# half-space limit and continuity through sigma1 = sigma0
# --------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 784, 3072, 150528])
@pytest.mark.parametrize("p_a", [0.6, 0.999999])
def test_half_space_limit_and_continuity(n, p_a):
    a = np.array([0.0, 1e-6, 0.3, 2.0])
    limit = sc.ndtr(a - sc.ndtri(p_a))
    assert np.all(xi_greater(a, 1.0, 1.0, p_a, n) == limit)
    assert np.all(xi_less(a, 1.0, 1.0, p_a, n) == limit)
    for s in (1.0 - 1e-12, 1.0 - 1e-15):
        assert np.max(np.abs(xi_greater(a, 1.0, s, p_a, n) - limit)) <= 1e-9
    for s in (1.0 + 1e-12, 1.0 + 1e-15):
        assert np.max(np.abs(xi_less(a, 1.0, s, p_a, n) - limit)) <= 1e-9


def test_half_space_limit_with_p_b():
    a, p_b = 0.8, 0.03
    assert xi_greater(a, 2.0, 2.0, 0.9, 784, p_b=p_b) == sc.ndtr(a / 2.0 + sc.ndtri(p_b))


def test_xi_at_zero_distance_is_p_b_when_sigmas_equal():
    assert xi_greater(0.0, 1.0, 1.0, 0.9, 3072) == pytest.approx(0.1, abs=1e-15)


# --------------------------------------------------------------------------
# monotonicity (Lemma F.4, Thm 3.1)
# --------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 784, 3072])
def test_xi_non_decreasing_in_distance(n):
    a = np.linspace(0.0, 3.0, 61)
    for ratio in (0.9, 0.999):
        vals = xi_greater(a, 1.0, ratio, 0.99, n)
        assert np.all(np.diff(vals) >= -1e-10)
        vals = xi_less(a, 1.0, 1.0 / ratio, 0.99, n)
        assert np.all(np.diff(vals) >= -1e-10)


@pytest.mark.parametrize("n", [2, 784, 3072])
def test_theorem_3_1_threshold_monotonicity_in_sigma1(n):
    # Thm 3.1: sigma1 <= sigma2 <= sigma0 and xi>(R, sigma2) > 1/2  =>  xi>(R, sigma1) > 1/2
    # (and the mirror statement for xi<).
    R = np.linspace(0.0, 2.5, 26)[:, None]
    s_lo = np.linspace(0.9, 1.0, 41)[None, :]
    for p_a in (0.9, 0.999):
        g = xi_greater(R, 1.0, s_lo, p_a, n)  # columns: increasing sigma1 towards sigma0
        above = g > 0.5
        # once above 1/2 at some sigma2, stays above for every smaller sigma1
        assert np.all(above[:, :-1] >= above[:, 1:])
        l_ = xi_less(R, 1.0, 1.0 / s_lo, p_a, n)  # columns: decreasing sigma1 towards sigma0
        above = l_ > 0.5
        assert np.all(above[:, :-1] >= above[:, 1:])


# --------------------------------------------------------------------------
# Table 1 and the thresholds of Thm 2.4, Cor 2.5, Fig. 3
# --------------------------------------------------------------------------
_TABLE1 = {
    # dataset dimension: thresholds for p_A = 0.9, 0.99, 0.999, 0.99993
    784: [0.946, 0.924, 0.908, 0.892],  # MNIST 28x28x1
    3072: [0.973, 0.961, 0.953, 0.945],  # CIFAR10 32x32x3
    196608: [0.997, 0.995, 0.994, 0.993],  # ImageNet 3x256x256 (caption of Table 1)
}
_TABLE1_PA = [0.9, 0.99, 0.999, 0.99993]


def _mp_theorem_2_4_root(p_a: float, n: int, upper: bool) -> float:
    """Root of log(z) + 1 - z = 2 log(1 - p_a)/N (z < 1 or z > 1) by mpmath.findroot."""
    with mpmath.workdps(40):
        rhs = 2 * mpmath.log(1 - mpmath.mpf(p_a)) / n
        f = lambda z: mpmath.log(z) + 1 - z - rhs  # noqa: E731
        if upper:
            z = mpmath.findroot(
                f, (mpmath.mpf(1) + mpmath.mpf(10) ** -30, mpmath.mpf(50)), solver="anderson"
            )
            return float(mpmath.sqrt(z * n / (n - 1)))
        z = mpmath.findroot(
            f, (mpmath.mpf(10) ** -30, 1 - mpmath.mpf(10) ** -30), solver="anderson"
        )
        return float(mpmath.sqrt(z))


def test_table_1():
    for n, row in _TABLE1.items():
        got = min_sigma_ratio(_TABLE1_PA, n)
        assert np.all(np.abs(got - np.array(row)) <= 0.001), (n, got)


@pytest.mark.parametrize("n", [1, 2, 784, 3072, 150528, 196608])
@pytest.mark.parametrize("p_a", [0.6, 0.9, 0.99993, 0.999999])
def test_min_sigma_ratio_matches_mpmath_root(n, p_a):
    assert min_sigma_ratio(p_a, n) == pytest.approx(
        _mp_theorem_2_4_root(p_a, n, upper=False), abs=1e-6
    )
    if n > 1:
        assert max_sigma_ratio(p_a, n) == pytest.approx(
            _mp_theorem_2_4_root(p_a, n, upper=True), abs=1e-6
        )
    else:
        assert max_sigma_ratio(p_a, n) == math.inf
    # Corollary 2.5 is a weaker (smaller) version of part 1
    simple = min_sigma_ratio_simple(p_a, n)
    with mpmath.workdps(30):
        inner = 1 - 2 * mpmath.sqrt(-mpmath.log(1 - mpmath.mpf(p_a)) / n)
        ref = float(mpmath.sqrt(inner)) if inner > 0 else 0.0
    assert simple == pytest.approx(ref, abs=1e-12)
    assert simple <= min_sigma_ratio(p_a, n) + 1e-15


@pytest.mark.parametrize("n", [2, 784, 3072, 150528])
@pytest.mark.parametrize("p_a", [0.6, 0.9, 0.999, 0.99993])
def test_below_theoretical_threshold_nothing_certifies(n, p_a):
    lo = min_sigma_ratio(p_a, n)
    hi = max_sigma_ratio(p_a, n)
    # the exact crossing (practical threshold) lies on the certifiable side of the bound
    assert practical_sigma_ratio_threshold(p_a, n) >= lo
    assert practical_sigma_ratio_threshold_upper(p_a, n) <= hi
    for s in (0.999999 * lo, 0.9 * lo):
        assert xi_greater(0.0, 1.0, s, p_a, n) >= 0.5
        assert xi_greater(0.5, 1.0, s, p_a, n) >= 0.5
    for s in (1.000001 * hi, 1.1 * hi):
        assert xi_less(0.0, 1.0, s, p_a, n) >= 0.5


def _mp_practical_threshold(p_a: float, n: int, upper: bool) -> float:
    """Root in s of xi(0) = 1/2 from the central chi2 directly (mpmath).

    xi>(0) = F_n(q / s^2) with F_n(q) = 1 - p_a; xi<(0) = 1 - F_n(q / s^2) with
    F_n(q) = p_a.  F_n(q / s^2) = 1/2 is solved for s by Newton in log s."""
    with mpmath.workdps(30):
        half = mpmath.mpf(n) / 2
        q = _central_quantile(n, mpmath.mpf(p_a) if upper else 1 - mpmath.mpf(p_a))
        lognorm = half * mpmath.log(2) + mpmath.loggamma(half)
        x = _central_quantile(n, mpmath.mpf(1) / 2)  # start at s = sqrt(q / x)
        log_s = (mpmath.log(q) - mpmath.log(x)) / 2
        for _ in range(100):
            y = q * mpmath.exp(-2 * log_s)
            f = _mp_chi2_cdf(n, y) - mpmath.mpf(1) / 2
            dens = mpmath.exp((half - 1) * mpmath.log(y) - y / 2 - lognorm)
            step = f / (dens * (-2 * y))
            log_s -= step
            if abs(step) < mpmath.mpf(10) ** -25:
                break
        return float(mpmath.exp(log_s))


@pytest.mark.parametrize("n", [1, 2, 784, 3072, 150528])
@pytest.mark.parametrize("p_a", [0.6, 0.9, 0.999, 0.999999])
def test_practical_threshold(n, p_a):
    lo = practical_sigma_ratio_threshold(p_a, n)
    hi = practical_sigma_ratio_threshold_upper(p_a, n)
    assert lo == pytest.approx(_mp_practical_threshold(p_a, n, upper=False), rel=1e-10)
    assert hi == pytest.approx(_mp_practical_threshold(p_a, n, upper=True), rel=1e-10)
    assert lo < 1.0 < hi
    assert xi_greater(0.0, 1.0, lo, p_a, n) == pytest.approx(0.5, abs=1e-8)
    assert xi_less(0.0, 1.0, hi, p_a, n) == pytest.approx(0.5, abs=1e-8)


# --------------------------------------------------------------------------
# certified radius (Thm 3.2, Thm B.6)
# --------------------------------------------------------------------------
def test_rate_zero_is_cohen_exactly():
    p_a = np.array([0.5, 0.6, 0.9, 0.999, 0.999999, 0.3])
    sigma0 = np.array([0.12, 0.25, 0.5, 1.0, 0.25, 0.5])
    got = certified_radius(p_a, sigma0, 0.0, 3072)
    want = sigma0 * sc.ndtri(p_a)
    want = np.where(want > 0, want, 0.0)
    assert np.array_equal(got, want)
    assert certified_radius(0.9, 0.25, 0.0, 784) == 0.25 * sc.ndtri(0.9)
    assert cohen_radius(0.9, 0.25) == 0.25 * sc.ndtri(0.9)
    # App. B.5 analogue
    got = certified_radius(0.7, 0.5, 0.0, 784, p_b=0.1)
    assert got == 0.5 / 2 * (sc.ndtri(0.7) - sc.ndtri(0.1))


def test_radius_never_exceeds_cohen_and_is_monotone_in_rate():
    p_a = np.array([0.51, 0.9, 0.999, 0.999999])[:, None, None, None]
    sigma0 = np.array([0.12, 1.0])[None, :, None, None]
    rate = np.array([1e-6, 0.01, 0.1, 1.0])[None, None, :, None]
    dims = np.array([1, 2, 784, 3072])[None, None, None, :]
    r = certified_radius(p_a, sigma0, rate, dims)
    cohen = sigma0 * sc.ndtri(p_a)
    assert r.shape == (4, 2, 4, 4)
    assert np.all(r >= 0.0)
    assert np.all(r <= cohen)
    assert np.all(np.diff(r, axis=2) <= 0.0)  # larger semi-elasticity, smaller radius
    # and the radius approaches Cohen's as rate -> 0
    assert np.allclose(
        r[:, :, 0, :], np.broadcast_to(cohen[:, :, 0, :], r[:, :, 0, :].shape), rtol=1e-3
    )


def test_nothing_certifies_below_one_half():
    assert certified_radius(0.5, 0.25, 0.01, 3072) == 0.0
    assert np.all(certified_radius([0.1, 0.4999], 0.25, 0.01, 784) == 0.0)
    assert certified_radius(0.3, 0.25, 0.01, 784, p_b=0.3) == 0.0
    assert certified_radius(1.0, 0.25, 0.01, 784) == math.inf


def _mp_condition(R: float, sigma0: float, rate: float, p_a: float, n: int) -> bool:
    """Thm 3.2 condition at R with the mpmath reference."""
    s_minus = math.exp(-rate * R)
    s_plus = math.exp(rate * R)
    a = R / sigma0
    if _mp_xi(a, 1.0, s_minus, 1.0 - p_a, n, True) >= 0.5:
        return False
    return _mp_xi(a, 1.0, s_plus, 1.0 - p_a, n, False) < 0.5


@pytest.mark.parametrize(
    "p_a, sigma0, rate, n",
    [(0.9, 0.25, 0.01, 3072), (0.999, 0.5, 0.05, 784), (0.99, 0.25, 0.5, 2)],
)
def test_radius_matches_mpmath_bracket(p_a, sigma0, rate, n):
    """The mpmath reference verifies the bracket [R (1 - 1e-4), R (1 + 1e-4)] (the
    condition is monotone in R, Thm 3.1 + Lemma F.4, so this pins the true radius)."""
    r = certified_radius(p_a, sigma0, rate, n)
    assert 0.0 < r < sigma0 * sc.ndtri(p_a)
    assert _mp_condition(r * (1 - 1e-4), sigma0, rate, p_a, n)
    assert not _mp_condition(r * (1 + 1e-4), sigma0, rate, p_a, n)


def test_radius_relative_tolerance():
    # bisection to ~1e-9: the condition flips within a relative 1e-8 window
    p_a, sigma0, rate, n = 0.99, 0.25, 0.01, 3072
    r = certified_radius(p_a, sigma0, rate, n)
    for R, expect in ((r, True), (r * (1 + 1e-8), False)):
        a = R / sigma0
        ok = (
            xi_greater(a, 1.0, math.exp(-rate * R), p_a, n) < 0.5
            and xi_less(a, 1.0, math.exp(rate * R), p_a, n) < 0.5
        )
        assert ok == expect


def test_a_radius_is_the_same_alone_as_in_a_batch():
    """An input's radius does not depend on what else is solved with it: the certifier
    solves a shard or a round's stopped inputs, S0 a row's certificates at once, and S0
    compares the two (p_A near 1/2 gives the small radii where paths used to part)."""
    rng = np.random.default_rng(1)
    p_a = np.concatenate([rng.uniform(0.5000001, 0.50001, 20), rng.uniform(0.55, 0.999, 30)])
    sigma0 = rng.uniform(0.2, 0.3, 50)
    batch = certified_radius(p_a, sigma0, 0.2, 784)
    alone = [certified_radius(p, s, 0.2, 784) for p, s in zip(p_a, sigma0, strict=True)]
    assert batch.tolist() == alone
    assert certified_radius(p_a[:7], sigma0[:7], 0.2, 784).tolist() == alone[:7]


def test_radius_with_p_b():
    p_a, p_b, sigma0, rate, n = 0.7, 0.1, 0.5, 0.02, 784
    r = certified_radius(p_a, sigma0, rate, n, p_b=p_b)
    cohen = sigma0 / 2 * (sc.ndtri(p_a) - sc.ndtri(p_b))
    assert 0.0 < r <= cohen
    # the App. B.5 rule beats the two-class rule p_b = 1 - p_a whenever p_b < 1 - p_a
    assert r > certified_radius(p_a, sigma0, rate, n)
    # with p_b = 1 - p_a both rules coincide
    assert certified_radius(0.9, 0.25, 0.01, 3072, p_b=0.1) == pytest.approx(
        certified_radius(0.9, 0.25, 0.01, 3072), rel=1e-8
    )
    # App. B.5 condition verified at the returned radius and violated just above it
    for R, expect in ((r, True), (r * (1 + 1e-7), False)):
        a = R / sigma0
        sm, sp = math.exp(-rate * R), math.exp(rate * R)
        g = xi_greater(a, 1.0, sm, p_a, n, p_b=p_b) + xi_greater(a, 1.0, sm, p_a, n, p_b=1 - p_a)
        l_ = xi_less(a, 1.0, sp, p_a, n, p_b=p_b) + xi_less(a, 1.0, sp, p_a, n, p_b=1 - p_a)
        assert (g < 1 and l_ < 1) == expect


def test_app_b5_condition_is_an_interval_in_r():
    """certified_radius assumes (docstring) that the App. B.5 condition is monotone in R."""
    for p_a, p_b, sigma0, rate, n in [(0.6, 0.05, 0.5, 0.05, 784), (0.35, 0.2, 0.25, 0.02, 3072)]:
        r_c = sigma0 / 2 * (sc.ndtri(p_a) - sc.ndtri(p_b))
        R = np.linspace(0.0, r_c, 41)[1:]
        a = R / sigma0
        sm, sp = np.exp(-rate * R), np.exp(rate * R)
        g = xi_greater(a, 1.0, sm, p_a, n, p_b=p_b) + xi_greater(a, 1.0, sm, p_a, n, p_b=1 - p_a)
        l_ = xi_less(a, 1.0, sp, p_a, n, p_b=p_b) + xi_less(a, 1.0, sp, p_a, n, p_b=1 - p_a)
        ok = (g < 1) & (l_ < 1)
        assert ok[0] and not ok[-1]
        assert np.all(ok[:-1] >= ok[1:])  # True ... True False ... False
        r = certified_radius(p_a, sigma0, rate, n, p_b=p_b)
        assert R[ok].max() <= r < R[~ok].min()


def test_is_certified_rules():
    # two-class rule: xi < 1/2; at sigma1 = sigma0 this is Cohen's a < sigma0 Phi^-1(p_a)
    r_c = 0.5 * sc.ndtri(0.9)
    assert is_certified(r_c * 0.999, 0.5, 0.5, 0.9, 784)
    assert not is_certified(r_c * 1.001, 0.5, 0.5, 0.9, 784)
    out = is_certified([0.0, 0.1, 5.0], 1.0, [0.99, 1.01, 1.0], 0.9, 784)
    assert out.tolist() == [
        xi_greater(0.0, 1.0, 0.99, 0.9, 784) < 0.5,
        xi_less(0.1, 1.0, 1.01, 0.9, 784) < 0.5,
        False,
    ]
    # App. B.5 rule at sigma1 = sigma0: a < sigma0/2 (Phi^-1(p_a) - Phi^-1(p_b))
    r_b = 0.5 / 2 * (sc.ndtri(0.6) - sc.ndtri(0.05))
    assert is_certified(r_b * 0.999, 0.5, 0.5, 0.6, 3072, p_b=0.05)
    assert not is_certified(r_b * 1.001, 0.5, 0.5, 0.6, 3072, p_b=0.05)


def test_radius_high_dimension_and_extreme_probability():
    r = certified_radius([0.6, 0.999999999], 0.25, 0.01, 150528)
    assert np.all(r > 0) and np.all(r <= 0.25 * sc.ndtri([0.6, 0.999999999]))


# --------------------------------------------------------------------------
# vectorisation, types and validation
# --------------------------------------------------------------------------
def test_batch_equals_elementwise():
    rng = np.random.default_rng(1)
    a = rng.uniform(0, 2, 12)
    s = rng.uniform(0.95, 1.0, 12)
    p_a = rng.uniform(0.55, 0.9999, 12)
    dims = rng.choice([1, 2, 784, 3072], 12)
    batch = xi_greater(a, 1.0, s, p_a, dims)
    single = [xi_greater(a[i], 1.0, s[i], p_a[i], int(dims[i])) for i in range(12)]
    assert np.allclose(batch, single, rtol=0, atol=1e-12)
    batch = xi_less(a, 1.0, 1 / s, p_a, dims)
    single = [xi_less(a[i], 1.0, 1 / s[i], p_a[i], int(dims[i])) for i in range(12)]
    assert np.allclose(batch, single, rtol=0, atol=1e-12)
    mixed = xi(a, 1.0, np.where(np.arange(12) % 2 == 0, s, 1 / s), p_a, dims)
    for i in range(12):
        f = xi_greater if i % 2 == 0 else xi_less
        assert mixed[i] == pytest.approx(
            f(a[i], 1.0, s[i] if i % 2 == 0 else 1 / s[i], p_a[i], int(dims[i])), abs=1e-12
        )
    sig = rng.uniform(0.1, 1.0, 12)
    batch = certified_radius(p_a, sig, 0.02, dims)
    single = [certified_radius(p_a[i], sig[i], 0.02, int(dims[i])) for i in range(12)]
    assert np.allclose(batch, single, rtol=2e-9, atol=0)


def test_broadcasting_and_scalars():
    out = xi_greater(np.array([[0.1], [0.2]]), 1.0, np.array([0.9, 0.99, 1.0]), 0.9, 784)
    assert out.shape == (2, 3)
    assert isinstance(xi_greater(0.1, 1.0, 0.9, 0.9, 784), float)
    assert isinstance(certified_radius(0.9, 0.25, 0.01, 784), float)
    assert isinstance(min_sigma_ratio(0.9, 784), float)
    assert min_sigma_ratio([0.9, 0.99], [784, 3072]).shape == (2,)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: xi_greater(0.1, 1.0, 0.9, 0.9, 0), "dim"),
        (lambda: xi_greater(0.1, 1.0, 0.9, 0.9, 2.5), "dim"),
        (lambda: xi_greater(0.1, 1.0, 0.9, 0.9, True), "dim"),
        (lambda: xi_greater(0.1, 0.0, 0.9, 0.9, 10), "sigma0"),
        (lambda: xi_greater(0.1, 1.0, -0.9, 0.9, 10), "sigma1"),
        (lambda: xi_greater(0.1, 1.0, 0.9, 1.2, 10), "p_a"),
        (lambda: xi_greater(0.1, 1.0, 0.9, float("nan"), 10), "p_a"),
        (lambda: xi_greater(-0.1, 1.0, 0.9, 0.9, 10), "a"),
        (lambda: xi_greater(0.1, 1.0, 1.1, 0.9, 10), "sigma1 <= sigma0"),
        (lambda: xi_less(0.1, 1.0, 0.9, 0.9, 10), "sigma1 >= sigma0"),
        (lambda: xi_less(0.1, 1.0, 1.1, 0.9, 10, p_b=-0.1), "p_b"),
        (lambda: certified_radius(0.9, 0.25, -0.01, 784), "rate"),
        (lambda: certified_radius(0.9, float("inf"), 0.01, 784), "sigma0"),
        (lambda: min_sigma_ratio(0.9, -3), "dim"),
        (lambda: practical_sigma_ratio_threshold(1.5, 3), "p_a"),
    ],
)
def test_input_validation(call, match):
    with pytest.raises(ValueError, match=match):
        call()
