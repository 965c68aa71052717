"""The files a board ships beside it, read back to re-check it: the base model's weights
(``NAME.weights.pt``), the σ-estimators, and the plugins' trained parts, each checked
against the SHA-256 its run export records. Every path built from an export's fields is
checked as the harness checks its own: an export is a file from the field, and a forged
one must not make a reviewer's machine write outside the cache (a plugin's name is one
plain path component: :func:`harness.plugin.entry_points.artifact_folder`)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from harness.foundation.errors import IdrsError
from harness.store.storedrun import StoredRun


def missing_weights_message(path: Path) -> str:
    """How to get a board's weights file that is not beside it."""
    return (
        f"{path.name} is not beside the board ({path}): it ships with the board (copy it from "
        "where the board is published, e.g. the repository's leaderboards/ folder), or render "
        "the board again with `idrs-bench leaderboard RUN --db DB --out BOARD.md` on the "
        "machine whose model cache holds the run's weights"
    )


def stage_trained_parts(run: StoredRun, root: Path) -> None:
    """Copy the trained parts a board ships for ``run`` (plugins' fitted artifacts) where
    the plugins look for them under the cache root ``root``, each checked against the
    SHA-256 its export records."""
    from harness.foundation.artifacts import file_digest
    from harness.plugin.entry_points import ARTIFACT_FOLDER, artifact_folder
    from harness.running.runfiles import PLUGIN_ARTIFACT

    for f in run.files:
        if f["role"] == PLUGIN_ARTIFACT:
            source = Path(f["path"])
            if not source.is_file() or file_digest(source) != f["sha256"]:
                raise IdrsError(f"{source.name}, a trained part the board ships, is missing or "
                                "has another SHA-256")  # fmt: skip
            recipe = str(run.run["recipe_hash"])
            if not re.fullmatch(r"[0-9a-f]{1,64}", recipe):
                raise IdrsError(f"the board's export records the recipe hash {recipe!r}, not a "
                                "SHA-256 in hex: the export is damaged or forged")  # fmt: skip
            # the plugin's name from the export is a path component: checked as at discovery
            folder = artifact_folder(root / ARTIFACT_FOLDER, f["meta"]["plugin"], create=True)
            target = folder / recipe / Path(f["name"]).name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            (target.parent / (target.name + ".sha256")).write_text(f["sha256"] + "\n")


def replay_source(run: StoredRun, data_root: str | None):
    """The replay files of a run read from an export (their paths beside the board)."""
    from harness.running.redraw import ReplaySource
    from harness.running.runfiles import SIGMA_MODEL, WEIGHTS

    weights = next((f for f in run.files if f["role"] == WEIGHTS), None)
    if weights is None:
        raise IdrsError(
            f"run {run.run_id[:12]}'s export names no weights file (a run made before boards "
            "shipped their files); certify its spec again to replay it"
        )
    path = Path(weights["path"])
    if not path.is_file():
        raise IdrsError(missing_weights_message(path))
    models = {f["name"]: {"path": f["path"], "sha256": f["sha256"], **f["meta"]}
              for f in run.files if f["role"] == SIGMA_MODEL}  # fmt: skip
    return ReplaySource(run.config, path, weights["meta"].get("format", "state_dict"),
                        run.run.get("weights_digest"), run.run.get("arithmetic"),
                        run.data_files, data_root, models, missing_weights_message(path))  # fmt: skip
