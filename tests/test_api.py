"""The Python API: certify() uses Cohen's method unless told otherwise and matches the
store's evidence; run() and check() (the docs' examples run in tests/test_docs.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import beta, norm

from harness.api import CERTIFICATE_COLUMNS, certify, run
from harness.foundation.errors import IdrsError, ParameterError
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


SEQUENTIAL = {
    "name": "api-sequential", "seed": 3, "device": "cpu", "radii": [0.0, 0.25, 0.5],
    "dataset": {"name": "ball-2", "test_count": 8},
    "model": {"architecture": "ball-N", "trainer": "none"},
    "certification": {"n0": 32, "n": 3000, "alpha": 0.01, "batch_size": 1024,
                      "sampling": "sequential", "n_max": 2500},
    "methods": [{"name": "cohen", "settings": [{"sigma": 0.25}]}],
}  # fmt: skip


def test_sequential_certify_gives_a_benchmark_runs_certificates(tmp_path, manager):
    """api.certify(..., sampling="sequential", n_max, radii) on a benchmark's model and test
    points (ids 0..7, its seed) gives the certificates the benchmark file's run stored:
    the same looks, counts, bounds and radii."""
    from harness.foundation.progress import Progress
    from harness.running.benchmark import parse_benchmark
    from harness.running.preparation import RunOptions, prepare
    from harness.running.runner import run_benchmark
    from harness.store.store import ResultStore

    db = tmp_path / "r.sqlite"
    options = RunOptions(db=db)
    run_id = run_benchmark(parse_benchmark(SEQUENTIAL), options, Progress(enabled=False), manager)
    store = ResultStore(db)
    try:
        stored = sorted(store.certificates(run_id), key=lambda c: c["input_id"])
    finally:
        store.close()
    prepared = prepare(parse_benchmark(SEQUENTIAL), options, Progress(enabled=False), manager)
    data = prepared.dataset
    table = certify(prepared.context.model, data.test_x[:8], data.test_y[:8], method="cohen",
                    sigma=0.25, n0=32, n=3000, alpha=0.01, batch_size=1024, seed=3,
                    device="cpu", sampling="sequential", n_max=2500, radii=[0.0, 0.25, 0.5])  # fmt: skip
    assert table.attrs["precision"] == "fp32"  # auto, on a CPU
    assert [c["input_id"] for c in stored] == table["input_id"].tolist() == list(range(8))
    for row, cert in zip(table.to_dict("records"), stored, strict=True):
        for key in ("prediction", "radius", "p_lower", "sigma", "counts_selection",
                    "counts_estimation"):  # fmt: skip
            assert row[key] == cert[key], key
        assert row["draws"]["base"]["looks"] == cert["draws"]["base"]["looks"]
    drawn = [d["base"]["n"] for d in table["draws"]]
    assert min(drawn) < 2500 and all(d["base"]["rule"]["n_max"] == 2500 for d in table["draws"])


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"sampling": "sequentail"}, ParameterError, "unknown sampling 'sequentail'; choose"),
        ({"n_max": 5000}, ParameterError, 'n_max = 5000 is the cap of sampling = "sequential"'),
        ({"sampling": "sequential", "n_max": 5}, ParameterError,
         r"n_max = 5 cannot certify the grid's first radius 0.*set n_max >= 10"),
        ({"sampling": "sequential", "radii": [0.5, 0.25]}, ParameterError,
         r"radii = \[0.5, 0.25\] is not sorted"),
        ({"sampling": "sequential", "method": "lipschitz-sigma-net", "train_examples": 4,
          "train_steps": 1, "train_inputs": torch.rand(4, 4), "train_labels": torch.zeros(4)},
         IdrsError,
         "method 'lipschitz-sigma-net' certifies soft smoothing.*sampling = \"fixed\""),
        ({"precision": "fp64"}, ParameterError, "unknown precision 'fp64'; choose auto or one of"),
    ],
)  # fmt: skip
def test_invalid_sampling_or_precision_in_certify_is_a_clear_error(options, error, message):
    options = {"method": "cohen", "n": 100, "n0": 10, "device": "cpu", **options}
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    with pytest.raises(error, match=message):
        certify(model, torch.randn(2, 4), torch.zeros(2), **options)
