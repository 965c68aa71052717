"""Registration of the image architectures of :mod:`plugins.models.normalized` (torch-free)."""

from __future__ import annotations

from harness import ModelSpec


def _lazy(name: str):
    def build(input_shape, num_classes, params):
        from plugins.models import normalized

        return getattr(normalized, name)(input_shape, num_classes, params)

    return build


def register_normalized_models(register) -> None:
    register(ModelSpec(
        "cifar-resnet", _lazy("build_cifar_resnet"), {"depth": 110, "normalization": "cifar10"},
        "CIFAR ResNet (He et al. 2016) with Cohen et al.'s module names; depth 20, 56, 110",
    ))  # fmt: skip
    register(ModelSpec(
        "lenet", _lazy("build_lenet"), {"normalization": "mnist"}, "LeNet-5 for 28×28 images",
    ))  # fmt: skip
    register(ModelSpec(
        "resnet50", _lazy("build_resnet50"), {"normalization": "imagenet"},
        "torchvision's ResNet-50 (random initialization; ImageNet 224×224)",
    ))  # fmt: skip
