"""What S4, S5 and the empirical attack read of a row drawn at a diagonal scale.

A certificate drawn at a diagonal scale (:mod:`harness.engine.scale`) records the scale
its draws were made at (``draws["base"]["scale"]``), an ℓ2 ball of its ``radius`` and,
optionally, the ellipsoid {δ : ‖Σ^{-1/2}δ‖₂ <= κ} (``region``, κ its ``factor``), whose
semi-axes are κ·σ_i of the recorded scale (Eiras et al., ANCER, TMLR 2022, Thm 1). The
smoothed classifier at a point x' draws at the scale the σ-provider answers there, so the
checks ask σ at every point they judge; what they read of the stored rows is here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from harness.engine.scale import ELLIPSOID, SCALE_DTYPE, recorded_scale
from harness.foundation.certificate import ABSTAIN
from harness.foundation.errors import IdrsError


def as_drawn(sigma: np.ndarray) -> np.ndarray:
    """σ answered at points as the engine draws at it: a diagonal scale ([P, d] or
    [P, *input_shape]) rounded to float32 (:data:`~harness.engine.scale.SCALE_DTYPE`) and
    flattened to [P, d] in float64; one σ per point unchanged."""
    sigma = np.asarray(sigma)
    if sigma.ndim < 2:
        return sigma.astype(np.float64)
    return sigma.reshape(len(sigma), -1).astype(SCALE_DTYPE).astype(np.float64)


def ellipsoid_axes(row: Mapping[str, Any]) -> np.ndarray | None:
    """The semi-axes κ·σ_i [d] (float64) of the ellipsoid a stored certificate claims, or
    None where it claims none (no region, κ = 0, an abstention). A region of another kind,
    or an ellipsoid without a recorded scale, cannot be judged: an error naming it."""
    region = row.get("region")
    if not region or row["prediction"] == ABSTAIN:
        return None
    if region.get("kind") != ELLIPSOID:
        raise IdrsError(f"input {row['input_id']} claims a region of kind {region.get('kind')!r}; "
                        "S4 judges ℓ2 balls and ellipsoids only")  # fmt: skip
    factor = float(region.get("factor") or 0.0)
    scale = recorded_scale(row.get("draws"))
    if scale is None:
        raise IdrsError(f"input {row['input_id']} claims an ellipsoid but its draws record no "
                        "scale (draws['base']['scale']) to give its axes")  # fmt: skip
    if not (np.isfinite(factor) and factor >= 0):
        raise IdrsError(f"input {row['input_id']} claims an ellipsoid of κ = {factor!r}")
    return None if factor == 0 else factor * scale.astype(np.float64)


def whitened_norm(delta: torch.Tensor, axes: torch.Tensor) -> torch.Tensor:
    """‖δ / axes‖₂ per row in float64: < 1 inside the open ellipsoid of semi-axes ``axes``."""
    flat = delta.detach().double().cpu().reshape(len(delta), -1)
    return (flat / axes.double().cpu().reshape(len(delta), -1)).norm(dim=1)


def held_scales(rows: Sequence[Mapping[str, Any]]) -> torch.Tensor | None:
    """Each stored certificate's recorded scale [B, d] (float32; its σ in every axis where
    it records none), or None where no row was drawn at a scale."""
    scales = [recorded_scale(r.get("draws")) for r in rows]
    known = [s for s in scales if s is not None]
    if not known:
        return None
    dims = len(known[0])
    return torch.from_numpy(np.stack([
        s if s is not None else np.full(dims, r["sigma"], dtype=SCALE_DTYPE)
        for s, r in zip(scales, rows, strict=True)
    ]))  # fmt: skip


def memory_ball_scales(certifier, rows: Sequence[Mapping[str, Any]]) -> dict[int, np.ndarray]:
    """For a memory certifier's rows drawn at a diagonal scale: the scale that is constant in
    each certified ball, by input id, the recorded scale of the row whose σ the memory's
    ``ball_sigmas`` names for that ball (asked with each row's position in place of its σ,
    so the memory's own rule picks the row)."""
    indexed = [{**row, "sigma": float(k)} for k, row in enumerate(rows)]
    owners = certifier.ball_sigmas(indexed)
    scales = held_scales(rows)
    if scales is None:
        raise IdrsError("no row of the memory was drawn at a diagonal scale")
    out = {}
    for input_id, owner in owners.items():
        k = int(owner)
        if k != owner or not 0 <= k < len(rows):
            raise IdrsError(f"the memory's ball_sigmas named no stored row for input {input_id}")
        out[int(input_id)] = scales[k].double().numpy()
    return out
