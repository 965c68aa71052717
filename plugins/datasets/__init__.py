"""Built-in datasets: ``fashion-mnist`` (IDX files), the synthetic ``cone-N`` and ``gauss-mix``,
and torchvision's ``mnist``, ``cifar10``, ``cifar100``, ``svhn`` and ``imagenet``."""

from __future__ import annotations

from harness import DatasetSpec, hookimpl

IDRS_BENCH_CONTRACT = 4
"""The plugin contract this plugin is written against (docs/plugins.md)."""

FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip
CONE_CLASSES = ("outside", "cone")


def _fashion_mnist(data_root=None, download: bool = False, seed: int = 0, **_):
    from plugins.datasets.fashion_mnist import load_fashion_mnist

    return load_fashion_mnist(data_root, download)


def _cone(data_root=None, download: bool = False, seed: int = 0, dim: int = 2, **_):
    from plugins.datasets.cone import load_cone

    return load_cone(dim, seed)


@hookimpl
def idrs_register_datasets(register) -> None:
    register(DatasetSpec("fashion-mnist", _fashion_mnist, "Fashion-MNIST 28×28 grey images",
                         FASHION_MNIST_CLASSES))  # fmt: skip
    register(DatasetSpec("cone-N", _cone, "Súkeník et al. App. A.5 cone vs. rest, N dimensions",
                         CONE_CLASSES))  # fmt: skip
    from plugins.datasets.gauss_mix import register_gauss_mix  # Mohapatra et al. 2021 §3.1

    register_gauss_mix(register)
    from plugins.datasets.registration import register_torchvision_datasets

    register_torchvision_datasets(register)
