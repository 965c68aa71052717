"""Fixtures: the fixed run behind the golden leaderboard, written into a results database.

A pytest fixture module (loaded through ``pytest_plugins`` in ``tests/conftest.py``). The
run is written straight into a fresh results database (no model, no sampling): four
inputs per (method, setting) with hand-chosen radii, so every number on the board can be
checked by hand (see :data:`GOLDEN_NOTES`). ``make_run(db, monkeypatch, ...)`` writes it
(or a variant: other rows, checks, config, ...); ``golden_run`` holds its constants.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.foundation.certificate import Certificate
from harness.store.store import ResultStore

RUN_ID = "0f1e2d3c4b5a" + "6" * 52
RECIPE_HASH = "ab" * 32
NOW = "2024-05-06T07:08:09+00:00"
VERSIONS = {"idrs-bench": "0.1.0", "numpy": "2.0.0", "python": "3.11.9", "scipy": "1.14.0",
            "torch": "2.4.0"}  # fmt: skip

CONFIG = {
    "name": "golden",
    "seed": 3,
    "device": "auto",
    "shard_size": 32,
    "dataset": {"name": "cone-2", "test_every": 5, "test_count": 4},
    "model": {"architecture": "mlp", "trainer": "gaussian-augmentation", "seed": 0,
              "architecture_params": {"width": 8}, "trainer_params": {"sigma": 0.25}},
    "protocol": {"n0": 10, "n": 100, "alpha": 0.001, "batch_size": 64},
    "methods": [{"name": "cohen", "settings": [{"sigma": 0.25}, {"sigma": 0.5}]}],
}  # fmt: skip

LABELS = [0, 0, 1, 1]
# (method, setting) -> per input (prediction, predict, radius, sigma, seconds)
ROWS = {
    ("cohen", "sigma=0.25"): [(0, 0, 0.75, 0.25, 0.5), (0, 0, 0.25, 0.25, 0.5),
                              (1, 1, 0.5, 0.25, 0.25), (-1, 0, 0.0, 0.25, 0.25)],
    ("cohen", "sigma=0.5"): [(0, 0, 1.0, 0.5, 0.125), (1, 1, 0.5, 0.5, 0.125),
                             (1, 1, 1.5, 0.5, 0.125), (1, 1, 0.5, 0.5, 0.125)],
    ("chen-fgss", "sigma=0.25"): [(0, 0, 2.0, 0.75, 1.0), (0, 0, 2.0, 0.5, 1.0),
                                  (1, 1, 2.0, 1.0, 1.0), (1, 1, 2.0, 0.75, 1.0)],
    ("lipschitz-sigma-net", "sigma_min=0.1"): [(0, 0, 0.25, 0.5, 2.0), (-1, 1, 0.0, 0.5, 2.0),
                                               (-1, 1, 0.0, 0.5, 2.0), (1, 1, 0.5, 0.5, 2.0)],
}  # fmt: skip
CHECKS = [  # method, setting, check, verdict, summary, flags
    ("cohen", "sigma=0.25", "analytic-coverage", "sound", "200 trials, 0 violations", []),
    ("cohen", "sigma=0.25", "regularity", "not-applicable", "constant sigma", []),
    ("cohen", "sigma=0.5", "analytic-coverage", "sound", "200 trials, 0 violations", []),
    ("chen-fgss", "sigma=0.25", "analytic-coverage", "sound", "200 trials, 0 violations", []),
    ("chen-fgss", "sigma=0.25", "regularity", "violated",
     "sigma(x) changes 3x within the certified ball", ["sigma-search", "counterexample"]),
]  # fmt: skip
FAILURE = ("alfarra-ds", "sigma=0.12", "RuntimeError: certifier exploded\nTraceback: line 2")

GOLDEN_NOTES = """
Hand computation (4 inputs, labels 0 0 1 1; headline radius 0.5, the median of 0..1):
cohen sigma=0.5:   correct 0,2,3 with radii 1, 1.5, 0.5 -> cert@0 .75 @.25 .75 @.5 .75
                   @.75 .5 @1 .5; ACR 3/4 = .75; misclass .25 (input 1); PREDICT right
                   on 0,2,3: classes (.5, 1) -> min .5, max 1, std .25; 0.125 s/input.
