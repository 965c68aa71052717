"""What a replay of a run needs besides its database: files, each with its SHA-256.

The ``files`` table of the results database (:class:`~harness.store.store.ResultStore`)
names, per run:

- role ``weights``: the base model's weights (the model cache's state dict, or the
  user's checkpoint in its own format), meta ``format``;
- role ``plugin-artifact``: each file a plugin keeps for the run's base model under
  :meth:`~harness.plugin.components.BuildContext.artifact_dir` (e.g. the fitted σ-network of
  ``lipschitz-sigma-net``), named ``<plugin>/<file>``, meta ``plugin``;
- role ``sigma-model``: the state dict of a σ-smoothing's σ-estimator
  (:class:`~harness.engine.draws.SigmaSmoothing`), saved by the harness when the method is
  built, named ``<method> <setting>``, meta ``method``, ``setting``, ``architecture``,
  ``architecture_params``, ``levels``, ``noise``, ``alpha``.

A board ships each of these files beside its markdown (:func:`shipped_name`), and its
run export lists them with their digests, so that ``idrs-bench leaderboard --replay``
can re-draw samples anywhere (:mod:`harness.reports.leaderboard.recheck`).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.foundation.artifacts import cache_root, default_cache_dir, file_digest, save_artifact

if TYPE_CHECKING:
    from harness.plugin.components import SigmaProvider
    from harness.running.benchmark import Benchmark
    from harness.running.preparation import Prepared
    from harness.store.store import ResultStore

WEIGHTS, PLUGIN_ARTIFACT, SIGMA_MODEL = "weights", "plugin-artifact", "sigma-model"
_SKIPPED = (".sha256", ".tmp")


def weights_file(spec: Benchmark, recipe_hash: str, cache_dir: Path | None) -> tuple[Path, str]:
    """The base model's weights file of a run and the format it is read in: the spec's
    checkpoint, else the model cache's ``<recipe hash>.pt`` (a state dict)."""
    if spec.model.checkpoint is not None:
        return Path(spec.model.checkpoint).resolve(), spec.model.format
    return (cache_dir or default_cache_dir()).resolve() / f"{recipe_hash}.pt", "state_dict"


def record_run_files(
    store: ResultStore, prepared: Prepared, cache_dir: Path | None, plugins: set[str]
) -> None:
    """Record the run's weights file and the artifacts kept for its base model by
    ``plugins`` (those providing the run's components) and by every plugin whose artifact
    folder the run's methods asked for in this process (a method may read another
    plugin's, e.g. ANCER's isotropic stage Alfarra et al.'s cross-validated K); another
    method's artifacts for the same base model are not the run's."""
    run_id = prepared.run_id
    path, fmt = weights_file(prepared.benchmark, prepared.recipe_hash, cache_dir)
    if path.is_file():
        store.add_file(run_id, WEIGHTS, "base model", str(path), file_digest(path),
                       {"format": fmt})  # fmt: skip
    root = cache_root() / "plugins"
    if not root.is_dir():
        return
    wanted = plugins | prepared.context.artifact_plugins
    for folder in sorted(root.glob(f"*/{prepared.recipe_hash}")):
        if folder.parent.name not in wanted:
            continue
        for path in sorted(folder.iterdir()):
            if path.is_file() and not path.name.endswith(_SKIPPED) and ".corrupt-" not in path.name:
                plugin = folder.parent.name
                store.add_file(run_id, PLUGIN_ARTIFACT, f"{plugin}/{path.name}", str(path),
                               file_digest(path), {"plugin": plugin})  # fmt: skip


def sigma_model_file(method: str, setting: str) -> str:
    """The file name of a row's σ-estimator, ``sigma-model-<tag>.pt`` (tag: 16 hex digits
    of the SHA-256 of the method and setting)."""
    tag = hashlib.sha256(f"{method}\n{setting}".encode()).hexdigest()[:16]
    return f"sigma-model-{tag}.pt"


def record_sigma_model(
    store: ResultStore, run_id: str, method: str, setting: str, provider: SigmaProvider
) -> None:
    """Save the state dict of the provider's σ-estimator with the run (when it declares a
    σ-smoothing) and record it; the same state is saved once."""
    from harness.certification.certify import sigma_smoothing

    smoothing = sigma_smoothing(provider)
    if smoothing is None:
        return
    state = {k: v.detach().cpu() for k, v in smoothing.model.state_dict().items()}
    path = cache_root() / "runs" / run_id / sigma_model_file(method, setting)
    save_artifact(path, state)
    meta = {"method": method, "setting": setting, "architecture": smoothing.architecture,
            "architecture_params": dict(smoothing.architecture_params or {}),
            "levels": [float(v) for v in smoothing.levels], "noise": float(smoothing.noise),
            "alpha": float(smoothing.alpha)}  # fmt: skip
    store.add_file(run_id, SIGMA_MODEL, f"{method} {setting}", str(path), file_digest(path), meta)


def shipped_name(stem: str, run_id: str, entry: dict[str, Any], single: bool) -> str:
    """The file name beside board ``stem``.md of a recorded run file: ``NAME.weights.pt``
    for the base model of a one-run board (``NAME.weights-RUNID.pt`` with several runs),
    ``NAME.RUNID.<plugin>.<file>`` for a plugin artifact, ``NAME.RUNID.sigma-model-<tag>.pt``
    for a σ-estimator (RUNID: the run id's first 12 digits). Every name derives from the
    entry's role, name and meta, never from where the file lies now, so re-publishing a
    board from its own export keeps its file names."""
    run = run_id[:12]
    if entry["role"] == WEIGHTS:
        return f"{stem}.weights.pt" if single else f"{stem}.weights-{run}.pt"
    if entry["role"] == SIGMA_MODEL:
        meta = entry["meta"]
        return f"{stem}.{run}.{sigma_model_file(meta['method'], meta['setting'])}"
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", entry["name"].replace("/", "."))
    return f"{stem}.{run}.{safe}"
