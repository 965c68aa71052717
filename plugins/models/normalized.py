"""Image architectures with the per-channel normalization inside the model.

Randomized smoothing adds noise in input space (pixels in [0, 1]), so the dataset's
standardization is the model's first layer (Cohen et al. 2019, App. B / their
``NormalizeLayer``), never a preprocessing step. Every model here is
``Sequential(NormalizeLayer, net)``: the normalization holds no parameters, so the
network's state-dict keys start at ``1.``, exactly as in Cohen et al.'s checkpoints.

- ``cifar-resnet``: the CIFAR ResNet of He et al. (2016, §4.2) as in Cohen et al.'s
  code (depth 6n + 2 of basic blocks: 20, 56, 110; module names ``conv1``, ``bn1``,
  ``layer1``–``layer3``, ``fc``; projection shortcuts ``downsample.0`` / ``downsample.1``).
- ``lenet``: LeNet-5 (LeCun et al. 1998) for 28×28 grey images.
- ``resnet50``: torchvision's ResNet-50 (random weights; nothing is downloaded).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from harness import ParameterError

NORMALIZATIONS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),  # Cohen et al.'s values
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "svhn": ((0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "mnist": ((0.1307,), (0.3081,)),
    # SmoothAdv's InputCenterLayer (Salman et al. 2019): the mean subtracted, no division
    "cifar10-centered": ((0.4914, 0.4822, 0.4465), (1.0, 1.0, 1.0)),
    "imagenet-centered": ((0.485, 0.456, 0.406), (1.0, 1.0, 1.0)),
    "none": ((0.0,), (1.0,)),
}


class NormalizeLayer(nn.Module):
    """(x − mean_c) / sd_c per channel c; the constants are buffers that are not saved."""

    def __init__(self, means: Sequence[float], sds: Sequence[float]) -> None:
        super().__init__()
        self.register_buffer("means", torch.tensor(means).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("sds", torch.tensor(sds).view(1, -1, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.means.to(x.dtype)) / self.sds.to(x.dtype)


def normalize_layer(name: str, channels: int) -> NormalizeLayer:
    """The normalization called ``name`` (one of :data:`NORMALIZATIONS`) for ``channels``."""
    if name not in NORMALIZATIONS:
        raise ParameterError(
            f"unknown normalization {name!r}; choose one of {sorted(NORMALIZATIONS)}"
        )
    means, sds = NORMALIZATIONS[name]
    if len(means) == 1:
        means, sds = means * channels, sds * channels
    if len(means) != channels:
        raise ParameterError(
            f"normalization {name!r} is for {len(means)} channels, the inputs have {channels}"
        )
    return NormalizeLayer(means, sds)


class BasicBlock(nn.Module):
    """Two 3×3 convolutions with batch norm and an identity (or projection) shortcut."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample=None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.relu(out + shortcut)


class CifarResNet(nn.Module):
    """16-32-64-channel stages of (depth − 2)/6 basic blocks, global 8×8 pooling, a linear head."""

    def __init__(self, depth: int, num_classes: int, in_channels: int = 3) -> None:
        super().__init__()
        if depth < 8 or (depth - 2) % 6:
            raise ParameterError(f"cifar-resnet depth must be 6n + 2 (20, 56, 110), got {depth}")
        blocks = (depth - 2) // 6
        self.inplanes = 16
        self.conv1 = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._stage(16, blocks, 1)
        self.layer2 = self._stage(32, blocks, 2)
        self.layer3 = self._stage(64, blocks, 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)  # = AvgPool2d(8) on 32×32 inputs
        self.fc = nn.Linear(64, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):  # He et al. (2015) initialization
                fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def _stage(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _image_shape(name: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ParameterError(
            f"{name} needs image inputs [channels, height, width], got {list(input_shape)}"
        )
    return input_shape  # type: ignore[return-value]


def build_cifar_resnet(
    input_shape: tuple[int, ...], num_classes: int, params: Mapping[str, Any]
) -> nn.Module:
    channels, _, _ = _image_shape("cifar-resnet", input_shape)
    net = CifarResNet(int(params.get("depth", 110)), num_classes, channels)
    return nn.Sequential(
        normalize_layer(str(params.get("normalization", "cifar10")), channels), net
    )


class LeNet(nn.Module):
    """conv 5×5 (6) → pool → conv 5×5 (16) → pool → 120 → 84 → classes, ReLU activations."""

    def __init__(self, in_channels: int, size: int, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        side = ((size // 2) - 4) // 2
        if side < 1:
            raise ParameterError(f"lenet needs images of at least 12×12 pixels, got {size}")
        self.fc1 = nn.Linear(16 * side * side, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc3(torch.relu(self.fc2(x)))


def build_lenet(
    input_shape: tuple[int, ...], num_classes: int, params: Mapping[str, Any]
) -> nn.Module:
    channels, height, width = _image_shape("lenet", input_shape)
    if height != width:
        raise ParameterError(f"lenet needs square images, got {height}×{width}")
    net = LeNet(channels, height, num_classes)
    return nn.Sequential(normalize_layer(str(params.get("normalization", "mnist")), channels), net)


def build_resnet50(
    input_shape: tuple[int, ...], num_classes: int, params: Mapping[str, Any]
) -> nn.Module:
    from torchvision.models import resnet50

    channels, _, _ = _image_shape("resnet50", input_shape)
    if channels != 3:
        raise ParameterError(f"resnet50 needs 3-channel images, got {channels}")
    net = resnet50(weights=None, num_classes=num_classes)
    return nn.Sequential(normalize_layer(str(params.get("normalization", "imagenet")), 3), net)
