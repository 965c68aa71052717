"""The forward options of ``[certification]``: BatchNorm folded into the convolutions,
``torch.compile`` and CUDA graphs at the engine's batch shape; validated, recorded with a
run only when on, stated on its board, and what each computes."""

import json
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from harness.engine import forward
from harness.engine.arithmetic import differences, fingerprint
from harness.engine.folding import batchnorms, fold_batchnorm
from harness.engine.precision import prepare_model
from harness.engine.sampling import SamplingEngine
from harness.foundation.errors import IdrsError, ParameterError
from harness.foundation.progress import Progress
from harness.foundation.protocol import CertificationProtocol
from harness.running.benchmark import parse_benchmark
from harness.running.preparation import RunOptions, run_identity
from harness.running.runner import run_benchmark
from plugins.models.normalized import build_cifar_resnet

ROOT = Path(__file__).resolve().parents[1]

TINY = {
    "name": "tiny-forward",
    "seed": 1,
    "dataset": {"name": "cone-10", "test_count": 6},
    "model": {"architecture": "mlp", "trainer": "gaussian-augmentation",
              "architecture_params": {"width": 16}, "trainer_params": {"sigma": 0.5, "epochs": 1}},
    "certification": {"n0": 20, "n": 300, "alpha": 0.001, "batch_size": 64},
    "methods": [{"name": "cohen", "settings": [{"sigma": 0.5}]}],
}  # fmt: skip


def _trained_statistics(model: nn.Module, seed: int = 1) -> nn.Module:
    """Running statistics and affine parameters as training leaves them (not the identity
    of a fresh BatchNorm), scaled to keep ResNet activations of order one."""
    generator = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(torch.randn(c, generator=generator) * 0.2)
            m.running_var.copy_(torch.rand(c, generator=generator) * 1.5 + 0.25)
            m.weight.data.copy_(torch.rand(c, generator=generator) * 0.4 + 0.3)
            m.bias.data.copy_(torch.randn(c, generator=generator) * 0.1)
    return model.eval()


def test_folded_resnet_computes_the_unfolded_network_in_float64():
    """Every BatchNorm of a CIFAR ResNet-20 folded (21 of 21); the folded fp32 network is
    as close to the unfolded one evaluated in float64 as the unfolded fp32 network is, and
    a folded convolution's weights are W·γ/√(v + ε), its bias β − μ·γ/√(v + ε)."""
    torch.manual_seed(0)
    model = _trained_statistics(build_cifar_resnet((3, 32, 32), 10, {"depth": 20}))
    assert batchnorms(model) == 21
    folded, count = fold_batchnorm(model)
    assert count == 21 and batchnorms(folded) == 0 and batchnorms(model) == 21  # a copy
    x = torch.rand(16, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        exact = build_cifar_resnet((3, 32, 32), 10, {"depth": 20})
        exact.load_state_dict(model.state_dict())
        exact = exact.double().eval()(x.double())
        unfolded_error = (model(x).double() - exact).abs().max().item()
        folded_error = (folded(x).double() - exact).abs().max().item()
    scale = exact.abs().max().item()
    assert folded_error <= max(4 * unfolded_error, 1e-6 * scale), (folded_error, unfolded_error)
    assert unfolded_error < 1e-4 * scale
    conv, bn = model[1].conv1, model[1].bn1
    s = bn.weight.double() / torch.sqrt(bn.running_var.double() + bn.eps)
    fused = folded.get_submodule("1.conv1")
    expected = (conv.weight.double() * s[:, None, None, None]).float()
    assert torch.equal(fused.weight, expected)
    assert torch.allclose(fused.bias.double(), bn.bias.double() - bn.running_mean.double() * s,
                          rtol=1e-6, atol=1e-7)  # fmt: skip


class _Shared(nn.Module):
    """A convolution whose output a BatchNorm and the shortcut both read: not foldable."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(1, 2, 3, padding=1), nn.BatchNorm2d(2)

    def forward(self, x):
        y = self.conv(x)
        return (self.bn(y) + y).flatten(1)


class _Branching(nn.Module):
    """Python control flow on a tensor's value: torch.fx cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)

    def forward(self, x):
        y = self.bn(self.conv(x))
        return y.flatten(1) if y.sum() > 0 else -y.flatten(1)


def test_what_cannot_be_folded_is_refused_with_the_reason_and_the_fix():
    protocol = CertificationProtocol(n0=1, n=1, fold_batchnorm=True)
    with pytest.raises(IdrsError, match="1 of the base model's 1 BatchNorm layers do not"):
        prepare_model(_Shared().eval(), protocol)
    with pytest.raises(
        IdrsError, match=r"torch.fx cannot trace the base model.*fold_batchnorm = false"
    ):
        prepare_model(_Branching().eval(), protocol)
    plain = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))  # no BatchNorm: the model itself
    assert prepare_model(plain, protocol).model is plain


