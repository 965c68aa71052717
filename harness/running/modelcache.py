"""Base models trained once and cached by a content hash of everything that made them.

Every method of a benchmark certifies the identical weights; the hash is printed in
results and leaderboards. Checkpoints are state dicts loaded with
``torch.load(..., weights_only=True)``: nothing is unpickled.

Cached models heal like every cached artifact (:mod:`harness.foundation.artifacts`): a damaged
file is moved aside with a warning and the model is trained again. Processes that need
the same missing model at once (``idrs-bench run`` started twice) train it once: the
others wait on a lock file beside it and then load it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from harness.foundation.artifacts import default_cache_dir, load_artifact, quarantine, save_artifact
from harness.foundation.data import Dataset
from harness.foundation.identity import content_hash
from harness.foundation.progress import Progress
from harness.plugin.components import TrainContext
from harness.plugin.model_description import build_model
from harness.plugin.registry import Registry
from harness.running.benchmark import ModelConfig


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


def build_architecture(
    config: ModelConfig, dataset: Dataset, registry: Registry
) -> torch.nn.Module:
    """The recipe's architecture with its initial weights (seeded by the recipe's seed);
    the cache, training and every Ray worker build a base model through it."""
    torch.manual_seed(config.seed)  # the initial weights are part of the recipe
    params = model_recipe(config, dataset, registry)["architecture_params"]
    return build_model(registry, config.architecture, dataset.input_shape, dataset.num_classes,
                       params)  # fmt: skip


def obtain_model(
    config: ModelConfig,
    dataset: Dataset,
    registry: Registry,
    device: torch.device,
    progress: Progress,
    cache_dir: Path | None = None,
) -> tuple[torch.nn.Module, str]:
    """The cached model for ``config`` (trained now if missing or damaged) and its content hash."""
    if config.checkpoint is not None:  # the user's own weights (harness/running/checkpoint.py)
        from harness.running.checkpoint import load_checkpoint

        model, digest = load_checkpoint(config, dataset, registry)
        progress.log(f"base model {digest[:12]} loaded from {config.checkpoint}")
        return model.to(device).eval(), digest
    recipe = model_recipe(config, dataset, registry)
    digest = content_hash(recipe)
    cache_dir = cache_dir or default_cache_dir()
    path = cache_dir / f"{digest}.pt"
    with _exclusive(path.with_suffix(".lock"), progress, f"base model {digest[:12]}"):
        model = _cached_or_trained(config, dataset, registry, device, progress, recipe, path)
    return model.to(device).eval(), digest


@contextmanager
def _exclusive(lock: Path, progress: Progress, what: str) -> Iterator[None]:
    """Hold an exclusive lock on the file ``lock`` (waiting, with a line, while another
    process holds it); a no-op where ``fcntl`` does not exist."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress.log(f"waiting for another process that is training {what}")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _cached_or_trained(
    config: ModelConfig,
    dataset: Dataset,
    registry: Registry,
    device: torch.device,
    progress: Progress,
    recipe: dict[str, Any],
    path: Path,
) -> torch.nn.Module:
    """The model of ``recipe`` from ``path``, or trained now and saved there."""
    digest = path.stem
    model = build_architecture(config, dataset, registry)
    state = load_artifact(path, progress, "cached base model")
    if state is not None:
        try:
            model.load_state_dict(state)
        except Exception as exc:  # a readable file that does not fit the architecture
            quarantine(path, exc, progress, "cached base model")
            state = None
            model = build_architecture(config, dataset, registry)
    if state is not None:
        progress.log(f"base model {digest[:12]} loaded from {path}")
    else:
        trainer = registry.get("trainers", config.trainer)
        context = TrainContext(device=device, seed=config.seed, progress=progress)
        # the trainer gets the training split and the description, never the test split
        trainer.train(model, dataset.training_split(), recipe["trainer_params"], context)
        save_artifact(path, {k: v.cpu() for k, v in model.state_dict().items()})
        path.with_suffix(".json").write_text(json.dumps(recipe, indent=2, sort_keys=True))
        progress.log(f"base model {digest[:12]} trained and cached at {path}")
    return model
