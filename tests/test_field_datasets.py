"""torchvision datasets read from tiny files written in their real on-disk formats."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from harness.foundation.errors import DatasetMissingError


def _load(manager, name, root):
    return manager.registry.get("datasets", name).load(data_root=str(root), download=False)


def test_mnist_reads_idx_files(manager, tmp_path, write_mnist):
    write_mnist(tmp_path, train=20, test=10)
    data = _load(manager, "mnist", tmp_path)
    raw = (tmp_path / "MNIST/raw/t10k-images-idx3-ubyte").read_bytes()
    expected = np.frombuffer(raw, np.uint8, offset=16).reshape(10, 28, 28) / 255.0
    assert data.test_x.shape == (10, 1, 28, 28) and data.train_x.shape == (20, 1, 28, 28)
    assert np.allclose(data.test_x[:, 0].numpy(), expected, atol=1e-7)
    assert data.test_y.tolist() == [k % 10 for k in range(10)] and data.num_classes == 10


def test_cifar10_reads_pickles_and_warns_about_md5(manager, tmp_path, write_cifar10):
    write_cifar10(tmp_path, per_batch=4, test=20)
    with pytest.warns(UserWarning, match="MD5"):
        data = _load(manager, "cifar10", tmp_path)
    with open(tmp_path / "cifar-10-batches-py/test_batch", "rb") as handle:
        batch = pickle.load(handle)
    expected = batch["data"].reshape(20, 3, 32, 32) / 255.0
    assert data.train_x.shape == (20, 3, 32, 32) and data.test_x.shape == (20, 3, 32, 32)
    assert np.allclose(data.test_x.numpy(), expected, atol=1e-7)
    assert data.test_y.tolist() == batch["labels"]
    assert data.class_names[0] == "airplane" and data.num_classes == 10


def test_cifar100_fine_labels(manager, tmp_path, write_cifar100):
    write_cifar100(tmp_path)
    with pytest.warns(UserWarning, match="MD5"):
        data = _load(manager, "cifar100", tmp_path)
    assert data.num_classes == 100 and data.test_y.tolist() == [k * 7 % 100 for k in range(6)]


def test_svhn_reads_mat_and_maps_ten_to_zero(manager, tmp_path, write_svhn):
    write_svhn(tmp_path, train=10, test=6)
    with pytest.warns(UserWarning, match="MD5"):
        data = _load(manager, "svhn", tmp_path)
    from scipy.io import loadmat

    mat = loadmat(tmp_path / "test_32x32.mat")
    assert data.test_x.shape == (6, 3, 32, 32)
    assert np.allclose(data.test_x[2].numpy(), mat["X"][:, :, :, 2].transpose(2, 0, 1) / 255.0)
    assert data.test_y.tolist() == [(k % 10 + 1) % 10 for k in range(6)]


def test_imagenet_folder_resize_crop(manager, tmp_path, write_imagenet):
    write_imagenet(tmp_path, classes=3, per_class=2)
    data = _load(manager, "imagenet", tmp_path)
    assert data.num_classes == 3 and len(data.test_x) == 6 and data.input_shape == (3, 224, 224)
    batch = data.test_x[[0, 5]]
    assert (
        batch.shape == (2, 3, 224, 224) and 0.0 <= float(batch.min()) <= float(batch.max()) <= 1.0
    )
    assert data.test_y.tolist() == [0, 0, 1, 1, 2, 2]
    from PIL import Image
    from torchvision.transforms.functional import center_crop, pil_to_tensor, resize

    path = sorted((tmp_path / "val/n00000002").iterdir())[1]
    reference = center_crop(resize(pil_to_tensor(Image.open(path)), 256), 224).float() / 255
    assert torch.allclose(data.test_x[5], reference, atol=1 / 255 + 1e-6)


@pytest.mark.parametrize("name", ["mnist", "cifar10", "cifar100", "svhn", "imagenet"])
def test_absent_data_names_the_fix(manager, tmp_path, name):
    with pytest.raises(DatasetMissingError) as info:
        _load(manager, name, tmp_path)
    message = str(info.value)
    assert "\n" not in message and ("--download" in message or "val/" in message)


def test_the_files_read_are_recorded_with_their_sha256(
    manager, tmp_path, write_mnist, write_svhn, write_imagenet
):
    """Every file-backed dataset names what it read (runs record it; resuming on other
    files is refused), with SHA-256 digests computed here independently by hashlib."""
    import hashlib

    write_mnist(tmp_path, train=20, test=10)
    files = _load(manager, "mnist", tmp_path).files
    raw = tmp_path / "MNIST" / "raw"
    expected = {str(p.resolve()): hashlib.sha256(p.read_bytes()).hexdigest() for p in raw.iterdir()}
    assert files == expected and len(files) == 4
    write_svhn(tmp_path, train=4, test=4)
    assert len(_load(manager, "svhn", tmp_path).files) == 2
    write_imagenet(tmp_path / "imagenet", classes=2, per_class=2)
    [(name, digest)] = _load(manager, "imagenet", tmp_path / "imagenet").files.items()
    assert "manifest of 4 files" in name and len(digest) == 64
