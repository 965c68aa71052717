"""``idrs-bench compare``: per-row differences of two runs and protocol warnings."""

from __future__ import annotations

import argparse
import json

import pytest

from harness.reports.leaderboard.compare import (
    add_compare_parser,
    compare_runs,
    protocol_differences,
)
from harness.reports.leaderboard.source import export_runs
from harness.store.storedrun import load_runs

OTHER = "7" * 64


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_compare_parser(parser.add_subparsers())
    args = parser.parse_args(["compare", *argv])
    return args.handler(args)


def _metric(row, key):
    return next(m for m in row.metrics if m["key"] == key)


def test_same_protocol_differences_per_row(tmp_path, monkeypatch, make_run, golden_run):
    db = tmp_path / "r.sqlite"
    make_run(db, monkeypatch)
    rows = dict(golden_run.rows)
    # B: cohen sigma=0.5 loses input 2's certificate (radius 1.5 -> abstain); chen is gone
    golden = golden_run.rows["cohen", "sigma=0.5"]
    rows["cohen", "sigma=0.5"] = [*golden[:2], (-1, 1, 0.0, 0.5, 0.25), golden[3]]
    del rows["chen-fgss", "sigma=0.25"]
    make_run(db, monkeypatch, run_id=OTHER, rows=rows, checks=[], device="cuda:0")
    a, b = load_runs(db, [golden_run.run_id, OTHER])
    comparison = compare_runs(a, b)
    assert comparison.warnings == []  # same spec and model; only the device differs
    assert comparison.notes == ["devices: cpu (A) vs cuda:0 (B)"]
    by_key = {(r.method, r.setting): r for r in comparison.rows}
    row = by_key["cohen", "sigma=0.5"]
    assert row.verdicts == ("sound", "not checked")
    acr = _metric(row, "acr")
    assert (acr["a"], acr["b"], acr["diff"]) == (0.75, 0.375, -0.375)  # 3/4 vs 1.5/4
    cert = _metric(row, "certified_accuracy@1")
    assert (cert["a"], cert["b"], cert["diff"]) == (0.5, 0.25, -0.25)
    abstain = _metric(row, "abstention_rate")
    assert (abstain["diff"], abstain["higher_is_better"]) == (0.25, False)
    seconds = _metric(row, "seconds_per_input")
    assert seconds["diff"] == pytest.approx((0.125 * 3 + 0.25) / 4 - 0.125)
    unchanged = _metric(by_key["cohen", "sigma=0.25"], "acr")
    assert unchanged["diff"] == 0.0
    gone = by_key["chen-fgss", "sigma=0.25"]
    assert gone.verdicts == ("violated", None)
    acr = _metric(gone, "acr")
    assert (acr["a"], acr["b"], acr["diff"]) == (2.0, None, None)


def test_protocol_differences_are_warned_about(tmp_path, monkeypatch, capsys, make_run, golden_run):
    db = tmp_path / "r.sqlite"
    make_run(db, monkeypatch)
    protocol = golden_run.config["protocol"] | {"n": 1000, "alpha": 0.01}
    config = golden_run.config | {"seed": 4, "protocol": protocol}
    make_run(db, monkeypatch, run_id=OTHER, config=config, recipe_hash="cd" * 32)
    a, b = load_runs(db, [golden_run.run_id, OTHER])
    (warning,) = compare_runs(a, b).warnings
    for field in ("n: 100 (A) vs 1000 (B)", "alpha: 0.001 (A) vs 0.01 (B)", "seed: 3 (A) vs 4 (B)",
                  f"recipe_hash: '{'ab' * 32}' (A) vs '{'cd' * 32}' (B)"):  # fmt: skip
        assert field in warning
    assert "n0" not in warning and "dataset" not in warning
    # on the command line: the warning goes to stderr, the table to stdout
    assert _cli([golden_run.run_id[:8], OTHER[:8], "--db", str(db)]) == 0
    out, err = capsys.readouterr()
    assert "warning:" in err and "protocols differ" in err
    assert "cohen" in out and "ACR" in out


def test_protocol_difference_of_datasets():
    a = {"dataset": "cone-2", "n0": 10}
    assert protocol_differences(a, a) == []
    assert protocol_differences(a, a | {"dataset": "cone-60"}) == [
        "dataset: 'cone-2' (A) vs 'cone-60' (B)"
    ]


def test_compare_a_run_export_with_a_database_run_as_json(
    tmp_path, monkeypatch, capsys, make_run, golden_run
):
    db = tmp_path / "r.sqlite"
    make_run(db, monkeypatch)
    export = tmp_path / "board.run.json"
    export.write_text(export_runs(load_runs(db)))
    other_db = tmp_path / "gpu.sqlite"
    make_run(other_db, monkeypatch, run_id=OTHER)
    assert _cli([str(export), OTHER[:6], "--db-b", str(other_db), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["run_a"], data["run_b"], data["warnings"]) == (golden_run.run_id, OTHER, [])
    # equal, or (the load, which these runs did not record) absent from both
    assert all(m["diff"] == 0 or m["a"] is m["b"] is None
               for row in data["rows"] for m in row["metrics"])  # fmt: skip
    assert len(data["rows"]) == len(golden_run.rows)
