"""The ratio R(p) of Lemma 3, the Lipschitz constant L of Theorem 2, and Lemma 3's precondition.

Bergstrom, Sager, Anderson, "Lipschitz σ-networks": for ε0(p) = F⁻¹_χ²_d(1 − p) (eq. 4)

    R(p) = ε0(p)·f_χ²_d(ε0(p)) / φ(Φ⁻¹(p))                                 (Lemma 3)
    L    = (1/σ_min)·(1 + 2·Lip(σ)·R(p_min))                              (Thm 2, eq. 5)

Numerical formulation (all in log space, accurate for d up to 150528 and p down to 1e-12
and beyond). With k = d/2 and y = ε0/2, ε0·f_χ²_d(ε0) = y^k e^{−y}/Γ(k) = k·dpois(k; y),
and Loader's saddle-point form dpois(k; y) = exp(−stirlerr(k) − bd0(k, y))/√(2πk) gives

    log R(p) = ½·log k − stirlerr(k) − bd0(k, y) + Φ⁻¹(p)²/2,

where stirlerr(k) = log Γ(k+1) − (k+½)·log k + k − ½·log 2π and
bd0(k, y) = k·log(k/y) + y − k = k·(u − log1p(u)), u = (y − k)/k, are evaluated without
cancellation (series for small arguments). ε0 is computed from whichever tail is small:
ε0 = 2·Q⁻¹(k, p) for p < ½ and ε0 = 2·P⁻¹(k, 1 − p) otherwise (regularized incomplete
gamma inverses), and Φ⁻¹(p) = −Φ⁻¹(1 − p) for p > ½, so p near 0 and near 1 are both
resolved to full relative precision. (The lgamma-based log-density would lose ~1e-10 to
cancellation at d = 150528; this form does not.)
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from harness import ParameterError

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_LOGIT_STEP = 0.01
"""Spacing in log-odds of the grid on which Lemma 3's precondition is checked."""


def _stirlerr(k: np.ndarray) -> np.ndarray:
    """log Γ(k+1) − (k+½)·log k + k − ½·log 2π (Stirling's remainder), k > 0."""
    k = np.asarray(k, dtype=np.float64)
    small = k < 16.0
    ks = np.where(small, k, 16.0)
    direct = special.gammaln(ks + 1.0) - (ks + 0.5) * np.log(ks) + ks - _HALF_LOG_2PI
    kl = np.where(small, 16.0, k)
    inv2 = 1.0 / (kl * kl)
    series = (
        1.0 / 12 - inv2 * (1.0 / 360 - inv2 * (1.0 / 1260 - inv2 * (1.0 / 1680 - inv2 / 1188)))
    ) / kl
    return np.where(small, direct, series)


def _bd0(k: float, y: np.ndarray) -> np.ndarray:
    """k·log(k/y) + y − k = k·(u − log(1 + u)), u = (y − k)/k (Loader's deviance), k, y > 0.

    For |u| <= 1/4 the alternating series Σ_{j>=2} (−u)^j/j (no cancellation); otherwise
    u − log(y/k) with the ratio y/k formed directly (so y ≪ k keeps its precision).
    """
    y = np.asarray(y, dtype=np.float64)
    u = (y - k) / k
    small = np.abs(u) <= 0.25
    us = np.where(small, u, 0.0)
    series = np.zeros_like(us)
    power = us * us
    for j in range(2, 60):  # 0.25**60 / 60 is far below double precision
        series += (power / j) if j % 2 == 0 else -(power / j)
        power = power * us
    ratio = np.where(small, 1.0, y / k)
    return k * np.where(small, series, u - np.log(ratio))


def _check_dim(dim: int) -> float:
    if isinstance(dim, bool) or not isinstance(dim, int | np.integer) or dim < 1:
        raise ParameterError(f"dim must be a positive integer, got {dim!r}")
    return float(dim)


def _tails(p: np.ndarray, q: np.ndarray, dim: float) -> tuple[np.ndarray, np.ndarray]:
    """(y = ε0/2, z = Φ⁻¹(p)) from p and its exact complement q = 1 − p."""
    k = dim / 2.0
    lower = p < 0.5
    y = np.where(
        lower,
        special.gammainccinv(k, np.where(lower, p, 0.5)),
        special.gammaincinv(k, np.where(lower, 0.5, q)),
    )
    z = np.where(
        lower, special.ndtri(np.where(lower, p, 0.5)), -special.ndtri(np.where(lower, 0.5, q))
    )
    return y, z


def _log_ratio_r_pq(p: np.ndarray, q: np.ndarray, dim: float) -> np.ndarray:
    k = dim / 2.0
    y, z = _tails(p, q, dim)
    return 0.5 * math.log(k) - _stirlerr(k) - _bd0(k, y) + 0.5 * z * z


def _as_probability(p) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(p, dtype=np.float64)
    if not np.all((p > 0.0) & (p < 1.0)):
        raise ParameterError(f"p must lie in the open interval (0, 1), got {p!r}")
    return p, 1.0 - p  # 1 − p is exact for p >= ½ (Sterbenz); used only there


