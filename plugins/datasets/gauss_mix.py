"""The Gaussian mixture of Mohapatra et al. (2021), §3.1, in any dimension N.

Binary classification, each class with probability 1/2:

    X_1 = (1/2 − ε)·N(−a, σ_o²) + ε·N(k·a, σ_o²)      (label 0, "mixture")
    X_2 = 1/2 · N(0, σ_o²)                            (label 1, "centre")

so within class 0 the component at k·a has probability 2ε. In N dimensions the means
lie on the first axis (−a·e_1, k·a·e_1, 0) and the covariance is σ_o²·I. Theorem 1
needs k > 1/(2ε) − 1: then class 0's mean (k·a·2ε − a·(1 − 2ε)) is positive, and
class 1 (the centre) is the *bounded* class whose decision region randomized smoothing
shrinks as σ grows, until it is not predicted at all.

The paper fixes no values; the defaults here, a = 1, k = 4, ε = 0.2 (k > 1.5), σ_o = 0.25,
put the classes 4 σ_o apart and the bounded region's width (about 2.5) inside the σ
range 0.12–2 of the ``hidden-cost`` benchmark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness import Dataset

A = 1.0
K = 4.0
EPSILON = 0.2
SIGMA_O = 0.25
CLASSES = ("mixture", "centre")
_STREAM = 2021  # separates this generator's stream from other seeded datasets


def sample_gauss_mix(
    dim: int,
    count: int,
    rng,
    a: float = A,
    k: float = K,
    epsilon: float = EPSILON,
    sigma_o: float = SIGMA_O,
):
    """``count`` points per class: (points [2·count, dim], labels [2·count]), shuffled."""
    import numpy as np

    from harness import ParameterError

    if dim < 1:
        raise ParameterError(f"gauss-mix-N needs N >= 1, got {dim}")
    if not (0 < epsilon < 0.5 and a > 0 and k > 0 and sigma_o > 0):
        raise ParameterError("gauss-mix needs 0 < ε < 1/2 and a, k, σ_o > 0")
    far = rng.random(count) < 2 * epsilon  # class 0: the k·a component w.p. 2ε
    centres = np.concatenate([np.where(far, k * a, -a), np.zeros(count)])
    points = sigma_o * rng.standard_normal((2 * count, dim))
    points[:, 0] += centres
    labels = np.concatenate([np.zeros(count, np.int64), np.ones(count, np.int64)])
    order = rng.permutation(2 * count)
    return points[order], labels[order]


def load_gauss_mix(
    dim: int = 1, seed: int = 0, train_size: int = 2000, test_size: int = 500
) -> Dataset:
    """Seeded train and test sets (``train_size`` and ``test_size`` points per class)."""
    import numpy as np
    import torch

    from harness import Dataset

    rng = np.random.default_rng([seed, dim, _STREAM])
    train_x, train_y = sample_gauss_mix(dim, train_size, rng)
    test_x, test_y = sample_gauss_mix(dim, test_size, rng)
    return Dataset(
        name="gauss-mix" if dim == 1 else f"gauss-mix-{dim}",
        train_x=torch.from_numpy(train_x.astype(np.float32)),
        train_y=torch.from_numpy(train_y),
        test_x=torch.from_numpy(test_x.astype(np.float32)),
        test_y=torch.from_numpy(test_y),
        num_classes=2,
        class_names=CLASSES,
    )


def load(data_root=None, download: bool = False, seed: int = 0, dim: int = 1, **_) -> Dataset:
    """The DatasetSpec loader: ``gauss-mix`` is N = 1, ``gauss-mix-N`` any N."""
    return load_gauss_mix(dim, seed)


def register_gauss_mix(register) -> None:
    """Register ``gauss-mix`` (one dimension, as in the paper) and the family ``gauss-mix-N``."""
    from harness import DatasetSpec

    description = "Mohapatra et al. (2021) §3.1 Gaussian mixture"
    register(DatasetSpec("gauss-mix", load, description + ", 1 dimension", CLASSES))
    register(DatasetSpec("gauss-mix-N", load, description + ", N dimensions", CLASSES))
