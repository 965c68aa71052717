"""The methods ``alfarra-ds`` and ``alfarra-ds-memory`` in the runner: next to cohen on
the same base model, a resumed run continuing the memory, and order replays."""

import sqlite3
import tomllib

import numpy as np
import pytest

from harness.audit.order import order_spread
from harness.foundation.certificate import unlabelled
from harness.foundation.progress import Progress
from harness.plugin.manager import PluginManager
from harness.running.benchmark import parse_benchmark
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark
from harness.store.store import ResultStore
from plugins.alfarra.memory import INSIDE, KEPT, SHRUNK
from plugins.alfarra.order import pairwise_distances, raw_certificate, replay, replay_orders

MEMORY = "alfarra-ds-memory"
ALFARRA = {"sigma": 4.0, "steps": 5, "beta": 0.01}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def alfarra_manager():
    return PluginManager(third_party=False)


@pytest.fixture
def alfarra_spec(small_benchmark) -> str:
    """Cohen and both methods on cone-2 (Súkeník et al. App. A.5 in 2-D), whose test points
    lie close enough for the memory to act."""
    methods = {"cohen": [{"sigma": 4.0}], "alfarra-ds": [ALFARRA], MEMORY: [ALFARRA]}
    return small_benchmark(methods, name="alfarra-tiny", seed=4, shard_size=8, test_count=64,
                           n0=32, n=256, batch_size=256)  # fmt: skip


def _run(manager, alfarra_spec, db):
    spec = parse_benchmark(tomllib.loads(alfarra_spec))
    return run_benchmark(spec, RunOptions(db=db), Progress(enabled=False), manager), spec


def _rows(db, run_id, method=None):
    store = ResultStore(db)
    try:
        rows = [r for r in store.certificates(run_id) if method in (None, r["method"])]
        assert store.failures(run_id) == []
    finally:
        store.close()
    for r in rows:  # measurements of the machine, not of the certificate
        r.pop("seconds"), r.pop("load")
    return rows


def _exact(row):
    """Everything but the floats that depend on σ(x)."""
    evidence = {k: v for k, v in row["evidence"].items() if k != "memory_raw_radius"}
    return {**{k: v for k, v in row.items() if k not in ("sigma", "radius", "p_lower")},
            "evidence": evidence}  # fmt: skip


def test_both_methods_run_next_to_cohen_and_the_memory_resumes(
    alfarra_manager, alfarra_spec, tmp_path, monkeypatch
):
    run_id, _ = _run(alfarra_manager, alfarra_spec, tmp_path / "ref.sqlite")
    rows = _rows(tmp_path / "ref.sqlite", run_id)
    by_method = {m: [r for r in rows if r["method"] == m] for m in ("cohen", "alfarra-ds", MEMORY)}
    assert all(len(v) == 64 for v in by_method.values())
    plain, memory = by_method["alfarra-ds"], by_method[MEMORY]
    # identical σ(x) and counts: the memory only post-processes alfarra-ds's certificates
    for a, b in zip(plain, memory, strict=True):
        assert a["sigma"] == b["sigma"] and a["counts_estimation"] == b["counts_estimation"]
        assert raw_certificate(b) == (a["prediction"], a["radius"])
        assert b["radius"] <= a["radius"]
    assert all(r["sigma"] != 4.0 for r in plain)  # σ(x) was optimized per input
    actions = [r["evidence"]["memory_action"] for r in memory]
    assert {KEPT, INSIDE, SHRUNK} <= set(actions)
    assert sorted(r["evidence"]["memory_position"] for r in memory) == list(range(64))

    # the same run killed after 4 committed shards (32 certificates) of the memory method ...
    calls = {"n": 0}
    original = ResultStore.add_shard

    def crashing(self, run_id, method, *args, **kwargs):
        if method == MEMORY:
            calls["n"] += 1
            if calls["n"] == 5:
                raise KeyboardInterrupt
        return original(self, run_id, method, *args, **kwargs)

    monkeypatch.setattr(ResultStore, "add_shard", crashing)
    with pytest.raises(KeyboardInterrupt):
        _run(alfarra_manager, alfarra_spec, tmp_path / "killed.sqlite")
    monkeypatch.setattr(ResultStore, "add_shard", original)
    with sqlite3.connect(tmp_path / "killed.sqlite") as con:
        assert con.execute("SELECT COUNT(*) FROM certificates WHERE method = ?",
                           (MEMORY,)).fetchone()[0] == 32  # fmt: skip
    # ... and resumed: only the missing inputs are certified, the memory goes on
    run_id2, _ = _run(alfarra_manager, alfarra_spec, tmp_path / "killed.sqlite")
    assert run_id2 == run_id
    resumed = _rows(tmp_path / "killed.sqlite", run_id, MEMORY)
    # bit for bit: σ(x) does not depend on the batch, the memory was committed with
    # the certificates in the run's own database
    assert resumed == memory
    with sqlite3.connect(tmp_path / "killed.sqlite") as con:
        stored = con.execute(
            "SELECT COUNT(*) FROM state WHERE run_id = ? AND method = ?", (run_id, MEMORY)
        ).fetchone()[0]
    assert stored == 64
    # the test can fail: inputs certified after the crash were changed by earlier ones
    late = [r for r in memory if r["evidence"]["memory_position"] >= 32]
    assert any(r["evidence"]["memory_decided_by"] for r in late)


