"""The typed read side (harness.store.storedrun) against hand-written database rows."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from harness.foundation.certificate import Certificate
from harness.foundation.errors import IdrsError
from harness.mathematics.accuracy import row_metrics
from harness.store.store import ResultStore
from harness.store.storedrun import (
    IMPORTED,
    NOT_CHECKED,
    Completeness,
    StoredCertificate,
    StoredCheck,
    incomplete_note,
    load_runs,
    read_run,
)

RUN = "ab" * 32
CONFIG = {
    "name": "hand",
    "dataset": {"name": "cone-2"},
    "protocol": {"n0": 10, "n": 100, "alpha": 0.001},
    "methods": [
        {"name": "cohen", "settings": [{"sigma": 0.25}, {"sigma": 0.5}]},
        {"name": "memo", "settings": [{"sigma": 0.25}]},
        {"name": "plain"},  # no settings: one setting, "default"
    ],
}


def _db(tmp_path: Path, *, finished: bool = True, inputs: int | None = 3, config=CONFIG) -> Path:
    """A database whose rows are written by hand (SQL), not by the store's writers."""
    db = tmp_path / "hand.sqlite"
    ResultStore(db).close()  # the schema
    con = sqlite3.connect(db)
    with con:
        con.execute(
            "INSERT INTO runs (run_id, name, created, finished, config, versions, git_commit,"
            " device, seed, recipe_hash, inputs) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (RUN, "hand", "2024-01-01", "2024-01-02" if finished else None, json.dumps(config),
             "{}", None, "cpu", 0, "m" * 64, inputs),
        )  # fmt: skip
        certs = [  # method, setting, input_id, label, prediction, predict, radius, sigma
            ("cohen", "sigma=0.5", 2, 1, 1, 1, 0.5, 0.5),
            ("cohen", "sigma=0.25", 1, 0, -1, 0, 0.0, 0.25),
            ("cohen", "sigma=0.25", 0, 0, 0, 0, 0.75, 0.25),
            ("cohen", "sigma=0.25", 2, 1, 1, 0, 0.25, 0.25),
            ("memo", "sigma=0.25", 0, 0, 0, 0, 0.5, 0.25),
            ("memo", "sigma=0.25", 1, 1, 1, 1, 0.5, 0.25),
            ("memo", "sigma=0.25", 2, 1, 1, 1, 0.5, 0.25),
            ("stray", "x=1", 0, 0, 0, 0, 0.1, 0.1),  # not in the spec
        ]
        con.executemany(
            "INSERT INTO certificates (run_id, method, setting, input_id, shard, label,"
            " prediction, predict, radius, p_lower, sigma, alpha, counts_selection,"
            " counts_estimation, seconds, evidence)"
            " VALUES (?, ?, ?, ?, 0, ?, ?, ?, ?, 0.9, ?, 0.001, '[1, 9]', NULL, 0.5, '{\"k\": 1}')",
            [(RUN, *c) for c in certs],
        )
        order = {"input_id": [0, 1, 2], "prediction": [0, -1, 1], "radius": [0.5, 0.0, 0.1]}
        checks = [  # method, setting, check, verdict, evidence, flags
            ("cohen", "sigma=0.25", "coverage", "sound", {}, ["b"]),
            ("cohen", "sigma=0.25", "regularity", "not-applicable", {}, []),
            ("cohen", "sigma=0.25", "evidence", "sound", {}, ["a", "b"]),
            ("cohen", "sigma=0.5", "coverage", "sound", {}, []),
            ("cohen", "sigma=0.5", "justification", "error", {}, []),
            ("memo", "sigma=0.25", "coverage", "sound", {}, []),
            ("memo", "sigma=0.25", "memory-order", "order-dependent",
             {"orders": 3, "acr": {"min": 0.2}, "worst_order": order}, []),
        ]  # fmt: skip
        con.executemany(
            "INSERT INTO checks (run_id, method, setting, check_name, verdict, summary, evidence,"
            " flags, budget, at) VALUES (?, ?, ?, ?, ?, 's', ?, ?, 'small', '2024-01-02')",
            [(RUN, m, s, c, v, json.dumps(e), json.dumps(f)) for m, s, c, v, e, f in checks],
        )
        con.execute(
            "INSERT INTO failures VALUES (?, 'plain', 'default', 'Boom\nline 2', '2024-01-02')",
            (RUN,),
        )
    con.close()
    return db


