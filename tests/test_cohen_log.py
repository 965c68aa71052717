"""Cohen et al.'s certify log: import, export, boards, and what imported runs may not do."""

from __future__ import annotations

import json
import sqlite3
from datetime import timedelta

import pytest

from harness.cli.main import main
from harness.foundation.errors import IdrsError
from harness.reports.cohen_log import LogLine, format_line, parse_log
from harness.running.benchmark import BENCHMARKS_DIR

HEADER = "idx\tlabel\tpredict\tradius\tcorrect\ttime\n"
LOG = (
    HEADER
    + "0\t7\t7\t0.512\t1\t0:00:13.771528\n20\t2\t-1\t0.0\t0\t0:00:12.5\n40\t1\t3\t1.23\t0\t0:00:13\n"
)


def test_line_format_is_cohen_et_al():
    # the example line of the issue: radius with 3 significant digits, str(timedelta)
    line = LogLine(20, 7, 7, 0.073412345, 13.771528)
    assert format_line(line) == "20\t7\t7\t0.0734\t1\t0:00:13.771528"
    assert format_line(LogLine(1, 2, -1, 0.0, 3723.5)) == "1\t2\t-1\t0.0\t0\t1:02:03.500000"
    assert str(timedelta(seconds=3723.5)) == "1:02:03.500000"


def test_parse_reads_every_field():
    lines = parse_log(LOG)
    assert [(x.idx, x.label, x.predict, x.radius) for x in lines] == [
        (0, 7, 7, 0.512), (20, 2, -1, 0.0), (40, 1, 3, 1.23)]  # fmt: skip
    assert [x.seconds for x in lines] == pytest.approx([13.771528, 12.5, 13.0])


@pytest.mark.parametrize(
    "bad, number",
    [("0\t7\t7\t0.5\t1\n", 2), ("0\t7\t7\t0.5\t1\t0:00:01\n5\t1\t1\tx\t1\t0:00:01\n", 3),
     ("0\t7\t7\t0.5\t0\t0:00:01\n", 2), ("0\t7\t-1\t0.5\t0\t0:00:01\n", 2),
     ("0\t7\t7\t0.5\t1\t13 seconds\n", 2)],
)  # fmt: skip
def test_malformed_line_is_one_error_naming_it(bad, number):
    with pytest.raises(IdrsError, match=rf"^log:{number}: malformed line"):
        parse_log(HEADER + bad)
    with pytest.raises(IdrsError, match="header"):
        parse_log("index\tlabel\n")


@pytest.fixture(scope="module")
def db_with_run_and_log(tmp_path_factory, write_mnist):
    """One trained-and-certified MNIST run and one imported log (shared: tests only read,
    except the weights test, which changes the run's digest, read by no other test)."""
    tmp_path = tmp_path_factory.mktemp("log")
    write_mnist(tmp_path / "data", train=20, test=60)
    db = tmp_path / "r.sqlite"
    args = ["run", str(BENCHMARKS_DIR / "mnist.toml"), "--db", str(db), "--device", "cpu",
            "--data-root", str(tmp_path / "data"), "--quiet", "--no-check",
            "--set", "model.trainer_params.epochs=1", "--set", "certification.n0=10",
            "--set", "certification.n=100", "--set", "certification.batch_size=100",
            "--set", 'methods=[{name="cohen", settings=[{sigma=0.25}]}]']  # fmt: skip
    assert main(args) == 0
    (tmp_path / "paper.log").write_text(LOG)
    assert main(["import-log", str(tmp_path / "paper.log"), "--dataset", "mnist",
                 "--name", "paper-0.25", "--sigma", "0.25", "--db", str(db)]) == 0  # fmt: skip
    return db


def test_imported_log_on_a_board_beside_a_run(db_with_run_and_log, tmp_path, capsys):
    db = db_with_run_and_log
    runs = [r[0] for r in sqlite3.connect(db).execute("SELECT run_id FROM runs ORDER BY created")]
    capsys.readouterr()
    assert main(["leaderboard", *runs, "--db", str(db), "--out", str(tmp_path / "b.md"),
                 "--no-plots"]) == 0  # fmt: skip
    board = (tmp_path / "b.md").read_text()
    assert board.count("\n## ") == 2  # one table and the legend: the log sits beside the run
    imported = board.split("### Imported from published logs")[1]
    assert (
        "paper" not in board.split("### Imported from published logs")[0].split("### Verified")[1]
    )
    assert "| imported |" in imported and "weights: parameters' digest" in board
    data = json.loads((tmp_path / "b.json").read_text())
    assert [r["section"] for r in data["rows"] if r["verdict"] == "imported"] == ["imported"]


def test_imported_runs_are_never_audited(db_with_run_and_log, capsys):
    capsys.readouterr()
    assert main(["check", "--db", str(db_with_run_and_log)]) == 2
    assert "imported log" in capsys.readouterr().err


def test_results_write_a_cohen_log_that_imports_back(db_with_run_and_log, tmp_path, capsys):
    db = db_with_run_and_log
    capsys.readouterr()
    assert main(["results", "--db", str(db), "--format", "cohen-log"]) == 0  # the imported run
    written = capsys.readouterr().out
    assert [(x.idx, x.predict, x.radius) for x in parse_log(written)] == [
        (x.idx, x.predict, x.radius) for x in parse_log(LOG)]  # fmt: skip
    first = sqlite3.connect(db).execute("SELECT run_id FROM runs ORDER BY created").fetchone()[0]
    assert main(["results", first, "--db", str(db), "--format", "cohen-log"]) == 0
    lines = parse_log(capsys.readouterr().out)
    assert [x.idx for x in lines] == [0, 20, 40]


def test_checks_refuse_a_model_with_other_weights(db_with_run_and_log, capsys):
    db = db_with_run_and_log
    con = sqlite3.connect(db)
    with con:
        con.execute("UPDATE runs SET weights_digest = ? WHERE name = 'mnist'", ("0" * 64,))
    run_id = con.execute("SELECT run_id FROM runs WHERE name = 'mnist'").fetchone()[0]
    capsys.readouterr()
    data = str(db.parent / "data")
    assert main(["check", run_id, "--db", str(db), "--quiet", "--data-root", data]) == 2
    assert "weights" in capsys.readouterr().err


def test_compare_warns_when_weights_differ(db_with_run_and_log):
    from harness.reports.leaderboard.compare import compare_runs
    from harness.store.storedrun import load_runs

    (run,) = load_runs(db_with_run_and_log, [
        sqlite3.connect(db_with_run_and_log).execute(
            "SELECT run_id FROM runs WHERE name = 'mnist'").fetchone()[0]])  # fmt: skip
    other = type(run)(dict(run.run, weights_digest="f" * 64), run.certificates, [], [])
    warnings = compare_runs(run, other).warnings
    assert any("weights differ" in w for w in warnings)
    assert not any("weights differ" in w for w in compare_runs(run, run).warnings)
