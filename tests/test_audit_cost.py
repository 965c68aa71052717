"""What the audit costs (harness.audit.cost) and how it is spent: each check's seconds, σ
queries and samples stored and shown; no check asks σ twice at a point; rows audited side
by side (harness.audit.workers) give the audit one process gives."""

import hashlib
import json
from collections import Counter
from dataclasses import replace

import pytest

from harness.audit import cost as cost_module
from harness.audit import workers as workers_module
from harness.audit.audit import Budget, parse_entropy
from harness.audit.auditor import run_checks
from harness.audit.session import audits
from harness.cli.main import main
from harness.foundation.progress import Progress
from harness.running.benchmark import parse_benchmark
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark
from harness.store.store import ResultStore
from harness.store.storedrun import read_run

TINY = Budget("tiny", coverage_trials=24, coverage_n=400, pairs=4, ascent_steps=2,
              audited_inputs=6, attack_steps=2, attack_samples=16, orders=3)  # fmt: skip
ENTROPY = "00112233445566778899aabbccddeeff"
METHODS = [
    {"name": "cohen", "settings": [{"sigma": 0.25}, {"sigma": 0.5}]},
    {"name": "sukenik", "settings": [{"sigma": 0.25}]},  # σ differentiable in x
    {"name": "chen-fgss", "settings": [{"sigma": 0.25, "num_samples": 64}]},  # σ by a search
]


@pytest.fixture(scope="module")
def ball_run(tmp_path_factory):
    """A finished ball-2 run (20 inputs, n = 400) of a constant, a semi-elastic and a
    searched σ: (db, run id)."""
    from harness.plugin.manager import PluginManager

    raw = {
        "name": "cost", "seed": 5, "dataset": {"name": "ball-2", "test_count": 20},
        "model": {"architecture": "ball-N", "trainer": "none"},
        "certification": {"n0": 32, "n": 400, "alpha": 0.01, "batch_size": 4096},
        "methods": METHODS,
    }  # fmt: skip
    db = tmp_path_factory.mktemp("cost") / "ball.sqlite"
    manager = PluginManager(third_party=False)
    run_id = run_benchmark(parse_benchmark(raw), RunOptions(db=db), Progress(enabled=False),
                           manager)  # fmt: skip
    return db, run_id


def _audit(db, run_id, manager, workers, method=None):
    results = run_checks(db, run_id, RunOptions(db=db), Progress(enabled=False), manager,
                         method=method, budget=TINY, entropy=parse_entropy(ENTROPY),
                         workers=workers)  # fmt: skip
    return {key: {r.check: (str(r.verdict), r.summary, _untimed(r.evidence)) for r in rs}
            for key, rs in results.items()}  # fmt: skip


def _untimed(evidence: dict) -> str:
    return json.dumps({k: v for k, v in evidence.items() if k != "seconds"}, sort_keys=True,
                      default=str)  # fmt: skip


@pytest.mark.long
@pytest.mark.slow
def test_rows_side_by_side_are_audited_as_in_one_process_and_their_costs_shown(
    ball_run, manager, capsys
):  # fmt: skip
    db, run_id = ball_run
    alone = _audit(db, run_id, manager, workers=1)
    side_by_side = _audit(db, run_id, manager, workers=2)
    assert list(side_by_side) == list(alone)  # every row, in the spec's order
    assert side_by_side == alone  # verdicts, summaries and evidence
    store = ResultStore(db)
    try:
        rows = {(r.method, r.setting): r for r in read_run(store, run_id).rows()}
    finally:
        store.close()
    chen = dict(rows["chen-fgss", "num_samples=64,sigma=0.25"].audit_costs())
    assert set(chen) == set(alone["chen-fgss", "num_samples=64,sigma=0.25"])  # (no attack at TINY)
    # S1 queries the rebuilt σ at its trial points; S0 recomputes nothing
    assert chen["coverage"]["sigma_points"] >= 12 and chen["coverage"]["samples"] > 0
    assert chen["evidence"]["sigma_points"] == 0 and chen["evidence"]["samples"] == 0
    assert chen["replay"]["samples"] > 0  # drawn by the replay process, counted here
    cohen = rows["cohen", "sigma=0.25"]
    assert cohen.audit_seconds == pytest.approx(sum(c["seconds"] for _, c in cohen.audit_costs()))
    assert main(["results", "--db", str(db), run_id]) == 0
    out = capsys.readouterr().out
    line = next(li for li in out.splitlines() if li.strip().startswith("cohen sigma=0.25 ("))
    assert f"certification {cohen.certification_seconds:,.1f} s" in line
    assert f"audit {cohen.audit_seconds:,.1f} s" in line


