"""Registration of the torchvision datasets of :mod:`plugins.datasets.torchvision_sets`."""

from __future__ import annotations

from harness import DatasetSpec

DESCRIPTIONS = {
    "mnist": "MNIST 28×28 grey digits (torchvision layout root/MNIST/raw/)",
    "cifar10": "CIFAR-10 32×32 colour images (root/cifar-10-batches-py/)",
    "cifar100": "CIFAR-100 32×32 colour images, fine labels (root/cifar-100-python/)",
    "svhn": "SVHN 32×32 house numbers (root/{train,test}_32x32.mat)",
    "imagenet": "ILSVRC2012 validation set, 224×224 centre crops (root/val/<class>/)",
}


def _loader(name: str):
    def load(data_root=None, download: bool = False, seed: int = 0, **_):
        from plugins.datasets import torchvision_sets

        return getattr(torchvision_sets, f"load_{name}")(data_root, download)

    return load


def register_torchvision_datasets(register) -> None:
    for name, description in DESCRIPTIONS.items():
        register(DatasetSpec(name, _loader(name), description))
