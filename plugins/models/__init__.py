"""Built-in base-model architectures: ``mlp``, ``cnn``, ``cifar-resnet``, ``lenet``, ``resnet50``.

Models take inputs in the dataset's own space (pixels in [0, 1]) and return logits;
nothing is normalized outside the model because noise is added in input space.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from harness import ModelSpec, ParameterError, hookimpl

IDRS_BENCH_CONTRACT = 4
"""The plugin contract this plugin is written against (docs/plugins.md)."""


def build_mlp(input_shape: tuple[int, ...], num_classes: int, params: Mapping[str, Any]):
    """d → width → classes with one ReLU (784-200-10 on fashion-mnist, as in Bergstrom et al. §4)."""
    import torch.nn as nn

    width = int(params.get("width", 200))
    if width < 1:
        raise ParameterError(f"mlp width must be >= 1, got {width}")
    d = math.prod(input_shape)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(d, width), nn.ReLU(), nn.Linear(width, num_classes)
    )


def build_cnn(input_shape: tuple[int, ...], num_classes: int, params: Mapping[str, Any]):
    """Two 3×3 conv layers (32, 64 channels) with max-pooling, then a 128-unit hidden layer."""
    import torch.nn as nn

    if len(input_shape) != 3:
        raise ParameterError(
            f"cnn needs image inputs of shape [channels, height, width], got {list(input_shape)}; "
            "use the mlp for vector data"
        )
    channels, height, width = input_shape
    hidden = int(params.get("hidden", 128))
    return nn.Sequential(
        nn.Conv2d(channels, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * (height // 4) * (width // 4), hidden),
        nn.ReLU(),
        nn.Linear(hidden, num_classes),
    )


@hookimpl
def idrs_register_models(register) -> None:
    register(ModelSpec("mlp", build_mlp, {"width": 200}, "one hidden ReLU layer"))
    register(ModelSpec("cnn", build_cnn, {"hidden": 128}, "small two-layer conv net for images"))
    from plugins.models.registration import register_normalized_models

    register_normalized_models(register)
