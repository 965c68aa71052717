"""S0's tests of certificates drawn at a diagonal scale, and of the regions they claim.

A certificate drawn at a diagonal scale (:mod:`harness.engine.scale`) records the scale in
its base draws and its smallest axis as its σ; the ℓ2 radius is then re-derived by the
certifier's formula at that σ like any other (for Cohen's formula, σ_min·Φ⁻¹(p_A_lower):
the largest ball inside the ellipsoid, Eiras et al., ANCER, TMLR 2022, Thm 1). Here:

1. ``scale``: the recorded scale decodes to one positive, finite value per input
   dimension, at most SIGMA_MAX, and its smallest axis is the stored σ (exactly: both are
   float32 values);
2. ``ellipsoid``: a region is only claimed by a certificate drawn at a scale that
   certifies a class, of kind ``ellipsoid``, and its κ does not exceed Φ⁻¹ of the bound
   the formula re-derives (the ellipsoid {δ : ‖Σ^{-1/2}δ‖₂ <= κ} of ANCER's Thm 1);
3. ``proxy radius``: its proxy radius does not exceed κ·(∏σ_i)^{1/d} of the recorded
   scale (re-derived with the re-derived κ), nor, exactly, differ from it.

With ``exact`` (a board's verifier), κ must equal the re-derived one too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from scipy.special import ndtri

from harness.engine.scale import ELLIPSOID, geometric_mean, recorded_scale
from harness.foundation.certificate import ABSTAIN
from harness.foundation.protocol import SIGMA_MAX

RELATIVE = 1e-9
"""Relative tolerance of the comparisons (floating-point rounding only), as S0's."""


def scale_tests(
    rows: Sequence[Mapping[str, Any]], inputs: torch.Tensor | None, bound: np.ndarray,
    exact: bool,
) -> list[tuple]:  # fmt: skip
    """S0's tests (name, failing mask, stored, re-derived, message) of the rows' diagonal
    scales and claimed regions against the bound the formula re-derived (``bound``)."""
    count = len(rows)
    dims = int(inputs[0].numel()) if inputs is not None and len(inputs) else None
    smallest = np.full(count, np.nan)
    mean = np.full(count, np.nan)
    scaled = np.zeros(count, dtype=bool)
    for i, row in enumerate(rows):
        try:
            scale = recorded_scale(row.get("draws"))
        except ValueError:
            scaled[i] = True  # recorded, but not a scale: nan fails the test below
            continue
        if scale is None:
            continue
        scaled[i] = True
        valid = bool(np.all(np.isfinite(scale) & (scale > 0) & (scale <= SIGMA_MAX)))
        if valid and len(scale) and (dims is None or len(scale) == dims):
            smallest[i] = float(scale.min())
            mean[i] = float(geometric_mean(scale[None])[0])
    sigma = np.array([float(r["sigma"]) for r in rows])
    regions = [r.get("region") for r in rows]
    claimed = np.array([region is not None for region in regions])
    kind = np.array([isinstance(g, Mapping) and g.get("kind") == ELLIPSOID for g in regions])
    factor = np.array([_number(g, "factor") for g in regions])
    proxy = np.array([_number(g, "proxy_radius") for g in regions])
    certified = np.array([int(r["prediction"]) != ABSTAIN for r in rows])
    bound = np.asarray(bound, dtype=np.float64)
    kappa = np.where(bound > 0.5, ndtri(np.clip(bound, 0.5, 1.0)), 0.0)
    expected = np.where(np.isfinite(mean), mean, np.nan) * kappa
    where = claimed & ~(kind & scaled & certified)
    tests = [
        ("scale", scaled & ~(smallest == sigma), sigma, smallest,
         "stored σ {s} is not the smallest axis {r} of the diagonal scale its draws record "
         f"(nan: not {dims or 'd'} positive, finite values at most {SIGMA_MAX:g})"),
        ("region", where, np.array([_kind(g) for g in regions], dtype=object),
         np.full(count, ELLIPSOID, dtype=object),
         "claims a region {s} where none is certified: a region is an {r} of a certificate "
         "drawn at a diagonal scale that certifies a class"),
        ("ellipsoid", claimed & ~where & ~(factor <= kappa * (1 + RELATIVE)), factor, kappa,
         "claims an ellipsoid of κ = {s}, above Φ⁻¹ of the re-derived bound, {r}"),
        ("proxy radius", claimed & ~where & ~(proxy <= expected * (1 + RELATIVE)), proxy,
         expected, "claims a proxy radius {s}, above κ·(∏σ_i)^(1/d) = {r} of its recorded scale"),
    ]  # fmt: skip
    if exact:
        tests += [
            ("ellipsoid (exact)", claimed & ~where & ~_close(factor, kappa), factor, kappa,
             "claims an ellipsoid of κ = {s}, not Φ⁻¹ of the re-derived bound, {r}"),
            ("proxy radius (exact)", claimed & ~where & ~_close(proxy, mean * factor), proxy,
             mean * factor, "records a proxy radius {s}, not κ·(∏σ_i)^(1/d) = {r}"),
        ]  # fmt: skip
    return tests


def _number(region: Any, key: str) -> float:
    """``region[key]`` as a float (nan where it is none: every comparison then fails)."""
    value = region.get(key) if isinstance(region, Mapping) else None
    real = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if real else np.nan


def _kind(region: Any) -> str | None:
    return region.get("kind") if isinstance(region, Mapping) else None


def _close(stored: np.ndarray, derived: np.ndarray) -> np.ndarray:
    """Equal up to a relative :data:`RELATIVE` (or both within 1e-12 of each other)."""
    scale = np.maximum(RELATIVE * np.maximum(np.abs(stored), np.abs(derived)), 1e-12)
    return np.abs(stored - derived) <= scale
