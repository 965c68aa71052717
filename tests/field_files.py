"""Fixtures: tiny dataset files in the real on-disk formats torchvision reads.

A pytest fixture module (loaded through ``pytest_plugins`` in ``tests/conftest.py``):
each fixture ``write_<format>`` is the writer a test calls, e.g.
``write_mnist(tmp_path / "data", train=20, test=10)``.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest


def _write_mnist(root: Path, train: int = 20, test: int = 10, seed: int = 0) -> None:
    """Uncompressed IDX files under ``root/MNIST/raw/`` (magic 0x0803 images, 0x0801 labels)."""
    rng = np.random.default_rng(seed)
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, count in (("train", train), ("t10k", test)):
        images = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
        labels = (np.arange(count) % 10).astype(np.uint8)
        header = (0x0803).to_bytes(4, "big") + b"".join(
            s.to_bytes(4, "big") for s in (count, 28, 28)
        )
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(header + images.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(
            (0x0801).to_bytes(4, "big") + count.to_bytes(4, "big") + labels.tobytes()
        )


CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer",
                   "dog", "frog", "horse", "ship", "truck"]  # fmt: skip


def _write_cifar10(root: Path, per_batch: int = 4, test: int = 20, seed: int = 0) -> None:
    """``root/cifar-10-batches-py/`` with five data batches, a test batch and batches.meta."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        count = test if name == "test_batch" else per_batch
        batch = {
            "batch_label": name,
            "labels": [int(k % 10) for k in range(count)],
            "data": rng.integers(0, 256, (count, 3072), dtype=np.uint8),
            "filenames": [f"{name}_{k}.png" for k in range(count)],
        }
        with open(folder / name, "wb") as handle:
            pickle.dump(batch, handle)
    with open(folder / "batches.meta", "wb") as handle:
        pickle.dump(
            {"label_names": CIFAR10_CLASSES, "num_cases_per_batch": per_batch, "num_vis": 3072},
            handle,
        )


def _write_cifar100(root: Path, train: int = 10, test: int = 6, seed: int = 0) -> None:
    """``root/cifar-100-python/`` with train, test (fine and coarse labels) and meta."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    for name, count in (("train", train), ("test", test)):
        data = {
            "fine_labels": [int(k * 7 % 100) for k in range(count)],
            "coarse_labels": [int(k % 20) for k in range(count)],
            "data": rng.integers(0, 256, (count, 3072), dtype=np.uint8),
        }
        with open(folder / name, "wb") as handle:
            pickle.dump(data, handle)
    with open(folder / "meta", "wb") as handle:
        pickle.dump({"fine_label_names": [f"c{k}" for k in range(100)],
                     "coarse_label_names": [f"s{k}" for k in range(20)]}, handle)  # fmt: skip


def _write_svhn(root: Path, train: int = 10, test: int = 6, seed: int = 0) -> None:
    """``train_32x32.mat`` and ``test_32x32.mat``: X [32, 32, 3, N] uint8, y [N, 1] in 1..10."""
    from scipy.io import savemat

    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for name, count in (("train", train), ("test", test)):
        x = rng.integers(0, 256, (32, 32, 3, count), dtype=np.uint8)
        y = (np.arange(count) % 10 + 1).reshape(-1, 1).astype(np.uint8)
        savemat(root / f"{name}_32x32.mat", {"X": x, "y": y})


def _write_imagenet(root: Path, classes: int = 3, per_class: int = 2, seed: int = 0) -> None:
    """``root/val/<wnid>/*.JPEG``: a few random JPEGs of varied sizes per class folder."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in range(classes):
        folder = root / "val" / f"n{c:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            h, w = int(rng.integers(240, 320)), int(rng.integers(240, 400))
            pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"ILSVRC2012_val_{c:04d}{k:04d}.JPEG")


def _write_cohen_checkpoint(path: Path, arch: str = "cifar_resnet20", seed: int = 0) -> dict:
    """A file as Cohen et al.'s train.py writes it: epoch, arch, state_dict, optimizer.

    The state dict is that of ``Sequential(NormalizeLayer, net)`` (the normalization
    has no saved tensors, so keys start at ``1.``); ``resnet50``'s net is wrapped in
    DataParallel (``1.module.…``). Returns the state dict as saved.
    """
    import torch

    from plugins.models.normalized import build_cifar_resnet, build_resnet50

    torch.manual_seed(seed)
    if arch == "resnet50":
        model = build_resnet50((3, 224, 224), 1000, {})
        state = {k.replace("1.", "1.module.", 1): v for k, v in model.state_dict().items()}
    else:
        depth = {"cifar_resnet20": 20, "cifar_resnet110": 110}[arch]
        model = build_cifar_resnet((3, 32, 32), 10, {"depth": depth})
        state = model.state_dict()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    torch.save({"epoch": 90, "arch": arch, "state_dict": state,
                "optimizer": optimizer.state_dict()}, path)  # fmt: skip
    return state


def _write_macer_checkpoint(path: Path, seed: int = 0) -> dict:
    """A file as MACER's main.py writes it (Zhai et al. 2020): ``{'net':
    base_model.state_dict(), 'epoch': epoch}``, its ResNet-110 without a normalization
    layer (module names conv1, bn1, layer1-3, fc, as Cohen et al.'s). Returns the net's
    state dict."""
    import torch

    from plugins.models.normalized import CifarResNet

    torch.manual_seed(seed)
    state = CifarResNet(110, 10).state_dict()
    torch.save({"net": state, "epoch": 440}, path)
    return state


@pytest.fixture(scope="session")
def write_mnist():
    """``write_mnist(root, train=20, test=10, seed=0)``: MNIST's IDX files."""
    return _write_mnist


@pytest.fixture(scope="session")
def write_cifar10():
    """``write_cifar10(root, per_batch=4, test=20, seed=0)``: CIFAR-10's pickled batches."""
    return _write_cifar10


@pytest.fixture(scope="session")
def write_cifar100():
    """``write_cifar100(root, train=10, test=6, seed=0)``: CIFAR-100's pickled files."""
    return _write_cifar100


@pytest.fixture(scope="session")
def write_svhn():
    """``write_svhn(root, train=10, test=6, seed=0)``: SVHN's ``.mat`` files."""
    return _write_svhn


@pytest.fixture(scope="session")
def write_imagenet():
    """``write_imagenet(root, classes=3, per_class=2, seed=0)``: ImageNet validation JPEGs."""
    return _write_imagenet


@pytest.fixture(scope="session")
def write_cohen_checkpoint():
    """``write_cohen_checkpoint(path, arch="cifar_resnet20", seed=0) -> state dict``: a
    checkpoint as Cohen et al.'s train.py writes it."""
    return _write_cohen_checkpoint


@pytest.fixture(scope="session")
def write_macer_checkpoint():
    """``write_macer_checkpoint(path, seed=0) -> the net's state dict``: a checkpoint as
    MACER's main.py writes it."""
    return _write_macer_checkpoint