cohen sigma=0.25:  correct 0,1,2 with radii .75 .25 .5; input 3 abstains -> cert@0 .75
                   @.25 .75 @.5 .5 @.75 .25 @1 0; ACR 1.5/4 = .375; abstain .25;
                   PREDICT wrong on 3 -> classes (1, .5); 0.375 s/input.
chen-fgss:         all correct with radius 2 -> 1.000 everywhere, ACR 2, mean sigma .75;
                   one check 'violated' -> second table, first there.
lipschitz:         correct 0 (r .25) and 3 (r .5); 1, 2 abstain -> cert@0 .5 @.25 .5 @.5 .25
                   @.75 0; ACR .75/4 = .1875 (printed 0.188: an exact tie, rounded to even);
                   PREDICT wrong on 1 -> classes (.5, 1); no check -> 'not checked'.
"""


def add_checks(db: Path, rows) -> None:
    """Insert soundness-check rows (creating the ``checks`` table if the store has none)."""
    with sqlite3.connect(db) as con:
        con.execute(
            "CREATE TABLE IF NOT EXISTS checks (run_id TEXT, method TEXT, setting TEXT,"
            " check_name TEXT, verdict TEXT, summary TEXT, evidence TEXT, flags TEXT,"
            " budget TEXT, at TEXT)"
        )
        columns = {r[1] for r in con.execute("PRAGMA table_info(checks)")}
        name = "check_name" if "check_name" in columns else "check"
        for run_id, method, setting, check, verdict, summary, flags in rows:
            values = {"run_id": run_id, "method": method, "setting": setting, name: check,
                      "verdict": verdict, "summary": summary, "evidence": "{}",
                      "flags": json.dumps(flags), "budget": "small", "at": NOW}  # fmt: skip
            values = {k: v for k, v in values.items() if k in columns}
            con.execute(
                f"INSERT INTO checks ({', '.join(map(repr, values))})"
                f" VALUES ({', '.join('?' * len(values))})",
                list(values.values()),
            )


def make_run(
    db: Path, monkeypatch, run_id: str = RUN_ID, rows=ROWS, checks=CHECKS, config=CONFIG,
    labels=LABELS, failure=FAILURE, recipe_hash: str = RECIPE_HASH, device: str = "cpu",
) -> str:  # fmt: skip
    """Write one fixed run into ``db``; returns its id."""
    monkeypatch.setattr("harness.store.store._now", lambda: NOW)
    store = ResultStore(db)
    try:
        store.begin_run(run_id, config["name"], config, VERSIONS, "c0ffee" * 6 + "beef",
                        device, config["seed"], recipe_hash)  # fmt: skip
        for (method, setting), certs in rows.items():
            for input_id, (prediction, predict, radius, sigma, seconds) in enumerate(certs):
                cert = Certificate(input_id, prediction, radius, 0.9, sigma, 0.001, predict,
                                   [1, 9], [10, 90], seconds, {"note": "fixture"})  # fmt: skip
                store.add_certificate(run_id, method, setting, 0, labels[input_id], cert)
        if failure:
            store.record_failure(run_id, *failure)
        store.finish_run(run_id)
    finally:
        store.close()
    add_checks(db, [(run_id, *c) for c in checks])
    return run_id


@dataclass(frozen=True)
class GoldenRun:
    """The golden run's constants, and :func:`add_checks` to add check rows to a database."""

    run_id: str
    recipe_hash: str
    config: dict[str, Any]
    rows: dict[tuple[str, str], list[tuple]]
    checks: list[tuple]
    add_checks = staticmethod(add_checks)


@pytest.fixture(scope="session")
def golden_run() -> GoldenRun:
    """The golden run's id, recipe hash, config, certificate rows and check rows."""
    return GoldenRun(RUN_ID, RECIPE_HASH, CONFIG, ROWS, CHECKS)


@pytest.fixture(scope="session", name="make_run")
def make_run_fixture():
    """``make_run(db, monkeypatch, run_id=..., rows=..., checks=..., config=..., labels=...,
    failure=..., recipe_hash=..., device=...) -> run id``: write the golden run, or a variant
    of it, into ``db``."""
    return make_run
