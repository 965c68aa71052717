"""Fixture: the small benchmark file of the tests that run a whole (tiny) benchmark.

A pytest fixture module (loaded through ``pytest_plugins`` in ``tests/conftest.py``).
``small_benchmark(methods, ...)`` is the TOML text of a benchmark on a ``cone-N`` dataset
with a small MLP trained by Gaussian augmentation, the shape those tests share; each test
passes the values it varies (the run's name and seed, the dataset and its test points, the
model's width and epochs, n0, n, α, the batch, the shards). The one-method file that the
tests of invalid values fill in is ``spec_template`` (``tests/conftest.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest


def _toml(value: Any) -> str:
    """``value`` written as a TOML value, tables inline (as a benchmark file writes settings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, Mapping):
        pairs = ", ".join(f"{key} = {_toml(item)}" for key, item in value.items())
        return f"{{ {pairs} }}" if pairs else "{}"
    if isinstance(value, Sequence):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    raise TypeError(f"no TOML value for {value!r}")


def _table(values: Mapping[str, Any]) -> list[str]:
    """``key = value`` lines, a ``None`` value left out (the benchmark's default applies)."""
    return [f"{key} = {_toml(value)}" for key, value in values.items() if value is not None]


def _small_benchmark(
    methods: Mapping[str, Sequence[Mapping[str, Any]]], *, name: str = "tiny", seed: int = 1,
    dataset: str = "cone-2", test_count: int = 8, width: int = 16, epochs: int = 1,
    trainer_sigma: float | None = 0.5, n0: int = 20, n: int = 500, alpha: float | None = 0.01,
    batch_size: int = 512, shard_size: int | None = None, device: str | None = None,
) -> str:  # fmt: skip
    sections = {
        "dataset": {"name": dataset, "test_count": test_count},
        "model": {"architecture": "mlp", "trainer": "gaussian-augmentation",
                  "architecture_params": {"width": width},
                  "trainer_params": _present({"sigma": trainer_sigma, "epochs": epochs})},
        "certification": {"n0": n0, "n": n, "alpha": alpha, "batch_size": batch_size},
    }  # fmt: skip
    lines = _table({"name": name, "seed": seed, "device": device, "shard_size": shard_size})
    for section, values in sections.items():
        lines += ["", f"[{section}]", *_table(values)]
    for method, settings in methods.items():
        lines += ["", "[[methods]]", f"name = {_toml(method)}", f"settings = {_toml(settings)}"]
    return "\n".join(lines) + "\n"


def _present(values: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


@pytest.fixture(scope="session")
def small_benchmark():
    """``small_benchmark(methods, name="tiny", seed=1, dataset="cone-2", test_count=8,
    width=16, epochs=1, trainer_sigma=0.5, n0=20, n=500, alpha=0.01, batch_size=512,
    shard_size=None, device=None) -> str``: the benchmark file of ``methods`` (``{name:
    [setting, ...]}``, in the run's order) on ``dataset``, an MLP of ``width`` trained
    ``epochs`` epochs at ``trainer_sigma``; ``None`` leaves a value out (its default)."""
    return _small_benchmark


def _beside_cohen(name: str, methods: Sequence[str] = (), cohen: bool = True) -> str:
    """The exact ``ball-2`` benchmark (4 test points, no training: the analytic ball
    classifier) with a built-in ``cohen`` row at σ = 0.25 (unless ``cohen`` is false) and
    each of ``methods`` at its defaults."""
    rows: dict[str, list[dict[str, Any]]] = {"cohen": [{"sigma": 0.25}]} if cohen else {}
    rows |= {method: [{}] for method in methods}
    lines = [*_table({"name": name, "seed": 0}), "", "[dataset]",
             *_table({"name": "ball-2", "test_count": 4}), "", "[model]",
             *_table({"architecture": "ball-N", "trainer": "none"}), "", "[certification]",
             *_table({"n0": 16, "n": 200, "alpha": 0.01, "batch_size": 256})]  # fmt: skip
    for method, settings in rows.items():
        lines += ["", "[[methods]]", f"name = {_toml(method)}", f"settings = {_toml(settings)}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def beside_cohen():
    """``beside_cohen(name, methods=(), cohen=True) -> str``: the benchmark file of the
    tests that run plugins beside a built-in row: ``ball-2`` (exact, untrained), a
    ``cohen`` row at σ = 0.25 and each of ``methods`` at its defaults."""
    return _beside_cohen
