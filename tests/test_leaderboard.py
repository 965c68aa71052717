"""Leaderboards: the golden board of a tiny fixed run, ranking, verdicts, files, --verify.

The fixture run (``tests/golden_run.py``) is written straight into a fresh results
database (no model, no sampling): four inputs per (method, setting) with hand-chosen
radii, so every number on the board can be checked by hand (see its GOLDEN_NOTES).
After an intended change of the layout, ``IDRS_UPDATE_GOLDEN=1 pytest
tests/test_leaderboard.py`` rewrites tests/data/leaderboard_golden.md; read the diff
before committing it.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from harness.reports.leaderboard.board import build_board
from harness.reports.leaderboard.cli import add_leaderboard_parser
from harness.reports.leaderboard.markdown import render_markdown
from harness.reports.leaderboard.render import write_board
from harness.reports.leaderboard.source import CERTIFICATE_COLUMNS, export_runs, read_export
from harness.reports.leaderboard.verify import verify_board
from harness.store.storedrun import load_runs

DATA = Path(__file__).parent / "data"
GOLDEN = DATA / "leaderboard_golden.md"


@pytest.fixture
def db(tmp_path, monkeypatch, make_run) -> Path:
    path = tmp_path / "results.sqlite"
    make_run(path, monkeypatch)
    return path


def test_golden_markdown(db):
    """The board of the fixed run equals the committed, hand-checked golden file."""
    text = render_markdown(build_board(load_runs(db)), "golden")
    if os.environ.get("IDRS_UPDATE_GOLDEN") == "1":  # then read it and check it by hand
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def _table_after(text: str, heading: str) -> list[list[str]]:
    """The cells of the first markdown table after the line ``heading`` (header included,
    the alignment line left out)."""
    lines = text.splitlines()
    start = lines.index(heading)
    table = []
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            table.append([cell.strip() for cell in line.strip("|").split("|")])
        elif table:
            break
    return [table[0], *table[2:]]


def _with_interval(k: int, n: int = 4) -> str:
    """k/n with its two-sided 95 % Clopper–Pearson interval, from SciPy's Beta quantiles."""
    from scipy.stats import beta

    low = beta.ppf(0.025, k, n - k + 1) if k > 0 else 0.0
    high = beta.ppf(0.975, k + 1, n - k) if k < n else 1.0
    return f"{k / n:.3f} [{low:.3f}, {high:.3f}]"


def _acr(radii: list[float]) -> str:
    """The mean of per-input radii with its 95 % t interval (SciPy), lower end clipped at 0."""
    from scipy import stats

    mean = sum(radii) / len(radii)
    low, high = stats.t.interval(0.95, len(radii) - 1, loc=mean, scale=stats.sem(radii))
    return f"{mean:.3f} [{max(low, 0.0):.3f}, {high:.3f}]"


def _bold(cell: str) -> str:
    value, interval = cell.split(" ", 1)
    return f"**{value}** {interval}"