def test_rows_group_certificates_by_method_and_setting(tmp_path):
    (run,) = load_runs(_db(tmp_path))
    rows = run.rows()
    assert [(r.method, r.setting) for r in rows] == [
        ("cohen", "sigma=0.25"), ("cohen", "sigma=0.5"), ("memo", "sigma=0.25"), ("stray", "x=1")
    ]  # fmt: skip
    cohen = rows[0]
    assert [c.input_id for c in cohen.certificates] == [0, 1, 2]  # by input id
    assert [c.radius for c in cohen.certificates] == [0.75, 0.0, 0.25]
    assert cohen.certificates[2].correct and not cohen.certificates[1].correct
    assert (cohen.certificates[0].counts_selection, cohen.certificates[0].evidence) == (
        [1, 9], {"k": 1}
    )  # fmt: skip
    assert cohen.certificates[0].counts_estimation is None
    assert [c.check for c in cohen.checks] == ["coverage", "evidence", "regularity"]
    assert cohen.applied == ["coverage", "evidence"] and cohen.flags == ["a", "b"]
    assert run.counts() == {("cohen", "sigma=0.25"): 3, ("cohen", "sigma=0.5"): 1,
                            ("memo", "sigma=0.25"): 3, ("stray", "x=1"): 1}  # fmt: skip
    assert run.failures == [
        {"method": "plain", "setting": "default", "error": "Boom\nline 2", "at": "2024-01-02"}
    ]


def test_verdict_of_each_row(tmp_path):
    (run,) = load_runs(_db(tmp_path))
    by_key = {(r.method, r.setting): r for r in run.rows()}
    assert by_key["cohen", "sigma=0.25"].verdict == "sound"  # not-applicable is ignored
    assert by_key["cohen", "sigma=0.5"].verdict == "not-verified"  # a check raised
    memo = by_key["memo", "sigma=0.25"]
    assert memo.verdict == "order-dependent"
    assert memo.order["worst_order"]["prediction"] == [0, -1, 1]
    assert memo.order["orders"] == 3
    assert by_key["stray", "x=1"].verdict == NOT_CHECKED and by_key["stray", "x=1"].order is None


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [
        ((), NOT_CHECKED),
        (("not-applicable",), "not-verified"),  # none applied
        (("sound", "unjustified", "violated"), "violated"),
        (("sound", "unjustified"), "unjustified"),
        (("sound", "made-up"), "violated"),  # an unknown verdict: the safe side
        (("order-dependent", "error"), "not-verified"),
    ],
)
def test_verdict_combination(tmp_path, verdicts, expected):
    db = _db(tmp_path)
    with sqlite3.connect(db) as con:
        con.execute("DELETE FROM checks WHERE method = 'cohen' AND setting = 'sigma=0.5'")
        for k, verdict in enumerate(verdicts):
            con.execute(
                "INSERT INTO checks (run_id, method, setting, check_name, verdict, summary,"
                " evidence, flags, budget, at) VALUES (?, 'cohen', 'sigma=0.5', ?, ?, '', '{}',"
                " 'not json', 'small', '')",
                (RUN, f"c{k}", verdict),
            )
    (run,) = load_runs(db)
    row = next(r for r in run.rows() if r.setting == "sigma=0.5")
    assert row.verdict == expected
    assert all(c.flags == ("not json",) for c in row.checks)  # flags that are not JSON: kept


def test_imported_runs_are_imported_whatever_their_checks(tmp_path):
    (run,) = load_runs(_db(tmp_path, config=CONFIG | {"imported": {"format": "cohen-log"}}))
    assert run.imported and {r.verdict for r in run.rows()} == {IMPORTED}


def test_completeness_against_the_spec(tmp_path):
    (run,) = load_runs(_db(tmp_path, inputs=3))
    assert run.settings() == [
        Completeness("cohen", "sigma=0.25", 3, 3, True),
        Completeness("cohen", "sigma=0.5", 1, 3, False),
        Completeness("memo", "sigma=0.25", 3, 3, True),
        Completeness("plain", "default", 0, 3, False),
    ]
    assert incomplete_note(run.settings()) == (
        "incomplete: cohen sigma=0.5 1 of 3 inputs; plain default 0 of 3 inputs"
    )
    rows = {(r.method, r.setting): r for r in run.rows()}
    assert rows["cohen", "sigma=0.25"].complete and not rows["cohen", "sigma=0.5"].complete
    assert rows["stray", "x=1"].status is None and not rows["stray", "x=1"].complete
    (unfinished,) = load_runs(_db(tmp_path / "u", finished=False))
    assert not any(s.complete for s in unfinished.settings())
    (unrecorded,) = load_runs(_db(tmp_path / "n", inputs=None))  # finished, count unknown
    assert [s.complete for s in unrecorded.settings()] == [True, True, True, True]
    assert incomplete_note(unrecorded.settings()) is None


def test_summaries_nest_the_row_metrics(tmp_path):
    (run,) = load_runs(_db(tmp_path))
    row = run.rows()[0]
    metrics = row_metrics(row.certificates, (0.0, 0.5))
    # inputs 0 (correct, r .75), 1 (abstains), 2 (correct, r .25, PREDICT wrong)
    assert metrics["certified_accuracy@0.5"] == 1 / 3 and metrics["acr"] == 1.0 / 3
    assert metrics["clean_accuracy"] == 2 / 3 and metrics["abstention_rate"] == 1 / 3
    assert metrics["classwise_accuracy"] == {0: 1.0, 1: 0.0}
    (first, *_) = run.summaries((0.0, 0.5))
    assert first["certified_accuracy"] == {"0": 2 / 3, "0.5": 1 / 3}
    assert (first["method"], first["setting"], first["inputs"]) == ("cohen", "sigma=0.25", 3)


