"""Bring your own model: base-model weights from a file instead of a training.

``[model] checkpoint = "PATH"`` with ``format`` one of

- ``cohen``: a file written by Cohen et al.'s (2019) ``train.py``: a dict with
  ``epoch``, ``arch`` (``cifar_resnet20``, ``cifar_resnet110`` or ``resnet50``),
  ``optimizer`` and the ``state_dict`` of ``Sequential(NormalizeLayer, net)`` (keys
  from ``1.``; ImageNet's ``net`` wrapped in DataParallel, ``1.module.…``). It loads
  into the matching architecture (``cifar-resnet`` of depth 20 / 110, ``resnet50``)
  with the dataset's normalization.
- ``state_dict``: the state dict of the spec's architecture (as the model cache stores
  them), or a dict holding one under ``state_dict``.
- ``torchscript``: a ``torch.jit.save`` file; the architecture comes with it.

Everything is read with ``torch.load(..., weights_only=True)`` (TorchScript with
``torch.jit.load``): nothing is unpickled. The model's cache key is a hash of the
file's SHA-256 and how it is read.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from harness.artifacts import file_digest
from harness.checkpoint_diagnosis import diagnose
from harness.components import Registry
from harness.data import Dataset
from harness.errors import IdrsError, ParameterError
from harness.spec import ModelConfig, content_hash

COHEN_ARCHITECTURES: dict[str, tuple[str, dict[str, Any]]] = {
    "cifar_resnet20": ("cifar-resnet", {"depth": 20}),
    "cifar_resnet110": ("cifar-resnet", {"depth": 110}),
    "resnet50": ("resnet50", {}),
}


class CheckpointError(IdrsError):
    """A checkpoint that cannot be read into the model the spec names."""


def load_checkpoint(
    config: ModelConfig, dataset: Dataset, registry: Registry
) -> tuple[torch.nn.Module, str]:
    """The model stored in ``config.checkpoint`` (on the CPU, eval mode) and its cache key."""
    path = Path(config.checkpoint or "")
    if not path.is_file():
        raise CheckpointError(f"model checkpoint {str(path)!r} not found")
    key = content_hash(
        {"checkpoint_sha256": file_digest(path), "format": config.format,
         "architecture": config.architecture, "architecture_params": config.architecture_params,
         "dataset": dataset.name, "num_classes": dataset.num_classes}
    )  # fmt: skip
    if config.format == "torchscript":
        try:
            with warnings.catch_warnings():  # torch.jit's deprecation notice, on every load
                warnings.simplefilter("ignore", FutureWarning)
                model = torch.jit.load(str(path), map_location="cpu")
        except Exception as exc:  # not TorchScript, damaged
            raise CheckpointError(diagnose(path, config.format, exc)) from None
        return model.eval(), key
    try:
        with warnings.catch_warnings():  # a TorchScript file is named in the error instead
            warnings.simplefilter("ignore", UserWarning)
            content = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a pickled object, a wrong format, a truncated file
        raise CheckpointError(diagnose(path, config.format, exc)) from None
    if config.format == "cohen":
        state, params = _cohen_state(content, config, dataset, path)
    else:
        state = content.get("state_dict", content) if isinstance(content, dict) else None
        if not isinstance(state, dict):
            raise CheckpointError(f"{path} holds no state dict (a mapping of tensors)")
        params = config.architecture_params
    arch = registry.get("models", config.architecture)
    try:
        model = arch.build(dataset.input_shape, dataset.num_classes, {**arch.defaults, **params})
    except ParameterError as exc:  # e.g. no normalization statistics for the dataset
        if config.format != "cohen":
            raise
        raise CheckpointError(
            f"{path}: Cohen et al.'s models normalize by the dataset's statistics, and "
            f"{config.architecture!r} has none for {dataset.name!r}: {exc}"
        ) from None
    load_state(model, state, path, config.architecture)
    return model.eval(), key


def _cohen_state(content: Any, config: ModelConfig, dataset: Dataset, path: Path):
    if not isinstance(content, dict) or "state_dict" not in content or "arch" not in content:
        raise CheckpointError(
            f"{path} is not a checkpoint of Cohen et al.'s train.py (a dict with 'arch' and "
            "'state_dict'); use format = \"state_dict\" for a plain state dict"
        )
    arch = content["arch"]
    if arch not in COHEN_ARCHITECTURES:
        raise CheckpointError(
            f"{path}: architecture {arch!r} is not one of Cohen et al.'s "
            f"{sorted(COHEN_ARCHITECTURES)}"
        )
    name, params = COHEN_ARCHITECTURES[arch]
    if config.architecture != name or any(
        config.architecture_params.get(k, v) != v for k, v in params.items()
    ):
        raise CheckpointError(
            f"{path} holds a {arch}; set [model] architecture = {name!r} and "
            f"architecture_params = {params} (the spec says {config.architecture!r}, "
            f"{config.architecture_params})"
        )
    state = {
        key.replace("1.module.", "1.", 1) if key.startswith("1.module.") else key: value
        for key, value in content["state_dict"].items()
    }
    return state, {**config.architecture_params, **params, "normalization": dataset.name}


def load_state(model: torch.nn.Module, state: dict, path: Path, architecture: str) -> None:
    """``model.load_state_dict(state)``, or one error naming the first mismatching keys."""
    expected = model.state_dict()
    # checkpoints older than PyTorch 0.4.1 (and Cohen et al.'s) may lack BN step counters
    state = {**{k: v for k, v in expected.items() if k.endswith("num_batches_tracked")}, **state}
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        raise CheckpointError(
            f"{path} does not fit architecture {architecture!r}: "
            f"{len(missing)} missing key(s) {missing[:5]}, "
            f"{len(unexpected)} unexpected key(s) {unexpected[:5]}"
        )
    wrong = [
        f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}"
        for k, v in expected.items()
        if tuple(state[k].shape) != tuple(v.shape)
    ]
    if wrong:
        raise CheckpointError(
            f"{path} does not fit architecture {architecture!r}: {len(wrong)} tensor(s) of the "
            f"wrong shape, e.g. {wrong[:3]} (checkpoint vs model)"
        )
    model.load_state_dict(state)
