"""Per-input logs as the field published them: each format imported, its metrics equal to
what the publishing repository's own analysis computes from the same file."""

from __future__ import annotations

import datetime
import sqlite3

import numpy as np
import pandas as pd
import pytest

from harness.cli.main import main
from harness.foundation.errors import IdrsError
from harness.mathematics.accuracy import RADII, certified_key, row_metrics
from harness.reports.import_log import import_log
from harness.reports.published_logs import parse_time, read_published_log
from harness.store.storedrun import load_runs

GRID = (0.0, 0.25, 0.5, 0.75, 1.0)


def _lines(seed: int, count: int = 60):
    """Random certify outcomes: (idx, label, prediction, radius, seconds, σ)."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        label = int(rng.integers(0, 10))
        kind = rng.random()
        prediction = -1 if kind < 0.15 else label if kind < 0.8 else (label + 1) % 10
        radius = 0.0 if prediction == -1 else float(rng.uniform(0, 1.3))
        out.append((20 * k, label, prediction, radius, float(rng.uniform(5, 200)),
                    float(rng.uniform(0.2, 0.6))))  # fmt: skip
    return out


def write_cohen(path, lines, seconds=False, crlf=False):
    """Cohen et al.'s code/certify.py: str(timedelta) times (their ImageNet logs), or seconds
    as ``{:.3}`` (their CIFAR-10 logs, e.g. ``15.4``)."""
    end = "\r\n" if crlf else "\n"
    text = "idx\tlabel\tpredict\tradius\tcorrect\ttime" + end
    for i, label, prediction, radius, t, _ in lines:
        time = f"{t:.3}" if seconds else str(datetime.timedelta(seconds=t))
        text += f"{i}\t{label}\t{prediction}\t{radius:.3}\t{int(prediction == label)}\t{time}" + end
    path.write_text(text, newline="")


def write_ddrs(path, lines):
    """Alfarra et al.'s certify_ds.py: ``idx label predict radius correct sigma time``."""
    text = "idx\tlabel\tpredict\tradius\tcorrect\tsigma\ttime\n"
    for i, label, prediction, radius, t, sigma in lines:
        text += f"{i}\t{label}\t{prediction}\t{radius:.3}\t{int(prediction == label)}\t{sigma:.3}\t{datetime.timedelta(seconds=t)!s}\n"  # fmt: skip
    path.write_text(text)


def write_ancer(path, lines):
    """ANCER's certify.py: radius = σ_min·gap, radius_proxy, min_sigma (a 0-d tensor's {:.3})."""
    text = "idx\tlabel\tpredict\tradius\tradius_proxy\tcorrect\tmin_sigma\ttime\n"
    for i, label, prediction, radius, t, sigma in lines:
        proxy = 1.7 * radius if radius > 0 else 0.0
        text += f"{i}\t{label}\t{prediction}\t{radius:.3}\t{proxy:.3}\t{int(prediction == label)}\t{sigma:.3}\t{datetime.timedelta(seconds=t)!s}\n"  # fmt: skip
    path.write_text(text)


def approximate_accuracy(path, radii):
    """Cohen et al.'s analyze.py ApproximateAccuracy (kept by SmoothAdv; ANCER's README
    states the same count): (correct & radius >= r).mean() over the file read by pandas."""
    df = pd.read_csv(path, delimiter="\t")
    return [float((df["correct"] & (df["radius"] >= r)).mean()) for r in radii]


def average_certified_radius(path):
    """MACER's ACR (rs/certify.py): the sum of the correct inputs' radii over all inputs."""
    df = pd.read_csv(path, delimiter="\t")
    return float((df["radius"] * df["correct"]).sum() / len(df))


def _imported(db, path, **kwargs):
    run_id = import_log(path, db, "cifar10", kwargs.pop("name", "log"), 0.25, **kwargs)
    (run,) = load_runs(db, [run_id])
    (row,) = run.rows()
    return run, row, row_metrics(row.certificates, GRID, run.unknown_metrics)


@pytest.mark.parametrize("seconds, crlf", [(False, False), (True, False), (True, True)])
def test_cohen_log_metrics_are_analyze_py_s(tmp_path, seconds, crlf):
    path = tmp_path / "sigma_0.25"
    lines = _lines(0)
    write_cohen(path, lines, seconds, crlf)
    run, row, metrics = _imported(tmp_path / "r.sqlite", path)
    assert run.config["imported"]["format"] == "cohen" and row.method == "cohen"
    expected = approximate_accuracy(path, GRID)
    assert [metrics[certified_key(r)] for r in GRID] == pytest.approx(expected, abs=1e-15)
    assert metrics["acr"] == pytest.approx(average_certified_radius(path), rel=1e-12)
    times = sorted(c.seconds for c in row.certificates)
    assert times == pytest.approx(sorted(float(f"{t:.3}") if seconds else t
                                         for *_, t, _ in lines), rel=1e-6)  # fmt: skip