@pytest.mark.parametrize("option", ["fold_batchnorm", "compile", "cuda_graphs"])
def test_forward_options_are_validated_and_recorded_only_when_on(option):
    with pytest.raises(ParameterError, match=f"{option} must be true or false, got 'yes'"):
        parse_benchmark({**TINY, "certification": {**TINY["certification"], option: "yes"}})
    plain = parse_benchmark(TINY)
    off = parse_benchmark({**TINY, "certification": {**TINY["certification"], option: False}})
    on = parse_benchmark({**TINY, "certification": {**TINY["certification"], option: True}})
    cpu = torch.device("cpu")
    # off, the spec and so the run id are those of a spec that never heard of the option
    assert option not in off.to_dict()["protocol"]
    assert run_identity(off, cpu, "r") == run_identity(plain, cpu, "r")
    assert on.to_dict()["protocol"][option] is True
    assert run_identity(on, cpu, "r") != run_identity(plain, cpu, "r")
    before, after = fingerprint(cpu, plain.protocol, 64), fingerprint(cpu, on.protocol, 64)
    assert option not in before
    if option == "cuda_graphs":  # nothing on a CPU: the same arithmetic
        assert after == before
    else:
        assert after[option] is True
        assert differences(before, after) == [f"{option}: None → True"]


def test_cuda_graphs_on_a_cpu_do_nothing_and_say_so(monkeypatch):
    monkeypatch.setattr(forward, "_warned", set())
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    protocol = CertificationProtocol(n0=1, n=1, cuda_graphs=True)
    with pytest.warns(RuntimeWarning, match="cuda_graphs = true has no effect on a CPU"):
        assert prepare_model(model, protocol) is model
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepare_model(model, protocol)  # once per process


COMPILED_ONLY_AT_THE_ENGINES_BATCH = """
import torch
from torch import nn
from harness.engine.precision import PrecisionModel, prepare_model
from harness.engine.sampling import SamplingEngine
from harness.foundation.protocol import CertificationProtocol

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(6, 24), nn.ReLU(), nn.Linear(24, 3)).eval()
model = prepare_model(net, CertificationProtocol(n0=1, n=1, compile=True))
assert isinstance(model, PrecisionModel) and model.model is net
calls, compiled_net = [], model.fixed.compiled
model.fixed.compiled = lambda x: calls.append(len(x)) or compiled_net(x)
x = torch.randn(32, 6)
with torch.no_grad():
    eager = model(x)
    SamplingEngine(model, 3, torch.device("cpu"), 32, pad_batches=True)  # serves 32 rows
    compiled = model(x)
    model(x[:16])
assert calls == [32], calls  # only the engine's batch
assert torch.allclose(compiled, eager, atol=1e-6), (compiled - eager).abs().max()
model(x)  # with gradients: eager
assert calls == [32] and not model.fixed.serves(x)
"""


@pytest.mark.slow
def test_compile_runs_the_engines_batch_compiled_and_every_other_call_eagerly():
    """A padded engine's batch runs compiled (without gradients); other shapes and calls
    that record gradients run the model itself; compiled and eager agree to rounding. In a
    fresh interpreter, as a run compiles: in the suite's xdist workers Inductor's import of
    setuptools has failed (its distutils shim found the standard library's distutils)."""
    done = subprocess.run([sys.executable, "-c", COMPILED_ONLY_AT_THE_ENGINES_BATCH],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_run_with_folding_records_it_and_its_board_says_so(tmp_path, manager, monkeypatch):
    """The 784-200-10-like MLP has no BatchNorm: folding leaves it as it is, so the folded
    run's certificates are the plain run's, under another run id, arithmetic and header."""
    from harness.reports.leaderboard.protocol_markdown import _arithmetic
    from harness.reports.leaderboard.stated_protocol import protocol_differences

    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path / "cache"))
    db = tmp_path / "r.sqlite"
    runs = {}
    for fold in (False, True):
        raw = {**TINY, "certification": {**TINY["certification"], "fold_batchnorm": fold}}
        runs[fold] = run_benchmark(parse_benchmark(raw), RunOptions(db=db),
                                   Progress(enabled=False), manager)  # fmt: skip
    assert runs[False] != runs[True]
    with sqlite3.connect(db) as con:
        rows = {run: con.execute("SELECT input_id, counts_estimation, radius FROM certificates "
                                 "WHERE run_id = ? ORDER BY input_id", (run,)).fetchall()
                for run in runs.values()}  # fmt: skip
        stored = {run: [json.loads(v) for v in con.execute(
            "SELECT config, arithmetic FROM runs WHERE run_id = ?", (run,)).fetchone()]
            for run in runs.values()}  # fmt: skip
    assert rows[runs[False]] == rows[runs[True]] and len(rows[runs[True]]) == 6
    (plain_config, plain_arith), (config, arith) = stored[runs[False]], stored[runs[True]]
    assert config["protocol"]["fold_batchnorm"] is True and arith["fold_batchnorm"] is True
    assert "fold_batchnorm" not in plain_config["protocol"] and "fold_batchnorm" not in plain_arith
    assert _arithmetic(config["protocol"]).endswith(", BatchNorm folded into the convolutions")
    assert protocol_differences([plain_config["protocol"], config["protocol"]]) == {
        "fold_batchnorm": ["false", "true"]}  # fmt: skip


