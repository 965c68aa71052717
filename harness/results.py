"""Summary metrics of one (method, setting)'s certificates.

Certified accuracy at radius r counts inputs whose CERTIFY prediction is the label and
whose certified radius is at least r; the average certified radius (ACR, Zhai et al.
2020) averages the radius over all inputs, counting 0 for wrong or abstained ones.
Clean accuracy is PREDICT's accuracy (abstentions count as errors). After Mohapatra et
al. (2021), §3.2 and Table 2: the clean (PREDICT) accuracy of every class present in
the test subset, and its minimum, maximum and population standard deviation over those
classes.

Every metric has one key (:func:`row_metrics`), the one the leaderboard's catalog
(:func:`harness.leaderboard.metrics.metric_catalog`), its JSON and CSV and ``idrs-bench
compare`` use; ``idrs-bench results --json`` nests certified accuracy by radius
(:func:`summary`; :meth:`harness.storedrun.StoredRun.summaries` for a whole run).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any, Protocol

from harness.certificate import ABSTAIN
from harness.spec import RADII


class CertifiedInput(Protocol):
    """What the metrics read of a certificate (e.g. :class:`harness.storedrun.StoredCertificate`)."""

    label: int
    prediction: int
    predict: int
    radius: float
    sigma: float
    seconds: float


def certified_key(radius: float) -> str:
    """The key of certified accuracy at ``radius``, e.g. ``certified_accuracy@0.5``."""
    return f"certified_accuracy@{radius:g}"


def benchmark_radii(config: dict[str, Any]) -> list[float]:
    """The spec's ``radii`` if its stored config has them, else :data:`RADII`, sorted."""
    radii = config.get("radii") or RADII
    return sorted({float(r) for r in radii})


def classwise_accuracy(certificates: Sequence[CertifiedInput]) -> dict[int, float]:
    """PREDICT's accuracy on each class present among ``certificates``' labels."""
    totals: dict[int, list[int]] = {}
    for cert in certificates:
        hits = totals.setdefault(int(cert.label), [0, 0])
        hits[0] += cert.predict == cert.label
        hits[1] += 1
    return {label: hits[0] / hits[1] for label, hits in sorted(totals.items())}


def row_metrics(
    certificates: Sequence[CertifiedInput], radii: Sequence[float] = RADII
) -> dict[str, Any]:
    """The metrics of one (method, setting)'s certificates (at least one).

    Keys: ``inputs`` (the number of certificates), ``clean_accuracy``,
    :func:`certified_key` of each radius, ``acr``, ``abstention_rate``,
    ``misclassification_rate``, ``classwise_accuracy_min``/``_max``/``_std``,
    ``mean_sigma``, ``seconds_per_input`` and ``classwise_accuracy`` (class -> accuracy).
    """
    count = len(certificates)
    correct = [c for c in certificates if c.prediction == c.label]
    per_class = classwise_accuracy(certificates)
    values = list(per_class.values())
    return {
        "inputs": count,
        "clean_accuracy": sum(c.predict == c.label for c in certificates) / count,
        **{certified_key(r): sum(c.radius >= r for c in correct) / count for r in radii},
        "acr": sum(c.radius for c in correct) / count,
        "abstention_rate": sum(c.prediction == ABSTAIN for c in certificates) / count,
        "misclassification_rate": sum(c.prediction not in (ABSTAIN, c.label) for c in certificates)
        / count,
        "classwise_accuracy_min": min(values),
        "classwise_accuracy_max": max(values),
        "classwise_accuracy_std": statistics.pstdev(values),
        "mean_sigma": sum(c.sigma for c in certificates) / count,
        "seconds_per_input": sum(c.seconds for c in certificates) / count,
        "classwise_accuracy": per_class,
    }


def summary(
    method: str, setting: str, certificates: Sequence[CertifiedInput], radii: Sequence[float]
) -> dict[str, Any]:
    """One row of ``idrs-bench results --json``: :func:`row_metrics` with certified accuracy
    nested by radius (``{"0.5": ...}``) and without the class-wise metrics."""
    m = row_metrics(certificates, radii)
    return {
        "method": method,
        "setting": setting,
        "inputs": m["inputs"],
        "clean_accuracy": m["clean_accuracy"],
        "certified_accuracy": {f"{r:g}": m[certified_key(r)] for r in radii},
        "acr": m["acr"],
        "abstention_rate": m["abstention_rate"],
        "misclassification_rate": m["misclassification_rate"],
        "mean_sigma": m["mean_sigma"],
        "seconds_per_input": m["seconds_per_input"],
    }
