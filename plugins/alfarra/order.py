"""Order dependence of memory-based certification (Súkeník et al. 2022, App. C.2, Remark C.2).

Alg. 3 of Alfarra et al. (2022) gives answers that depend on the order in which inputs
arrive. :func:`replay_orders` re-runs the memory over random orders of the *same*
stored certificates (no resampling: the inner certificates before the memory are
taken from the evidence) and reports the spread of certified accuracy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from plugins.alfarra.memory import resolve


def raw_certificate(row: Mapping[str, Any]) -> tuple[int, float]:
    """(prediction, radius) of a stored certificate before the memory adjusted it.

    Rows of a ``memory`` method carry them in their evidence; rows of any other
    method (e.g. ``alfarra-ds``) are taken as they are, so the memory can also be
    replayed over certificates that never went through it.
    """
    evidence = row.get("evidence") or {}
    if "memory_raw_prediction" in evidence:
        return int(evidence["memory_raw_prediction"]), float(evidence["memory_raw_radius"])
    return int(row["prediction"]), float(row["radius"])


def pairwise_distances(x: torch.Tensor) -> np.ndarray:
    """‖x_i − x_j‖ in float64, row by row as the memory computes them ([N, N])."""
    flat = x.detach().to(torch.float64).flatten(1)
    return np.stack([torch.linalg.vector_norm(flat - row, dim=1).numpy() for row in flat])


def replay(
    distances: np.ndarray, predictions: np.ndarray, radii: np.ndarray, order: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Alg. 3 over the inputs in ``order``: final (predictions, radii), indexed like the inputs."""
    n = len(predictions)
    out_pred = np.array(predictions, dtype=np.int64)
    out_rad = np.array(radii, dtype=np.float64)
    mem_pred = np.empty(n, dtype=np.int64)
    mem_rad = np.empty(n, dtype=np.float64)
    order = np.asarray(order, dtype=np.int64)
    for k, i in enumerate(order):
        res = resolve(distances[i, order[:k]], mem_pred[:k], mem_rad[:k], predictions[i], radii[i])
        mem_pred[k], mem_rad[k] = res.prediction, res.radius
        out_pred[i], out_rad[i] = res.prediction, res.radius
    return out_pred, out_rad


def certified_accuracy(
    predictions: np.ndarray, radii: np.ndarray, labels: np.ndarray, at: Sequence[float]
) -> np.ndarray:
    """Share of inputs with prediction = label and radius >= r, for each r in ``at``."""
    correct = predictions == labels
    return np.array([np.mean(correct & (radii >= r)) for r in at])


def replay_orders(
    certificates: Iterable[Mapping[str, Any]],
    orders: int,
    radii: Sequence[float],
    seed: int,
    *,
    inputs: torch.Tensor | Mapping[int, torch.Tensor],
) -> dict[str, Any]:
    """Certified accuracy of the memory over ``orders`` random input orders.

    :param certificates: stored rows of ONE method and setting, as
        ``ResultStore.certificates`` yields them (``input_id``, ``label``,
        ``prediction``, ``radius``, ``evidence``); the memory's raw inputs are read
        from the evidence (:func:`raw_certificate`).
    :param orders: P, the number of uniformly random permutations replayed.
    :param radii: the radii r at which certified accuracy is reported.
    :param seed: seed of the permutations (numpy ``default_rng``).
    :param inputs: the inputs by input id, e.g. ``dataset.test_x`` (the test inputs
        of the run) or a mapping id -> tensor.
    :returns: ``{"inputs", "orders", "radii", "min", "median", "max", "recorded",
        "per_order", "acr", "worst_order"}``: min/median/max over the P orders of the
        certified accuracy at each radius, the accuracy in the order the run used (by
        ``memory_position``; ``None`` when the rows have none), the P × len(radii)
        accuracies, min/median/max of the ACR, and the certificates (input ids,
        predictions, radii) of the order with the lowest ACR.
    """
    rows = list(certificates)
    if orders < 1:
        raise ValueError(f"orders must be >= 1, got {orders}")
    if not rows:
        raise ValueError("no certificates to replay")
    ids = [int(r["input_id"]) for r in rows]
    raw = [raw_certificate(r) for r in rows]
    predictions = np.array([p for p, _ in raw], dtype=np.int64)
    base_radii = np.array([r for _, r in raw], dtype=np.float64)
    labels = np.array([int(r["label"]) for r in rows], dtype=np.int64)
    x = torch.stack([torch.as_tensor(inputs[i]) for i in ids])
    distances = pairwise_distances(x)
    rng = np.random.default_rng(seed)
    accuracies, acrs, worst = [], [], None
    for _ in range(orders):
        pred, rad = replay(distances, predictions, base_radii, rng.permutation(len(rows)))
        accuracies.append(certified_accuracy(pred, rad, labels, radii))
        acrs.append(float(np.mean(np.where(pred == labels, rad, 0.0))))
        if worst is None or acrs[-1] < worst[0]:
            worst = (acrs[-1], pred, rad)
    per_order = np.stack(accuracies)
    recorded = None
    positions = [(r.get("evidence") or {}).get("memory_position") for r in rows]
    if all(p is not None for p in positions):
        order = np.argsort(np.asarray(positions))
        recorded = certified_accuracy(
            *replay(distances, predictions, base_radii, order), labels, radii
        ).tolist()
    return {
        "inputs": len(rows),
        "orders": orders,
        "radii": [float(r) for r in radii],
        "min": per_order.min(axis=0).tolist(),
        "median": np.median(per_order, axis=0).tolist(),
        "max": per_order.max(axis=0).tolist(),
        "recorded": recorded,
        "per_order": per_order.tolist(),
        "acr": {"min": min(acrs), "median": float(np.median(acrs)), "max": max(acrs)},
        "worst_order": {"input_id": ids, "prediction": worst[1].tolist(),
                        "radius": worst[2].tolist()},
    }  # fmt: skip
