"""MNIST, CIFAR-10/100, SVHN and ImageNet through torchvision's dataset classes.

Each is read from ``data_root`` in torchvision's on-disk layout (or downloaded there
by torchvision with ``--download``); images become float tensors in [0, 1] and are
never normalized here (the models normalize, see :mod:`plugins.models.normalized`).

torchvision's CIFAR and SVHN classes refuse files whose MD5 differs from the official
archives'; the subclasses below keep torchvision's parsing but accept a file of the
right format with a one-line warning naming the mismatch, so re-packed copies load.
ImageNet is an ImageFolder over the ILSVRC2012 ``val/`` folder (one folder per class,
1000 of them) with the standard resize to 256 and centre crop to 224 (Cohen et al.
2019, App. C); it has no training split here, and its images are decoded on demand.
"""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path

import numpy as np
import torch

from harness import Dataset, DatasetMissingError

DEFAULT_ROOT = Path.home() / ".cache" / "idrs-bench" / "data"


def _root(data_root) -> Path:
    return Path(data_root) if data_root is not None else DEFAULT_ROOT


def _warn_md5(files: list[tuple[str, str]]) -> None:
    """One warning line naming every file whose MD5 differs from the official one."""
    from torchvision.datasets.utils import calculate_md5

    wrong = []
    for path, expected in files:
        actual = calculate_md5(path)
        if actual != expected:
            wrong.append(f"{os.path.basename(path)} has {actual}, not {expected}")
    if wrong:
        folder = os.path.dirname(files[0][0])
        message = (
            f"MD5 mismatch in {folder}: {'; '.join(wrong)}; reading the files anyway "
            "(their format is right), but they are not the official release"
        )
        warnings.warn_explicit(message, UserWarning, folder, 0)  # one line, no source


def _lenient(cls):
    """A CIFAR-style class whose files only need to exist; wrong MD5s are warned about."""

    class Lenient(cls):
        def _check_integrity(self) -> bool:
            files = [*self.train_list, *self.test_list, (self.meta["filename"], self.meta["md5"])]
            paths = [(os.path.join(self.root, self.base_folder, f), md5) for f, md5 in files]
            if not all(os.path.isfile(p) for p, _ in paths):
                return False
            if not getattr(type(self), "_warned", False):
                _warn_md5(paths)
                type(self)._warned = True
            return True

        def _load_meta(self) -> None:
            path = os.path.join(self.root, self.base_folder, self.meta["filename"])
            with open(path, "rb") as handle:
                self.classes = pickle.load(handle, encoding="latin1")[self.meta["key"]]
            self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

    Lenient.__name__ = cls.__name__
    return Lenient


def _files(paths) -> dict[str, str]:
    """The files read (resolved path -> SHA-256), recorded with every run."""
    from harness import file_digest

    return {
        str(Path(p).resolve()): file_digest(Path(p)) for p in sorted(paths) if Path(p).is_file()
    }


def _manifest(folder: Path, paths: list[str]) -> dict[str, str]:
    """One digest of the sorted (relative path, size) list: hashing 50,000 images would
    take minutes, and a changed, added or removed file changes the manifest."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(f"{os.path.relpath(path, folder)}\t{os.path.getsize(path)}\n".encode())
    return {f"{folder.resolve()} (manifest of {len(paths)} files)": digest.hexdigest()}


def _images(array: np.ndarray) -> torch.Tensor:
    """uint8 [N, H, W, C] or [N, C, H, W] (``channels_last=False``) → float [N, C, H, W] in [0, 1]."""
    return torch.from_numpy(np.ascontiguousarray(array)).float().div_(255.0)


def _missing(name: str, layout: str, data_root) -> DatasetMissingError:
    return DatasetMissingError(
        f"{name} not found under {_root(data_root)} (expected {layout}); pass --data-root DIR "
        "holding that layout, or --download to let torchvision fetch it"
    )


def load_mnist(data_root=None, download: bool = False) -> Dataset:
    """MNIST's IDX files under ``root/MNIST/raw/`` (uncompressed); [N, 1, 28, 28]."""
    from torchvision.datasets import MNIST

    root = _root(data_root)
    try:
        train, test = (MNIST(str(root), train=t, download=download) for t in (True, False))
    except RuntimeError:
        raise _missing(
            "mnist", "MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte", data_root
        ) from None
    return Dataset(
        name="mnist",
        train_x=train.data.float().div_(255.0).unsqueeze(1),
        train_y=train.targets.long(),
        test_x=test.data.float().div_(255.0).unsqueeze(1),
        test_y=test.targets.long(),
        num_classes=10,
        class_names=tuple(str(c) for c in range(10)),
        files=_files((root / "MNIST" / "raw").iterdir()),
    )


