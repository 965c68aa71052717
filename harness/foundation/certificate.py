"""One certified input as the store keeps it: the certifier's claim and the harness's draws."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

ABSTAIN = -1


@dataclass
class Certificate:
    """The certificate of one input and the evidence behind it.

    ``prediction`` is CERTIFY's class (``ABSTAIN`` = -1) with certified ℓ2 ``radius``
    (0 when abstaining); ``p_lower`` is the lower confidence bound on p_A; ``predict``
    is PREDICT's class; ``alpha`` is the run's α, at which the whole certificate holds.
    These and ``evidence`` (what the certifier derived) come from the certifier's
    :class:`~harness.engine.draws.Claim`. ``sigma``, ``draws`` (per smoothing, ``"base"`` and
    possibly ``"sigma"``, a :meth:`~harness.engine.draws.Draws.record`) and, for hard smoothing,
    the base model's class counts are the harness's own: what it drew, never what a
    plugin reported, so the certificate can be re-derived without resampling. ``seconds``
    is the wall time it took and ``load`` the machine's load while it was measured
    (:func:`harness.foundation.threads.load_per_core`; None where not recorded).

    ``region``: a second kind of certificate beside the ℓ2 ball, the region certified
    around the input where it is not a ball (drawn at a diagonal scale: an ellipsoid,
    ``{"kind": "ellipsoid", "factor": κ, "proxy_radius": ...}``,
    :func:`harness.engine.scale.ellipsoid_region`); never an ℓ2 radius. None: none claimed.
    """

    input_id: int
    prediction: int
    radius: float
    p_lower: float
    sigma: float
    alpha: float
    predict: int = ABSTAIN
    counts_selection: list[int] | None = None
    counts_estimation: list[int] | None = None
    seconds: float = 0.0
    evidence: dict[str, Any] = field(default_factory=dict)
    draws: dict[str, Any] | None = None
    load: float | None = None
    region: dict[str, Any] | None = None

    @property
    def abstained(self) -> bool:
        return self.prediction == ABSTAIN


def unlabelled(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Stored certificate rows without their test labels: how they reach plugin code (a
    radius formula, a memory's balls and replays). The harness alone scores with the labels
    (docs/plugins.md, "What a plugin sees of the dataset")."""
    return [{k: v for k, v in row.items() if k != "label"} for row in rows]
