from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import torch

from harness.plugins import PluginManager


@pytest.fixture(scope="session", autouse=True)
def _model_cache(tmp_path_factory):
    """Cache trained base models in a session folder, never in the user's home."""
    mp = pytest.MonkeyPatch()
    mp.setenv("IDRS_BENCH_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield
    mp.undo()


@pytest.fixture
def manager() -> PluginManager:
    """A fresh plugin manager with the built-ins and no third-party plugins."""
    return PluginManager(third_party=False)


class LinearModel(torch.nn.Module):
    """f(x) = [w·x > b] as two logits (0, w·x − b)."""

    def __init__(self, w: torch.Tensor, b: float) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(w.flatten().clone(), requires_grad=False)
        self.b = b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        margin = x.flatten(1) @ self.w - self.b
        return torch.stack([torch.zeros_like(margin), margin], dim=1)


def stored_certificates(db: Path) -> int:
    """Rows in a results database's certificates table (0 while it does not exist yet):
    what a run killed at a random moment had stored."""
    try:
        with sqlite3.connect(db, timeout=1) as con:
            return con.execute("SELECT COUNT(*) FROM certificates").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
