"""``idrs-bench leaderboard --verify BOARD.md --reaudit``: every check re-run on the board's files.

Re-deriving a board (:mod:`harness.reports.leaderboard.recheck`) confirms S0's and the
replay check's verdicts from their recorded evidence; the other checks' verdicts rest
on searches and draws the export only summarizes. :func:`reaudit_board` re-runs every
check of every row (:func:`harness.audit.reaudit.reaudit`: the checks' own code path,
from each row's recorded entropy, against the plugins installed here) on what the board
ships: the run export's certificates, the base model's weights (staged in a temporary
cache root as the model cache's ``<recipe hash>.pt``, checked against the SHA-256 the
export records), the plugins' trained parts
(:func:`~harness.reports.leaderboard.shipped_files.stage_trained_parts`), the σ-estimators, and
the dataset, whose files must have the SHA-256 the run recorded. It costs what the
run's checks cost (measured in leaderboards/README.md).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from harness.audit.audit import Budget
from harness.audit.reaudit import RowReaudit, reaudit
from harness.foundation.artifacts import cache_root_at, file_digest
from harness.foundation.errors import IdrsError
from harness.foundation.progress import Progress
from harness.plugin.manager import PluginManager, managed
from harness.reports.leaderboard.shipped_files import missing_weights_message, stage_trained_parts
from harness.running.preparation import RunOptions
from harness.running.runfiles import WEIGHTS
from harness.store.storedrun import StoredRun


def reaudit_board(
    runs: list[StoredRun], data_root: str | None, device: str, progress: Progress,
    manager: PluginManager | None = None, budgets: Mapping[str, Budget] | None = None,
    workers: int | None = 1,
) -> list[RowReaudit]:  # fmt: skip
    """Re-audit every checked row of the board's ``runs`` from the files beside it.
    ``device``: ``auto`` (the run's device where this machine has one, else the CPU),
    ``cpu`` or ``cuda``; ``workers``: processes auditing rows side by side
    (:func:`harness.audit.auditor.run_checks`)."""
    out: list[RowReaudit] = []
    with managed(manager) as manager:  # (one made here ends its hosts on return)
        for run in runs:
            if run.imported:
                continue
            with tempfile.TemporaryDirectory(prefix="idrs-reaudit-") as folder:
                root = Path(folder) / "cache"
                with cache_root_at(root):
                    try:
                        stage_weights(run, root)
                        stage_trained_parts(run, root)
                    except IdrsError as exc:
                        out += [RowReaudit.of(run, row, error=str(exc))
                                for row in run.rows() if row.checks]  # fmt: skip
                        continue
                    manager.stop_hosts()  # (they start again with this cache root: a confined
                    # host writes its plugins' artifact folders under the cache root it starts with)
                    here = _device(run, device, progress)
                    options = RunOptions(db=Path(os.devnull), device=here, data_root=data_root)
                    out += reaudit(run, Path(folder), options, progress, manager, budgets=budgets,
                                   workers=workers)  # fmt: skip
    return out


def stage_weights(run: StoredRun, root: Path) -> None:
    """The board's base-model weights as the model cache under ``root`` holds them
    (``models/<recipe hash>.pt`` with its SHA-256), checked against the export's record."""
    weights = next((f for f in run.files if f["role"] == WEIGHTS), None)
    if weights is None:
        raise IdrsError(f"run {run.run_id[:12]}'s export names no weights file (a run made "
                        "before boards shipped their files); certify its spec again")  # fmt: skip
    if run.config["model"].get("checkpoint"):
        raise IdrsError(f"run {run.run_id[:12]} certified a checkpoint of its own; re-audit it "
                        "on its results database (`idrs-bench check RUN --reaudit`)")  # fmt: skip
    path = Path(weights["path"])
    if not path.is_file():
        raise IdrsError(missing_weights_message(path))
    digest = file_digest(path)
    if digest != weights["sha256"]:
        raise IdrsError(f"{path.name} has SHA-256 {digest}, the run's weights "
                        f"{weights['sha256']}: another model, refused")  # fmt: skip
    target = root / "models" / f"{run.run['recipe_hash']}.pt"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, target)
    target.with_name(target.name + ".sha256").write_text(digest + "\n")


def _device(run: StoredRun, device: str, progress: Progress) -> str:
    """Where to re-audit: ``auto`` is the run's device when this machine has one."""
    if device != "auto":
        return device
    import torch

    if run.run["device"] == "cpu" or torch.cuda.is_available():
        return run.run["device"]
    progress.note(f"run {run.run_id[:12]} was audited on {run.run['device']}, which this "
                  "machine lacks: re-audited on the CPU, where a statistical check draws with "
                  "another rounding (a sound row's verdict may differ by chance)")  # fmt: skip
    return "cpu"