@pytest.mark.slow
def test_a_row_audited_in_a_worker_shows_its_checks_and_its_attack_as_stages(ball_run, manager):
    """``--timings``' stages of a row audited side by side: its checks and its attack, as for
    a row audited here (the attack runs where the row's checks ran)."""
    db, run_id = ball_run
    progress = Progress(enabled=False)
    with_attack = replace(TINY, name="small")  # the small budget's attack, TINY's checks
    run_checks(db, run_id, RunOptions(db=db), progress, manager, method="cohen",
               budget=with_attack, entropy=parse_entropy(ENTROPY), workers=2)  # fmt: skip
    stages = [name for name, _ in progress.timings]
    for setting in ("sigma=0.25", "sigma=0.5"):
        assert stages.count(f"checks cohen {setting}") == 1
        assert stages.count(f"attack cohen {setting}") == 1


def test_a_worker_that_fails_leaves_its_rows_to_this_process(ball_run, manager, monkeypatch):
    db, run_id = ball_run
    broken = workers_module._job

    def job(*args):  # a worker that cannot open the run ends without auditing a row
        return broken(*args) | {"run_id": "no-such-run"}

    monkeypatch.setattr(workers_module, "_job", job)
    warnings = []
    progress = Progress(enabled=False)
    progress.warn = warnings.append
    results = run_checks(db, run_id, RunOptions(db=db), progress, manager, method="cohen",
                         budget=TINY, entropy=parse_entropy(ENTROPY), workers=2)  # fmt: skip
    assert list(results) == [("cohen", "sigma=0.25"), ("cohen", "sigma=0.5")]
    assert all(len(rs) == 7 for rs in results.values())
    assert any("audit worker ended" in w for w in warnings)


@pytest.mark.slow
def test_no_check_asks_sigma_twice_at_a_point(ball_run, manager, monkeypatch):
    """Within one check, σ's value is asked at most once per point and provider (S1's
    rebuilt providers are others): asking again is only for σ's gradient there (a PGD
    iterate that did not move, for a σ with a gradient); the replay check asks each of its
    points twice by design (in a shuffled batch and alone). A query that raised answered
    nothing (S1's query of a round, when σ reads the exact model whose placement it
    withholds: σ is then asked trial by trial)."""
    db, run_id = ball_run
    asked: Counter = Counter()  # value queries per (provider, point) after the first query
    seen: set = set()
    counted = cost_module.CountingSigma.__call__

    def recording(self, x):
        sigma = counted(self, x)
        for row in x.detach().cpu().double():
            key = (id(self.uncounted), hashlib.sha256(row.numpy().tobytes()).hexdigest())
            asked[key] += key in seen and not x.requires_grad
            seen.add(key)
        return sigma

    monkeypatch.setattr(cost_module.CountingSigma, "__call__", recording)
    checks = [manager.registry.get("checks", n) for n in manager.registry.names("checks")]
    store = ResultStore(db)
    try:
        for audit in audits(store, run_id, RunOptions(db=db), Progress(enabled=False), manager,
                            budget=TINY, entropy=parse_entropy(ENTROPY)):  # fmt: skip
            for check in checks:
                asked.clear()
                seen.clear()
                check.run(audit)
                again = max(asked.values(), default=0)
                assert again <= (check.name == "replay"), (audit.method.name, check.name, again)
    finally:
        store.close()
