"""An unpredictable audit: every random choice of the checks comes from entropy drawn at
audit time and recorded with the verdicts, so the same entropy re-runs an audit exactly
(``idrs-bench check --entropy``, ``harness.api.check``) and another one chooses other
inputs, trial points and pairs."""

import json
import sqlite3

import pytest

from harness.api import check
from harness.audit.audit import Budget, parse_entropy
from harness.audit.auditor import run_checks
from harness.cli.main import main
from harness.foundation.errors import IdrsError
from harness.foundation.progress import Progress
from harness.running.benchmark import parse_benchmark
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark

TINY = Budget("tiny", coverage_trials=24, coverage_n=400, pairs=4, ascent_steps=2,
              audited_inputs=6, attack_steps=2, attack_samples=16, orders=3)  # fmt: skip
ENTROPY = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def ball_run(tmp_path, manager):
    """A finished ball-2 run of cohen at two σ (30 inputs, n = 400): (db, run id)."""
    raw = {
        "name": "entropy", "seed": 3, "dataset": {"name": "ball-2", "test_count": 30},
        "model": {"architecture": "ball-N", "trainer": "none"},
        "certification": {"n0": 32, "n": 400, "alpha": 0.01, "batch_size": 4096},
        "methods": [{"name": "cohen", "settings": [{"sigma": 0.25}, {"sigma": 0.5}]}],
    }  # fmt: skip
    db = tmp_path / "ball.sqlite"
    run_id = run_benchmark(
        parse_benchmark(raw), RunOptions(db=db), Progress(enabled=False), manager
    )
    return db, run_id


def _audit(db, run_id, manager, entropy):
    results = run_checks(db, run_id, RunOptions(db=db), Progress(enabled=False), manager,
                         budget=TINY, entropy=parse_entropy(entropy))  # fmt: skip
    return {key: {r.check: (str(r.verdict), r.summary, _choices(r.evidence)) for r in rs}
            for key, rs in results.items()}  # fmt: skip


def _choices(evidence: dict) -> str:
    """The evidence without its wall-clock time (the replay records how long it took)."""
    untimed = {key: value for key, value in evidence.items() if key != "seconds"}
    return json.dumps(untimed, sort_keys=True, default=str)


def test_the_same_entropy_gives_the_same_audit_and_another_other_choices(ball_run, manager):
    db, run_id = ball_run
    first = _audit(db, run_id, manager, ENTROPY)
    again = _audit(db, run_id, manager, ENTROPY)
    assert first == again  # verdicts, summaries and evidence, bit for bit
    for checks in first.values():
        for _, _, evidence in checks.values():
            assert json.loads(evidence)["entropy"] == ENTROPY
    other = _audit(db, run_id, manager, "f" * 32)
    cohen, cohen_other = first["cohen", "sigma=0.25"], other["cohen", "sigma=0.25"]

    def chosen(checks, name, *path):
        value = json.loads(checks[name][2])
        for key in path:
            value = value[key]
        return value

    # S1 trial points, S2/S3/S4 audited inputs: random subsets, never the first k
    picks = [("coverage", "ball-2", "inputs"), ("sigma-regularity", "audited"),
             ("counterexamples", "attack", "inputs")]  # fmt: skip
    for where in picks:
        a, b = chosen(cohen, *where), chosen(cohen_other, *where)
        assert a != b, where
        assert len(a) == len(b), where
    audited = chosen(cohen, "counterexamples", "attack", "inputs")
    assert audited != list(range(len(audited)))
    assert chosen(cohen, "coverage", "calibration", "bias") != chosen(
        cohen_other, "coverage", "calibration", "bias"
    )


def test_fresh_audits_draw_fresh_entropy(ball_run, manager):
    db, run_id = ball_run
    a = _audit(db, run_id, manager, None)
    b = _audit(db, run_id, manager, None)
    entropy = {json.loads(ev)["entropy"] for audit in (a, b) for checks in audit.values()
               for _, _, ev in checks.values()}  # fmt: skip
    assert len(entropy) == 4  # one per row and audit, shared by the row's checks


@pytest.mark.slow
def test_check_entropy_reruns_an_audit_from_the_command_line_and_the_api(
    ball_run, manager, capsys
):  # fmt: skip
    db, run_id = ball_run
    code = main(["check", run_id[:8], "--db", str(db), "--method", "cohen", "--entropy",
                 ENTROPY, "--json", "--quiet"])  # fmt: skip
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert {row["setting"] for row in rows} == {"sigma=0.25", "sigma=0.5"}
    table = check(db, run_id, method="cohen", budget="small", entropy=int(ENTROPY, 16))
    for row in rows:
        mine = table[table["setting"] == row["setting"]]
        assert set(mine["check"]) == {c["check"] for c in row["checks"]}
        for c in row["checks"]:
            assert c["evidence"]["entropy"] == ENTROPY
            got = mine[mine["check"] == c["check"]].iloc[0]
            assert (got["verdict"], got["summary"]) == (c["verdict"], c["summary"])


@pytest.mark.parametrize("bad", ["xyz", "", "1" * 33, "-5"])
def test_a_bad_entropy_is_a_clear_error(bad):
    with pytest.raises(IdrsError, match="hexadecimal digits"):
        parse_entropy(bad)
    assert parse_entropy("0x" + ENTROPY) == int(ENTROPY, 16)


def test_run_entropy_is_the_checks_and_refused_without_them(tmp_path, capsys, spec_template):
    """``run --entropy HEX`` audits every row from it (a reproducible audit); a bad value,
    or one given with ``--no-check``, is a one-line error before any work."""
    spec = tmp_path / "spec.toml"
    spec.write_text(spec_template.format(dataset="cone-2", arch="mlp", n0=10, n=50, alpha=0.01,
                                         method="cohen", sigma=0.5))  # fmt: skip
    db = tmp_path / "r.sqlite"
    assert main(["run", str(spec), "--db", str(db), "--no-check", "--entropy", ENTROPY]) == 2
    assert "leave out --no-check, or --entropy" in capsys.readouterr().err
    assert main(["run", str(spec), "--db", str(db), "--quiet", "--entropy", "xyz"]) == 2
    assert "hexadecimal digits" in capsys.readouterr().err and not db.exists()
    assert main(["run", str(spec), "--db", str(db), "--quiet", "--entropy", ENTROPY]) == 0
    with sqlite3.connect(db) as con:
        stored = {name: (verdict, json.loads(evidence)["entropy"]) for name, verdict, evidence
                  in con.execute("SELECT check_name, verdict, evidence FROM checks")}  # fmt: skip
    assert stored and {e for _, e in stored.values()} == {ENTROPY}
    again = check(db, method="cohen", budget="small", entropy=ENTROPY)  # the same audit
    assert {c: v for c, v in zip(again["check"], again["verdict"], strict=True)} == {
        name: verdict for name, (verdict, _) in stored.items()
    }
