"""What the harness promises about bits (harness/README.md, "Replay"): a run measures whether a
row's logits depend on the other rows of its batch and replays statistically where they
do; on CUDA every process computes a run's quantities with deterministic kernels, and the
engine's sums are deterministic by construction."""

from __future__ import annotations

import json
import os
import sqlite3

import numpy as np
import pytest
import torch

from harness import ModelSpec, hookimpl
from harness.audit.audit import BUDGETS
from harness.audit.replay import check_replay
from harness.audit.session import audits
from harness.engine.arithmetic import ROWS_DEPENDENT, differences, rows_independent
from harness.engine.determinism import CUBLAS_WORKSPACE, deterministic_kernels, kernels_restored
from harness.engine.sampling import SamplingEngine
from harness.foundation.progress import Progress
from harness.foundation.verdict import Verdict
from harness.running.benchmark import parse_benchmark
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark
from harness.store.store import ResultStore


class BatchMixing(torch.nn.Module):
    """Logits of a linear map plus a trace of the batch's mean: each row depends, in its
    last bits, on every other row of the batch."""

    def __init__(self, dim: int, classes: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(dim, classes)

    def forward(self, x):
        out = self.linear(x.flatten(1))
        return out + 1e-4 * out.mean(0, keepdim=True)


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(784, 200), torch.nn.ReLU(), torch.nn.Linear(200, 10)
    ).eval()


def test_the_rows_probe_flags_a_model_whose_rows_depend_on_the_batch():
    examples = torch.rand(3, 784, generator=torch.Generator().manual_seed(4))
    assert not rows_independent(BatchMixing(784, 10).eval(), examples, 64)
    rowwise = torch.nn.Sequential(torch.nn.Tanh()).eval()  # elementwise: each row alone
    assert rows_independent(rowwise, examples, 64)
    assert rows_independent(BatchMixing(784, 10).eval(), examples, 1)  # one row: nothing shared


def test_the_rows_probe_agrees_with_a_direct_look_at_this_machines_blas():
    """The premise of padding every forward pass to one shape is that there a row's logits
    depend on the row alone. Some BLAS break it (the CPU of a GPU machine, torch 2.11, on
    this MLP at 64 rows), so a run measures it; the measurement must agree with what a
    batch of other rows at other positions shows here, whichever way it goes."""
    model = _mlp()
    rows = torch.randn(64, 784, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = model(rows)
        observed = True
        for seed in range(3):
            other = torch.randn(64, 784, generator=torch.Generator().manual_seed(10 + seed))
            order = torch.randperm(64, generator=torch.Generator().manual_seed(20 + seed))
            mixed = other.clone()
            mixed[order[:40]] = rows[:40]  # 40 of the rows, at other positions
            observed &= torch.equal(model(mixed)[order[:40]], reference[:40])
    assert rows_independent(model, rows[:4], 64) == observed


class MixingPlugin:
    @hookimpl
    def idrs_register_models(self, register):
        register(ModelSpec("batch-mixing", lambda shape, classes, params: BatchMixing(
            int(np.prod(shape)), classes)))  # fmt: skip


def test_a_run_records_whether_its_rows_depend_on_the_batch(tmp_path, manager, capsys):
    manager.register(MixingPlugin(), name="mixing")
    raw = {"name": "mixing", "device": "cpu", "dataset": {"name": "ball-2", "test_count": 4},
           "model": {"architecture": "batch-mixing", "trainer": "none"},
           "certification": {"n0": 16, "n": 64, "batch_size": 32},
           "methods": [{"name": "cohen", "settings": [{"sigma": 0.25}]}]}  # fmt: skip
    db = tmp_path / "mixing.sqlite"
    run_benchmark(parse_benchmark(raw), RunOptions(db=db), Progress(enabled=True), manager)
    with sqlite3.connect(db) as con:
        (text,) = con.execute("SELECT arithmetic FROM runs").fetchone()
    recorded = json.loads(text)
    assert recorded["rows"] == ROWS_DEPENDENT
    assert "its replays are statistical" in capsys.readouterr().err
    [why] = differences(recorded, recorded)  # matches no arithmetic, not even its own
    assert why.startswith("rows: a row's logits depended on the other rows")
    raw["model"]["architecture"] = "ball-N"  # a row-wise model: its replays are bit for bit
    run_benchmark(parse_benchmark(raw), RunOptions(db=db), Progress(enabled=False), manager)
    with sqlite3.connect(db) as con:
        rows = [json.loads(t)["rows"] for (t,) in con.execute("SELECT arithmetic FROM runs")]
    assert sorted(rows) == [ROWS_DEPENDENT, "independent"]


def test_a_run_whose_rows_depend_on_the_batch_replays_statistically(tmp_path, manager, replay_run):
    db, run_id = replay_run(tmp_path, manager, ["cohen"], device="cpu")
    with sqlite3.connect(db) as con:
        (text,) = con.execute("SELECT arithmetic FROM runs").fetchone()
        assert json.loads(text)["rows"] == "independent"
        con.execute("UPDATE runs SET arithmetic = ?",
                    (json.dumps(json.loads(text) | {"rows": ROWS_DEPENDENT}),))  # fmt: skip
    store = ResultStore(db)
    try:
        # a fixed audit: the replication test's verdict is the same every time (with fresh
        # entropy a sound row is flagged 1 time in 1,000, as the test promises)
        [audit] = list(audits(store, run_id, RunOptions(db=db), Progress(enabled=False), manager,
                              budget=BUDGETS["small"], entropy=0x47_DE7))  # fmt: skip
    finally:
        store.close()
    result = check_replay(audit)
    assert result.verdict == Verdict.SOUND, result.summary
    assert result.evidence["mode"] == "replication" and "fresh" in result.evidence
    assert "rows: a row's logits depended on the other rows" in result.summary


def test_deterministic_kernels_are_set_on_cuda_only_and_restored(monkeypatch):
    """Nothing changes for a CPU (its runs stay bit for bit what they were); for CUDA the
    deterministic algorithms (warn-only), cuBLAS's workspace and no NaN filling, inside the
    block only. (Setting the flags needs no GPU.)"""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    fill = torch.utils.deterministic
    before = (torch.are_deterministic_algorithms_enabled(), fill.fill_uninitialized_memory)
    with deterministic_kernels("cpu"):
        assert (torch.are_deterministic_algorithms_enabled(),
                fill.fill_uninitialized_memory) == before  # fmt: skip
        assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    with deterministic_kernels(torch.device("cuda")):
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert fill.fill_uninitialized_memory is False
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE
    assert (torch.are_deterministic_algorithms_enabled(), fill.fill_uninitialized_memory) == before


def _engine(device, batch=512):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10)).to(device).eval()  # fmt: skip
    return SamplingEngine(model, 10, device, batch, seed=3, pad_batches=True)


