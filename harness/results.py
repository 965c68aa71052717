"""Summary metrics of a run, per method and setting.

Certified accuracy at radius r counts inputs whose CERTIFY prediction is the label and
whose certified radius is at least r; the average certified radius (ACR, Zhai et al.
2020) averages the radius over all inputs, counting 0 for wrong or abstained ones.
Clean accuracy is PREDICT's accuracy (abstentions count as errors).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from harness.certificate import ABSTAIN

RADII = (0.0, 0.25, 0.5, 0.75, 1.0)


def summarize(
    certificates: Iterable[dict[str, Any]], radii: Sequence[float] = RADII
) -> list[dict[str, Any]]:
    """One row of metrics per (method, setting), in order of first appearance."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in certificates:
        groups[row["method"], row["setting"]].append(row)
    return [_summarize_group(m, s, rows, radii) for (m, s), rows in groups.items()]


def _summarize_group(
    method: str, setting: str, rows: list[dict], radii: Sequence[float]
) -> dict[str, Any]:
    count = len(rows)
    correct = [r for r in rows if r["prediction"] == r["label"]]
    return {
        "method": method,
        "setting": setting,
        "inputs": count,
        "clean_accuracy": sum(r["predict"] == r["label"] for r in rows) / count,
        "certified_accuracy": {
            f"{radius:g}": sum(r["radius"] >= radius for r in correct) / count for radius in radii
        },
        "acr": sum(r["radius"] for r in correct) / count,
        "abstention_rate": sum(r["prediction"] == ABSTAIN for r in rows) / count,
        "misclassification_rate": sum(r["prediction"] not in (ABSTAIN, r["label"]) for r in rows)
        / count,
        "mean_sigma": sum(r["sigma"] for r in rows) / count,
        "seconds_per_input": sum(r["seconds"] for r in rows) / count,
    }
