"""The certifier wrapper ``memory``: any certifier followed by Alg. 3 (Alfarra et al. 2022, App. C).

The inner certifier's claims on the harness's evidence are put through the memory in
the order of the inputs (the runner's order of test inputs). Each claim records in its
evidence

- ``memory_position``: its place in the memory (the input order of the run);
- ``memory_raw_prediction``, ``memory_raw_radius``, ``memory_raw_predict``: the inner
  certificate before the memory adjusted it (for :func:`plugins.alfarra.order.replay_orders`);
- ``memory_action``: ``kept``, ``inside`` (LargestInSubset: prediction and PREDICT's
  answer replaced by the enclosing ball's class) or ``shrunk`` (LargestOutSubset);
- ``memory_decided_by``: the input ids of the memory entries that changed it.

The wrapper takes a diagonal scale when its inner certifier does (``diagonal_scale``); the
memory acts on the ℓ2 balls only, so a certificate it changes (``inside``, ``shrunk``)
loses its ellipsoid (ANCER's region, certified with the inner ball it no longer claims).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from harness import Certifier, Claim, Evidence, IdrsError, RadiusFormula, Recomputed, RunState
from plugins.alfarra.memory import INSIDE, KEPT, Memory, MemoryEntry
from plugins.alfarra.memory_store import stage_entry


class MemoryCertifier:
    """Wraps ``inner``; ``state`` (optional, the run's) receives every new memory entry.

    The runner commits the staged entry of a certificate in the same transaction as
    the certificate (:mod:`harness.foundation.runstate`). ``order_dependent`` tells the soundness checks that certificates depend on the order
    of inputs (they replay orders instead of attacking a fixed smoothed classifier).
    """

    order_dependent = True

    @staticmethod
    def ball_sigmas(rows) -> dict[int, float]:
        """The σ that is constant inside each certified ball, by input id.

        An input certified "inside" an earlier ball lives in (a sub-ball of) that ball,
        whose σ is the earlier entry's (recursively); every other ball is its own input's
        Cohen certificate at its own σ. ``rows`` have input_id, sigma and evidence.
        """
        by_id = {int(r["input_id"]): r for r in rows}
        out: dict[int, float] = {}

        def resolve(i: int) -> float:
            if i not in out:
                evidence = by_id[i]["evidence"] or {}
                decided = evidence.get("memory_decided_by") or []
                inside = evidence.get("memory_action") == INSIDE and decided and decided[0] in by_id
                out[i] = resolve(int(decided[0])) if inside else float(by_id[i]["sigma"])
            return out[i]

        for i in by_id:
            resolve(i)
        return out

    @staticmethod
    def order_replays(certificates, inputs, orders: int, seed: int) -> dict:
        """The certificates over ``orders`` random input orders (:func:`replay_orders`)."""
        from plugins.alfarra.order import replay_orders

        return replay_orders(certificates, orders, seed, inputs=inputs)

    def __init__(self, inner: Certifier, memory: Memory, state: RunState | None = None) -> None:
        self.inner = inner
        self.memory = memory
        self.state = state
        self.smoothing = inner.smoothing
        # a diagonal scale is certified as the inner certifier declares (check_diagonal)
        self.diagonal_scale = getattr(inner, "diagonal_scale", False) is True
        self.radius_formula = RadiusFormula(
            f"memory({inner.radius_formula.name})", memory_recompute, inner.radius_formula
        )

    def certify(self, evidence: Evidence) -> list[Claim]:
        """The inner certifier's claims put through the memory, in the inputs' order."""
        order = [int(i) for i in evidence.input_ids]
        if len(set(order)) != len(order):
            raise IdrsError("the memory certifier needs distinct input ids in one call")
        claims = list(self.inner.certify(evidence))
        if len(claims) != len(order):
            raise IdrsError(
                f"the inner certifier returned {len(claims)} claims for {len(order)} inputs; "
                "the memory needs every input in order"
            )
        return [
            self._adjust(i, claim, x) for i, claim, x in zip(order, claims, evidence.x, strict=True)
        ]

    def _adjust(self, input_id: int, claim: Claim, x: torch.Tensor) -> Claim:
        known = input_id in self.memory
        entry: MemoryEntry = self.memory.certify(input_id, x, claim.prediction, claim.radius)
        if not known and self.state is not None:
            stage_entry(self.state, entry, x)
        ids = [self.memory.entries[p].input_id for p in entry.decided_by]
        evidence = {
            **claim.evidence,
            "memory_position": entry.position,
            "memory_raw_prediction": entry.raw_prediction,
            "memory_raw_radius": entry.raw_radius,
            "memory_raw_predict": claim.predict,
            "memory_action": entry.action,
            "memory_decided_by": ids,
        }
        predict = entry.prediction if entry.action == INSIDE else claim.predict
        # an ellipsoid (a diagonal scale) was certified with the inner ball: the memory keeps
        # balls disjoint, so a certificate it changes keeps only the ball it is given
        ellipsoid = claim.ellipsoid if entry.action == KEPT else None
        return replace(claim, prediction=entry.prediction, radius=entry.radius, predict=predict,
                       evidence=evidence, ellipsoid=ellipsoid)  # fmt: skip


def memory_recompute(rows, inputs, protocol, regularity, inner: RadiusFormula) -> Recomputed:
    """Alg. 3 re-derived: the inner certificate before the memory (its raw prediction and
    radius, from the evidence) by the ``inner`` formula at the ball's own σ; then a
    ``kept`` or ``shrunk`` certificate may claim at most that radius, and one placed
    ``inside`` an earlier ball (x_j, R_j) at most R_j − ‖x − x_j‖ with x_j's class, R_j
    itself bounded the same way (recursively)."""
    raw_rows = []
    for row in rows:
        ev = row.get("evidence") or {}
        raw_rows.append({**row, "prediction": ev.get("memory_raw_prediction", row["prediction"]),
                         "radius": ev.get("memory_raw_radius", row["radius"])})  # fmt: skip
    raw = inner.derive(raw_rows, inputs, protocol, regularity)
    index = {int(r["input_id"]): i for i, r in enumerate(rows)}
    flat = torch.as_tensor(inputs).detach().double().flatten(1)
    prediction, radius = raw.prediction.copy(), raw.radius.copy()
    done: set[int] = set()

    def resolve(i: int, depth: int = 0) -> None:
        if i in done:
            return
        done.add(i)
        ev = rows[i].get("evidence") or {}
        decided = ev.get("memory_decided_by") or []
        if (
            ev.get("memory_action") == INSIDE
            and decided
            and int(decided[0]) in index
            and depth < len(rows)
        ):
            j = index[int(decided[0])]
            resolve(j, depth + 1)
            distance = float(torch.linalg.vector_norm(flat[i] - flat[j]))
            prediction[i], radius[i] = prediction[j], max(radius[j] - distance, 0.0)

    for i in range(len(rows)):
        resolve(i)
    return Recomputed(raw.n0, raw.n, raw.bound, prediction, radius)
