"""Summary metrics of one (method, setting)'s certificates.

Certified accuracy at radius r counts inputs whose CERTIFY prediction is the label and
whose certified radius is at least r; the average certified radius (ACR, Zhai et al.
2020) averages the radius over all inputs, counting 0 for wrong or abstained ones.
Clean accuracy is PREDICT's accuracy (abstentions count as errors). After Mohapatra et
al. (2021), §3.2 and Table 2: the clean (PREDICT) accuracy of every class present in
the test subset, and its minimum, maximum and population standard deviation over those
classes.

Clean and certified accuracy carry a 95 % Clopper–Pearson interval over the n test
inputs (:mod:`harness.mathematics.significance`), under ``intervals`` (metric key -> [low, high]).
A run imported from a log that lacks labels or times (MACER's) has the metrics it cannot
give blanked (None).

Every metric has one key (:func:`row_metrics`), the one the leaderboard's catalog
(:func:`harness.reports.leaderboard.metrics.metric_catalog`), its JSON and CSV and ``idrs-bench
compare`` use; ``idrs-bench results --json`` nests certified accuracy by radius
(:func:`summary`; :meth:`harness.store.storedrun.StoredRun.summaries` for a whole run).
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Sequence
from typing import Any, Protocol

from harness.foundation.certificate import ABSTAIN

RADII = (0.0, 0.25, 0.5, 0.75, 1.0)
"""The radii certified accuracy is reported at when a benchmark names none (``radii``)."""


class CertifiedInput(Protocol):
    """What the metrics read of a certificate (e.g. :class:`harness.store.storedrun.StoredCertificate`)."""

    label: int
    prediction: int
    predict: int
    radius: float
    sigma: float
    seconds: float


def certified_key(radius: float) -> str:
    """The key of certified accuracy at ``radius``, e.g. ``certified_accuracy@0.5``."""
    return f"certified_accuracy@{radius:g}"


def empirical_key(radius: float) -> str:
    """The key of empirical robust accuracy at ``radius`` (:mod:`harness.audit.empirical`), e.g.
    ``empirical_accuracy@0.5``."""
    return f"empirical_accuracy@{radius:g}"


def empirical_successes(
    attack: dict[str, Any], radius: float, correct: Collection[int]
) -> int | None:
    """Inputs robust to the empirical attack at ``radius`` (:func:`harness.audit.empirical.
    attack_row`'s ``attack`` result), or None when it did not run at ``radius``: those of
    ``correct`` (the input ids on which the smoothed classifier answers the label: PREDICT,
    as clean accuracy counts it) that the attack did not break at ``radius`` or below. An
    input the smoothed classifier misclassifies or abstains on is robust at no radius, so
    empirical accuracy is at most clean accuracy at every radius."""
    if not any(abs(radius - r) <= 1e-12 for r in attack["radii"]):
        return None
    broken = attack["broken"]
    return sum(1 for i in correct
               if str(int(i)) not in broken or broken[str(int(i))] > radius + 1e-12)  # fmt: skip


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


def estimation_samples(certificate: CertifiedInput) -> int | None:
    """The base model's estimation samples behind a certificate (n, or under sequential
    sampling its last look's), from the harness's draws; None without them (an imported
    log, an export without evidence)."""
    base = (getattr(certificate, "draws", None) or {}).get("base") or {}
    return int(base["n"]) if "n" in base else None


def row_metrics(
    certificates: Sequence[CertifiedInput],
    radii: Sequence[float] = RADII,
    unknown: Sequence[str] = (),
) -> dict[str, Any]:
    """The metrics of one (method, setting)'s certificates (at least one).

    Keys: ``inputs`` (the number of certificates), ``clean_accuracy``,
    :func:`certified_key` of each radius, ``acr``, ``abstention_rate``,
    ``misclassification_rate``, ``classwise_accuracy_min``/``_max``/``_std``,
    ``mean_sigma`` and ``sigma_min``/``_median``/``_max`` (σ(x) over the inputs: a setting's
    σ is its base level, not the σ its certificates used), ``seconds_per_input`` and
    ``load_per_core`` (the median machine load its certificates' seconds were measured under,
    :func:`harness.foundation.threads.load_per_core`; None where none recorded it),
    ``samples_mean`` and ``samples_max`` (estimation samples behind a certificate,
    :func:`estimation_samples`; None where a certificate does not record its draws),
    ``classwise_accuracy`` (class -> accuracy) and ``intervals`` (clean and certified
    accuracy -> 95 % interval). The metrics named in
    ``unknown`` are None (a log that does not record them; class-wise ones: ``{}``).
    """
    from harness.mathematics.significance import proportion_interval

    count = len(certificates)
    samples = [estimation_samples(c) for c in certificates]
    loads = [c.load for c in certificates if getattr(c, "load", None) is not None]
    correct = [c for c in certificates if c.prediction == c.label]
    per_class = classwise_accuracy(certificates)
    values = list(per_class.values())
    successes = {"clean_accuracy": sum(c.predict == c.label for c in certificates),
                 **{certified_key(r): sum(c.radius >= r for c in correct) for r in radii}}  # fmt: skip
    out = {
        "inputs": count,
        **{key: k / count for key, k in successes.items()},
        "acr": sum(c.radius for c in correct) / count,
        "abstention_rate": sum(c.prediction == ABSTAIN for c in certificates) / count,
        "misclassification_rate": sum(c.prediction not in (ABSTAIN, c.label) for c in certificates)
        / count,
        "classwise_accuracy_min": min(values),
        "classwise_accuracy_max": max(values),
        "classwise_accuracy_std": statistics.pstdev(values),
        "mean_sigma": sum(c.sigma for c in certificates) / count,
        "sigma_min": min(c.sigma for c in certificates),
        "sigma_median": statistics.median(c.sigma for c in certificates),
        "sigma_max": max(c.sigma for c in certificates),
        "seconds_per_input": sum(c.seconds for c in certificates) / count,
        "load_per_core": statistics.median(loads) if loads else None,
        "samples_mean": None if None in samples else sum(samples) / count,
        "samples_max": None if None in samples else max(samples),
        "classwise_accuracy": per_class,
        "intervals": {key: proportion_interval(k, count) for key, k in successes.items()},
    }
    for key in unknown:
        out[key] = None
    if "classwise_accuracy_min" in unknown:
        out["classwise_accuracy"] = {}
    return out


def summary(
    method: str, setting: str, certificates: Sequence[CertifiedInput], radii: Sequence[float],
    unknown: Sequence[str] = (),
) -> dict[str, Any]:  # fmt: skip
    """One row of ``idrs-bench results --json``: :func:`row_metrics` with certified accuracy
    and its 95 % intervals nested by radius (``{"0.5": ...}``), without the class-wise metrics."""
    m = row_metrics(certificates, radii, unknown)
    return {
        "method": method,
        "setting": setting,
        "inputs": m["inputs"],
        "clean_accuracy": m["clean_accuracy"],
        "clean_accuracy_interval": list(m["intervals"]["clean_accuracy"]),
        "certified_accuracy": {f"{r:g}": m[certified_key(r)] for r in radii},
        "certified_accuracy_interval": {
            f"{r:g}": list(m["intervals"][certified_key(r)]) for r in radii
        },
        "acr": m["acr"],
        "abstention_rate": m["abstention_rate"],
        "misclassification_rate": m["misclassification_rate"],
        "mean_sigma": m["mean_sigma"],
        "seconds_per_input": m["seconds_per_input"],
        "load_per_core": m["load_per_core"],
        "samples_mean": m["samples_mean"],
        "samples_max": m["samples_max"],
    }
