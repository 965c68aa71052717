"""The engine and the Súkeník σ reproduce the published quick board's certificates.

``leaderboards/quick.md`` was certified before the engine's batch planning and the
kNN σ's training-set cache were rewritten for speed; its run export
(``leaderboards/quick.run.json``) holds every certificate. Re-certifying the board's
first shard (32 inputs, the runner's unit of work, so every batch of noisy inputs is
composed as it was) from the shipped weights must give the same predictions, σ and
radii, bit for bit.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from harness.foundation.progress import Progress
from harness.running.benchmark import DEFAULT_BENCHMARK, parse_benchmark
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark
from harness.store.store import ResultStore

BOARDS = Path(__file__).resolve().parent.parent / "leaderboards"
DATA = Path("/usr/share/datasets")
SETTINGS = {"cohen": {"sigma": 0.25}, "sukenik": {"sigma": 0.25}}


@pytest.mark.reproduction
@pytest.mark.skipif(
    not (DATA / "fashion-mnist").is_dir(), reason="needs Fashion-MNIST under /usr/share/datasets"
)
def test_first_shard_of_the_quick_board_is_reproduced(tmp_path, monkeypatch):
    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path / "cache"))
    runs = json.loads((BOARDS / "quick.run.json").read_text())["runs"]
    published_run = next(r for r in runs if r["run"]["config"]["model"]["seed"] == 0 and any(
        (c["method"], c["setting"]) == ("cohen", "sigma=0.25") for c in r["certificates"]))  # fmt: skip
    raw = tomllib.loads(DEFAULT_BENCHMARK.read_text())
    raw["dataset"]["test_count"] = 32
    del raw["model"]["per_sigma"]  # the one model of that run, from its shipped weights
    weights = BOARDS / f"quick.weights-{published_run['run']['run_id'][:12]}.pt"
    raw["model"].update(checkpoint=str(weights))
    raw["methods"] = [{"name": name, "settings": [s]} for name, s in SETTINGS.items()]
    db = tmp_path / "q.sqlite"
    run_id = run_benchmark(parse_benchmark(raw), RunOptions(db=db, device="cpu"), Progress(False))
    store = ResultStore(db)
    rows = list(store.certificates(run_id))
    store.close()
    board = published_run["certificates"]
    for name, setting in SETTINGS.items():
        key = f"sigma={setting['sigma']}"
        published = next(c["columns"] for c in board if (c["method"], c["setting"]) == (name, key))
        mine = sorted((r for r in rows if r["method"] == name), key=lambda r: r["input_id"])
        assert [r["input_id"] for r in mine] == published["input_id"][:32]
        assert [r["prediction"] for r in mine] == published["prediction"][:32]
        assert [r["sigma"] for r in mine] == published["sigma"][:32]
        assert [r["radius"] for r in mine] == published["radius"][:32]