def test_certificates_are_inserted_by_column_name(tmp_path):
    """A table whose columns are in another order still gets every value in its column."""
    db = tmp_path / "shuffled.sqlite"
    with sqlite3.connect(db) as con:
        con.execute(
            "CREATE TABLE certificates (evidence TEXT NOT NULL, seconds REAL NOT NULL,"
            " radius REAL NOT NULL, counts_estimation TEXT, counts_selection TEXT,"
            " alpha REAL NOT NULL, sigma REAL NOT NULL, p_lower REAL NOT NULL,"
            " predict INTEGER NOT NULL, prediction INTEGER NOT NULL, label INTEGER NOT NULL,"
            " shard INTEGER NOT NULL, input_id INTEGER NOT NULL, setting TEXT NOT NULL,"
            " method TEXT NOT NULL, run_id TEXT NOT NULL,"
            " PRIMARY KEY (run_id, method, setting, input_id))"
        )
    store = ResultStore(db)
    store.begin_run(RUN, "hand", CONFIG, {}, None, "cpu", 0, "m" * 64)
    cert = Certificate(7, 1, 0.625, 0.875, 0.25, 0.001, 2, [3, 4], [5, 6], 1.5, {"e": [1]})
    store.add_certificate(RUN, "cohen", "sigma=0.25", 4, 3, cert)
    (stored,) = read_run(store).certificates
    store.close()
    assert (stored.method, stored.setting, stored.shard, stored.label) == (
        "cohen", "sigma=0.25", 4, 3
    )  # fmt: skip
    assert (stored.input_id, stored.prediction, stored.radius, stored.p_lower, stored.sigma,
            stored.alpha, stored.predict, stored.counts_selection, stored.counts_estimation,
            stored.seconds, stored.evidence) == (
        7, 1, 0.625, 0.875, 0.25, 0.001, 2, [3, 4], [5, 6], 1.5, {"e": [1]}
    )  # fmt: skip


def test_checks_of_a_legacy_table_and_their_export_form():
    legacy = {"method": "m", "setting": "s", "check": "coverage", "verdict": "sound",
              "summary": None, "flags": '["x"]', "budget": None}  # fmt: skip
    check = StoredCheck.from_row(legacy)
    assert check == StoredCheck("m", "s", "coverage", "sound", "", ("x",), None, None)
    assert check.as_dict() == {"method": "m", "setting": "s", "check": "coverage",
                               "verdict": "sound", "summary": "", "flags": ["x"],
                               "budget": None}  # fmt: skip


def test_missing_database_and_run_are_named(tmp_path):
    with pytest.raises(IdrsError, match="not found"):
        load_runs(tmp_path / "none.sqlite")
    with pytest.raises(IdrsError, match="no run matches 'zz'"):
        load_runs(_db(tmp_path), ["zz"])
    with pytest.raises(IdrsError, match="named twice"):
        load_runs(_db(tmp_path / "t"), [RUN[:4], RUN[:6]])


def test_a_certificates_dict_is_a_deep_copy_equal_to_dataclasses_asdict():
    """``as_dict`` (a pickle round trip) gives what :func:`dataclasses.asdict` gives, with its
    own nested values (a reader that edits them leaves the certificate as it was), keeps a
    NumPy scalar a NumPy scalar, and copies what pickle refuses as ``asdict`` does."""
    import dataclasses

    import numpy as np

    draws = {"estimation": {"looks": [{"n": 100, "counts": [3, 97]}], "sigma": -0.0},
             "selection": (1, 2)}  # fmt: skip
    cert = StoredCertificate("m", "s", 3, 1, 1, 1, 0.5, 0.25, 0.1, evidence={"p": float("nan")},
                             draws=draws)  # fmt: skip
    copied = cert.as_dict()
    expected = dataclasses.asdict(cert)
    assert json.dumps(copied, sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert copied["draws"]["selection"] == (1, 2)
    copied["draws"]["estimation"]["looks"][0]["counts"][0] = 99
    assert cert.draws["estimation"]["looks"][0]["counts"] == [3, 97]
    odd = StoredCertificate("m", "s", 3, 1, 1, 1, 0.5, 0.25, 0.1, evidence={"p": np.float32(0.5)})
    assert type(odd.as_dict()["evidence"]["p"]) is np.float32
    unpicklable = StoredCertificate(
        "m", "s", 3, 1, 1, 1, 0.5, 0.25, 0.1, evidence={"f": len, "g": lambda: 0}
    )
    assert unpicklable.as_dict()["evidence"]["f"] is len  # copied by asdict
