"""Leaderboard metrics of one (run, method, setting): harness.results plus class-wise accuracy.

The base metrics are :func:`harness.results.summarize`'s (clean accuracy of PREDICT,
certified accuracy at each radius, ACR, abstention and misclassification rates, mean
σ(x), seconds per input). Added here, after Mohapatra et al. (2021), §3.2 and Table 2:
the clean (PREDICT) accuracy of every class present in the test subset, and its
minimum, maximum and population standard deviation over those classes.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.results import RADII, summarize


@dataclass(frozen=True)
class Metric:
    """A column: its key in rows and exports, header, direction and meaning."""

    key: str
    header: str
    higher_is_better: bool | None  # None: descriptive, neither better nor worse
    description: str
    digits: int | None = 3  # fixed decimals in markdown; None: 3 significant digits (#.3g)


def certified_key(radius: float) -> str:
    return f"certified_accuracy@{radius:g}"


def metric_catalog(radii: Sequence[float]) -> list[Metric]:
    """Every metric of a row at ``radii``, in table order."""
    return [
        Metric("clean_accuracy", "clean acc", True, "accuracy of PREDICT (abstention counts as an error)"),
        *[
            Metric(certified_key(r), f"cert@{r:g}", True,
                   f"fraction of inputs CERTIFY classifies correctly with radius >= {r:g}")
            for r in radii
        ],
        Metric("acr", "ACR", True, "average certified radius (0 for wrong or abstained inputs)"),
        Metric("abstention_rate", "abstain", False, "fraction of inputs CERTIFY abstains on"),
        Metric("misclassification_rate", "misclass", False,
               "fraction of inputs CERTIFY assigns a wrong class"),
        Metric("classwise_accuracy_min", "class min", True,
               "lowest per-class clean accuracy (Mohapatra et al. 2021)"),
        Metric("classwise_accuracy_max", "class max", True,
               "highest per-class clean accuracy (Mohapatra et al. 2021)"),
        Metric("classwise_accuracy_std", "class std", False,
               "population standard deviation of the per-class clean accuracies"),
        Metric("mean_sigma", "mean σ", None, "mean σ(x) over the inputs"),
        Metric("seconds_per_input", "s/input", False, "certification seconds per input", None),
    ]  # fmt: skip


def classwise_accuracy(certificates: Sequence[dict[str, Any]]) -> dict[int, float]:
    """PREDICT's accuracy on each class present among ``certificates``' labels."""
    totals: dict[int, list[int]] = {}
    for cert in certificates:
        hits = totals.setdefault(int(cert["label"]), [0, 0])
        hits[0] += cert["predict"] == cert["label"]
        hits[1] += 1
    return {label: hits[0] / hits[1] for label, hits in sorted(totals.items())}


def row_metrics(
    certificates: Sequence[dict[str, Any]], radii: Sequence[float] = RADII
) -> dict[str, Any]:
    """The metrics of one (method, setting)'s certificates, keyed as in :func:`metric_catalog`.

    Also ``inputs`` (the number of certificates) and ``classwise_accuracy`` (class -> accuracy).
    """
    (base,) = summarize(certificates, radii)
    per_class = classwise_accuracy(certificates)
    values = list(per_class.values())
    out = {
        "inputs": base["inputs"],
        "clean_accuracy": base["clean_accuracy"],
        **{certified_key(r): base["certified_accuracy"][f"{r:g}"] for r in radii},
        "acr": base["acr"],
        "abstention_rate": base["abstention_rate"],
        "misclassification_rate": base["misclassification_rate"],
        "classwise_accuracy_min": min(values),
        "classwise_accuracy_max": max(values),
        "classwise_accuracy_std": statistics.pstdev(values),
        "mean_sigma": base["mean_sigma"],
        "seconds_per_input": base["seconds_per_input"],
        "classwise_accuracy": per_class,
    }
    return out


def certified_curve(certificates: Sequence[dict[str, Any]], radii: Sequence[float]) -> list[float]:
    """Certified accuracy at each of ``radii`` (any grid, e.g. for a plot)."""
    count = len(certificates)
    correct = sorted(c["radius"] for c in certificates if c["prediction"] == c["label"])
    return [(len(correct) - bisect.bisect_left(correct, r)) / count for r in radii]
