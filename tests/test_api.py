"""The Python API: certify() uses Cohen's method unless told otherwise and matches the
store's evidence; run() and check() (the docs' examples run in tests/test_docs.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import beta, norm

from harness.api import CERTIFICATE_COLUMNS, certify, run
from harness.foundation.errors import IdrsError
from harness.running.benchmark import BENCHMARKS_DIR


def test_certify_defaults_to_cohens_method():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    table = certify(model, torch.randn(3, 4), torch.zeros(3), n0=20, n=200, device="cpu")
    assert list(table.columns) == list(CERTIFICATE_COLUMNS)
    assert set(table["method"]) == {"cohen"} and set(table["setting"]) == {"sigma=0.25"}


def test_certify_evidence_matches_clopper_pearson_and_cohen_radius():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    table = certify(model, x, y, method="cohen", sigma=0.5, n0=50, n=1000, device="cpu")
    for row in table.itertuples():
        counts = np.array(row.counts_estimation)
        top = int(np.argmax(row.counts_selection))
        n_a = counts[top]
        lower = beta.ppf(0.001, n_a, counts.sum() - n_a + 1) if n_a > 0 else 0.0  # one-sided
        assert row.p_lower == pytest.approx(lower, rel=1e-6)
        if lower > 0.5:
            assert row.prediction == top and row.radius == pytest.approx(0.5 * norm.ppf(lower))
        else:
            assert row.prediction == -1 and row.radius == 0


def test_certify_errors_are_clear():
    model = torch.nn.Linear(4, 3)
    with pytest.raises(IdrsError, match="train_inputs"):
        certify(model, torch.randn(2, 4), torch.zeros(2), method="sukenik", n=100, device="cpu")
    with pytest.raises(IdrsError, match="unknown parameter"):
        certify(model, torch.randn(2, 4), torch.zeros(2), method="cohen", n=100, bogus=1)


def test_run_with_overrides(tmp_path, write_mnist):
    write_mnist(tmp_path / "data", train=20, test=40)
    out = run(BENCHMARKS_DIR / "mnist.toml", db=tmp_path / "r.sqlite", device="cpu",
              data_root=str(tmp_path / "data"), check=False, certification__n0=10,
              certification__n=100, certification__batch_size=100,
              model__trainer_params__epochs=1,
              methods=[{"name": "cohen", "settings": [{"sigma": 0.25}]}])  # fmt: skip
    assert len(out["run_id"]) == 64 and len(out["weights_digest"]) == 64
    assert out["summary"]["inputs"].tolist() == [2]
    assert sorted(out["certificates"]["input_id"]) == [0, 20]


def test_run_returns_the_verdicts_with_the_summary(tmp_path):
    spec = {
        "name": "api-verdicts",
        "dataset": {"name": "cone-2", "test_count": 4},
        "model": {"architecture": "mlp", "trainer": "gaussian-augmentation",
                  "architecture_params": {"width": 8}, "trainer_params": {"epochs": 1}},
        "certification": {"n0": 10, "n": 200, "alpha": 0.01, "batch_size": 256},
        "methods": [{"name": "cohen", "settings": [{"sigma": 0.5}]}],
    }  # fmt: skip
    out = run(spec, db=tmp_path / "r.sqlite", device="cpu")
    summary = out["summary"]
    assert summary[["method", "setting"]].values.tolist() == [["cohen", "sigma=0.5"]]
    verdict = summary["verdict"][0]
    assert out["verdicts"] == {("cohen", "sigma=0.5"): verdict}
    assert verdict in ("sound", "unjustified", "violated", "not-verified")  # it was checked
    assert "evidence" in summary["checks_applied"][0] and summary["flags"][0] == []
