"""``idrs-bench import-log FILE``: store a published certification log as an imported run.

The log, in any format of :mod:`harness.reports.published_logs` (detected from the file),
becomes a run whose config is marked ``imported``: its rows appear on a board in their
own section beside the runs made here, never as verified sound (there is no evidence to
audit), and ``idrs-bench check`` refuses it. The whole run is written in one
transaction, after the whole file has been read: a log that fails to import changes
nothing already stored.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.store.store import DEFAULT_DB

UNKNOWN_WITHOUT_LABELS = (
    "abstention_rate", "misclassification_rate", "classwise_accuracy_min",
    "classwise_accuracy_max", "classwise_accuracy_std", "seconds_per_input",
)  # fmt: skip
"""Metrics a log without labels, predictions and times (MACER's) cannot give."""


def import_log(
    path: str | Path, db: str | Path, dataset: str, name: str, sigma: float,
    method: str | None = None, n0: int = 100, n: int = 100_000, alpha: float = 0.001,
    key: str | None = None, start: int | None = None, skip: int | None = None,
) -> str:  # fmt: skip
    """Store the log at ``path`` in ``db``; returns the new run's id.

    Each line becomes a certificate with the log's prediction, claimed radius, σ (the
    input's own when the log records it, else ``sigma``) and time; p_A's lower bound is
    the one the claimed radius implies, Φ(radius/σ) (Cohen et al. 2019, Thm. 1), not an
    estimate. ``method`` defaults to the format's (``cohen``, ``alfarra-ds``, ``ancer``).
    """
    import hashlib
    import math

    from harness.foundation.certificate import ABSTAIN, Certificate
    from harness.foundation.errors import IdrsError
    from harness.foundation.identity import content_hash, setting_key
    from harness.foundation.protocol import CertificationProtocol, check_sigma
    from harness.foundation.version import __version__
    from harness.mathematics.accuracy import RADII
    from harness.reports.published_logs import MACER, MACER_SKIP, MACER_START, read_published_log
    from harness.store.store import ResultStore

    sigma = check_sigma(sigma)
    protocol = CertificationProtocol(n0=n0, n=n, alpha=alpha)
    log = read_published_log(path, key, MACER_START if start is None else start,
                             MACER_SKIP if skip is None else skip)  # fmt: skip
    if log.format is not MACER and (start is not None or skip is not None):
        raise IdrsError(f"--start and --skip apply to MACER's .mat files; {path} names its inputs")
    method = method or log.format.default_method
    sha = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    setting = setting_key({"sigma": sigma})
    source: dict[str, Any] = {"format": log.format.name, "file": Path(path).name, "sha256": sha}
    if log.key is not None:
        source["key"] = log.key
    if log.format is MACER:
        source["unknown_metrics"] = list(UNKNOWN_WITHOUT_LABELS)
    config: dict[str, Any] = {
        "name": name,
        "imported": source,
        "dataset": {"name": dataset, "test_every": 1, "test_count": None},
        "model": {"architecture": "imported", "trainer": "imported", "seed": 0,
                  "architecture_params": {}, "trainer_params": {}},
        "protocol": {"n0": protocol.n0, "n": protocol.n, "alpha": protocol.alpha,
                     "batch_size": None},
        "methods": [{"name": method, "settings": [{"sigma": sigma}]}],
        "seed": 0, "device": "unknown", "shard_size": len(log.lines), "radii": list(RADII),
        "headline_radius": None,
    }  # fmt: skip
    certificates = []
    for line in log.lines:
        own = line.sigma if line.sigma is not None else sigma
        if line.label is None:  # MACER: only whether it was correct; class 0 stands in
            label, prediction = 0, 0 if line.correct else ABSTAIN
        else:
            label, prediction = line.label, line.predict
        p_lower = 0.5 * math.erfc(-line.radius / own / math.sqrt(2.0))
        evidence: dict[str, Any] = {
            "imported": True, "line": line.line,
            "p_lower": "implied by the claimed radius, not estimated", **line.extra,
        }  # fmt: skip
        if line.label is None:
            evidence["label"] = evidence["prediction"] = "not in the file (only: correct or not)"
        cert = Certificate(
            input_id=line.idx, prediction=prediction, radius=line.radius,
            p_lower=p_lower if prediction != ABSTAIN else 0.0, sigma=own, alpha=alpha,
            predict=prediction, seconds=line.seconds or 0.0, evidence=evidence,
        )  # fmt: skip
        certificates.append((label, cert))
    run_id = content_hash({"imported": config})
    store = ResultStore(db)
    try:
        added = store.add_imported_run(
            run_id, name, config, {"idrs-bench": __version__}, method, setting, certificates, sha
        )
    finally:
        store.close()
    if not added:
        raise IdrsError(
            f"{path} is already imported as run {run_id[:12]} ({name}) in {db}; nothing changed"
        )
    return run_id


def add_import_log_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``import-log`` subcommand to ``idrs-bench``'s subparsers."""
    parser = sub.add_parser(
        "import-log",
        help="store a published certification log (Cohen, SmoothAdv, DDRS, ANCER, MACER)",
    )
    parser.add_argument(
        "file", type=Path,
        help="the log, in a format detected from the file (docs/benchmarks.md: Published logs)",
    )  # fmt: skip
    parser.add_argument("--dataset", required=True, help="the dataset it certified, e.g. cifar10")
    parser.add_argument("--name", required=True, help="a name for the run, e.g. cohen2019-0.25")
    parser.add_argument("--sigma", type=float, required=True, help="the smoothing σ of the log")
    parser.add_argument(
        "--method", help="the method it ran (default: the format's, e.g. cohen, ancer)"
    )
    parser.add_argument("--n0", type=int, default=100, help="its selection samples (default 100)")
    parser.add_argument("--n", type=int, default=100_000, help="its estimation samples")
    parser.add_argument("--alpha", type=float, default=0.001, help="its failure probability")
    parser.add_argument(
        "--key", choices=("hard", "soft"), metavar="hard|soft", help="MACER .mat: which smoothing"
    )
    parser.add_argument(
        "--start", type=int, metavar="I", help="MACER .mat: first test input (default 500)"
    )
    parser.add_argument(
        "--skip", type=int, metavar="K", help="MACER .mat: stride between inputs (default 1)"
    )
    parser.add_argument("--db", type=Path, default=DEFAULT_DB, help="results database")
    parser.set_defaults(handler=_import_log_command)
    return parser


def _import_log_command(args: argparse.Namespace) -> int:
    from harness.mathematics.accuracy import row_metrics
    from harness.store.storedrun import load_runs

    run_id = import_log(args.file, args.db, args.dataset, args.name, args.sigma, args.method,
                        args.n0, args.n, args.alpha, args.key, args.start, args.skip)  # fmt: skip
    (run,) = load_runs(args.db, [run_id])
    (row,) = run.rows()
    metrics = row_metrics(row.certificates, run.config["radii"])
    what = ", ".join(
        f"cert@{r:g} {metrics[f'certified_accuracy@{r:g}']:.3f}" for r in run.config["radii"]
    )
    print(
        f"imported {args.file} ({run.config['imported']['format']} format, {row.inputs} inputs) "
        f"as run {run_id[:12]} ({args.name}) into {args.db}: {what}, ACR {metrics['acr']:.3f}"
    )
    return 0
