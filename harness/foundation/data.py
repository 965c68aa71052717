"""The in-memory dataset every component sees."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


@dataclass
class Dataset:
    """Train and test tensors; inputs are float32 of shape [N, *input_shape].

    Image datasets hold pixels in [0, 1] and are never normalized outside the model:
    noise is added in input space. ``files`` are recorded with every run.
    """

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    class_names: tuple[str, ...] = field(default=())
    files: dict[str, str] = field(default_factory=dict)
    """The files read (path -> SHA-256 hex); empty for a generated dataset."""

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.test_x.shape[1:])

    @property
    def dim(self) -> int:
        return math.prod(self.input_shape)

    def test_subset(self, every: int = 1, count: int | None = None) -> torch.Tensor:
        """Indices of every ``every``-th test point, the first ``count`` of them."""
        indices = torch.arange(0, len(self.test_x), every)
        return indices if count is None else indices[:count]
