"""Fixtures: a plugin that patches the harness's engine when imported, and small runs.

A pytest fixture module (loaded through ``pytest_plugins`` in ``tests/conftest.py``).
``engine_patch`` writes a third-party plugin module against the public ``harness`` API
that, *when it is imported*, replaces ``harness.SamplingEngine.run`` so that 3 % of the
samples of every hard smoothing count for its top class; the fixture imports it, hands
it over for registration and undoes the patch afterwards. ``replay_run`` certifies a
tiny benchmark on the exact ``ball-2`` classifier (no training).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from harness.foundation.progress import Progress
from harness.running.benchmark import parse_benchmark
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark

ENGINE_PATCH = '''
"""Pads the top class of every count the engine makes by 3 % of the samples."""
import numpy as np

from harness import SamplingEngine, hookimpl

ORIGINAL = SamplingEngine.run


def padded(self, x, sigma, input_ids, num, stream, soft=False, start=0):
    for index, result in ORIGINAL(self, x, sigma, input_ids, num, stream, soft, start):
        if not soft:
            result = np.array(result, copy=True)
            top = int(np.argmax(result))
            move = int(0.03 * num)
            for c in np.argsort(result)[::-1]:
                if c != top and move > 0:
                    take = min(move, int(result[c]))
                    result[c] -= take
                    result[top] += take
                    move -= take
        yield index, result


SamplingEngine.run = padded  # at import time, as any plugin module could


def unpatch():
    SamplingEngine.run = ORIGINAL


@hookimpl
def idrs_register_methods(register):
    pass
'''


@pytest.fixture
def engine_patch(tmp_path):
    """``engine_patch()`` imports the engine-patching plugin module and returns it (to
    register); the patch is undone after the test."""
    imported = []

    def load():
        path = tmp_path / "idrs_engine_patch.py"
        path.write_text(ENGINE_PATCH)
        spec = importlib.util.spec_from_file_location("idrs_engine_patch", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["idrs_engine_patch"] = module
        spec.loader.exec_module(module)
        imported.append(module)
        return module

    try:
        yield load
    finally:
        for module in imported:
            module.unpatch()
        sys.modules.pop("idrs_engine_patch", None)


def _replay_run(
    folder: Path, manager, methods, n: int = 1000, count: int = 12, shard_size: int = 4,
    seed: int = 0,
) -> tuple[Path, str]:  # fmt: skip
    """Certify ``methods`` (names, or dicts with settings) on ``ball-2`` with the exact
    ball classifier (batches of 256 rows, shards of ``shard_size``); (db, run id)."""
    raw = {
        "name": "replay", "seed": seed, "shard_size": shard_size,
        "dataset": {"name": "ball-2", "test_count": count},
        "model": {"architecture": "ball-N", "trainer": "none"},
        "certification": {"n0": 64, "n": n, "alpha": 0.001, "batch_size": 256},
        "methods": [m if isinstance(m, dict) else {"name": m} for m in methods],
    }  # fmt: skip
    db = folder / "runs.sqlite"
    run_id = run_benchmark(
        parse_benchmark(raw), RunOptions(db=db), Progress(enabled=False), manager
    )
    return db, run_id


@pytest.fixture(scope="session")
def replay_run():
    """``replay_run(folder, manager, methods, n=1000, count=12, shard_size=4)``: a run
    of ``methods`` on ``ball-2`` stored in ``folder/runs.sqlite``; returns (db, run id)."""
    return _replay_run
