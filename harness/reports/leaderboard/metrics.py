"""The metric catalog of a leaderboard: each column's key, header, direction and meaning.

The values are :func:`harness.mathematics.accuracy.row_metrics`'s, under the same keys (clean
accuracy of PREDICT, certified accuracy at each radius, ACR, abstention and
misclassification rates, the class-wise accuracy of Mohapatra et al. (2021), §3.2 and
Table 2, σ(x) over the inputs (mean, min, median, max), wall seconds per input; with
sequential sampling the estimation samples per certificate), and, where the empirical
attack ran, the empirical robust accuracy beside certified accuracy at each radius
(:mod:`harness.audit.empirical`). The accuracies over test inputs and the ACR carry 95 %
intervals (:func:`has_interval` says which).

Two columns are descriptive on purpose: the ACR (it rewards inputs certified far out and
can rank a worse certifier higher: Sun et al. 2024, arXiv 2410.06895), shown with its
interval and never used to rank rows; and the seconds per input, wall time shown beside the
machine's load per processor while it was measured (recorded with each certificate since
the load column exists), comparable only between rows measured under similar loads.

Each metric names the board table that shows it (:data:`TABLES`): ``main``, the columns a
reader compares (clean accuracy, certified accuracy at each radius, ACR); ``attack``, the
empirical robust accuracy; ``details``, the rest (abstention, misclassification, the
class-wise figures, σ, time, samples). The JSON and CSV beside a board hold them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.mathematics.accuracy import certified_key, empirical_key

CERTIFIED = "fraction of inputs CERTIFY classifies correctly with radius >= {r}"
EMPIRICAL = ("fraction of inputs the smoothed classifier answers right (PREDICT) that a PGD "
             "attack on it did not break within radius {r} (each break confirmed by fresh Monte "
             "Carlo): an upper bound on robust accuracy, not a certificate")  # fmt: skip
"""The meaning of ``cert@r`` and ``emp@r``, at a radius ``r``."""
ACR = ("average certified radius (0 for wrong or abstained inputs), with its 95 % Student t "
       "interval over the inputs; not used to rank rows (it rewards inputs certified far out: "
       "Sun et al. 2024, arXiv 2410.06895)")  # fmt: skip
SECONDS = ("wall seconds of certification per input, under the load beside it: comparable "
           "only between rows measured under similar loads, never ranked")  # fmt: skip
LOAD = ("the machine's 1-minute load average per usable processor while the row was certified "
        "(median over its certificates; about 1: the run alone on every processor, 2: twice "
        "as many runnable threads as processors), empty where the run did not record it")  # fmt: skip
TABLES = ("main", "attack", "details")
"""The board's tables a metric can be shown in (module docstring)."""


@dataclass(frozen=True)
class Metric:
    """A column: its key in rows and exports, header, direction, meaning and board table."""

    key: str
    header: str
    higher_is_better: bool | None  # None: descriptive, neither better nor worse
    description: str
    digits: int | None = 3  # fixed decimals in markdown; None: 3 significant digits (#.3g)
    table: str = "details"  # one of TABLES


def has_interval(key: str) -> bool:
    """Whether a metric has a 95 % interval over the test inputs: the accuracies
    (Clopper–Pearson) and the ACR (Student's t)."""
    return key in ("clean_accuracy", "acr") or key.startswith(
        ("certified_accuracy@", "empirical_accuracy@")
    )


def metric_catalog(
    radii: Sequence[float], empirical: bool = False, sequential: bool = False
) -> list[Metric]:
    """Every metric of a row at ``radii``, in table order; ``empirical``: with the
    empirical robust accuracy beside each certified accuracy; ``sequential``: with the
    estimation samples per certificate (mean and max) beside the seconds per input."""
    return [
        Metric("clean_accuracy", "clean acc", True,
               "accuracy of PREDICT (abstention counts as an error)", table="main"),
        *[Metric(certified_key(r), f"cert@{r:g}", True, CERTIFIED.format(r=f"{r:g}"),
                 table="main") for r in radii],
        Metric("acr", "ACR", None, ACR, table="main"),
        *[Metric(empirical_key(r), f"emp@{r:g}", None, EMPIRICAL.format(r=f"{r:g}"),
                 table="attack") for r in (radii if empirical else ())],
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
        Metric("sigma_min", "σ min", None, "smallest σ(x) over the inputs"),
        Metric("sigma_median", "σ median", None, "median σ(x) over the inputs"),
        Metric("sigma_max", "σ max", None, "largest σ(x) over the inputs"),
        Metric("seconds_per_input", "wall s/input", None, SECONDS, None),
        Metric("load_per_core", "load/core", None, LOAD, 2),
        *([Metric("samples_mean", "samples", False,
                  "mean estimation samples per certificate (sequential sampling stops an input "
                  "once its place on the radius grid is decided)", 0),
           Metric("samples_max", "max samples", False,
                  "most estimation samples behind one certificate", 0)] if sequential else []),
    ]  # fmt: skip


def sampled_in_rounds(runs) -> bool:
    """Whether some of ``runs`` (stored runs) drew its estimation samples sequentially."""
    return any(run.run["config"]["protocol"].get("sampling") == "sequential" for run in runs)