def test_the_board_tables_hold_the_hand_computed_values(db):
    """The ranking and details tables against GOLDEN_NOTES's hand computation (counts of
    the 4 inputs), the intervals from SciPy, the best sound row at each radius in bold."""
    text = render_markdown(build_board(load_runs(db)), "golden")
    sound = _table_after(text, "### Verified sound")
    assert sound[0] == ["#", "method", "setting", "verdict", "σ(x) min / median / max",
                        "clean acc", "cert\\@0", "cert\\@0.25", "cert\\@0.5", "cert\\@0.75",
                        "cert\\@1", "ACR"]  # fmt: skip
    # cohen σ = 0.5: PREDICT right on 3 of 4, certified 3 3 3 2 2 (the best sound row at
    # every radius, bold), per-input radii 1, 0 (misclassified), 1.5, 0.5: ACR 3/4
    assert sound[1] == ["1", "cohen", "sigma=0.5", "sound", "0.500", _with_interval(3),
                        *(_bold(_with_interval(k)) for k in (3, 3, 3, 2, 2)),
                        _acr([1.0, 0.0, 1.5, 0.5])]  # fmt: skip
    # σ = 0.25: 3 3 2 1 0, equal to σ = 0.5 (bold too) at radii 0 and 0.25; ACR 1.5/4
    assert sound[2] == ["2", "cohen", "sigma=0.25", "sound", "0.250", _with_interval(3),
                        *map(_bold, map(_with_interval, (3, 3))),
                        *map(_with_interval, (2, 1, 0)), _acr([0.75, 0.25, 0.5, 0.0])]  # fmt: skip
    others = _table_after(text, "### Not verified sound: these radii are not certified")
    # σ(x) of chen-fgss: 0.75, 0.5, 1.0, 0.75: min / median / max; never bold (not sound)
    assert others[1] == ["1", "chen-fgss", "sigma=0.25", "violated", "0.500 / 0.750 / 1.000",
                         _with_interval(4), *map(_with_interval, (4,) * 5),
                         "2.000 [2.000, 2.000]"]  # fmt: skip
    assert others[2] == ["2", "lipschitz-sigma-net", "sigma\\_min=0.1", "not checked", "0.500",
                         _with_interval(3), *map(_with_interval, (2, 2, 1, 0, 0)),
                         _acr([0.25, 0.0, 0.0, 0.5])]  # fmt: skip
    assert "| leader |" not in text and "tie (p" not in text and ": a tie" not in text
    details = _table_after(text, "### Every row: abstention, class-wise accuracy, σ and time")
    assert details == [
        ["method", "setting", "abstain", "misclass", "class min", "class max", "class std",
         "mean σ", "σ min", "σ median", "σ max", "wall s/input", "load/core"],
        ["cohen", "sigma=0.5", "0.000", "0.250", "0.500", "1.000", "0.250", "0.500", "0.500",
         "0.500", "0.500", "0.125", "–"],
        ["cohen", "sigma=0.25", "0.250", "0.000", "0.500", "1.000", "0.250", "0.250", "0.250",
         "0.250", "0.250", "0.375", "–"],
        ["chen-fgss", "sigma=0.25", "0.000", "0.000", "1.000", "1.000", "0.000", "0.750",
         "0.500", "0.750", "1.000", "1.00", "–"],
        ["lipschitz-sigma-net", "sigma\\_min=0.1", "0.500", "0.000", "0.500", "1.000", "0.250",
         "0.500", "0.500", "0.500", "0.500", "2.00", "–"],
    ]  # fmt: skip
    legend = text.split("## Columns")[1]
    assert (
        "- **wall s/input**: wall seconds of certification per input, under the load beside "
        "it\\: comparable only between rows measured under similar loads, never ranked "
        "(descriptive)."
        in legend
        and "- **load/core**: the machine's 1-minute load average per usable processor" in legend
        and "lower is better)" not in legend.split("**wall s/input**")[1].split("\n")[0]
    )
    assert "not used to rank rows" in legend.split("**ACR**")[1].split("\n")[0]


def test_metrics_match_hand_computation(db):
    (table,) = build_board(load_runs(db)).tables
    rows = {(r.method, r.setting): r.metrics for r in table.rows}
    a = rows["cohen", "sigma=0.5"]
    assert [a[f"certified_accuracy@{r}"] for r in ("0", "0.25", "0.5", "0.75", "1")] == [
        0.75, 0.75, 0.75, 0.5, 0.5,
    ]  # fmt: skip
    assert (a["acr"], a["misclassification_rate"], a["clean_accuracy"]) == (0.75, 0.25, 0.75)
    assert a["classwise_accuracy"] == {0: 0.5, 1: 1.0}
    assert (a["classwise_accuracy_min"], a["classwise_accuracy_max"]) == (0.5, 1.0)
    assert a["classwise_accuracy_std"] == 0.25
    b = rows["cohen", "sigma=0.25"]
    assert [b[f"certified_accuracy@{r}"] for r in ("0", "0.25", "0.5", "0.75", "1")] == [
        0.75, 0.75, 0.5, 0.25, 0.0,
    ]  # fmt: skip
    assert (b["acr"], b["abstention_rate"], b["seconds_per_input"]) == (0.375, 0.25, 0.375)
    assert b["classwise_accuracy"] == {0: 1.0, 1: 0.5}
    c = rows["lipschitz-sigma-net", "sigma_min=0.1"]
    assert (c["acr"], c["abstention_rate"], c["certified_accuracy@0.5"]) == (0.1875, 0.5, 0.25)


