"""``idrs-bench bench``: the rates, the limit over batch sizes and settings, their ratios,
the reference loop, ``harness.api.certify`` against it, the errors."""

import json

import numpy as np
import pytest
import torch
from scipy.stats import norm

from harness.cli import bench
from harness.cli.main import main
from harness.cli.throughput import reference_certify
from harness.foundation.errors import IdrsError
from harness.plugin.manager import PluginManager

KEYS = {"model", "device", "batch_size", "raw_per_s", "best_raw_per_s", "limit_per_s",
        "ideal_per_s", "engine_per_s", "reference_per_s", "engine_vs_ideal", "engine_vs_raw",
        "engine_vs_best_raw", "engine_vs_limit", "engine_vs_reference"}  # fmt: skip


def test_bench_json_for_a_tiny_mlp(capsys, tmp_path, monkeypatch):
    """The limit is the best raw rate over batch sizes and the settings of --limit: at
    least the raw rate at the engine's batch, and over all settings at least over the
    engine's own; the API section times harness.api.certify against the reference loop
    and, in bf16, counts the noisy decisions that differ from fp32."""
    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path))
    argv = ["bench", "--models", "mlp", "--device", "cpu", "--n", "200", "--inputs", "1",
            "--seconds", "0.05", "--batch-size", "64", "--limit", "all", "--api",
            "--precision", "bf16", "--reference-batch", "100", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["engine"]
    assert [r["model"] for r in rows] == ["mlp"]
    for r in rows:
        assert set(r) >= KEYS
        assert r["device"] == "cpu" and r["batch_size"] == 64 and r["n"] == 200
        assert r["setting"] == "bf16 cudnn-heuristic" and r["reference_batch"] == 100
        for key in ("raw_per_s", "ideal_per_s", "engine_per_s", "reference_per_s"):
            assert np.isfinite(r[key]) and r[key] > 0
        assert r["limit_per_s"] >= r["best_raw_per_s"] >= r["raw_per_s"]
        assert r["limit_setting"] in {"bf16 cudnn-heuristic", "fp32 cudnn-heuristic"}
        for other in ("ideal", "raw", "best_raw", "limit", "reference", "reference_default"):
            assert r[f"engine_vs_{other}"] == pytest.approx(r["engine_per_s"] / r[f"{other}_per_s"])
        # PyTorch's default arithmetic on a CPU is fp32: the reference loop measured there
        assert r["reference_default_setting"] == "fp32 cudnn-heuristic"
    for a in out["api"]:
        assert a["inputs"] == 1 and a["n"] == 200 and a["batch_size"] == 64
        assert a["api_speedup"] == pytest.approx(a["reference_s_per_input"] / a["api_s_per_input"])
        assert a["decisions_checked"] == 200 and 0 <= a["decisions_differ_from_fp32"] <= 200
        assert a["api_speedup_vs_default"] == pytest.approx(
            a["reference_default_s_per_input"] / a["api_s_per_input"])  # fmt: skip
        assert a["sequential_s_per_input"] is None  # fixed sampling only
    assert [a["model"] for a in out["api"]] == ["mlp"]


def test_bench_api_with_sequential_sampling_on_the_cpu(capsys, tmp_path, monkeypatch):
    """Default precision (auto: fp32 on a CPU, where the reference in PyTorch's default
    arithmetic is the reference itself); with --sampling sequential api.certify is timed
    sequentially too, and each of api, sequential api and reference says how many inputs
    it certifies at each grid radius."""
    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path))
    argv = ["bench", "--models", "mlp", "--device", "cpu", "--n", "2000", "--inputs", "2",
            "--seconds", "0.05", "--batch-size", "256", "--api", "--sampling", "sequential",
            "--json"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    [row], [api] = out["engine"], out["api"]
    assert row["precision"] == "fp32" and row["reference_default_per_s"] == row["reference_per_s"]
    assert api["reference_default_s_per_input"] == api["reference_s_per_input"]
    assert api["grid"] == [0.0, 0.25, 0.5, 0.75, 1.0]
    for key in ("api_on_grid", "reference_on_grid", "sequential_on_grid"):
        counts = api[key]
        assert len(counts) == 5 and all(0 <= c <= 2 for c in counts)
        assert counts == sorted(counts, reverse=True)  # certified at r: also at every r' < r
    assert 100 <= api["sequential_samples"] <= 2000 and api["sequential_s_per_input"] > 0


def test_the_limit_is_taken_over_the_settings_a_device_offers():
    from harness.cli.throughput import Setting, limit_settings

    own = Setting("bf16", True, "heuristic")
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert limit_settings(own, "setting", cuda) == [own]
    assert limit_settings(own, "precision", cuda) == [
        own, Setting("bf16", True, "benchmark"), Setting("bf16", False, "heuristic"),
        Setting("bf16", False, "benchmark"),
    ]  # fmt: skip
    every = limit_settings(own, "all", cuda)
    assert every[0] == own and len(every) == len(set(every)) == 3 * 2 * 2
    assert {s.precision for s in every} == {"bf16", "fp32", "tf32"}
    on_cpu = limit_settings(own, "all", cpu)  # no TF32 and no cuDNN on a CPU
    assert {(s.precision, s.cudnn) for s in on_cpu} == {("bf16", "heuristic"),
                                                        ("fp32", "heuristic")}  # fmt: skip
    assert len(on_cpu) == 4
    dense = limit_settings(own, "all", cuda, convolutional=False)  # no layout, no cuDNN
    assert [(s.precision, s.channels_last, s.cudnn) for s in dense] == [
        ("bf16", True, "heuristic"), ("fp32", True, "heuristic"), ("tf32", True, "heuristic")
    ]  # fmt: skip


def test_the_batch_sweep_stops_where_the_rate_stops_growing(monkeypatch):
    """A model whose pass costs 4 ms up to 512 rows and grows linearly beyond (on a
    simulated clock): the rate doubles up to 512, then stays; the sweep stops two
    doublings after it, and stops at once where one pass takes over a second."""
    import types

    from harness.cli import throughput

    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(throughput, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))

    class Fixed(torch.nn.Module):
        def __init__(self, seconds):
            super().__init__()
            self.seconds = seconds

        def forward(self, x):
            clock.now += self.seconds * max(1, len(x) / 512)
            return torch.zeros(len(x), 2)

    rates = throughput.batch_sweep(Fixed(0.004), (3,), torch.device("cpu"), 64, 1 << 16, 0.02)
    assert list(rates) == [64, 128, 256, 512, 1024, 2048]
    assert rates[512] == pytest.approx(8 * rates[64]) and rates[2048] == pytest.approx(rates[512])
    slow = throughput.batch_sweep(Fixed(2.0), (3,), torch.device("cpu"), 64, 1 << 16, 0.02)
    assert list(slow) == [64]


