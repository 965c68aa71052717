"""S4: concrete counterexamples to certificates (DESIGN §8).

(a) Two certified inputs with different predictions whose certified balls intersect:
a point in both balls would have to be classified as both, so one certificate is false.
"""

from __future__ import annotations

import torch

from harness.certificate import ABSTAIN
from harness.soundness.audit import Audit
from harness.soundness.verdict import CheckResult, Verdict

NAME = "counterexamples"


def intersecting_pairs(points: torch.Tensor, radii: torch.Tensor, predictions: torch.Tensor):
    """Pairs (i, j), i < j, with different predictions and ‖x_i − x_j‖ < R_i + R_j.

    Returns (i, j, distance, overlap) tensors, most overlapping first.
    """
    flat = points.flatten(1).double()
    dist = torch.cdist(flat, flat)
    overlap = radii[:, None] + radii[None, :] - dist
    mask = (predictions[:, None] != predictions[None, :]) & (overlap > 0)
    mask &= torch.triu(torch.ones_like(mask), diagonal=1)
    i, j = torch.nonzero(mask, as_tuple=True)
    order = torch.argsort(overlap[i, j], descending=True)
    return i[order], j[order], dist[i, j][order], overlap[i, j][order]


def check_counterexamples(audit: Audit) -> CheckResult:
    certs = audit.certificates
    keep = [k for k, c in enumerate(certs) if c["prediction"] != ABSTAIN and c["radius"] > 0]
    evidence: dict = {"certificates": len(keep)}
    if len(keep) >= 2:
        index = torch.tensor(keep)
        radii = torch.tensor([certs[k]["radius"] for k in keep], dtype=torch.float64)
        preds = torch.tensor([certs[k]["prediction"] for k in keep])
        i, j, dist, _ = intersecting_pairs(audit.inputs[index].cpu(), radii, preds)
        evidence["intersecting_pairs"] = len(i)
        if len(i):
            a, b = keep[int(i[0])], keep[int(j[0])]
            evidence["example"] = {
                "inputs": [certs[a]["input_id"], certs[b]["input_id"]],
                "predictions": [certs[a]["prediction"], certs[b]["prediction"]],
                "radii": [certs[a]["radius"], certs[b]["radius"]],
                "distance": float(dist[0]),
            }
            return CheckResult(
                NAME, Verdict.VIOLATED,
                f"{len(i)} pairs of certified balls with different predictions intersect, e.g. inputs "
                f"{certs[a]['input_id']} and {certs[b]['input_id']} at distance {float(dist[0]):.4g} "
                f"with radii {certs[a]['radius']:.4g} and {certs[b]['radius']:.4g}", evidence,
            )  # fmt: skip
    return CheckResult(
        NAME, Verdict.SOUND, "no intersecting certified balls with different predictions", evidence
    )
