"""One certified input: what a certifier returns and what the store keeps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ABSTAIN = -1


@dataclass
class Certificate:
    """The certificate of one input and the evidence behind it.

    ``prediction`` is CERTIFY's class (``ABSTAIN`` = -1) with certified ℓ2 ``radius``
    (0 when abstaining); ``p_lower`` is the lower confidence bound on p_A at level
    ``alpha``; ``predict`` is PREDICT's class. The class counts are kept so that the
    certificate can be recomputed without resampling.
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

    @property
    def abstained(self) -> bool:
        return self.prediction == ABSTAIN
