"""The metric catalog of a leaderboard: each column's key, header, direction and meaning.

The values are :func:`harness.mathematics.accuracy.row_metrics`'s, under the same keys (clean
accuracy of PREDICT, certified accuracy at each radius, ACR, abstention and
misclassification rates, the class-wise accuracy of Mohapatra et al. (2021), §3.2 and
Table 2, mean σ(x), seconds per input; with sequential sampling the estimation samples
per certificate), and, where the empirical attack ran, the
empirical robust accuracy beside certified accuracy at each radius
(:mod:`harness.audit.empirical`). The accuracies over test inputs carry 95 % intervals
(:data:`INTERVAL_KEYS` names which).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.mathematics.accuracy import certified_key, empirical_key


@dataclass(frozen=True)
class Metric:
    """A column: its key in rows and exports, header, direction and meaning."""

    key: str
    header: str
    higher_is_better: bool | None  # None: descriptive, neither better nor worse
    description: str
    digits: int | None = 3  # fixed decimals in markdown; None: 3 significant digits (#.3g)


def has_interval(key: str) -> bool:
    """Whether a metric is an accuracy over test inputs with a 95 % interval."""
    return key == "clean_accuracy" or key.startswith(("certified_accuracy@", "empirical_accuracy@"))


def metric_catalog(
    radii: Sequence[float], empirical: bool = False, sequential: bool = False
) -> list[Metric]:
    """Every metric of a row at ``radii``, in table order; ``empirical``: with the
    empirical robust accuracy beside each certified accuracy; ``sequential``: with the
    estimation samples per certificate (mean and max) beside the seconds per input."""
    return [
        Metric("clean_accuracy", "clean acc", True, "accuracy of PREDICT (abstention counts as an error)"),
        *[
            metric
            for r in radii
            for metric in [
                Metric(certified_key(r), f"cert@{r:g}", True,
                       f"fraction of inputs CERTIFY classifies correctly with radius >= {r:g}"),
                *([Metric(empirical_key(r), f"emp@{r:g}", None,
                          f"fraction of inputs a PGD attack on the smoothed classifier did not "
                          f"break within radius {r:g} (each break confirmed by fresh Monte Carlo): "
                          "an upper bound on robust accuracy, not a certificate")]
                  if empirical else []),
            ]
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
        *([Metric("samples_mean", "samples", False,
                  "mean estimation samples per certificate (sequential sampling stops an input "
                  "once its place on the radius grid is decided)", 0),
           Metric("samples_max", "max samples", False,
                  "most estimation samples behind one certificate", 0)] if sequential else []),
    ]  # fmt: skip


def sampled_in_rounds(runs) -> bool:
    """Whether some of ``runs`` (stored runs) drew its estimation samples sequentially."""
    return any(run.run["config"]["protocol"].get("sampling") == "sequential" for run in runs)
