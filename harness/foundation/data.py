"""The in-memory dataset the harness loads, and the part of it plugin code sees.

A dataset plugin produces both splits (:class:`Dataset`); the harness alone keeps the test
split, certifies and scores with it. σ-providers, certifiers and trainers get a
:class:`TrainingSplit`: the training split and the dataset's description, never the test
inputs or labels (docs/plugins.md, "What a plugin sees of the dataset").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from harness.foundation.errors import ContractError

if TYPE_CHECKING:
    import torch

PORTING = "docs/plugins.md, 'Porting a plugin to contract 4'"
"""Where the author of a plugin that read the test split reads how to port it."""
WITHHELD = "withheld"
"""What a run records (``runs.test_split``) when it began under this rule: its plugins got
:class:`TrainingSplit` views only, and test inputs one batch at a time when asked."""


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
        import torch

        indices = torch.arange(0, len(self.test_x), every)
        return indices if count is None else indices[:count]

    def training_split(self) -> TrainingSplit:
        """What plugin code sees of this dataset: its training split and description."""
        return TrainingSplit(self.name, self.train_x, self.train_y, self.num_classes,
                             self.input_shape, tuple(self.class_names), dict(self.files))  # fmt: skip


@dataclass(frozen=True)
class TrainingSplit:
    """A dataset as σ-providers, certifiers and trainers see it: the
    training split (``train_x`` [N_train, *input_shape], ``train_y``) and the description
    (``name``, ``num_classes``, ``class_names``, ``input_shape``, ``dim``, ``files``: path ->
    SHA-256). The test split is withheld: reading ``test_x``, ``test_y`` or ``test_subset``
    raises a :class:`~harness.foundation.errors.ContractError` naming the rule."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    class_names: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)

    @property
    def dim(self) -> int:
        return math.prod(self.input_shape)

    @property
    def test_x(self) -> torch.Tensor:
        raise withheld(self.name, "test_x")

    @property
    def test_y(self) -> torch.Tensor:
        raise withheld(self.name, "test_y")

    def test_subset(self, *_, **__) -> torch.Tensor:
        raise withheld(self.name, "test_subset")


def withheld(dataset: str, name: str) -> ContractError:
    """The error for plugin code that reads the test split (``name``) of ``dataset``."""
    return ContractError(
        f"dataset {dataset!r}: {name} is withheld from plugins. σ-providers, certifiers and "
        "trainers get the training split (train_x, train_y) and the "
        "dataset's description (name, num_classes, class_names, input_shape, dim, files), "
        "never the test inputs or labels: the harness alone certifies and scores with them, "
        "and a σ-provider sees each test input only when asked for its σ. A plugin written "
        "against contract 3 that read the test split fits on the training split instead "
        f"({PORTING})"
    )
