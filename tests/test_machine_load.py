"""The machine's load recorded beside every certificate's seconds, and shown on boards."""

import json
import os
import sqlite3
import statistics

import pytest

from harness.audit.evidence import certificates_digest
from harness.cli.main import main
from harness.foundation.threads import load_per_core
from harness.reports.leaderboard.source import read_export


def test_load_per_core_is_the_load_average_over_the_usable_processors(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0, 2.0, 1.0))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert load_per_core() == 0.75

    def missing():
        raise OSError("no load average")

    monkeypatch.setattr(os, "getloadavg", missing)
    assert load_per_core() is None


def test_a_run_records_the_load_and_its_board_shows_it(tmp_path, capsys, small_benchmark):
    spec = tmp_path / "tiny.toml"
    spec.write_text(small_benchmark({"cohen": [{"sigma": 0.5}]}, test_count=6, n=200))
    db = tmp_path / "r.sqlite"
    assert main(["run", str(spec), "--db", str(db), "--quiet", "--no-check"]) == 0
    with sqlite3.connect(db) as con:
        loads = [row[0] for row in con.execute("SELECT load FROM certificates")]
    assert len(loads) == 6 and all(isinstance(x, float) and x >= 0 for x in loads)
    capsys.readouterr()
    board = tmp_path / "board.md"
    assert main(["leaderboard", "--db", str(db), "--out", str(board), "--no-plots",
                 "--allow-incomplete"]) == 0  # fmt: skip
    (row,) = json.loads(board.with_suffix(".json").read_text())["rows"]
    assert row["load_per_core"] == pytest.approx(statistics.median(loads))
    assert "load/core" in board.read_text()
    # the export keeps each certificate's load, so a board rendered from it shows the same
    (run,) = read_export(board.with_suffix(".run.json"))
    assert sorted(c.load for c in run.certificates) == sorted(loads)


def test_the_audited_digest_covers_a_recorded_load_and_keeps_older_digests():
    row = {"input_id": 0, "label": 1, "prediction": 1, "predict": 1, "radius": 0.5,
           "p_lower": 0.9, "sigma": 0.25, "alpha": 0.001, "seconds": 0.1, "evidence": {},
           "draws": None}  # fmt: skip
    older = certificates_digest([row])
    assert certificates_digest([row | {"load": None}]) == older
    assert certificates_digest([row | {"load": 1.5}]) != certificates_digest([row | {"load": 0.5}])
