"""Base classifiers whose smoothed classifier is known exactly (checks S1 and S4).

- ``linear-N``: f(x) = [w·x > b] with ‖w‖ = 1. For Gaussian noise of *any* σ(x),
  P(f(x + σ(x)ε) = 1) = Φ((w·x − b)/σ(x)), which exceeds 1/2 exactly when w·x > b:
  the smoothed classifier's boundary is the hyperplane, whatever σ(x).
- ``ball-N``: f(x) = [‖x − c‖ <= ρ]. P(f(x + σε) = inside) = P(‖x − c + σε‖² <= ρ²)
  = χ²_N(ρ²/σ²; noncentrality ‖x − c‖²/σ²), the noncentral χ² CDF, for any σ = σ(x).

Class 1 is "positive side" / "inside"; the models return two logits. With
``one_hot=True`` the logits are (0, L) or (L, 0) with L = :data:`ONE_HOT_LOGIT`, so the
softmax is exactly one-hot in float64: then the soft smoothed classifier of Bergstrom et
al. is exact too, E[softmax_1] = P(f = 1), and with the normalization of their Remark 2,
g = (1 − 2·p_min)·onehot + p_min, E[g_1] = (1 − 2·p_min)·P(f = 1) + p_min: its argmax
changes exactly where P(f = 1) crosses 1/2, so soft certificates are audited against the
exact soft expectation, whose boundary is the hard one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from scipy import stats

from harness.data import Dataset
from harness.errors import ParameterError

ONE_HOT_LOGIT = 1e4
"""Logit of the predicted class of a one-hot analytic model (exp(−1e4) = 0 in float64)."""


def _logits(margin: torch.Tensor, one_hot: bool) -> torch.Tensor:
    """(0, margin), or one-hot logits of class [margin > 0]."""
    if one_hot:
        positive = (margin > 0).to(margin.dtype) * ONE_HOT_LOGIT
        return torch.stack([ONE_HOT_LOGIT - positive, positive], dim=1)
    return torch.stack([torch.zeros_like(margin), margin], dim=1)


class LinearClassifier(torch.nn.Module):
    """f(x) = [w·x > b] with unit normal w (default e_1), as logits (0, w·x − b)."""

    def __init__(self, dim: int, offset: float = 0.0, one_hot: bool = False) -> None:
        super().__init__()
        w = torch.zeros(dim)
        w[0] = 1.0
        self.register_buffer("w", w)
        self.offset = float(offset)
        self.one_hot = one_hot

    def set_plane(self, normal: torch.Tensor, offset: float) -> None:
        """Move the boundary to {x : w·x = offset}, w = normal / ‖normal‖."""
        normal = normal.flatten().to(self.w.device, self.w.dtype)
        self.w.copy_(normal / normal.norm())
        self.offset = float(offset)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _logits(x.flatten(1) @ self.w - self.offset, self.one_hot)

    def signed_distance(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x).reshape(len(x), -1) @ self.w.cpu().numpy() - self.offset

    def smoothed_probability(self, x: np.ndarray, sigma: np.ndarray) -> np.ndarray:
        """P(f(x + σε) = 1) = Φ((w·x − b)/σ)."""
        return stats.norm.cdf(self.signed_distance(x) / np.asarray(sigma))


class BallClassifier(torch.nn.Module):
    """f(x) = [‖x − c‖ <= ρ] (default c = 0), as logits (0, ρ − ‖x − c‖)."""

    def __init__(self, dim: int, radius: float = 1.0, one_hot: bool = False) -> None:
        super().__init__()
        self.dim = dim
        self.radius = float(radius)
        self.one_hot = one_hot
        self.register_buffer("center", torch.zeros(dim))

    def set_ball(self, center: torch.Tensor, radius: float) -> None:
        """Move the ball to B(center, radius)."""
        self.center.copy_(center.flatten().to(self.center.device, self.center.dtype))
        self.radius = float(radius)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        margin = self.radius - (x.flatten(1) - self.center).norm(dim=1)
        return _logits(margin, self.one_hot)

    def smoothed_probability(self, x: np.ndarray, sigma: np.ndarray) -> np.ndarray:
        """P(f(x + σε) = inside) = χ²_N(ρ²/σ²; nc = ‖x − c‖²/σ²) (noncentral χ² CDF)."""
        sigma = np.asarray(sigma, dtype=np.float64)
        flat = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
        dist2 = np.sum((flat - self.center.double().cpu().numpy()) ** 2, axis=1)
        return stats.ncx2.cdf(self.radius**2 / sigma**2, self.dim, dist2 / sigma**2)


def build_linear(input_shape: tuple[int, ...], num_classes: int, params: Mapping[str, Any]):
    dim = _checked_dim(input_shape, num_classes, params, "linear-N")
    return LinearClassifier(dim, params.get("offset", 0.0))


def build_ball(input_shape: tuple[int, ...], num_classes: int, params: Mapping[str, Any]):
    dim = _checked_dim(input_shape, num_classes, params, "ball-N")
    radius = float(params.get("radius", 1.0))
    if radius <= 0:
        raise ParameterError(f"ball-N radius must be positive, got {radius}")
    return BallClassifier(dim, radius)


def _checked_dim(input_shape, num_classes, params, name) -> int:
    dim = int(np.prod(input_shape))
    if "dim" in params and params["dim"] != dim:
        raise ParameterError(
            f"{name} with N={params['dim']} needs {params['dim']}-dimensional inputs, got {dim}"
        )
    if num_classes != 2:
        raise ParameterError(
            f"{name} is a binary classifier; the dataset has {num_classes} classes"
        )
    return dim


def load_ball_dataset(
    dim: int, seed: int = 0, radius: float = 1.0, train_size: int = 2000, test_size: int = 500
) -> Dataset:
    """Points x = ‖x‖·u with u uniform on the sphere and ‖x‖ uniform in [0, 2ρ]; label [‖x‖ <= ρ]."""
    if dim < 1:
        raise ParameterError(f"ball-N needs N >= 1, got {dim}")
    rng = np.random.default_rng([seed, dim, 7])

    def sample(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        u = rng.standard_normal((count, dim))
        u /= np.linalg.norm(u, axis=1, keepdims=True)
        norms = rng.uniform(0, 2 * radius, count)
        x = u * norms[:, None]
        return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(
            (norms <= radius).astype(np.int64)
        )

    train_x, train_y = sample(train_size)
    test_x, test_y = sample(test_size)
    return Dataset(f"ball-{dim}", train_x, train_y, test_x, test_y, 2, ("outside", "inside"))