def test_ranking_sound_rows_first_and_by_headline_then_acr(db):
    (table,) = build_board(load_runs(db)).tables
    assert table.headline_radius == 0.5
    # chen-fgss claims 1.0 everywhere but one check is violated: it is not ranked as certified
    assert [(r.method, r.setting) for r in table.sound_rows] == [
        ("cohen", "sigma=0.5"), ("cohen", "sigma=0.25"),
    ]  # fmt: skip
    assert [(r.method, r.verdict) for r in table.other_rows] == [
        ("chen-fgss", "violated"), ("lipschitz-sigma-net", "not checked"),
    ]  # fmt: skip


def test_ties_at_the_headline_radius_are_broken_by_the_other_radii_never_by_acr(
    tmp_path, monkeypatch, make_run
):
    rows = {  # each certifies 2 of 4 at radius 0.5; "late" also 1 at 0.75, "wide" has the
        # largest ACR but certifies what "early" does at every radius of the board
        ("early", "a"): [(0, 0, 0.5, 1, 1), (0, 0, 0.5, 1, 1), (-1, 0, 0, 1, 1), (-1, 0, 0, 1, 1)],
        ("late", "a"): [(0, 0, 0.5, 1, 1), (0, 0, 0.9, 1, 1), (-1, 0, 0, 1, 1), (-1, 0, 0, 1, 1)],
        ("wide", "a"): [(0, 0, 0.5, 1, 1), (0, 0, 0.7, 1, 1), (-1, 0, 0, 1, 1), (-1, 0, 0, 1, 1)],
        ("na", "a"): [(0, 0, 3.0, 1, 1), (0, 0, 3.0, 1, 1), (1, 1, 3, 1, 1), (1, 1, 3, 1, 1)],
    }
    checks = [("early", "a", "c", "sound", "", []), ("late", "a", "c", "sound", "", []),
              ("late", "a", "d", "not-applicable", "", []), ("wide", "a", "c", "sound", "", []),
              ("na", "a", "c", "not-applicable", "", [])]  # fmt: skip
    make_run(tmp_path / "r.sqlite", monkeypatch, rows=rows, checks=checks, failure=None)
    (table,) = build_board(load_runs(tmp_path / "r.sqlite")).tables
    assert [r.method for r in table.sound_rows] == ["late", "early", "wide"]
    assert table.sound_rows[2].metrics["acr"] > table.sound_rows[1].metrics["acr"]
    # only not-applicable checks: nothing vouches for it, so it is not ranked as certified
    assert [(r.method, r.verdict) for r in table.other_rows] == [("na", "not-verified")]


def test_without_check_rows_every_verdict_says_not_checked(tmp_path, monkeypatch, make_run):
    make_run(tmp_path / "r.sqlite", monkeypatch, checks=[])
    board = build_board(load_runs(tmp_path / "r.sqlite"))
    assert {r.verdict for r in board.tables[0].rows} == {"not checked"}
    assert board.tables[0].sound_rows == []
    text = render_markdown(board, "x")
    assert "No row of this table is verified sound." in text and "[^v1]" not in text


def test_the_verdicts_are_a_matrix_of_rows_and_checks_with_short_footnotes(db):
    """One line per checked row, one column per check (S0–S5 and the replay always, then
    the others a row records, then the attack); a mark per cell; a footnote only for a row
    with a flag or an error, holding the finding of each such check, short."""
    text = render_markdown(build_board(load_runs(db)), "golden")
    matrix = _table_after(text, "### Verdicts: what each check found")
    assert matrix[0] == ["method", "setting", "verdict", "S0 evidence", "S1 coverage",
                         "S2 σ-regularity", "S3 worst case", "S4 counterexamples",
                         "S5 memory order", "replay", "analytic-coverage", "regularity",
                         "attack", "finding"]  # fmt: skip
    none = ["–"] * 7
    assert matrix[1:] == [
        ["cohen", "sigma=0.5", "sound", *none, "pass", "–", "–", ""],
        ["cohen", "sigma=0.25", "sound", *none, "pass", "–", "–", ""],  # not-applicable: –
        ["chen-fgss", "sigma=0.25", "violated", *none, "pass", "**violated**", "–", "[^v1]"],
        ["lipschitz-sigma-net", "sigma\\_min=0.1", "not checked", *none, "–", "–", "–", ""],
    ]
    notes = [line for line in text.splitlines() if line.startswith("[^v")]
    assert notes == ["[^v1]: regularity\\: sigma(x) changes 3x within the certified ball."]


