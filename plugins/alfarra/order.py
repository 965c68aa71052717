"""Order dependence of memory-based certification (Súkeník et al. 2022, App. C.2, Remark C.2).

Alg. 3 of Alfarra et al. (2022) gives answers that depend on the order in which inputs
arrive. :func:`replay_orders` re-runs the memory over random orders of the *same*
stored certificates (no resampling: the inner certificates before the memory are
taken from the evidence); the harness scores each order with the test labels, which the
plugin never sees, and reports the spread of certified accuracy
(:mod:`harness.audit.order`).
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


def replay_orders(
    certificates: Iterable[Mapping[str, Any]],
    orders: int,
    seed: int,
    *,
    inputs: torch.Tensor | Mapping[int, torch.Tensor],
) -> dict[str, Any]:
    """The memory's certificates over ``orders`` random input orders (no labels: the
    harness scores them, :func:`harness.audit.order.order_spread`).

    :param certificates: stored rows of ONE method and setting, as the memory-order check
        passes them (``input_id``, ``prediction``, ``radius``, ``evidence``; no label); the
        memory's raw inputs are read from the evidence (:func:`raw_certificate`).
    :param orders: P, the number of uniformly random permutations replayed.
    :param seed: seed of the permutations (numpy ``default_rng``).
    :param inputs: the inputs by input id (a mapping id -> tensor, or a tensor indexed by id).
    :returns: ``{"input_id", "orders", "recorded"}``: the input ids; per order, the final
        ``prediction`` and ``radius`` of every input (in the order of ``input_id``); and
        the same in the order the run used (by ``memory_position``; None when the rows
        have none).
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
    x = torch.stack([torch.as_tensor(inputs[i]) for i in ids])
    distances = pairwise_distances(x)
    rng = np.random.default_rng(seed)

    def replayed(order: np.ndarray) -> dict[str, list]:
        pred, rad = replay(distances, predictions, base_radii, order)
        return {"prediction": pred.tolist(), "radius": rad.tolist()}

    out = [replayed(rng.permutation(len(rows))) for _ in range(orders)]
    positions = [(r.get("evidence") or {}).get("memory_position") for r in rows]
    recorded = None
    if all(p is not None for p in positions):
        recorded = replayed(np.argsort(np.asarray(positions)))
    return {"input_id": ids, "orders": out, "recorded": recorded}