def test_replay_orders_reproduces_the_recorded_order_and_the_harness_scores_the_spread(
    alfarra_manager, alfarra_spec, tmp_path, monkeypatch
):
    run_id, spec = _run(alfarra_manager, alfarra_spec, tmp_path / "r.sqlite")
    memory = _rows(tmp_path / "r.sqlite", run_id, MEMORY)
    registry = alfarra_manager.registry
    dataset = registry.get("datasets", "cone-2").load(
        data_root=None, download=False, seed=spec.seed, **registry.family_args("datasets", "cone-2")
    )
    x = dataset.test_x[[r["input_id"] for r in memory]]
    # replaying the recorded order of the raw certificates gives the stored ones back
    raw = np.array([raw_certificate(r) for r in memory])
    order = np.argsort([r["evidence"]["memory_position"] for r in memory])
    pred, rad = replay(pairwise_distances(x), raw[:, 0].astype(int), raw[:, 1], order)
    assert pred.tolist() == [r["prediction"] for r in memory]
    assert np.allclose(rad, [r["radius"] for r in memory], rtol=1e-12, atol=1e-12)

    radii = [0.0, 0.5, 1.0, 2.0]
    labels = {r["input_id"]: r["label"] for r in memory}
    replays = replay_orders(unlabelled(memory), 12, seed=0, inputs=dataset.test_x)
    assert replays == replay_orders(unlabelled(memory), 12, seed=0, inputs=dataset.test_x)
    out = order_spread(replays, labels, radii, 12)  # scored by the harness, with the labels
    stored = [
        np.mean([m["prediction"] == m["label"] and m["radius"] >= r for m in memory]) for r in radii
    ]
    assert out["recorded"] == pytest.approx(stored)
    per_order = [[np.mean([p == labels[i] and d >= r for i, p, d in
                           zip(replays["input_id"], o["prediction"], o["radius"], strict=True)])
                  for r in radii] for o in replays["orders"]]  # fmt: skip
    assert out["orders"] == 12 and np.array(per_order).shape == (12, 4)
    assert out["min"] == pytest.approx(np.min(per_order, axis=0))
    assert out["max"] == pytest.approx(np.max(per_order, axis=0))
    acrs = [np.mean([d if p == labels[i] else 0.0 for i, p, d in
                     zip(replays["input_id"], o["prediction"], o["radius"], strict=True)])
            for o in replays["orders"]]  # fmt: skip
    assert out["acr"]["min"] == pytest.approx(min(acrs))
    worst = replays["orders"][int(np.argmin(acrs))]
    assert out["worst_order"]["prediction"] == worst["prediction"]
    # the orders really differ in outcome here, and a single fixed order has no spread
    assert max(np.array(out["max"]) - np.array(out["min"])) > 0
    # replaying certificates that never went through the memory (alfarra-ds) works too
    plain = _rows(tmp_path / "r.sqlite", run_id, "alfarra-ds")
    assert replay_orders(plain, 3, seed=1, inputs=dataset.test_x)["recorded"] is None