def _check(check: str, verdict: str, summary: str = ""):
    from harness.store.storedrun import StoredCheck

    return StoredCheck("m", "s", check, verdict, summary)


def test_a_footnote_states_the_findings_not_the_passes_and_stays_short():
    from harness.reports.leaderboard.board import Row
    from harness.reports.leaderboard.verdict_matrix import FOOTNOTE_BUDGET, Footnotes, finding

    coverage = ("linear-784: 0/60 trials give a false certificate (p = 1); ball-784: 15/60 "
                "trials give a false certificate (p = 5.1e-32, rejected); calibration of 120 "
                "trials' counts: bias -0.698 (p = 0.485)")  # fmt: skip
    justification = ("16/16 radii have no valid proof, e.g. input 100: R = 1.177607564, "
                     "σ0 = 0.4282727055 gives ξ = 1 >= 1/2")  # fmt: skip
    # the clause that rejected, up to its example
    assert (
        finding(coverage)
        == "ball-784: 15/60 trials give a false certificate (p = 5.1e-32, rejected)"
    )
    assert finding(justification) == "16/16 radii have no valid proof"
    checks = (_check("worst-case-justification", "unjustified", justification),
              _check("coverage", "violated", coverage),
              _check("sigma-regularity", "sound", "worst quotient 0.2000000526 within declared 0.2-semi-elastic"),
              _check("counterexamples", "sound", "no counterexample found"))  # fmt: skip
    row = Row("r", "chen-fgss", "sigma=0.12", {}, "violated", checks, [],
              attack={"inputs": 4}, beyond_attack={0.5: [3, 7]})  # fmt: skip
    notes = Footnotes()
    assert notes.add(row) == "[^v1]"
    (line,) = notes.lines
    # S1 before S3 (the matrix's order); nothing of the checks that passed; the attack's flag
    assert line.startswith("[^v1]: S1\\: ball-784\\: 15/60 trials give a false certificate")
    assert "S3\\: 16/16 radii have no valid proof" in line and "quotient" not in line
    assert "S4" not in line and "attack\\: 2 input(s) certified at radius 0.5" in line
    assert len(line) <= len("[^v1]: ") + FOOTNOTE_BUDGET + 40  # escapes add a few characters
    quiet = Row("r", "cohen", "sigma=0.25", {}, "sound", checks[2:], [], attack={"inputs": 4})
    assert notes.add(quiet) == "" and len(notes.lines) == 1


def test_files_beside_the_board(db, tmp_path, golden_run):
    from harness.reports.leaderboard.verify import PNG_SIGNATURE

    out = tmp_path / "boards" / "golden.md"
    written = {p.name for p in write_board(load_runs(db), out)}
    assert written == {
        "golden.md", "golden.json", "golden.csv", "golden.run.json",
        f"golden.spec-{golden_run.run_id[:12]}.toml",
        "golden-1-certified-accuracy.png", "golden-1-classwise-accuracy.png",
    }  # fmt: skip
    text = out.read_text()
    for name in ("golden-1-certified-accuracy.png", "golden-1-classwise-accuracy.png"):
        data = (out.parent / name).read_bytes()
        assert data[:8] == PNG_SIGNATURE and len(data) > 10_000
        assert f"]({name})" in text
        from PIL import Image

        with Image.open(out.parent / name) as image:
            assert image.size[0] >= 400 and image.size[1] >= 200
            assert sum(1 for n in image.convert("L").histogram() if n) > 10  # not blank