def test_the_published_cifar10_lines_and_whitespace(tmp_path):
    """Lines of Cohen et al.'s data/certify/cifar10/resnet110/noise_0.25/test/sigma_0.25
    (time in seconds), with trailing spaces and a blank line added."""
    path = tmp_path / "sigma_0.25"
    path.write_text(
        "idx\tlabel\tpredict\tradius\tcorrect\ttime \n0\t3\t3\t0.378\t1\t15.4\n"
        "20\t7\t-1\t0.0\t0\t15.6  \n\n40\t4\t4\t0.341\t1\t15.7\n340\t2\t4\t0.152\t0\t16.9\n"
    )
    lines = read_published_log(path).lines
    assert [(x.idx, x.predict, x.radius, x.seconds) for x in lines] == [
        (0, 3, 0.378, 15.4), (20, -1, 0.0, 15.6), (40, 4, 0.341, 15.7), (340, 4, 0.152, 16.9)]  # fmt: skip


def test_time_formats():
    assert parse_time("0:02:31.238689") == pytest.approx(151.238689)
    assert parse_time("1 day, 2:00:00") == 93600
    assert parse_time("15.4") == 15.4 and parse_time("1.23e+03") == 1230.0
    for bad in ("13 seconds", "-1", "nan", "1:2:3"):
        with pytest.raises(ValueError, match="neither H:MM:SS"):
            parse_time(bad)


def test_ddrs_log_keeps_each_inputs_sigma(tmp_path):
    path = tmp_path / "ddrs.txt"
    lines = _lines(1)
    write_ddrs(path, lines)
    run, row, metrics = _imported(tmp_path / "r.sqlite", path)
    assert run.config["imported"]["format"] == "ddrs" and row.method == "alfarra-ds"
    assert [metrics[certified_key(r)] for r in GRID] == pytest.approx(
        approximate_accuracy(path, GRID), abs=1e-15
    )
    assert metrics["acr"] == pytest.approx(average_certified_radius(path), rel=1e-12)
    assert [c.sigma for c in row.certificates] == pytest.approx(
        [float(f"{s:.3}") for *_, s in lines]
    )


def test_ancer_log_reads_the_l2_radius(tmp_path):
    path = tmp_path / "ancer.csv"
    lines = _lines(2)
    write_ancer(path, lines)
    run, row, metrics = _imported(tmp_path / "r.sqlite", path)
    assert run.config["imported"]["format"] == "ancer" and row.method == "ancer"
    assert [metrics[certified_key(r)] for r in GRID] == pytest.approx(
        approximate_accuracy(path, GRID), abs=1e-15
    )
    assert metrics["acr"] == pytest.approx(average_certified_radius(path), rel=1e-12)
    proxies = [c.evidence["radius_proxy"] for c in row.certificates]
    assert proxies == pytest.approx([float(f"{1.7 * r:.3}") if r > 0 else 0.0
                                     for _, _, _, r, *_ in lines])  # fmt: skip
    assert [c.sigma for c in row.certificates] == pytest.approx(
        [float(f"{s:.3}") for *_, s in lines]
    )


def _macer_summary(radius_hard, grid):
    """MACER's rs/certify.py summary: cnt_grid (correct and radius >= grid) / num_img, ACR."""
    num = len(radius_hard)
    counts = [sum(r >= 0 for r in radius_hard)] + [sum(r >= g for r in radius_hard if r >= 0)
                                                   for g in grid]  # fmt: skip
    return [c / num for c in counts], sum(r for r in radius_hard if r >= 0) / num


def test_macer_mat_file(tmp_path):
    from scipy.io import savemat

    rng = np.random.default_rng(3)
    hard = np.where(rng.random(50) < 0.3, -1.0, rng.uniform(0, 1.2, 50))
    soft = np.where(rng.random(50) < 0.3, -1.0, rng.uniform(0, 1.4, 50))
    savemat(tmp_path / "440.mat", {"hard": hard, "soft": soft})  # main.py --task test: 'both'
    db = tmp_path / "r.sqlite"
    with pytest.raises(IdrsError, match="pass --key hard or --key soft"):
        import_log(tmp_path / "440.mat", db, "cifar10", "macer", 0.25)
    assert not db.exists()
    for key, radii in (("hard", hard), ("soft", soft)):
        run, row, metrics = _imported(db, tmp_path / "440.mat", key=key, name=key)
        assert run.config["imported"]["key"] == key
        accuracy, acr = _macer_summary(radii.tolist(), GRID[1:])
        assert [metrics[certified_key(r)] for r in GRID] == pytest.approx(accuracy, abs=1e-15)
        assert metrics["acr"] == pytest.approx(acr, rel=1e-12)
        assert [c.input_id for c in row.certificates] == list(range(500, 550))  # --start_img 500
        assert metrics["abstention_rate"] is None and metrics["classwise_accuracy"] == {}
    savemat(tmp_path / "hard.mat", {"hard": hard})
    _, row, _ = _imported(db, tmp_path / "hard.mat", start=0, skip=20, name="strided")
    assert [c.input_id for c in row.certificates][:3] == [0, 20, 40]


