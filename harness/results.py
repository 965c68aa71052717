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
from harness.spec import RADII, setting_key


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


def completeness(
    config: dict[str, Any],
    counts: dict[tuple[str, str], int],
    expected: int | None,
    finished: bool,
) -> list[dict[str, Any]]:
    """Per (method, setting) of the run's config: inputs stored, inputs expected, complete?

    ``expected`` is the number of test inputs of every setting (None when the run did
    not record it: then only a finished run counts as complete).
    """
    out = []
    for method in config["methods"]:
        for setting in method.get("settings") or [{}]:
            key = setting_key(setting)
            n = counts.get((method["name"], key), 0)
            done = finished and (expected is None or n >= expected)
            out.append({"method": method["name"], "setting": key, "inputs": n,
                        "expected": expected, "complete": done})  # fmt: skip
    return out


def incomplete_note(settings: list[dict[str, Any]]) -> str | None:
    """``"incomplete: cohen sigma=0.5 12 of 48 inputs, ..."``, or None when all are complete."""
    parts = [
        f"{s['method']} {s['setting']} {s['inputs']} of {s['expected'] or '?'} inputs"
        for s in settings
        if not s["complete"]
    ]
    return "incomplete: " + "; ".join(parts) if parts else None
