"""S4 (a): pairs of certified ℓ2 balls with different predictions that intersect.

A point in both balls would have to be classified as both, so at least one of the two
certificates is false (Súkeník et al. 2022, App. C); a greedy matching of the pairs
counts certificates that are false at least. The balls are those of the stored radii,
whatever noise the certificates were drawn at (one σ or a diagonal scale: the ℓ2 ball of
the smallest axis); where a certificate claims an ellipsoid, the regions compared are the
ellipsoids (:mod:`harness.audit.ellipsoid_intersections`)."""

from __future__ import annotations

import numpy as np
import torch

from harness.audit.ellipsoid_intersections import meeting_ellipsoids
from harness.audit.scaled_regions import ellipsoid_axes
from harness.foundation.certificate import ABSTAIN


def intersecting_pairs(points: torch.Tensor, radii: torch.Tensor, predictions: torch.Tensor):
    """Pairs (i, j), i < j, with different predictions and ‖x_i − x_j‖ < R_i + R_j.

    Returns (i, j, distance, overlap) tensors, most overlapping first.
    """
    flat = points.flatten(1).double()
    dist = torch.cdist(flat, flat)
    overlap = radii[:, None] + radii[None, :] - dist
    # balls that only touch do not intersect (open balls); allow rounding of d − R_i
    mask = (predictions[:, None] != predictions[None, :]) & (overlap > 1e-9 * (1 + dist))
    mask &= torch.triu(torch.ones_like(mask), diagonal=1)
    i, j = torch.nonzero(mask, as_tuple=True)
    order = torch.argsort(overlap[i, j], descending=True)
    return i[order], j[order], dist[i, j][order], overlap[i, j][order]


def _matching(i: torch.Tensor, j: torch.Tensor) -> int:
    """Size of a greedy matching of the pairs: at least that many certificates are false."""
    used: set[int] = set()
    size = 0
    for a, b in zip(i.tolist(), j.tolist(), strict=True):
        if a not in used and b not in used:
            used.update((a, b))
            size += 1
    return size


def intersections(certs: list[dict], inputs: torch.Tensor) -> dict:
    """The intersecting pairs of certified regions: ℓ2 balls, or where a certificate claims
    an ellipsoid, the ellipsoids (:mod:`harness.audit.ellipsoid_intersections`)."""
    keep = [k for k, c in enumerate(certs) if c["prediction"] != ABSTAIN and c["radius"] > 0]
    if len(keep) < 2:
        return {"certificates": len(keep), "count": 0}
    axes = [ellipsoid_axes(certs[k]) for k in keep]
    if any(a is not None for a in axes):
        return _ellipsoid_intersections(certs, inputs, keep, axes)
    radii = torch.tensor([certs[k]["radius"] for k in keep], dtype=torch.float64)
    preds = torch.tensor([certs[k]["prediction"] for k in keep])
    i, j, dist, _ = intersecting_pairs(inputs[torch.tensor(keep)].cpu(), radii, preds)
    out: dict = {"certificates": len(keep), "count": len(i), "false_at_least": _matching(i, j)}
    if len(i):
        a, b = keep[int(i[0])], keep[int(j[0])]
        out["example"] = {
            "inputs": [certs[a]["input_id"], certs[b]["input_id"]],
            "predictions": [certs[a]["prediction"], certs[b]["prediction"]],
            "radii": [certs[a]["radius"], certs[b]["radius"]],
            "distance": float(dist[0]),
        }
    return out


def _ellipsoid_intersections(certs: list[dict], inputs: torch.Tensor, keep: list[int],
                             axes: list) -> dict:  # fmt: skip
    """:func:`intersections` where some certificate claims an ellipsoid: each certificate's
    region is its ellipsoid, or its ball (every semi-axis its radius)."""
    centres = inputs[torch.tensor(keep)].cpu().flatten(1).double().numpy()
    axes = np.stack([a if a is not None else np.full(centres.shape[1], certs[k]["radius"])
                     for k, a in zip(keep, axes, strict=True)])  # fmt: skip
    preds = np.array([certs[k]["prediction"] for k in keep])
    pairs = meeting_ellipsoids(centres, axes, preds)
    i = torch.tensor([p[0] for p in pairs], dtype=torch.long)
    j = torch.tensor([p[1] for p in pairs], dtype=torch.long)
    out: dict = {"certificates": len(keep), "count": len(pairs), "false_at_least": _matching(i, j),
                 "regions": "ellipsoids"}  # fmt: skip
    if pairs:
        a, b, depth = keep[pairs[0][0]], keep[pairs[0][1]], pairs[0][2]
        out["example"] = {
            "inputs": [certs[a]["input_id"], certs[b]["input_id"]],
            "predictions": [certs[a]["prediction"], certs[b]["prediction"]],
            "radii": [certs[a]["radius"], certs[b]["radius"]],
            "distance": float(np.linalg.norm(centres[pairs[0][0]] - centres[pairs[0][1]])),
            "witness_depth": depth,
        }
    return out
