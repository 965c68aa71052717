"""Fashion-MNIST (Xiao et al. 2017) from its IDX files.

Looked for in ``data_root`` when given (the files themselves, or a ``fashion-mnist``
or torchvision ``FashionMNIST/raw`` folder under it; an explicit root is never
silently replaced by another), else where Debian's package ``dataset-fashion-mnist``
installs them; then (only when asked) fetched by torchvision's download.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness import Dataset, DatasetMissingError
from plugins.datasets import FASHION_MNIST_CLASSES
from plugins.datasets.idx import read_idx

DEBIAN_LOCATION = Path("/usr/share/datasets/fashion-mnist")
FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}


def _find(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def candidate_folders(data_root: str | Path | None) -> list[Path]:
    folders = []
    if data_root is not None:
        root = Path(data_root)
        return [root, root / "fashion-mnist", root / "FashionMNIST" / "raw"]
    folders.append(DEBIAN_LOCATION)
    return folders


def load_fashion_mnist(data_root: str | Path | None = None, download: bool = False) -> Dataset:
    """Train (60,000) and test (10,000) images as [N, 1, 28, 28] floats in [0, 1]."""
    for folder in candidate_folders(data_root):
        paths = {key: _find(folder, stem) for key, stem in FILES.items()}
        if all(paths.values()):
            break
    else:
        if not download:
            looked = ", ".join(str(f) for f in candidate_folders(data_root))
            files = ", ".join(f"{stem}[.gz]" for stem in FILES.values())
            raise DatasetMissingError(
                f"fashion-mnist not found (looked for {files} in {looked}); either pass --data-root DIR "
                "with the four IDX files, or install Debian's package "
                "(apt-get install dataset-fashion-mnist), or pass --download to let "
                "torchvision fetch it where the network allows"
            )
        folder = _download(data_root)
        paths = {key: _find(folder, stem) for key, stem in FILES.items()}
    arrays = {key: read_idx(path) for key, path in paths.items()}

    import torch

    from harness import file_digest

    def images(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a.astype(np.float32) / 255.0).unsqueeze(1)

    return Dataset(
        name="fashion-mnist",
        train_x=images(arrays["train_x"]),
        train_y=torch.from_numpy(arrays["train_y"].astype(np.int64)),
        test_x=images(arrays["test_x"]),
        test_y=torch.from_numpy(arrays["test_y"].astype(np.int64)),
        num_classes=10,
        class_names=FASHION_MNIST_CLASSES,
        files={str(path.resolve()): file_digest(path) for path in paths.values()},
    )


def _download(data_root: str | Path | None) -> Path:
    from torchvision.datasets import FashionMNIST

    root = Path(data_root or Path.home() / ".cache" / "idrs-bench" / "data")
    for train in (True, False):
        FashionMNIST(str(root), train=train, download=True)
    return root / "FashionMNIST" / "raw"
