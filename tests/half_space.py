"""Fixture: a base model whose smoothed classifier is known in closed form, with inputs on it.

A pytest fixture module (loaded through ``pytest_plugins`` in ``tests/conftest.py``).
``half_space`` gives the two-class model with logits (0, x₀ − 0.1), whose smoothed
classifier at noise σ answers class 1 with probability Φ((x₀ − 0.1)/σ), and five inputs at
σ = 0.5: at signed distances far from every grid threshold of the sequential tests, and one
just past the threshold of radius 0.25 (p_A = Φ(0.5)), slow to decide.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch


class HalfSpace(torch.nn.Module):
    """Logits (0, x₀ − 0.1) of a half-space."""

    def forward(self, x):
        margin = x.flatten(1)[:, 0] - 0.1
        return torch.stack([torch.zeros_like(margin), margin], dim=1)


class HalfSpaceCase:
    """The model and (a fresh copy of) the inputs: ``(x, ids, sigma)``."""

    model = HalfSpace()

    @staticmethod
    def inputs() -> tuple[torch.Tensor, list[int], np.ndarray]:
        margins = torch.tensor([-1.5, 2.0, 0.6, -0.05, 0.25 * 1.0005])
        x = torch.zeros(len(margins), 3)
        x[:, 0] = margins + 0.1
        return x, list(range(100, 100 + len(margins))), np.full(len(margins), 0.5)


@pytest.fixture
def half_space() -> HalfSpaceCase:
    return HalfSpaceCase()