def test_api_certify_folds_a_batchnorm_model_and_keeps_its_decisions():
    """A small convolutional network with trained BatchNorm statistics: api.certify with
    fold_batchnorm certifies as the unfolded model does (the same predictions; counts off
    by at most a few near-tie samples)."""
    from harness.api import certify

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                        nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                        nn.Flatten(), nn.Linear(4 * 36, 3))  # fmt: skip
    _trained_statistics(net)
    x = torch.rand(4, 1, 6, 6, generator=torch.Generator().manual_seed(3))
    y = torch.zeros(4, dtype=torch.long)
    args = {"sigma": 0.25, "n0": 50, "n": 500, "device": "cpu", "batch_size": 64}
    plain, folded = certify(net, x, y, **args), certify(net, x, y, fold_batchnorm=True, **args)
    assert list(plain["prediction"]) == list(folded["prediction"])
    difference = np.abs(np.array(list(plain["counts_estimation"]))
                        - np.array(list(folded["counts_estimation"])))  # fmt: skip
    assert difference.sum() <= 8
    assert batchnorms(net) == 2  # the caller's model is left alone


def test_bench_refuses_cuda_graphs_on_a_cpu_and_names_a_folded_setting(capsys, tmp_path,
                                                                        monkeypatch):  # fmt: skip
    from harness.cli.main import main

    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path))
    common = ["bench", "--models", "mlp", "--device", "cpu", "--n", "200", "--inputs", "1",
              "--seconds", "0.05", "--batch-size", "64", "--reference-batch", "100", "--json"]  # fmt: skip
    assert main([*common, "--cuda-graphs"]) == 2
    assert "--cuda-graphs needs --device cuda" in capsys.readouterr().err
    assert main([*common, "--fold-batchnorm", "--api"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine"][0]["setting"] == "fp32+bn-folded cudnn-heuristic"
    api = out["api"][0]
    # compared with the plain fp32 model (the MLP has no BatchNorm: no decision differs)
    assert api["decisions_checked"] == 200 and api["decisions_differ_from_fp32"] == 0
    assert api["reference_default_setting"] == "fp32 cudnn-heuristic"


@pytest.mark.gpu
def test_cuda_graphs_replay_the_eager_counts_bit_for_bit_on_cuda():
    """On CUDA, an engine whose model replays CUDA graphs at its batch (and compiled, and
    folded and compiled) counts the base model's decisions; the graphs' counts are the
    eager engine's bit for bit (the same kernels), the folded or compiled ones within a
    few near-tie samples; a model that syncs with the host is refused by name."""
    device = torch.device("cuda")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.Flatten(), nn.Linear(8 * 64, 4))  # fmt: skip
    net = _trained_statistics(net).to(device)
    x = torch.rand(6, 1, 8, 8, device=device)
    ids, sigma = list(range(6)), [0.3] * 6

    def counts(**options):
        protocol = CertificationProtocol(n0=1, n=1, precision="fp32", **options)
        engine = SamplingEngine(prepare_model(net, protocol), 4, device, 256, seed=1,
                                noise="philox-v1", pad_batches=True)  # fmt: skip
        return engine.counts(x, sigma, ids, 1000, stream=1)

    eager = counts()
    assert np.array_equal(counts(cuda_graphs=True), eager)
    for options in ({"compile": True}, {"fold_batchnorm": True, "compile": True,
                                        "cuda_graphs": True}):  # fmt: skip
        other = counts(**options)
        assert other.sum() == eager.sum() and np.abs(other - eager).sum() <= 20

    class Syncing(nn.Module):  # (a parameter on the GPU: a model without any counts as on the CPU)
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(()))

        def forward(self, x):
            return x.flatten(1)[:, :4] * self.scale * float(x.sum().item() > 0)

    syncing = Syncing().to(device)
    model = prepare_model(syncing, CertificationProtocol(n0=1, n=1, cuda_graphs=True))
    SamplingEngine(model, 4, device, 32, pad_batches=True)
    with torch.no_grad(), pytest.raises(IdrsError, match="cannot be captured in a CUDA graph"):
        model(torch.rand(32, 1, 8, 8, device=device))