def _load_cifar(name: str, hundred: bool, data_root, download: bool) -> Dataset:
    from torchvision.datasets import CIFAR10, CIFAR100

    cls = _lenient(CIFAR100 if hundred else CIFAR10)
    root = _root(data_root)
    try:
        train, test = (cls(str(root), train=t, download=download) for t in (True, False))
    except RuntimeError:
        folder = cls.base_folder
        files = "train, test, meta" if hundred else "data_batch_1…5, test_batch, batches.meta"
        raise _missing(name, f"{folder}/ with the python pickles {files}", data_root) from None

    def images(ds) -> torch.Tensor:
        return _images(ds.data.transpose(0, 3, 1, 2))

    return Dataset(
        name=name,
        train_x=images(train),
        train_y=torch.tensor(train.targets, dtype=torch.long),
        test_x=images(test),
        test_y=torch.tensor(test.targets, dtype=torch.long),
        num_classes=100 if hundred else 10,
        class_names=tuple(test.classes),
        files=_files((root / cls.base_folder).iterdir()),
    )


def load_cifar10(data_root=None, download: bool = False) -> Dataset:
    """CIFAR-10's python batches under ``root/cifar-10-batches-py/``; [N, 3, 32, 32]."""
    return _load_cifar("cifar10", False, data_root, download)


def load_cifar100(data_root=None, download: bool = False) -> Dataset:
    """CIFAR-100's python pickles under ``root/cifar-100-python/`` (fine labels)."""
    return _load_cifar("cifar100", True, data_root, download)


def load_svhn(data_root=None, download: bool = False) -> Dataset:
    """SVHN's ``train_32x32.mat`` and ``test_32x32.mat`` under ``root`` (label 10 → 0)."""
    from torchvision.datasets import SVHN

    class LenientSVHN(SVHN):
        def _check_integrity(self) -> bool:
            path = os.path.join(self.root, self.filename)
            if not os.path.isfile(path):
                return False
            _warn_md5([(path, self.file_md5)])
            return True

    root = _root(data_root)
    try:
        train, test = (
            LenientSVHN(str(root), split=s, download=download) for s in ("train", "test")
        )
    except RuntimeError:
        raise _missing("svhn", "train_32x32.mat and test_32x32.mat", data_root) from None
    return Dataset(
        name="svhn",
        train_x=_images(train.data),
        train_y=torch.from_numpy(train.labels).long(),
        test_x=_images(test.data),
        test_y=torch.from_numpy(test.labels).long(),
        num_classes=10,
        class_names=tuple(str(c) for c in range(10)),
        files=_files(root / f"{split}_32x32.mat" for split in ("train", "test")),
    )


class LazyImages:
    """Images of an ImageFolder decoded on indexing, as ``tensor[indices]`` would return them."""

    def __init__(self, folder, shape: tuple[int, ...]) -> None:
        self.folder = folder
        self.shape = torch.Size([len(folder), *shape])

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index) -> torch.Tensor:
        if isinstance(index, int):
            return self.folder[index][0]
        if isinstance(index, slice):
            index = range(*index.indices(len(self)))
        items = torch.as_tensor(index).reshape(-1).tolist()
        return torch.stack([self.folder[i][0] for i in items])


def load_imagenet(data_root=None, download: bool = False) -> Dataset:
    """ILSVRC2012 validation images in ``root/val/<wnid>/*.JPEG``: resize 256, crop 224."""
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

    root = _root(data_root)
    val = root / "val" if (root / "val").is_dir() else root
    layout = "val/<class folder>/*.JPEG, one folder per class (1000 for ILSVRC2012)"
    if download:
        raise DatasetMissingError(
            "ImageNet cannot be downloaded (its licence requires a login at image-net.org); "
            f"put the ILSVRC2012 validation set under --data-root as {layout}"
        )
    try:
        folder = ImageFolder(
            str(val),
            transforms.Compose(
                [transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor()]
            ),
        )
    except (FileNotFoundError, RuntimeError):
        raise DatasetMissingError(
            f"imagenet not found under {val} (expected {layout}); pass --data-root DIR"
        ) from None
    test_x = LazyImages(folder, (3, 224, 224))
    return Dataset(
        name="imagenet",
        train_x=torch.empty(0, 3, 224, 224),
        train_y=torch.empty(0, dtype=torch.long),
        test_x=test_x,  # type: ignore[arg-type]
        test_y=torch.tensor(folder.targets, dtype=torch.long),
        num_classes=len(folder.classes),
        class_names=tuple(folder.classes),
        files=_manifest(val, [path for path, _ in folder.samples]),
    )