def test_bench_table(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path))
    argv = ["bench", "--models", "cnn", "--device", "cpu", "--n", "100", "--inputs", "1",
            "--seconds", "0.02", "--batch-size", "32"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "engine/limit" in out and "cnn" in out and "n0 = 100, n = 100" in out


def test_bench_diagonal_times_a_diagonal_scale_against_one_sigma(capsys, tmp_path, monkeypatch):
    """--diagonal certifies the same inputs at the scale σ … 2σ and reports its wall time
    against one σ per input, in the JSON and under the table."""
    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path))
    argv = ["bench", "--models", "mlp", "--device", "cpu", "--n", "200", "--inputs", "2",
            "--seconds", "0.02", "--batch-size", "64", "--diagonal"]  # fmt: skip
    assert main([*argv, "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["engine"]
    assert np.isfinite(row["diagonal_vs_scalar_time"]) and row["diagonal_vs_scalar_time"] > 0
    assert main(argv) == 0
    assert "mlp: at a diagonal scale (σ … 2σ) in " in capsys.readouterr().out


def test_the_bench_s_diagonal_claims_are_cohen_s_ball_at_the_smallest_axis():
    """At the bench's diagonal scale (σ evenly to 2σ) the harness draws x + σ_i·ε_i and the
    bench's certifier claims σ·Φ⁻¹(p_A_lower), p_A_lower the one-sided Clopper–Pearson bound
    of the drawn counts (SciPy's beta quantile)."""
    from scipy.stats import beta

    from harness.certification.certify import certify_drawn
    from harness.cli.bench_variants import cohen_certifier, diagonal_scale
    from harness.engine.sampling import SamplingEngine
    from harness.foundation.protocol import CertificationProtocol

    scale = diagonal_scale(0.25, 3, 4)
    assert (
        scale.shape == (3, 4) and np.allclose(scale[:, 0], 0.25) and np.allclose(scale[:, -1], 0.5)
    )
    model = torch.nn.Linear(4, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 0, 0, 0], [-1.0, 0, 0, 0]]))
        model.bias.zero_()
    x = torch.tensor([[0.3, 0, 0, 0], [0.6, 0, 0, 0], [-0.4, 0, 0, 0]])
    engine = SamplingEngine(model, 2, torch.device("cpu"), 256, seed=3)
    protocol = CertificationProtocol(n0=100, n=2000, alpha=0.001, batch_size=256)
    for c in certify_drawn(engine, protocol, cohen_certifier(), x, [0, 1, 2], scale):
        n_a = c.counts_estimation[c.prediction]
        p_lower = beta.ppf(0.001, n_a, 2000 - n_a + 1)
        assert not c.abstained and c.sigma == pytest.approx(0.25)
        assert c.radius == pytest.approx(0.25 * norm.ppf(p_lower), rel=1e-9)
        assert c.prediction == (0 if x[c.input_id, 0] > 0 else 1)


def test_reference_certify_gives_cohens_certificate_of_a_linear_classifier(linear_model):
    """f(x) = [x_0 > 0], σ = 0.5, x_0 = 0.5: p_A = Φ(1); the radius is σ·Φ⁻¹(p_A_lower),
    a little below x_0 = 0.5 (the exact smoothed radius)."""

    w = torch.zeros(10)
    w[0] = 1.0
    model = linear_model(w, 0.0)
    x = torch.zeros(2, 10)
    x[:, 0] = torch.tensor([0.5, -0.01])
    torch.manual_seed(0)
    (c0, r0), (c1, r1) = reference_certify(model, x, 0.5, 100, 4000, 0.001, 1000, 2)
    assert c0 == 1 and 0.5 * norm.ppf(norm.cdf(1.0) - 0.03) < r0 < 0.5
    assert (c1, r1) == (-1, 0.0)  # p_A ~ 0.51: abstain


def test_unknown_and_unregistered_bench_models_are_clear_errors(monkeypatch, capsys):
    assert main(["bench", "--models", "vgg", "--device", "cpu"]) != 0
    assert "unknown bench model(s) ['vgg']; choose from mlp, cnn, resnet110" in (
        capsys.readouterr().err
    )
    monkeypatch.setitem(bench.BENCH_MODELS, "resnet-x", ("no-such-arch", {}, (3, 32, 32)))
    with (
        PluginManager() as manager,
        pytest.raises(IdrsError, match="needs the registered architecture 'no-such-arch'"),
    ):
        bench._build(manager.registry, "resnet-x")