@pytest.mark.gpu
def test_on_cuda_sums_are_deterministic_and_counts_exact_under_the_deterministic_mode():
    """Soft sums: the same bits twice, in or out of the deterministic mode (no float
    atomics); an input re-drawn alone within the replay's n·2⁻⁵²; class counts the same in
    and out of the mode (integer atomics kept inside it); and at one batch shape a row's
    logits depend on the row alone (cuBLAS)."""
    cuda = torch.device("cuda")
    engine = _engine(cuda)
    x = torch.rand(9, 1, 28, 28, generator=torch.Generator().manual_seed(5))
    ids = list(range(40, 49))
    first = engine.soft_stats(x, [0.5] * 9, ids, 3000, 1)
    again = engine.soft_stats(x, [0.5] * 9, ids, 3000, 1)
    with deterministic_kernels(cuda):
        inside = engine.soft_stats(x, [0.5] * 9, ids, 3000, 1)
        counts_inside = engine.counts(x, [0.5] * 9, ids, 3000, 1)
    for a, b, c in zip(first, again, inside, strict=True):
        assert np.array_equal(a.sums, b.sums) and np.array_equal(a.sums, c.sums)
    np.testing.assert_array_equal(counts_inside, engine.counts(x, [0.5] * 9, ids, 3000, 1))
    alone = engine.soft_stats(x[4:5], [0.5], ids[4:5], 3000, 1)[0]
    assert np.all(np.abs(alone.sums - first[4].sums) <= 3000 * 2.0**-52)
    examples = x[:3].to(cuda)
    assert rows_independent(engine.model, examples, 512)


def test_the_kernel_settings_are_restored_and_left_alone_when_unchanged(monkeypatch):
    """After a block that set the deterministic mode, it is as before; after one that did
    not, it is not set again (setting it imports torch's compiler configuration)."""
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.utils.deterministic.fill_uninitialized_memory)  # fmt: skip
    with kernels_restored():
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = not before[2]
    assert (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.utils.deterministic.fill_uninitialized_memory) == before  # fmt: skip
    calls = []
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda *a, **k: calls.append(a))
    with kernels_restored():
        pass
    assert calls == []
