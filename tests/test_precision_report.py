"""harness.reports.precision_report: what bf16 changes against fp32 on one benchmark."""

import numpy as np
import torch

from harness.engine.precision import PrecisionModel
from harness.foundation.progress import Progress
from harness.reports.precision_report import JointDecisions, format_report, precision_report
from harness.running.preparation import RunOptions
from harness.store.store import ResultStore

METHODS = {"cohen": [{"sigma": 0.5}, {"sigma": 1.0}],
           "alfarra-ds": [{"sigma": 0.5, "steps": 3, "samples": 4, "beta": 0.05}]}  # fmt: skip


def test_joint_decisions_name_both_argmaxes():
    torch.manual_seed(0)
    first, second = torch.nn.Linear(5, 3), torch.nn.Linear(5, 3)
    x = torch.randn(50, 5)
    with torch.no_grad():
        out = JointDecisions(first, second, 3)(x)
        expected = first(x).argmax(1) * 3 + second(x).argmax(1)
    assert out.shape == (50, 9) and torch.equal(out.argmax(1), expected)


def test_report_counts_what_differs_between_the_two_runs(tmp_path, monkeypatch, small_benchmark):
    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path / "cache"))
    spec = tmp_path / "tiny.toml"
    spec.write_text(small_benchmark(METHODS, name="tiny-precision", seed=2, dataset="cone-10",
                                    n=400, alpha=None))  # fmt: skip
    options = RunOptions(db=tmp_path / "r.sqlite")
    report = precision_report(str(spec), [], "bf16", options, Progress(enabled=False))
    store = ResultStore(options.db)
    try:
        runs = {p: {(c["setting"], c["input_id"]): c for c in store.certificates(r)}
                for p, r in report["runs"].items()}  # fmt: skip
        assert store.run(report["runs"]["bf16"])["config"]["protocol"]["precision"] == "bf16"
    finally:
        store.close()
    assert set(report["settings"]) == {"cohen sigma=0.5", "cohen sigma=1.0",
                                       "alfarra-ds beta=0.05,samples=4,sigma=0.5,steps=3"}  # fmt: skip
    for key, row in report["settings"].items():
        setting = key.split(" ", 1)[1]
        pairs = [(a, runs["bf16"][k]) for k, a in runs["fp32"].items() if k[0] == setting]
        assert row["certificates"] == len(pairs) == 8
        assert row["counts_reproduced"] is True  # the fp32 half are the certificates' samples
        assert row["samples"] == 8 * 400
        assert row["predictions"] == sum(a["prediction"] != b["prediction"] for a, b in pairs)
        assert row["sigmas"] == sum(a["sigma"] != b["sigma"] for a, b in pairs)
        if setting.startswith("sigma="):  # constant σ: both runs drew the same samples
            # a class that lost k samples lost them to decisions that changed
            lost = sum(np.maximum(np.subtract(a["counts_estimation"], b["counts_estimation"]),
                                  0).sum() for a, b in pairs)  # fmt: skip
            assert row["decisions"] >= lost and row["sigmas"] == 0
    assert report["settings"]["alfarra-ds beta=0.05,samples=4,sigma=0.5,steps=3"]["sigmas"] > 0
    # clean decisions, recounted here on the whole test split
    from harness.running.benchmark import load_benchmark
    from harness.running.preparation import prepare

    prepared = prepare(load_benchmark(spec), options, Progress(enabled=False))
    context = prepared.context
    x = prepared.dataset.test_x.to(context.device)
    bf16 = PrecisionModel(context.model, "bf16", False)
    with torch.no_grad():
        differ = int((context.model(x).argmax(1) != bf16(x).argmax(1)).sum())
    assert report["clean_inputs"] == len(x) and report["clean_decisions"] == differ
    text = format_report(report)
    assert "| **all** | 24 |" in text and "fp32 vs bf16 on tiny-precision" in text
