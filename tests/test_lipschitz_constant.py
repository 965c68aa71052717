"""Bergstrom et al. Lemma 3 / Thm 2: R(p), L, and the Lemma 3 precondition check."""

import subprocess
import sys

import mpmath as mp
import numpy as np
import pytest
from scipy import special

from harness.foundation.errors import ParameterError
from plugins import lipschitz
from plugins.lipschitz import constant

DIMS = [1, 2, 3, 10, 784, 3072, 150528]
PROBS = ["1e-12", "1e-7", "0.3", "0.5", "0.9", "1-1e-7", "1-1e-12"]


def _float_p(text: str) -> float:
    return 1.0 - float(text[2:]) if text.startswith("1-") else float(text)


def _mp_log_ratio(p: float, d: int) -> mp.mpf:
    """log R(p) at 50 digits, from the definitions alone (mpmath, no scipy numerics).

    ε0 solves Q(d/2, ε0/2) = p (upper regularized Γ) or, for p >= 1/2, P(d/2, ε0/2) = 1 − p
    with P from its 1F1 series; Φ⁻¹(p) solves Φ(z) = p; R = (y^k e^{−y}/Γ(k)) / φ(z).
    The float p is taken exactly (1 − p is exact for p >= 1/2).
    """
    with mp.workdps(50):
        k = mp.mpf(d) / 2
        pm = mp.mpf(p)
        qm = 1 - pm
        guess = mp.mpf(float(d))  # start at the mean; solved in log y so y stays positive
        if p < 0.5:

            def tail(y):
                return mp.gammainc(k, y, mp.inf, regularized=True) - pm

            guess = mp.mpf(special.gammainccinv(d / 2, p))
        else:

            def tail(y):
                lower = mp.exp(k * mp.log(y) - y - mp.loggamma(k + 1))
                return lower * mp.hyp1f1(1, k + 1, y, maxterms=10**6) - qm

            guess = mp.mpf(special.gammaincinv(d / 2, 1.0 - p))
        y = mp.exp(mp.findroot(lambda s: tail(mp.exp(s)), mp.log(guess)))
        z0 = mp.mpf(float(special.ndtri(min(p, 1 - p))))
        z = mp.findroot(lambda t: mp.ncdf(t) - min(pm, qm), z0)
        z = z if p < 0.5 else -z
        log_eps_f = k * mp.log(y) - y - mp.loggamma(k)  # ε0·f(ε0) = y^k e^{−y}/Γ(k), y = ε0/2
        log_phi = -(z**2) / 2 - mp.log(2 * mp.pi) / 2
        return log_eps_f - log_phi


@pytest.mark.parametrize("d", DIMS)
def test_ratio_r_matches_mpmath_to_1e_11(d):
    for text in PROBS:
        p = _float_p(text)
        reference = _mp_log_ratio(p, d)
        assert lipschitz.log_ratio_r(p, d) == pytest.approx(float(reference), abs=1e-11)
        assert lipschitz.ratio_r(p, d) == pytest.approx(float(mp.exp(reference)), rel=1e-11)


def test_ratio_r_is_vectorized_and_rejects_p_outside_0_1():
    p = np.array([1e-9, 0.5, 1 - 1e-9])
    values = lipschitz.ratio_r(p, 784)
    assert values.shape == (3,)
    assert values == pytest.approx([lipschitz.ratio_r(float(v), 784) for v in p], rel=1e-15)
    for bad in (0.0, 1.0, -0.1, float("nan")):
        with pytest.raises(ParameterError):
            lipschitz.ratio_r(bad, 784)


def test_lipschitz_constant_is_one_over_sigma_without_lipschitz_term():
    # Remark 1: Lip(σ) = 0 recovers standard smoothing's 1/σ, in every dimension
    for d in (1, 784, 150528):
        assert lipschitz.lipschitz_constant(0.37, 0.0, 1e-7, d) == 1 / 0.37


def test_lipschitz_constant_matches_equation_5_with_mpmath():
    for d, sigma_min, lip, p_min in [(784, 0.65, 0.5, 1e-7), (150528, 0.25, 0.1, 1e-12)]:
        r = mp.exp(_mp_log_ratio(p_min, d))
        expected = float((1 + 2 * lip * r) / sigma_min)
        assert lipschitz.lipschitz_constant(sigma_min, lip, p_min, d) == pytest.approx(
            expected, rel=1e-11
        )


def test_paper_settings_give_l_near_35_and_radius_cap_near_0_15():
    L = lipschitz.lipschitz_constant(0.65, 0.5, 1e-7, 784)
    cap = (special.ndtri(1 - 1e-7) - special.ndtri(1e-7)) / (2 * L)
    assert 34.0 < L < 35.5
    assert 0.14 < cap < 0.16


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(sigma_min=0.0, lip_sigma=0.5, p_min=1e-7, dim=10),
        dict(sigma_min=0.5, lip_sigma=-1.0, p_min=1e-7, dim=10),
        dict(sigma_min=0.5, lip_sigma=0.5, p_min=0.5, dim=10),
        dict(sigma_min=0.5, lip_sigma=0.5, p_min=0.0, dim=10),
        dict(sigma_min=0.5, lip_sigma=0.5, p_min=1e-7, dim=0),
    ],
)
def test_lipschitz_constant_rejects_invalid_arguments(kwargs):
    with pytest.raises(ParameterError):
        lipschitz.lipschitz_constant(**kwargs)


@pytest.mark.parametrize("d", [1, 2, 784, 150528])
def test_lemma3_precondition_holds_on_a_dense_grid(d):
    lipschitz.check_lemma3(1e-12, d)
    p, q = constant.lemma3_grid(1e-12)
    assert p[0] == pytest.approx(1e-12, rel=1e-12) and q[-1] == pytest.approx(1e-12, rel=1e-12)
    assert np.max(np.diff(np.log(p) - np.log(q))) <= 0.0100001  # spacing in log-odds


def test_lemma3_derivative_sign_agrees_with_mpmath_differences():
    d = 784
    for p in (1e-10, 0.01, 0.5, 0.97, 1 - 1e-10):
        h = min(p, 1 - p) * 1e-3
        slope = _mp_log_ratio(p + h, d) - _mp_log_ratio(p - h, d)
        sign = constant._dlog_ratio_sign(np.array([p]), np.array([1 - p]), d)[0]
        assert sign == np.sign(float(slope)) == -1


def test_lemma3_check_refuses_when_r_is_not_decreasing(monkeypatch):
    honest = constant._log_ratio_r_pq

    def bumped(p, q, dim):  # a local increase of R near p = 0.2
        return honest(p, q, dim) + 0.5 * np.exp(-(((special.logit(p) + 1.4) / 0.1) ** 2))

    monkeypatch.setattr(constant, "_log_ratio_r_pq", bumped)
    with pytest.raises(ParameterError, match="Lemma 3"):
        lipschitz.check_lemma3(1e-7, 784)


def test_lemma3_check_refuses_when_the_derivative_is_positive(monkeypatch):
    monkeypatch.setattr(constant, "_dlog_ratio_sign", lambda p, q, d: np.where(p > 0.9, 1.0, -1.0))
    with pytest.raises(ParameterError, match="not decreasing"):
        lipschitz.check_lemma3(1e-7, 784)


def test_plugin_import_is_lazy():
    code = (
        "import sys, plugins.lipschitz as m; "
        "assert 'plugins.lipschitz.constant' not in sys.modules; "
        "assert 'scipy' not in sys.modules and 'torch' not in sys.modules; "
        "assert m.lipschitz_constant(2.0, 0.0, 0.1, 3) == 0.5"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