def test_plots_are_deterministic(db, tmp_path):
    runs = load_runs(db)
    write_board(runs, tmp_path / "a" / "b.md")
    write_board(runs, tmp_path / "c" / "b.md")
    for name in ("b-1-certified-accuracy.png", "b-1-classwise-accuracy.png"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "c" / name).read_bytes()


def test_json_matches_its_schema_and_the_metrics(db, tmp_path, golden_run):
    jsonschema = pytest.importorskip("jsonschema")
    from harness.reports.leaderboard.board_schema import BOARD_SCHEMA

    write_board(load_runs(db), tmp_path / "golden.md", plots=False)
    data = json.loads((tmp_path / "golden.json").read_text())
    jsonschema.validate(data, BOARD_SCHEMA)
    flags = {m["key"]: m["higher_is_better"] for m in data["metrics"]}
    assert flags["abstention_rate"] is False and flags["certified_accuracy@0.5"] is True
    # descriptive: σ, the ACR (never used to rank) and the wall time (load not recorded)
    assert flags["mean_sigma"] is None and flags["sigma_median"] is None
    assert flags["acr"] is None and flags["seconds_per_input"] is None
    first = data["rows"][0]
    assert (first["method"], first["setting"], first["section"], first["rank"]) == (
        "cohen", "sigma=0.5", "sound", 1,
    )  # fmt: skip
    assert first["acr"] == 0.75 and isinstance(first["inputs"], int)
    assert first["classwise_accuracy"] == {"0": 0.5, "1": 1.0}
    assert (first["sigma_min"], first["sigma_median"], first["sigma_max"]) == (0.5, 0.5, 0.5)
    assert first["best_at"] == [0.0, 0.25, 0.5, 0.75, 1.0] and first["intervals"]["acr"][0] == 0
    assert set(first["differences"].values()) == {None}  # the reference at every radius
    second = data["rows"][1]
    assert second["best_at"] == [0.0, 0.25]
    assert second["differences"]["0.5"] | {"low": 0, "high": 0} == {
        "radius": 0.5, "inputs": 4, "row_only": 0, "reference_only": 1, "difference": -0.25,
        "low": 0, "high": 0, "reading": "not separated"}  # fmt: skip
    reference = {"run_id": golden_run.run_id, "method": "cohen", "setting": "sigma=0.5"}
    assert data["tables"][0]["references"] == {
        golden_run.recipe_hash: dict.fromkeys(["0", "0.25", "0.5", "0.75", "1"], reference)}  # fmt: skip
    (run,) = data["runs"]
    assert (run["n0"], run["n"], run["alpha"], run["recipe_hash"]) == (10, 100, 0.001,
                                                                     golden_run.recipe_hash)  # fmt: skip
    assert data["failures"][0]["method"] == "alfarra-ds"
    # a wrong type is caught by the schema
    data["rows"][0]["acr"] = "0.75"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, BOARD_SCHEMA)


def test_csv_is_long_form_with_numbers_and_flags(db, tmp_path):
    import pandas as pd

    write_board(load_runs(db), tmp_path / "golden.md", plots=False)
    frame = pd.read_csv(tmp_path / "golden.csv")
    assert frame["value"].dtype.kind == "f" and frame["n"].dtype.kind == "i"
    row = frame[(frame.setting == "sigma=0.25") & (frame.method == "cohen")]
    cert = row[row.metric == "certified_accuracy@0.75"].iloc[0]
    assert (cert["radius"], cert["value"], bool(cert["higher_is_better"])) == (0.75, 0.25, True)
    classes = row[row.metric == "class_accuracy"].sort_values("class")
    assert classes["value"].tolist() == [1.0, 0.5]
    assert set(frame["section"]) == {"sound", "not-certified"}


def test_export_round_trip_gives_the_same_board(db, tmp_path):
    runs = load_runs(db)
    path = tmp_path / "x.run.json"
    path.write_text(export_runs(runs))
    again = read_export(path)
    assert [r.run for r in again] == [r.run for r in runs]
    columns = ("method", "setting", *CERTIFICATE_COLUMNS)

    def exported(run):
        return [tuple(getattr(c, k) for k in columns) for c in run.certificates]

    assert [exported(r) for r in again] == [exported(r) for r in runs]
    assert [r.checks for r in again] == [r.checks for r in runs]
    assert render_markdown(build_board(again), "g") == render_markdown(build_board(runs), "g")


