"""Inputs drawn together: several inputs (and several shards) per engine call give every
input the samples and counts it gets alone, bit for bit, under fixed and sequential
sampling; a run that draws its shards together stores what a run drawing them one by one
stores, shard by shard."""

import json
import sqlite3

import numpy as np
import pytest
import torch

from harness.certification.certify import certify_drawn
from harness.engine.arithmetic import rows_independent
from harness.engine.sampling import NOISE_SCHEMES, SamplingEngine
from harness.foundation.progress import Progress
from harness.foundation.protocol import CertificationProtocol
from harness.mathematics.accuracy import RADII
from harness.running.benchmark import parse_benchmark
from harness.running.local_executor import LocalExecutor
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark
from harness.running.work import MAX_INPUTS_PER_CALL, shards_per_call
from plugins.cohen.certifier import CohenCertifier

BATCH = 64


def _engine(noise: str) -> SamplingEngine:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 24), torch.nn.ReLU(), torch.nn.Linear(24, 3))
    return SamplingEngine(model.eval(), 3, torch.device("cpu"), BATCH, seed=5, noise=noise,
                          pad_batches=True)  # fmt: skip


def _certify(engine, protocol, x, ids, sigma):
    certs = certify_drawn(engine, protocol, CohenCertifier(), x, ids, sigma)
    return {c.input_id: (c.prediction, c.radius, c.p_lower, c.predict, c.draws) for c in certs}


@pytest.mark.parametrize("noise", NOISE_SCHEMES)
@pytest.mark.parametrize("sampling", ["fixed", "sequential"])
def test_inputs_drawn_together_get_the_counts_they_get_alone(noise, sampling):
    """Five inputs in one call, n0 and n not multiples of the batch (a batch mixes several
    inputs' samples, and one input's samples span batches), against each input alone:
    the same selection and estimation counts, looks, stops and claims."""
    engine = _engine(noise)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(5, 6, generator=generator) * 0.3
    assert rows_independent(engine.model, x, BATCH)  # what makes packing exact (measured)
    ids, sigma = [3, 40, 7, 1000, 12], np.array([0.2, 0.5, 0.35, 1.0, 0.05])
    extra = {"sampling": "sequential", "n_max": 1500, "grid": RADII} if sampling != "fixed" else {}
    protocol = CertificationProtocol(n0=37, n=1500, alpha=0.01, batch_size=BATCH, **extra)
    assert protocol.n0 % BATCH and protocol.n % BATCH
    together = _certify(engine, protocol, x, ids, sigma)
    alone = {}
    for k, i in enumerate(ids):
        alone |= _certify(_engine(noise), protocol, x[k : k + 1], [i], sigma[k : k + 1])
    assert together == alone
    drawn = {i: d["base"]["n"] for i, (*_, d) in together.items()}
    if sampling == "sequential":  # inputs stopped at different looks: rounds were shared
        assert len(set(drawn.values())) > 1 and max(drawn.values()) <= 1500
        assert all("looks" in d["base"] for *_, d in together.values())
    else:
        assert set(drawn.values()) == {1500}


def test_shards_per_call_fill_the_smallest_engine_call():
    fixed = CertificationProtocol(n0=100, n=10_000)
    assert shards_per_call(fixed, 1024, 32) == 1  # 3,200 selection samples fill a batch
    assert shards_per_call(fixed, 65_536, 32) == 21  # ⌈65,536 / 3,200⌉
    sequential = CertificationProtocol(n0=100, n=100_000, sampling="sequential", grid=RADII)
    # the smallest round of grid-place-v1 (looks 100, 102, 104, ...: ×1.02) adds 2 samples
    # per input, ⌈1024 / (32 · 2)⌉; of mixture-cs-v2 (100, 110, 121, ...: ×1.1) 10, ⌈1024 / 320⌉
    assert shards_per_call(sequential, 1024, 32) == 16
    v2 = CertificationProtocol(n0=100, n=100_000, sampling="sequential", grid=RADII,
                               rule="mixture-cs-v2")  # fmt: skip
    assert shards_per_call(v2, 1024, 32) == 4
    assert shards_per_call(sequential, 1 << 20, 32) == MAX_INPUTS_PER_CALL // 32
    assert shards_per_call(fixed, 1, 32) == 1


def _raw(sampling: str) -> dict:
    cert = {"n0": 20, "n": 300, "alpha": 0.01, "batch_size": 256}
    if sampling == "sequential":
        cert |= {"sampling": "sequential", "n": 2000}
    return {"name": "shards", "seed": 2, "shard_size": 3, "radii": [0.0, 0.25, 0.5],
            "dataset": {"name": "cone-10", "test_count": 10},
            "model": {"architecture": "mlp", "trainer": "gaussian-augmentation",
                      "architecture_params": {"width": 16},
                      "trainer_params": {"sigma": 0.5, "epochs": 1}},
            "certification": cert,
            "methods": [{"name": "cohen", "settings": [{"sigma": 0.5}]},
                        {"name": "alfarra-ds-memory", "settings": [{"sigma": 0.5}]}]}  # fmt: skip


def _stored(db):
    with sqlite3.connect(db) as con:
        certs = con.execute(
            "SELECT method, input_id, shard, prediction, predict, radius, p_lower, sigma, "
            "counts_selection, counts_estimation, evidence, draws FROM certificates "
            "ORDER BY method, input_id"
        ).fetchall()
        shards = con.execute("SELECT method, shard FROM shards ORDER BY method, shard").fetchall()
        state = con.execute("SELECT method, seq, record FROM state ORDER BY method, seq").fetchall()
    return certs, shards, state


@pytest.mark.parametrize("sampling", ["fixed", "sequential"])
def test_a_run_drawing_its_shards_together_stores_what_one_shard_at_a_time_stores(
    sampling, tmp_path, manager, monkeypatch
):
    """Four shards of 3, 3, 3 and 1 inputs, drawn three at a time (a memory among the
    methods: its inputs still in order, its state with them) and one at a time: the same
    certificates, shards and state; fewer engine calls."""
    if sampling == "sequential":  # the memory certifies fixed n only
        raw = _raw(sampling)
        raw["methods"] = raw["methods"][:1]
    else:
        raw = _raw(sampling)
    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path / "cache"))
    calls = []
    run = SamplingEngine.run

    def counted(self, x, *args, **kwargs):
        calls.append(len(x))
        return run(self, x, *args, **kwargs)

    monkeypatch.setattr(SamplingEngine, "run", counted)
    made = {}
    for per_call in (1, 3):
        db = tmp_path / f"{per_call}.sqlite"
        calls.clear()
        run_benchmark(parse_benchmark(raw), RunOptions(db=db), Progress(enabled=False), manager,
                      executor=LocalExecutor(shards_per_call=per_call))  # fmt: skip
        made[per_call] = (_stored(db), list(calls))
    (one, one_calls), (three, three_calls) = made[1], made[3]
    assert one == three
    certs, shards, state = three
    methods = {m["name"] for m in raw["methods"]}
    assert len(certs) == 10 * len(methods) and len(shards) == 4 * len(methods)
    assert all(json.loads(c[11])["base"]["n"] > 0 for c in certs)
    assert bool(state) == ("alfarra-ds-memory" in methods)
    # the base model's draws: inputs of three shards in one call (σ searches call too)
    assert max(three_calls) > max(one_calls) == 3 and len(three_calls) < len(one_calls)
