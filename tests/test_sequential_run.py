"""A sequential run end to end: refusals recorded, certificates checked (S0 re-derives the
looks, S1 holds the rule's bound to α exactly, the replay re-draws every look), the board
reports samples, and an invalid rule (the fixture ``naive_sequential_rule``) is caught."""

from dataclasses import replace

import pytest

from harness.audit.audit import BUDGETS
from harness.audit.auditor import run_checks
from harness.foundation.progress import Progress
from harness.running.benchmark import parse_benchmark
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark
from harness.store.storedrun import load_runs

TINY = replace(BUDGETS["small"], name="tiny", coverage_trials=16, pairs=2, ascent_steps=2,
               audited_inputs=4, attack_steps=2, attack_samples=16, orders=2, replay_inputs=4)  # fmt: skip
ENTROPY = 0x47_5E9
"""The audits' entropy: fixed, so that the verdicts asserted here are the same every time
(with fresh entropy a sound row is flagged 1 time in 1,000, as the checks promise)."""


def _run(tmp_path, manager, methods):
    raw = {"name": "ball-seq", "seed": 3, "radii": [0.0, 0.25, 0.5],
           "dataset": {"name": "ball-2", "test_count": 12},
           "model": {"architecture": "ball-N", "trainer": "none"},
           "certification": {"n0": 32, "n": 3000, "alpha": 0.01, "batch_size": 1024,
                             "sampling": "sequential"},
           "methods": methods}  # fmt: skip
    db = tmp_path / "run.sqlite"
    run_id = run_benchmark(parse_benchmark(raw), RunOptions(db=db), Progress(enabled=False),
                           manager)  # fmt: skip
    results = run_checks(db, run_id, RunOptions(db=db), Progress(enabled=False), manager,
                         budget=TINY, entropy=ENTROPY, attack=False)  # fmt: skip
    return load_runs(db, [run_id])[0], results, db


@pytest.mark.slow
def test_a_sequential_run_is_refused_where_unsupported_checked_and_reported(tmp_path, manager):
    from harness.reports.leaderboard.board import build_board
    from harness.reports.leaderboard.markdown import render_markdown

    lipschitz = {"train_examples": 64, "train_steps": 2, "sigma_min": 0.3}
    run, results, db = _run(tmp_path, manager, [
        {"name": "cohen", "settings": [{"sigma": 0.25}]},
        {"name": "lipschitz-sigma-net", "settings": [lipschitz]},
    ])  # fmt: skip
    [failure] = run.failures
    assert "method 'lipschitz-sigma-net' certifies soft smoothing" in failure["error"]
    checks = {r.check: r for r in results[("cohen", "sigma=0.25")]}
    for name in ("evidence", "coverage", "replay"):
        assert checks[name].verdict == "sound", (name, checks[name].summary)
    assert checks["coverage"].evidence["sequential"]["rules"][0]["ratio_to_alpha"] <= 1
    assert "re-drawn bit for bit" in checks["replay"].summary
    [row] = run.rows()
    samples = [c.draws["base"]["n"] for c in row.certificates]
    assert min(samples) < 3000 and all(len(c.draws["base"]["looks"]) >= 1 for c in row.certificates)
    text = render_markdown(build_board([run]), "b")
    assert "| samples | max samples |" in text and "the ACR falls by design" in text
    from rich.console import Console

    from harness.cli.results_table import samples_table

    console = Console(width=200, record=True)
    console.print(samples_table(db, run.run_id))
    line = next(x for x in console.export_text().splitlines() if "cohen" in x)
    assert f"{sum(samples):,}" in line and "x fewer" in line


@pytest.mark.slow
@pytest.mark.usefixtures("naive_sequential_rule")
def test_a_plain_clopper_pearson_bound_at_every_look_is_caught(tmp_path, manager):
    _, results, _ = _run(tmp_path, manager, [{"name": "cohen", "settings": [{"sigma": 0.25}]}])
    checks = {r.check: r for r in results[("cohen", "sigma=0.25")]}
    assert checks["evidence"].verdict == "sound"  # consistent with itself ...
    coverage = checks["coverage"]
    assert coverage.verdict == "violated"  # ... but not anytime-valid
    assert coverage.evidence["sequential"]["rules"][0]["ratio_to_alpha"] > 1.5