@pytest.mark.parametrize(
    "text, match",
    [
        ("idx\tlabel\tpredict\tradius\tcorrect\ttime\n0\t1\t1\t0.5\t1\n",
         r"log:2: malformed line \(5 tab-separated columns, expected 6: idx, label, predict, "
         r"radius, correct, time\)"),
        ("idx\tlabel\tpredict\tradius\tcorrect\ttime\n0\t1\t1\t0.5\t1\t1\n0\t1\t1\t0.5\t1\t1\n",
         "log:3: .*idx 0 appears twice"),
        ("idx\tlabel\tpredict\tradius\tcorrect\tsigma\ttime\n0\t1\t1\t0.5\t1\t-0.1\t1\n",
         "log:2: .*sigma '-0.1' must be > 0.*certify_ds.py"),
        ("index\tradius\n", "log:1: unknown log format.*cohen .*ddrs .*ancer .*macer"),
        ("===certify(N=100000, sigma=0.25, mode=hard)===\nRadius: 0.0  Number: 1  Acc: 50.0\n",
         "log:1: this is MACER's printed certify summary.*--matdir"),
        ("idx\tlabel\tpredict\tcorrect\ttime\n0\t1\t1\t1\t0:00:01\n", "log:1: this is a predict.py log"),
    ],
)  # fmt: skip
def test_bad_logs_name_the_line_and_the_columns(tmp_path, text, match):
    path = tmp_path / "log"
    path.write_text(text)
    with pytest.raises(IdrsError, match=match) as info:
        read_published_log(path)
    assert "\n" not in str(info.value)


def _dump(db):
    with sqlite3.connect(db) as con:
        return list(con.iterdump())


def test_a_failed_import_changes_nothing(tmp_path, capsys):
    db = tmp_path / "r.sqlite"
    good = tmp_path / "good"
    write_cohen(good, _lines(4, count=5))
    assert main(["import-log", str(good), "--dataset", "cifar10", "--name", "good",
                 "--sigma", "0.25", "--db", str(db)]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "cohen format, 5 inputs" in out and "cert@0.5" in out and "ACR" in out
    before = _dump(db)
    bad = tmp_path / "bad"
    bad.write_text(good.read_text() + "100\t1\t1\tx\t1\t1.0\n")
    assert main(["import-log", str(bad), "--dataset", "cifar10", "--name", "bad",
                 "--sigma", "0.25", "--db", str(db)]) == 2  # fmt: skip
    assert "bad:7: malformed line" in capsys.readouterr().err
    assert main(["import-log", str(good), "--dataset", "cifar10", "--name", "good",
                 "--sigma", "0.25", "--db", str(db)]) == 2  # fmt: skip
    assert "already imported" in capsys.readouterr().err
    assert _dump(db) == before


def test_imported_radii_default_to_the_reported_ones(tmp_path):
    path = tmp_path / "log"
    write_cohen(path, _lines(5, count=8))
    run, _, _ = _imported(tmp_path / "r.sqlite", path)
    assert run.config["radii"] == list(RADII)


def test_a_macer_import_on_a_board(tmp_path):
    """Metrics MACER's file cannot give show as '–' (null in JSON, valid by the schema)."""
    import json

    import jsonschema
    from scipy.io import savemat

    from harness.reports.leaderboard.board_schema import BOARD_SCHEMA
    from harness.reports.leaderboard.render import write_board

    savemat(tmp_path / "m.mat", {"hard": np.array([0.5, -1.0, 0.2, 1.1])})
    db = tmp_path / "r.sqlite"
    run_id = import_log(tmp_path / "m.mat", db, "cifar10", "macer", 0.25)
    write_board(load_runs(db, [run_id]), tmp_path / "b.md", plots=False)
    data = json.loads((tmp_path / "b.json").read_text())
    jsonschema.validate(data, BOARD_SCHEMA)
    (row,) = data["rows"]
    assert row["abstention_rate"] is None and row["certified_accuracy@0.5"] == 0.5
    assert "| – |" in (tmp_path / "b.md").read_text()
