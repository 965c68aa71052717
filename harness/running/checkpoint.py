"""Bring your own model: base-model weights from a file instead of a training.

``[model] checkpoint = "PATH"`` with ``format`` one of

- ``cohen``: a file as the field published it, read as its own code reads it:

  - Cohen et al.'s (2019) ``train.py`` (kept by SmoothAdv's ``train_pgd.py``, Salman et
    al. 2019): a dict with ``epoch``, ``arch`` (``cifar_resnet20``, ``cifar_resnet110``
    or ``resnet50``), ``optimizer`` and the ``state_dict`` of ``Sequential(normalize,
    net)``, as their ``architectures.get_architecture`` builds it: the normalization
    holds no saved tensor, so the keys start at ``1.``; ImageNet's ``net`` is wrapped in
    DataParallel (``1.module.…``). The ``arch`` names the architecture (``cifar-resnet``
    of depth 20 or 110, ``resnet50``), normalized per channel by the dataset's
    statistics (``NormalizeLayer``). SmoothAdv trained some of its released models with
    an ``InputCenterLayer`` (mean subtracted, no division; their README lists which):
    for those give ``architecture_params = { normalization = "cifar10-centered" }``
    (or ``"imagenet-centered"``).
  - MACER's ``main.py`` (Zhai et al. 2020): a dict with ``net`` (the state dict of its
    ResNet-110, same module names, no normalization layer: it is trained on pixels in
    [0, 1]) and ``epoch``; read as ``cifar-resnet`` of depth 110 with
    ``normalization = "none"`` (MACER's CIFAR-10 and SVHN models).

  ``architecture`` may be left out (it is read from the file and recorded in the run);
  when given it must agree with the file.
- ``state_dict``: the state dict of the spec's architecture (as the model cache stores
  them), or a dict holding one under ``state_dict``.
- ``torchscript``: a ``torch.jit.save`` file; the architecture comes with it.

Everything is read with ``torch.load(..., weights_only=True)`` (TorchScript with
``torch.jit.load``): nothing is unpickled. The model's cache key is a hash of the
file's SHA-256 and how it is read.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from harness.foundation.artifacts import file_digest
from harness.foundation.data import Dataset
from harness.foundation.errors import IdrsError, ParameterError
from harness.foundation.identity import content_hash
from harness.plugin.model_description import build_model
from harness.plugin.registry import Registry
from harness.running.benchmark import AUTO_ARCHITECTURE, ModelConfig
from harness.running.checkpoint_diagnosis import diagnose

COHEN_ARCHITECTURES: dict[str, tuple[str, dict[str, Any]]] = {
    "cifar_resnet20": ("cifar-resnet", {"depth": 20}),
    "cifar_resnet110": ("cifar-resnet", {"depth": 110}),
    "resnet50": ("resnet50", {}),
}
"""The ``arch`` values of Cohen et al.'s (and SmoothAdv's) ``architectures.py`` the
harness builds: arch -> (architecture, its parameters)."""

MACER_DATASETS = ("cifar10", "svhn")
"""Datasets MACER's ``main.py`` trains its ResNet-110 on (its MNIST LeNet is not built in)."""


class CheckpointError(IdrsError):
    """A checkpoint that cannot be read into the model the spec names."""


@dataclass(frozen=True)
class PublishedCheckpoint:
    """A ``format = "cohen"`` file, as its publishing code reads it."""

    source: str  # "cohen" (train.py, train_pgd.py) or "macer" (main.py)
    arch: str  # how the file (or, for MACER, its code) names the architecture
    architecture: str  # the harness's architecture
    params: dict[str, Any]  # its parameters (normalization included)
    state: dict[str, torch.Tensor]  # keys of Sequential(normalize, net): ``1.…``


def _read(path: Path, fmt: str = "cohen") -> Any:
    """The content of a checkpoint read with ``weights_only=True``; anything else (a pickled
    object, a wrong format, a truncated file) is an error naming what it is and the fix."""
    if not path.is_file():
        raise CheckpointError(f"model checkpoint {str(path)!r} not found")
    try:
        with warnings.catch_warnings():  # a TorchScript file is named in the error instead
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(diagnose(path, fmt, exc)) from None


