"""S5: memory certificates are their own category (Súkeník et al. 2022, App. C.2).

A memory (Alfarra et al. 2022, Alg. 3) adjusts each certificate to those issued before
it, so its radii certify no fixed smoothed classifier and change with the order of the
inputs. Such a row is never ``sound``: this check has the certifier replay the stored
certificates over ``budget.orders`` random input orders (``certifier.order_replays``,
seeded from the audit's entropy; it sees the certificates without their labels), scores
each order with the test labels itself (:func:`order_spread`), reports the spread of the
certified accuracy and ACR, and keeps the certificates of the order with the lowest ACR,
at which the leaderboard scores the row. Its verdict is ``order-dependent``.

Applicability: the certifier declares ``order_dependent = True``; otherwise
``not-applicable``.

At a diagonal scale (:mod:`harness.engine.scale`; the memory wraps a certifier for it,
e.g. ``anisotropic``) the memory's balls are the ℓ2 balls of σ_min and the replays are
the same and every order is scored on its ℓ2 radii (the evidence says so); an ellipsoid,
which the memory keeps only on a certificate it leaves as it was, is shown at the worst
order only where that order left the certificate as recorded
(:func:`harness.reports.leaderboard.board.at_order`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.audit.audit import Audit
from harness.engine.scale import drawn_with_scale
from harness.foundation.certificate import unlabelled
from harness.foundation.errors import ContractError
from harness.foundation.verdict import CheckResult, Verdict

NAME = "memory-order"


def check_order(audit: Audit) -> CheckResult:
    certifier = audit.certifier
    if not certifier.order_dependent:
        return CheckResult(NAME, Verdict.NOT_APPLICABLE,
                           "certificates do not depend on the order of inputs (order_dependent = False)")  # fmt: skip
    certs = audit.certificates
    inputs = {int(c["input_id"]): x for c, x in zip(certs, audit.inputs.cpu(), strict=True)}
    radii = list(audit.radii) or [0.5]
    replays = certifier.order_replays(unlabelled(certs), inputs, audit.budget.orders,
                                      audit.seed(f"{NAME}/orders"))  # fmt: skip
    labels = {int(c["input_id"]): int(c["label"]) for c in certs}
    spread = order_spread(replays, labels, radii, audit.budget.orders)
    if drawn_with_scale(certs):
        spread["regions"] = ("drawn at a diagonal scale: the orders are scored on their ℓ2 "
                             "radii; the recorded ellipsoids are not replayed")  # fmt: skip
    acr = spread["acr"]
    k = len(radii) // 2
    summary = (
        f"memory certificates depend on the input order (not a fixed classifier, Súkeník et al. "
        f"App. C.2): over {spread['orders']} orders ACR {acr['min']:.4f}–{acr['max']:.4f} "
        f"(median {acr['median']:.4f}), certified accuracy at {radii[k]:g} "
        f"{spread['min'][k]:.4f}–{spread['max'][k]:.4f}; scored at the worst order"
    )
    return CheckResult(NAME, Verdict.ORDER_DEPENDENT, summary, spread, ["order-dependent"])


def order_spread(
    replays: Mapping[str, Any], labels: Mapping[int, int], radii: Sequence[float], orders: int
) -> dict[str, Any]:
    """Certified accuracy and ACR of a memory's ``replays`` (``order_replays``'s answer:
    ``input_id``, per order the final ``prediction`` and ``radius`` of each input, and
    ``recorded``, the run's own order or None), scored with the test ``labels`` by input id.

    Returns ``orders``, ``radii``, ``min``/``median``/``max`` over the orders of the certified
    accuracy at each radius, ``recorded`` (the run's order; None when not replayed), ``acr``
    (min, median, max) and ``worst_order``: the ids, predictions and radii of the first
    order with the lowest ACR. An answer of another shape is the certifier's
    :class:`~harness.foundation.errors.ContractError`.
    """
    ids = [int(i) for i in replays.get("input_id", ())]
    if sorted(ids) != sorted(labels) or len(replays.get("orders", ())) != orders:
        raise ContractError(f"order_replays answered for {len(ids)} inputs and "
                            f"{len(replays.get('orders', ()))} orders; it was asked to replay "
                            f"the {len(labels)} certificates over {orders} orders")  # fmt: skip
    truth = np.array([labels[i] for i in ids], dtype=np.int64)

    def scored(order: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        pred = np.asarray(order["prediction"], dtype=np.int64)
        rad = np.asarray(order["radius"], dtype=np.float64)
        if pred.shape != truth.shape or rad.shape != truth.shape:
            raise ContractError(f"order_replays answered an order of {pred.size} predictions "
                                f"and {rad.size} radii for {truth.size} inputs")  # fmt: skip
        correct = pred == truth
        accuracy = np.array([np.mean(correct & (rad >= r)) for r in radii])
        return pred, rad, accuracy, float(np.mean(np.where(correct, rad, 0.0)))

    per_order = [scored(order) for order in replays["orders"]]
    accuracies = np.stack([a for _, _, a, _ in per_order])
    acrs = [acr for *_, acr in per_order]
    worst = per_order[int(np.argmin(acrs))]
    recorded = replays.get("recorded")
    return {
        "orders": orders,
        "radii": [float(r) for r in radii],
        "min": accuracies.min(axis=0).tolist(),
        "median": np.median(accuracies, axis=0).tolist(),
        "max": accuracies.max(axis=0).tolist(),
        "recorded": None if recorded is None else scored(recorded)[2].tolist(),
        "acr": {"min": min(acrs), "median": float(np.median(acrs)), "max": max(acrs)},
        "worst_order": {"input_id": ids, "prediction": worst[0].tolist(),
                        "radius": worst[1].tolist()},
    }  # fmt: skip