def log_ratio_r(p, dim: int) -> np.ndarray | float:
    """log R(p) of Lemma 3 for χ²_dim (vectorized over p in (0, 1))."""
    d = _check_dim(dim)
    p, q = _as_probability(p)
    out = _log_ratio_r_pq(p, q, d)
    return float(out) if out.ndim == 0 else out


def ratio_r(p, dim: int) -> np.ndarray | float:
    """R(p) = ε0(p)·f_χ²_d(ε0(p)) / φ(Φ⁻¹(p)), ε0(p) = F⁻¹_χ²_d(1 − p) (Lemma 3, eq. 4)."""
    return np.exp(log_ratio_r(p, dim))


def lipschitz_constant(sigma_min: float, lip_sigma: float, p_min: float, dim: int) -> float:
    """L = (1/σ_min)·(1 + 2·Lip(σ)·R(p_min)): Lipschitz constant of Φ⁻¹∘ḡ_i (Thm 2, eq. 5)."""
    if not (isinstance(sigma_min, int | float) and 0.0 < sigma_min < math.inf):
        raise ParameterError(f"sigma_min must be a positive number, got {sigma_min!r}")
    if not (isinstance(lip_sigma, int | float) and 0.0 <= lip_sigma < math.inf):
        raise ParameterError(f"lip_sigma must be a finite number >= 0, got {lip_sigma!r}")
    check_p_min(p_min)
    if lip_sigma == 0:
        return 1.0 / sigma_min  # Remark 1 (also avoids 0·R)
    return (1.0 + 2.0 * lip_sigma * ratio_r(p_min, dim)) / sigma_min


def check_p_min(p_min: float) -> float:
    """Return ``p_min`` if it lies in (0, ½) as Lemma 3 and Thm 2 require, else raise."""
    if not (isinstance(p_min, int | float) and 0.0 < p_min < 0.5):
        raise ParameterError(f"p_min must lie in (0, 1/2), got {p_min!r}")
    return float(p_min)


def _dlog_ratio_sign(p: np.ndarray, q: np.ndarray, dim: float) -> np.ndarray:
    """Sign of d/dp log R(p) = −(k − y)/(k·dpois(k; y)) + z/φ(z) (proof of Lemma 3).

    With y = ε0/2 and z = Φ⁻¹(p); the two terms are compared through their logarithms, so
    neither 1/dpois nor 1/φ overflows in the tails.
    """
    k = dim / 2.0
    y, z = _tails(p, q, dim)
    log_dpois = -_stirlerr(k) - _bd0(k, y) - 0.5 * math.log(2.0 * math.pi * k)
    with np.errstate(divide="ignore"):
        log_a = np.log(np.abs(k - y)) - math.log(k) - log_dpois
        log_b = np.log(np.abs(z)) + 0.5 * z * z + _HALF_LOG_2PI
    top = np.maximum(log_a, log_b)
    top = np.where(np.isfinite(top), top, 0.0)
    value = -np.sign(k - y) * np.exp(log_a - top) + np.sign(z) * np.exp(log_b - top)
    return np.sign(value)


def lemma3_grid(p_min: float) -> tuple[np.ndarray, np.ndarray]:
    """(p, 1 − p) on a grid of spacing 0.01 in log-odds spanning [p_min, 1 − p_min]."""
    t_min = float(special.logit(check_p_min(p_min)))
    count = max(2001, math.ceil(-2.0 * t_min / _LOGIT_STEP) + 1)
    t = np.linspace(t_min, -t_min, count)
    return special.expit(t), special.expit(-t)


def check_lemma3(p_min: float, dim: int) -> None:
    """Lemma 3's precondition: R strictly decreasing on [p_min, 1 − p_min] for χ²_dim.

    Checked on a dense log-odds grid (:func:`lemma3_grid`) twice: log R must strictly
    decrease between consecutive grid points, and its derivative (proof of Lemma 3) must
    be negative at every grid point. Raises :class:`ParameterError` otherwise: Thm 2's L
    then does not bound the Lipschitz constant of Φ⁻¹∘ḡ and no certificate may be issued.
    """
    d = _check_dim(dim)
    p, q = lemma3_grid(p_min)
    log_r = _log_ratio_r_pq(p, q, d)
    steps = np.diff(log_r)
    slope = _dlog_ratio_sign(p, q, d)
    bad = ~np.isfinite(log_r)
    bad[1:] |= ~(steps < 0)
    bad |= ~(slope < 0)
    if bad.any():
        where = p[np.argmax(bad)]
        raise ParameterError(
            f"Lemma 3's precondition fails: R(p) is not decreasing on [p_min, 1 - p_min] = "
            f"[{p_min:g}, {1 - p_min:g}] for dimension {dim} (first at p = {where:.6g}); "
            "Theorem 2's Lipschitz constant does not hold there, so no certificate is issued; "
            "use a larger p_min"
        )
