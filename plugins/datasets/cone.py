"""The synthetic cone dataset of Súkeník et al. (2022), App. A.5, in any dimension N.

The paper describes it only in words: class 1 lies in a cone of small angle with its
vertex at the origin, denser near the vertex; class 0 is spherically symmetric with a
density peak at the centre sharper than a Gaussian's, cone points excluded. Here: the
cone's axis is e_1 and its half-angle ``angle``; every point is ρ·u with ρ ~
Exponential(mean √N) (density ∝ e^(−ρ/√N) ρ^(1−N) near the origin, so far sharper
than a Gaussian; the √N scale matches the norm of N-dimensional noise), u uniform on
the sphere for class 0 (rejected if inside the cone) and uniform inside the cone for
class 1.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from harness import Dataset, ParameterError
from plugins.datasets import CONE_CLASSES


def sample_cone(
    dim: int, count: int, rng: np.random.Generator, angle: float = 0.35
) -> tuple[np.ndarray, np.ndarray]:
    """``count`` points per class: (points [2·count, dim], labels [2·count])."""
    if dim < 2:
        raise ParameterError(f"cone-N needs N >= 2, got {dim}")
    scale = math.sqrt(dim)
    # class 1: direction at angle φ from e_1 with φ = angle · U^(1/(N−1)) (uniform in the
    # small-angle cone, where sin φ ≈ φ), and a uniform direction orthogonal to e_1.
    phi = angle * rng.random(count) ** (1.0 / (dim - 1))
    ortho = rng.standard_normal((count, dim))
    ortho[:, 0] = 0.0
    ortho /= np.linalg.norm(ortho, axis=1, keepdims=True)
    inside = ortho * np.sin(phi)[:, None]
    inside[:, 0] = np.cos(phi)
    inside *= rng.exponential(scale, count)[:, None]
    # class 0: uniform directions outside the cone
    outside = np.empty((0, dim))
    while len(outside) < count:
        u = rng.standard_normal((2 * count, dim))
        u /= np.linalg.norm(u, axis=1, keepdims=True)
        outside = np.concatenate([outside, u[u[:, 0] < math.cos(angle)]])
    outside = outside[:count] * rng.exponential(scale, count)[:, None]
    points = np.concatenate([outside, inside])
    labels = np.concatenate([np.zeros(count, np.int64), np.ones(count, np.int64)])
    order = rng.permutation(len(points))
    return points[order], labels[order]


def load_cone(dim: int, seed: int = 0, train_size: int = 2000, test_size: int = 500) -> Dataset:
    """Seeded train and test sets (``train_size`` and ``test_size`` points per class)."""
    rng = np.random.default_rng([seed, dim])
    train_x, train_y = sample_cone(dim, train_size, rng)
    test_x, test_y = sample_cone(dim, test_size, rng)
    return Dataset(
        name=f"cone-{dim}",
        train_x=torch.from_numpy(train_x.astype(np.float32)),
        train_y=torch.from_numpy(train_y),
        test_x=torch.from_numpy(test_x.astype(np.float32)),
        test_y=torch.from_numpy(test_y),
        num_classes=2,
        class_names=CONE_CLASSES,
    )
