"""``idrs-bench bench``: the four rates, their ratios, the reference loop, the errors."""

import json

import numpy as np
import pytest
import torch
from scipy.stats import norm

from harness.cli import bench
from harness.cli.main import main
from harness.foundation.errors import IdrsError

KEYS = {"model", "device", "batch_size", "raw_per_s", "ideal_per_s", "engine_per_s",
        "reference_per_s", "engine_vs_ideal", "engine_vs_raw", "engine_vs_reference"}  # fmt: skip


def test_bench_json_for_tiny_mlp_and_cnn(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path))
    argv = ["bench", "--models", "mlp,cnn", "--device", "cpu", "--n", "200", "--inputs", "1",
            "--seconds", "0.05", "--batch-size", "64", "--json"]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["model"] for r in rows] == ["mlp", "cnn"]
    for r in rows:
        assert set(r) >= KEYS
        assert r["device"] == "cpu" and r["batch_size"] == 64 and r["n"] == 200
        for key in ("raw_per_s", "ideal_per_s", "engine_per_s", "reference_per_s"):
            assert np.isfinite(r[key]) and r[key] > 0
        assert r["engine_vs_ideal"] == pytest.approx(r["engine_per_s"] / r["ideal_per_s"])
        assert r["engine_vs_raw"] == pytest.approx(r["engine_per_s"] / r["raw_per_s"])
        assert r["engine_vs_reference"] == pytest.approx(r["engine_per_s"] / r["reference_per_s"])


def test_bench_table(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path))
    argv = ["bench", "--models", "mlp", "--device", "cpu", "--n", "100", "--inputs", "1",
            "--seconds", "0.02", "--batch-size", "32"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "engine/ideal" in out and "mlp" in out and "n0 = 100, n = 100" in out


def test_reference_certify_gives_cohens_certificate_of_a_linear_classifier(linear_model):
    """f(x) = [x_0 > 0], σ = 0.5, x_0 = 0.5: p_A = Φ(1); the radius is σ·Φ⁻¹(p_A_lower),
    a little below x_0 = 0.5 (the exact smoothed radius)."""

    w = torch.zeros(10)
    w[0] = 1.0
    model = linear_model(w, 0.0)
    x = torch.zeros(2, 10)
    x[:, 0] = torch.tensor([0.5, -0.01])
    torch.manual_seed(0)
    (c0, r0), (c1, r1) = bench.reference_certify(model, x, 0.5, 100, 4000, 0.001, 1000)
    assert c0 == 1 and 0.5 * norm.ppf(norm.cdf(1.0) - 0.03) < r0 < 0.5
    assert (c1, r1) == (-1, 0.0)  # p_A ~ 0.51: abstain


def test_unknown_and_unregistered_bench_models_are_clear_errors(monkeypatch, capsys):
    assert main(["bench", "--models", "vgg", "--device", "cpu"]) != 0
    assert "unknown bench model(s) ['vgg']; choose from mlp, cnn, resnet110" in (
        capsys.readouterr().err
    )
    monkeypatch.setitem(bench.BENCH_MODELS, "resnet-x", ("no-such-arch", {}, (3, 32, 32)))
    with pytest.raises(IdrsError, match="needs the registered architecture 'no-such-arch'"):
        bench._build(bench._registry(), "resnet-x")