def test_spec_file_reproduces_the_stored_config(db, tmp_path, golden_run):
    import tomllib

    import torch

    from harness.running.benchmark import parse_benchmark
    from harness.running.preparation import resolved

    write_board(load_runs(db), tmp_path / "golden.md", plots=False)
    spec = tomllib.loads((tmp_path / f"golden.spec-{golden_run.run_id[:12]}.toml").read_text())
    defaults = {"radii": (0.0, 0.25, 0.5, 0.75, 1.0), "headline_radius": None}
    # a run stored before precision and noise were recorded: its file names neither, and on
    # its device (cpu, the command's --device) "auto" is what it used, fp32 and block-v1
    protocol = {**golden_run.config["protocol"], "precision": "fp32", "channels_last": False,
                "noise": "block-v1"}  # fmt: skip
    assert resolved(parse_benchmark(spec), torch.device("cpu")).to_dict() == {
        **golden_run.config,
        **defaults,
        "protocol": protocol,
    }
    assert (
        f"idrs-bench run golden.spec-{golden_run.run_id[:12]}.toml --device cpu"
        in (tmp_path / "golden.md").read_text()
    )


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_leaderboard_parser(parser.add_subparsers())
    args = parser.parse_args(["leaderboard", *argv])
    return args.handler(args)


def test_verify_passes_then_fails_with_a_diff(db, tmp_path, capsys, golden_run):
    out = tmp_path / "lb" / "golden.md"
    assert _cli([golden_run.run_id[:6], "--db", str(db), "--out", str(out)]) == 0
    assert _cli(["--verify", str(out)]) == 0
    assert _cli(["--verify", str(out), "--db", str(db)]) == 0
    capsys.readouterr()
    # a hand edit of the committed markdown is caught, with a diff
    out.write_text(out.read_text().replace("| 0.750 [", "| 0.800 [", 1))
    assert _cli(["--verify", str(out)]) == 1
    report = capsys.readouterr().out
    assert "-| 1 | cohen | sigma=0.5 | sound | 0.500 | 0.800 [0.194, 0.994] |" in report
    assert "+| 1 | cohen | sigma=0.5 | sound | 0.500 | 0.750 [0.194, 0.994] |" in report
    assert "differs from its re-rendering" in report


def test_verify_from_the_database_sees_new_check_rows(db, tmp_path, golden_run):
    out = tmp_path / "golden.md"
    write_board(load_runs(db), out)
    golden_run.add_checks(
        db, [(golden_run.run_id, "cohen", "sigma=0.5", "worst-case", "violated", "found x", [])]
    )
    assert verify_board(out) == []  # the committed export is unchanged
    problems = verify_board(out, db)
    assert any("golden.md (committed)" in p for p in problems)
    assert any("golden.run.json" in p for p in problems)


def test_verify_reports_a_missing_plot(db, tmp_path):
    out = tmp_path / "golden.md"
    write_board(load_runs(db), out)
    (tmp_path / "golden-1-classwise-accuracy.png").unlink()
    assert verify_board(out) == [
        f"{tmp_path / 'golden-1-classwise-accuracy.png'}: missing or not a PNG file"
    ]


