"""Base models trained once and cached by a content hash of everything that made them.

Every method of a benchmark certifies the identical weights; the hash is printed in
results and leaderboards. Checkpoints are state dicts loaded with
``torch.load(..., weights_only=True)``: nothing is unpickled.

Caches heal: every cached artifact (a base model here, or a plugin's, e.g. the fitted
σ-network of ``lipschitz-sigma-net``) is written with :func:`save_artifact`, which
stores the file's SHA-256 beside it (``<file>.sha256``). :func:`load_artifact` checks
that digest before loading; a file that is truncated, altered or fails to load is
named in a one-line warning, moved aside to ``<file>.corrupt-<timestamp>`` and
reported as missing, so the caller rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from harness.components import TrainContext
from harness.data import Dataset
from harness.plugins import Registry
from harness.progress import Progress
from harness.spec import ModelConfig, content_hash

CACHE_ENV_VAR = "IDRS_BENCH_CACHE"


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV_VAR, Path.home() / ".cache" / "idrs-bench")) / "models"


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def save_artifact(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` (tensors) to ``path`` atomically, with its SHA-256 beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    digest = file_digest(tmp)
    tmp.replace(path)  # atomic: an interrupted save leaves no half checkpoint
    _digest_path(path).write_text(digest + "\n")


def load_artifact(path: Path, progress: Progress, what: str = "cached file") -> Any | None:
    """The state saved at ``path``, or None when it is absent or damaged (then moved aside).

    A file without a stored digest (written before digests were kept) is loaded and
    its digest recorded; a digest mismatch or a load error quarantines the file.
    """
    if not path.is_file():
        return None
    digest_file = _digest_path(path)
    try:
        if digest_file.is_file():
            expected = digest_file.read_text().strip()
            actual = file_digest(path)
            if actual != expected:
                raise ValueError(f"SHA-256 {actual[:12]} does not match the stored {expected[:12]}")
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # any damage: warn, move aside, rebuild
        quarantine(path, exc, progress, what)
        return None
    if not digest_file.is_file():
        digest_file.write_text(file_digest(path) + "\n")
    return state


def quarantine(path: Path, reason: BaseException | str, progress: Progress, what: str) -> None:
    """Move a damaged cached file aside (``<file>.corrupt-<timestamp>``) with a one-line warning."""
    aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
    path.replace(aside)
    _digest_path(path).unlink(missing_ok=True)
    text = (str(reason).splitlines() or [type(reason).__name__])[0]
    progress.warn(f"{what} {path} is damaged ({text}); moved to {aside.name}, rebuilding")


def model_recipe(config: ModelConfig, dataset: Dataset, registry: Registry) -> dict[str, Any]:
    """What makes the model, with every default filled in (the input to its hash)."""
    arch = registry.get("models", config.architecture)
    trainer = registry.get("trainers", config.trainer)
    return {
        "format": 1,
        "dataset": dataset.name,
        "input_shape": list(dataset.input_shape),
        "num_classes": dataset.num_classes,
        "architecture": config.architecture,
        "architecture_params": {
            **arch.defaults,
            **registry.family_args("models", config.architecture),
            **config.architecture_params,
        },
        "trainer": config.trainer,
        "trainer_params": {**trainer.defaults, **config.trainer_params},
        "seed": config.seed,
    }


def obtain_model(
    config: ModelConfig,
    dataset: Dataset,
    registry: Registry,
    device: torch.device,
    progress: Progress,
    cache_dir: Path | None = None,
) -> tuple[torch.nn.Module, str]:
    """The cached model for ``config`` (trained now if missing or damaged) and its content hash."""
    if config.checkpoint is not None:  # the user's own weights (harness/checkpoint.py)
        from harness.checkpoint import load_checkpoint

        model, digest = load_checkpoint(config, dataset, registry)
        progress.log(f"base model {digest[:12]} loaded from {config.checkpoint}")
        return model.to(device).eval(), digest
    recipe = model_recipe(config, dataset, registry)
    digest = content_hash(recipe)
    cache_dir = cache_dir or default_cache_dir()
    path = cache_dir / f"{digest}.pt"
    torch.manual_seed(config.seed)  # the initial weights are part of the recipe
    arch = registry.get("models", config.architecture)
    model = arch.build(dataset.input_shape, dataset.num_classes, recipe["architecture_params"])
    state = load_artifact(path, progress, "cached base model")
    if state is not None:
        try:
            model.load_state_dict(state)
        except Exception as exc:  # a readable file that does not fit the architecture
            quarantine(path, exc, progress, "cached base model")
            state = None
            torch.manual_seed(config.seed)
            model = arch.build(
                dataset.input_shape, dataset.num_classes, recipe["architecture_params"]
            )
    if state is not None:
        progress.log(f"base model {digest[:12]} loaded from {path}")
    else:
        trainer = registry.get("trainers", config.trainer)
        context = TrainContext(device=device, seed=config.seed, progress=progress)
        trainer.train(model, dataset, recipe["trainer_params"], context)
        save_artifact(path, {k: v.cpu() for k, v in model.state_dict().items()})
        path.with_suffix(".json").write_text(json.dumps(recipe, indent=2, sort_keys=True))
        progress.log(f"base model {digest[:12]} trained and cached at {path}")
    return model.to(device).eval(), digest
