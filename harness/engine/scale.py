"""A diagonal noise scale: σ(x) per input dimension, and the ellipsoid it certifies.

A σ-provider may answer, per input, a scale σ_1 … σ_d > 0 (one per input dimension)
instead of one σ: the harness then smooths with anisotropic Gaussian noise
x + Σ(x)^{1/2}·ε, Σ = diag(σ_1², …, σ_d²), ε drawn exactly as for a scalar σ (the noise
contract, :mod:`harness.engine.sampling`) and multiplied coordinate by coordinate. A
scale is held in float32, the precision the engine draws x + σ_i·ε_i in, so the
recorded scale is exactly the one the samples were drawn at; a scale of c in every
dimension draws exactly the samples of the scalar σ = c (bit for bit on a CPU).

What it certifies (Eiras et al., ANCER, TMLR 2022, Thm 1, the anisotropic form of Cohen
et al. 2019, Thm 1: for ε ~ N(0, Σ) the smoothed classifier is constant on
{δ : ‖Σ^{-1/2}δ‖₂ < Φ⁻¹(p_A)} when p_B <= 1 − p_A): with κ = Φ⁻¹(p_A_lower),

- the ellipsoid with semi-axes κ·σ_i (:func:`ellipsoid_region`), whose volume-equivalent
  radius, ANCER's *proxy radius*, is κ·(∏σ_i)^{1/d} (:func:`geometric_mean`): a measure
  of the region, never an ℓ2 radius;
- the largest ℓ2 ball inside it, of radius κ·min_i σ_i (:func:`smallest_axis`): Cohen's
  radius at σ_min, the certificate's ``sigma`` and ``radius``.

A certificate's draws record the scale it was drawn at (:func:`encode_scale`: the
float32 values little-endian in base64, 4/3·4·d bytes, 4.2 KB for a 784-pixel input):
evidence that S0 and a board's verifier re-derive from without any other file.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import numpy as np

SCALE_DTYPE = np.dtype("<f4")
"""How a scale is held and recorded: little-endian float32, the engine's precision."""
ELLIPSOID = "ellipsoid"
"""The region kind of an anisotropic Gaussian certificate (:func:`ellipsoid_region`)."""


def as_scale(sigma: np.ndarray, count: int) -> np.ndarray | None:
    """``sigma`` as a diagonal scale [count, d] in float32 when it holds one (an array of
    two or more dimensions: [count, d] or [count, *input_shape]); None for one σ per input."""
    if np.ndim(sigma) < 2:
        return None
    return np.ascontiguousarray(np.asarray(sigma).reshape(count, -1), dtype=SCALE_DTYPE)


def smallest_axis(scale: np.ndarray) -> np.ndarray:
    """min_i σ_i of each row of ``scale`` [B, d] (float64, exact): the ℓ2 ball's σ."""
    return np.asarray(scale, dtype=SCALE_DTYPE).min(axis=1).astype(np.float64)


def geometric_mean(scale: np.ndarray) -> np.ndarray:
    """(∏_i σ_i)^{1/d} of each row of ``scale`` [B, d] (float64): exp of the mean log, so
    that a product of thousands of axes neither overflows nor underflows."""
    scale = np.asarray(scale, dtype=np.float64)
    return np.exp(np.log(scale).mean(axis=1))


def ellipsoid_region(scale: np.ndarray, factor: float) -> dict[str, Any]:
    """The certified region of one input drawn at ``scale`` [d] with κ = ``factor``: the
    ellipsoid {δ : ‖Σ^{-1/2}δ‖₂ <= κ} with semi-axes κ·σ_i (κ recorded, the axes are κ
    times the recorded scale) and its proxy radius κ·(∏σ_i)^{1/d} (ANCER, §4)."""
    factor = float(factor)
    proxy = factor * float(geometric_mean(np.asarray(scale)[None])[0])
    return {"kind": ELLIPSOID, "factor": factor, "proxy_radius": proxy}


def encode_scale(scale: np.ndarray) -> str:
    """One input's scale [d] as recorded: its float32 bytes, little-endian, in base64."""
    row = np.ascontiguousarray(np.asarray(scale, dtype=SCALE_DTYPE).reshape(-1))
    return base64.b64encode(row.tobytes()).decode("ascii")


def decode_scale(text: str) -> np.ndarray:
    """The scale [d] (float32) of :func:`encode_scale`'s record; a ValueError if it is not one."""
    if not isinstance(text, str):
        raise ValueError(f"a recorded scale is a base64 string, got {type(text).__name__}")
    raw = base64.b64decode(text.encode("ascii"), validate=True)
    if len(raw) % SCALE_DTYPE.itemsize:
        raise ValueError(f"a recorded scale of {len(raw)} bytes is not float32 values")
    return np.frombuffer(raw, dtype=SCALE_DTYPE).copy()


def recorded_scale(draws: Mapping[str, Any] | None) -> np.ndarray | None:
    """The scale a certificate's base draws (``draws["base"]``, :meth:`~harness.engine.
    draws.Draws.record`) were made at, or None where they were made at one σ."""
    base = (draws or {}).get("base") or {}
    return None if base.get("scale") is None else decode_scale(base["scale"])


def drawn_with_scale(rows: list[Mapping[str, Any]]) -> bool:
    """Whether any of the stored certificates ``rows`` was drawn at a diagonal scale."""
    return any(((r.get("draws") or {}).get("base") or {}).get("scale") is not None for r in rows)


def noise_levels(sigma: list[float], scale: list[str] | None) -> np.ndarray:
    """What a sampling engine draws a request's inputs at: their recorded scales [B, d]
    (:func:`encode_scale` records), or their σ [B] where none is recorded."""
    if scale is None:
        return np.asarray(sigma, dtype=np.float64)
    return np.stack([decode_scale(text) for text in scale]) if scale else np.zeros((0, 1))


def relative_deviation(a: np.ndarray, b: np.ndarray) -> float:
    """max_i |a_i − b_i| / |b_i| of two scales (inf where their shapes differ)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    return float(np.max(np.abs(a - b) / np.abs(b))) if a.size else 0.0


def recorded_scales(bases: list[Mapping[str, Any]]) -> list[str] | None:
    """The recorded scales of stored base draws, as a replay request carries them (None
    where none was drawn at a scale: the request is then as before scales existed)."""
    scales = [base.get("scale") for base in bases]
    return None if all(s is None for s in scales) else scales
