"""``idrs-bench import-log FILE``: store a published certification log as an imported run.

The log (Cohen et al.'s format, :mod:`harness.cohen_log`) becomes a run whose config
is marked ``imported``: its rows appear on a board in their own section beside the
runs made here, never as verified sound (there is no evidence to audit), and
``idrs-bench check`` refuses it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness.store import DEFAULT_DB


def import_log(
    path: str | Path, db: str | Path, dataset: str, name: str, sigma: float,
    method: str = "cohen", n0: int = 100, n: int = 100_000, alpha: float = 0.001,
) -> str:  # fmt: skip
    """Store the log at ``path`` in ``db``; returns the new run's id.

    Each line becomes a certificate with CERTIFY's prediction, the claimed radius, σ
    and the time; p_A's lower bound is the one the claimed radius implies,
    Φ(radius/σ) (Cohen et al. 2019, Thm. 1), not an estimate.
    """
    import hashlib
    import math

    from harness import __version__
    from harness.certificate import Certificate
    from harness.cohen_log import read_log
    from harness.protocol import CertificationProtocol, check_sigma
    from harness.results import RADII
    from harness.spec import content_hash, setting_key
    from harness.store import ResultStore

    lines = read_log(path)
    sigma = check_sigma(sigma)
    protocol = CertificationProtocol(n0=n0, n=n, alpha=alpha)
    sha = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    setting = setting_key({"sigma": sigma})
    config: dict[str, Any] = {
        "name": name,
        "imported": {"format": "cohen-log", "file": Path(path).name, "sha256": sha},
        "dataset": {"name": dataset, "test_every": 1, "test_count": None},
        "model": {"architecture": "imported", "trainer": "imported", "seed": 0,
                  "architecture_params": {}, "trainer_params": {}},
        "protocol": {"n0": protocol.n0, "n": protocol.n, "alpha": protocol.alpha,
                     "batch_size": None},
        "methods": [{"name": method, "settings": [{"sigma": sigma}]}],
        "seed": 0, "device": "unknown", "shard_size": len(lines), "radii": list(RADII),
        "headline_radius": None,
    }  # fmt: skip
    run_id = content_hash({"imported": config})
    store = ResultStore(db)
    try:
        store.begin_run(run_id, name, config, {"idrs-bench": __version__}, None, "unknown", 0,
                        sha)  # fmt: skip
        for number, line in enumerate(lines, start=2):
            p_lower = 0.5 * math.erfc(-line.radius / sigma / math.sqrt(2.0))
            cert = Certificate(
                input_id=line.idx, prediction=line.predict, radius=line.radius,
                p_lower=p_lower if line.predict >= 0 else 0.0, sigma=sigma, alpha=alpha,
                predict=line.predict, seconds=line.seconds,
                evidence={"imported": True, "line": number,
                          "p_lower": "implied by the claimed radius, not estimated"},
            )  # fmt: skip
            store.add_certificate(run_id, method, setting, 0, line.label, cert)
        store.finish_shard(run_id, method, setting, 0)
        store.finish_run(run_id)
    finally:
        store.close()
    return run_id


def add_import_log_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``import-log`` subcommand to ``idrs-bench``'s subparsers."""
    parser = sub.add_parser(
        "import-log", help="store a published certification log (Cohen et al.'s format)"
    )
    parser.add_argument(
        "file", type=Path, help="the log: idx, label, predict, radius, correct, time"
    )
    parser.add_argument("--dataset", required=True, help="the dataset it certified, e.g. cifar10")
    parser.add_argument("--name", required=True, help="a name for the run, e.g. cohen2019-0.25")
    parser.add_argument("--sigma", type=float, required=True, help="the smoothing σ of the log")
    parser.add_argument("--method", default="cohen", help="the method it ran (default cohen)")
    parser.add_argument("--n0", type=int, default=100, help="its selection samples (default 100)")
    parser.add_argument("--n", type=int, default=100_000, help="its estimation samples")
    parser.add_argument("--alpha", type=float, default=0.001, help="its failure probability")
    parser.add_argument("--db", type=Path, default=DEFAULT_DB, help="results database")
    parser.set_defaults(handler=_import_log_command)
    return parser


def _import_log_command(args: argparse.Namespace) -> int:
    run_id = import_log(args.file, args.db, args.dataset, args.name, args.sigma, args.method,
                        args.n0, args.n, args.alpha)  # fmt: skip
    print(f"imported {args.file} as run {run_id[:12]} ({args.name}) into {args.db}")
    return 0