def test_stdout_rendering_and_latest_run(db, capsys):
    assert _cli(["--db", str(db)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# Leaderboard: golden\n")
    assert "idrs-bench run SPEC.toml --device cpu" in text and ".png" not in text


def test_two_runs_on_the_same_model_share_a_table_with_a_run_column(
    db, tmp_path, monkeypatch, make_run, golden_run
):
    other = "9" * 64
    make_run(db, monkeypatch, run_id=other, checks=[], failure=None, device="cuda:0")
    board = build_board(load_runs(db, [golden_run.run_id, other]))
    (table,) = board.tables
    assert len(table.rows) == 8 and len(table.runs) == 2
    text = render_markdown(board, "two")
    assert "| # | run | method |" in text and "--device cuda" in text
    # a base model made otherwise (another width) gets its own table
    third = "8" * 64
    model = golden_run.config["model"]
    wider = golden_run.config | {"model": model | {"architecture_params": {"width": 999}}}
    make_run(db, monkeypatch, run_id=third, recipe_hash="cd" * 32, checks=[], failure=None,
             config=wider)  # fmt: skip
    board = build_board(load_runs(db, [golden_run.run_id, third]))
    assert [t.recipe_hash for t in board.tables] == [golden_run.recipe_hash, "cd" * 32]


def test_runs_from_several_databases_make_one_board(tmp_path, monkeypatch, make_run, golden_run):
    """``leaderboard a.sqlite b.sqlite --out``: the latest run of each, a table per model."""
    make_run(tmp_path / "a.sqlite", monkeypatch)
    config = golden_run.config | {"name": "other",
                                  "dataset": golden_run.config["dataset"] | {"name": "cone-60"}}  # fmt: skip
    make_run(tmp_path / "b.sqlite", monkeypatch, run_id="5" * 64, config=config,
             recipe_hash="ef" * 32, checks=[])  # fmt: skip
    out = tmp_path / "cone.md"
    assert _cli([str(tmp_path / "a.sqlite"), str(tmp_path / "b.sqlite"), "--out", str(out),
                 "--no-plots"]) == 0  # fmt: skip
    text = out.read_text()
    assert text.startswith("# Leaderboard: golden, other\n")
    assert "## 1. cone-2 · mlp" in text and "## 2. cone-60 · mlp" in text
    exported = [r.run_id for r in read_export(tmp_path / "cone.run.json")]
    assert exported == [golden_run.run_id, "5" * 64]


def test_radii_and_headline_radius_from_the_spec(tmp_path, monkeypatch, make_run, golden_run):
    config = golden_run.config | {"radii": [0.0, 1.0, 2.0], "headline_radius": 1.0}
    make_run(tmp_path / "r.sqlite", monkeypatch, config=config)
    (table,) = build_board(load_runs(tmp_path / "r.sqlite")).tables
    assert (table.radii, table.headline_radius) == ([0.0, 1.0, 2.0], 1.0)
    # certified accuracy at radius 1: sigma=0.5 has 0.5 (radii 1, 1.5), sigma=0.25 has 0
    assert [r.setting for r in table.sound_rows] == ["sigma=0.5", "sigma=0.25"]
    text = render_markdown(build_board(load_runs(tmp_path / "r.sqlite")), "r")
    assert "| cert\\@0 | cert\\@1 | cert\\@2 | ACR |" in text
    # the best sound rows by band of radii: both at 0 (3 of 4), σ = 0.5 alone at radius 1
    # (2 of 4), and no sound row certifies at radius 2
    assert ("- radius 0: cohen (sigma=0.5) and cohen (sigma=0.25), 0.750 [0.194, 0.994]\n"
            "- radius 1: cohen (sigma=0.5), 0.500 [0.068, 0.932]\n"
            "- radius 2: no verified-sound row certifies an input\n") in text  # fmt: skip


def _perturb_acr(path, factor: float) -> tuple[str, str]:
    """Scale the first ACR of a board's JSON by ``factor``; return (old, new) as written."""
    import re

    text = path.read_text()
    match = re.search(r'"acr": ([0-9.e-]+)', text)
    old = match.group(1)
    new = repr(float(old) * factor)
    assert new != old
    path.write_text(text[: match.start(1)] + new + text[match.end(1) :])
    return old, new


def test_verify_accepts_float_noise_in_the_last_digits(db, tmp_path):
    out = tmp_path / "golden.md"
    write_board(load_runs(db), out)
    old, new = _perturb_acr(tmp_path / "golden.json", 1 + 3e-15)  # the 16th digit
    assert abs(float(new) - float(old)) > 0
    assert verify_board(out) == []


def test_verify_names_a_number_that_differs_beyond_the_tolerance(db, tmp_path):
    out = tmp_path / "golden.md"
    write_board(load_runs(db), out)
    old, new = _perturb_acr(tmp_path / "golden.json", 1 + 1e-6)
    problems = verify_board(out)
    assert len(problems) == 1
    assert f"committed {new}, re-rendered {old}" in problems[0]
    assert "golden.json: numbers differ beyond a relative 1e-09" in problems[0]


def test_verify_compares_integers_and_text_exactly(db, tmp_path):
    from harness.reports.leaderboard.verify import numeric_differences

    assert numeric_differences('{"n": 100000, "x": 0.25}', '{"n": 100001, "x": 0.25}') == [
        "line 1: committed 100000, re-rendered 100001"
    ]
    assert numeric_differences("sigma=0.25\nacr 0.5", "sigma=0.25\nacr 0.5000000000001") == []
    assert numeric_differences("a 0.5 | b", "a 0.5 | c") is None
    # digits inside words and hashes are text, versions too
    assert numeric_differences("run 9a2284e1 torch 2.11.0", "run 9a2284e2 torch 2.11.0") is None


def test_precision_and_noise_in_the_header_and_a_warning_for_mixed_protocols(db):
    import copy

    from harness.reports.leaderboard.board_schema import BOARD_SCHEMA
    from harness.reports.leaderboard.tabular import board_json

    (legacy,) = load_runs(db)
    assert "precision" not in render_markdown(build_board([legacy]), "g")  # as rendered before
    bf16 = copy.deepcopy(legacy)
    bf16.run["run_id"] = "f" * 64
    bf16.run["config"]["protocol"] |= {
        "precision": "bf16", "channels_last": True, "noise": "philox-v1",
    }  # fmt: skip
    text = render_markdown(build_board([bf16]), "g")
    assert "batch size 64, precision bf16, channels-last, noise philox-v1 |" in text
    assert "**Warning.**" not in text
    mixed = render_markdown(build_board([legacy, bf16]), "g")
    assert (
        "**Warning.** The runs of this table follow different protocols (precision: fp32, "
        "bf16; channels_last: false, true; noise: block-v1, philox-v1)"
    ) in mixed
    import jsonschema

    document = json.loads(board_json(build_board([legacy, bf16]), "g"))
    jsonschema.validate(document, BOARD_SCHEMA)
    assert document["runs"][1]["precision"] == "bf16" and "precision" not in document["runs"][0]


def test_a_row_whose_input_dependent_sigma_is_one_value_says_so():
    """The published quick board's Lipschitz σ-network sits at σ_min on every input: its
    declared regularity is not a constant, so the board names it as constant-σ in fact;
    cohen's rows (declared constant) and sukenik's (σ varies) are not named."""
    from harness.reports.leaderboard.source import read_export

    runs = read_export(Path(__file__).parents[1] / "leaderboards" / "quick.run.json")
    text = render_markdown(build_board(runs), "quick")
    (note,) = [line for line in text.splitlines() if line.startswith("**One σ for every input")]
    for seed in (0, 1, 2):  # a base model each
        assert (f"lipschitz-sigma-net (active\\_start=True,train\\_steps=2000; σ 0.25 · seed "
                f"{seed}) at σ = 0.65 on all 200 inputs") in note  # fmt: skip
    assert "cohen" not in note and "sukenik" not in note


def test_a_database_supersedes_an_exports_copy_of_its_run(db, tmp_path):
    """A published run audited again in a results database replaces the export's copy on
    the board, in its place; a run named twice by id is still an error."""
    import sqlite3

    from harness.foundation.errors import IdrsError
    from harness.reports.leaderboard.source import resolve_runs

    (run,) = load_runs(db)
    export = tmp_path / "board.run.json"
    export.write_text(export_runs([run]))
    with sqlite3.connect(db) as con:  # the database's audit now says otherwise
        con.execute("UPDATE checks SET verdict = 'violated', summary = 'again'")
    (again,) = resolve_runs([str(export), str(db)], db)
    assert again.run_id == run.run_id
    assert {c.verdict for c in again.checks} == {"violated"} != {c.verdict for c in run.checks}
    (kept,) = resolve_runs([str(db), str(export)], db)  # the later source wins
    assert [c.verdict for c in kept.checks] == [c.verdict for c in run.checks]
    with pytest.raises(IdrsError, match="named twice"):
        resolve_runs([run.run_id[:8], run.run_id[:10]], db)