def read_published(path: Path, dataset: str, content: Any = None) -> PublishedCheckpoint:
    """The architecture, normalization and state dict of a Cohen- or MACER-format file
    (``architecture`` None for an ``arch`` the harness does not know)."""
    content = _read(path) if content is None else content
    if isinstance(content, dict) and "arch" in content and "state_dict" in content:
        arch = str(content["arch"])
        architecture, params = COHEN_ARCHITECTURES.get(arch, (None, {}))
        state = {
            key.replace("1.module.", "1.", 1) if key.startswith("1.module.") else key: value
            for key, value in content["state_dict"].items()
        }
        return PublishedCheckpoint("cohen", arch, architecture, {**params, "normalization": dataset},
                                   state)  # fmt: skip
    if isinstance(content, dict) and "net" in content and "epoch" in content:
        if dataset not in MACER_DATASETS:
            raise CheckpointError(
                f"{path} is a MACER checkpoint ('net', 'epoch'); MACER's ResNet-110 is for "
                f"{' and '.join(MACER_DATASETS)}, the spec certifies {dataset!r} (MACER's MNIST "
                'LeNet is not built in: load it as TorchScript, format = "torchscript")'
            )
        state = {"1." + key.removeprefix("module."): value for key, value in content["net"].items()}
        return PublishedCheckpoint("macer", "resnet110", "cifar-resnet",
                                   {"depth": 110, "normalization": "none"}, state)  # fmt: skip
    keys = sorted(map(str, content))[:6] if isinstance(content, dict) else type(content).__name__
    raise CheckpointError(
        f"{path} is neither a checkpoint of Cohen et al.'s train.py (a dict with 'arch' and "
        f"'state_dict') nor of MACER's main.py ('net' and 'epoch'); it holds {keys}: use "
        'format = "state_dict" with [model] architecture for a plain state dict'
    )


def resolve_architecture(config: ModelConfig, dataset: str, registry: Registry) -> ModelConfig:
    """``config`` with the architecture of a ``format = "cohen"`` file filled in (it may be
    left out of the spec) and checked against the spec's when given; other formats as they are."""
    if config.checkpoint is None or config.format != "cohen":
        return config
    path = Path(config.checkpoint)
    published = read_published(path, dataset)
    if published.architecture is None:  # an arch the harness does not know
        if config.architecture == AUTO_ARCHITECTURE:
            raise CheckpointError(
                f"{path}: the file's arch {published.arch!r} is not one the harness knows "
                f"({', '.join(sorted(COHEN_ARCHITECTURES))}); name the architecture in the spec, "
                '[model] architecture = NAME (e.g. "cifar-resnet" with architecture_params = '
                '{ depth = 56 }; `idrs-bench plugins` lists them): format = "cohen" still reads '
                "the file's state_dict"
            )
        defaults = registry.get("models", config.architecture).defaults
        normalize = {"normalization": dataset} if "normalization" in defaults else {}
        return replace(config, architecture_params={**normalize, **config.architecture_params})
    params = {**published.params, **config.architecture_params}  # the spec may set normalization
    if config.architecture not in (AUTO_ARCHITECTURE, published.architecture) or any(
        params[k] != v for k, v in published.params.items() if k != "normalization"
    ):
        given = {k: v for k, v in published.params.items() if k != "normalization"}
        raise CheckpointError(
            f"{path} holds a {published.arch} ({published.source} format), but the spec says "
            f"architecture = {config.architecture!r} with {config.architecture_params}; set "
            f"architecture = {published.architecture!r} and architecture_params = {given}, or "
            "leave both out (they are read from the file)"
        )
    return replace(config, architecture=published.architecture, architecture_params=params)


def load_checkpoint(
    config: ModelConfig, dataset: Dataset, registry: Registry
) -> tuple[torch.nn.Module, str]:
    """The model stored in ``config.checkpoint`` (on the CPU, eval mode) and its cache key."""
    config = resolve_architecture(config, dataset.name, registry)
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
    content = _read(path, config.format)
    if config.format == "cohen":
        state = read_published(path, dataset.name, content).state
    else:
        state = content.get("state_dict", content) if isinstance(content, dict) else None
        if not isinstance(state, dict):
            raise CheckpointError(f"{path} holds no state dict (a mapping of tensors)")
    arch = registry.get("models", config.architecture)
    try:
        model = build_model(registry, config.architecture, dataset.input_shape,
                            dataset.num_classes, {**arch.defaults, **config.architecture_params})  # fmt: skip
    except ParameterError as exc:  # e.g. no normalization statistics for the dataset
        if config.format != "cohen":
            raise
        raise CheckpointError(
            f"{path}: the published models normalize by their dataset's statistics, and "
            f"{config.architecture!r} has none for {dataset.name!r}: {exc}; set "
            "[model] architecture_params = { normalization = NAME }"
        ) from None
    load_state(model, state, path, config.architecture)
    return model.eval(), key


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
