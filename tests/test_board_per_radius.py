"""A board read per radius: the envelope of the sound rows and its marks, the paired
differences from the best constant-σ row, σ as a distribution, and headers that say what
re-checking establishes and what each digest hashes."""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
from pathlib import Path

import pytest

from harness.reports.leaderboard.board import build_board
from harness.reports.leaderboard.envelope import bands, best_rows, envelope_curve
from harness.reports.leaderboard.markdown import render_markdown
from harness.reports.leaderboard.paired_differences import constant_sigma
from harness.reports.leaderboard.source import read_export
from harness.store.storedrun import load_runs

BOARDS = Path(__file__).resolve().parent.parent / "leaderboards"

# a small σ certifies every input a little way out; a larger one certifies fewer further out;
# a third, input-dependent, certifies at 1 what the larger one does and one input more
ROWS = {
    ("cohen", "sigma=0.12"): [(0, 0, 0.3, 0.12, 1), (0, 0, 0.3, 0.12, 1),
                              (1, 1, 0.3, 0.12, 1), (1, 1, 0.3, 0.12, 1)],
    ("cohen", "sigma=0.5"): [(0, 0, 1.2, 0.5, 1), (0, 0, 1.2, 0.5, 1),
                             (-1, 1, 0.0, 0.5, 1), (-1, 1, 0.0, 0.5, 1)],
    ("sukenik", "sigma=0.5"): [(0, 0, 1.2, 0.5, 1), (0, 0, 1.3, 0.52, 1),
                               (1, 1, 1.1, 0.6, 1), (-1, 1, 0.0, 0.49, 1)],
    ("chen-fgss", "sigma=0.5"): [(0, 0, 3.0, 0.5, 1), (0, 0, 3.0, 0.9, 1),
                                 (1, 1, 3.0, 1.9, 1), (1, 1, 3.0, 0.5, 1)],
}  # fmt: skip
SOUND = [("cohen", "sigma=0.12"), ("cohen", "sigma=0.5"), ("sukenik", "sigma=0.5")]


@pytest.fixture
def table(tmp_path, monkeypatch, make_run):
    checks = [(*key, "evidence", "sound", "", []) for key in SOUND]
    checks.append(("chen-fgss", "sigma=0.5", "evidence", "violated", "edited radii", []))
    make_run(tmp_path / "r.sqlite", monkeypatch, rows=ROWS, checks=checks, failure=None)
    (table,) = build_board(load_runs(tmp_path / "r.sqlite")).tables
    return table


def _names(rows) -> list[str]:
    return [f"{r.method} {r.setting}" for r in rows]


def test_the_best_sound_rows_at_each_radius_and_their_bands(table):
    assert table.radii == [0.0, 0.25, 0.5, 0.75, 1.0]
    # 0, 0.25: σ = 0.12 certifies all 4; 0.5-1: sukenik 3 of 4, cohen σ = 0.5 2; the unsound
    # row (4 of 4 everywhere) is never best
    assert _names(best_rows(table, 0.0)) == ["cohen sigma=0.12"]
    assert _names(best_rows(table, 0.5)) == ["sukenik sigma=0.5"]
    assert [(b.radii, _names(b.rows)) for b in bands(table)] == [
        ((0.0, 0.25), ["cohen sigma=0.12"]),
        ((0.5, 0.75, 1.0), ["sukenik sigma=0.5"]),
    ]
    grid = [0.0, 0.3, 0.31, 1.1, 1.15, 1.25, 1.3, 1.31, 3.0]
    # the highest of the sound curves at each radius, past every single row's own cap
    assert envelope_curve(table.sound_rows, grid) == [1, 1, 0.75, 0.75, 0.5, 0.25, 0.25, 0, 0]
    assert envelope_curve([], grid) is None


def test_bold_marks_the_envelope_and_the_headline_reads_it_by_band(table):
    text = render_markdown(build_board(table.runs), "t")
    lines = {line.split(" | ")[1] + " " + line.split(" | ")[2]: line for line in
             text.split("### Verified sound")[1].split("###")[0].splitlines()
             if line.startswith("| ") and line[2].isdigit()}  # fmt: skip
    assert lines["cohen sigma=0.12"].count("**") == 4  # bold at 0 and 0.25
    assert lines["sukenik sigma=0.5"].count("**") == 6  # bold at 0.5, 0.75, 1
    assert "**" not in lines["cohen sigma=0.5"]
    unsound = text.split("### Not verified sound")[1].split("###")[0]
    assert "**" not in unsound and "| leader |" not in unsound
    assert "- radii 0–0.25: cohen (sigma=0.12), 1.000 [0.398, 1.000] at 0, 1.000 " in text
    assert "- radii 0.5–1: sukenik (sigma=0.5), 0.750 [0.194, 0.994] at 0.5" in text


def test_each_row_is_paired_with_the_best_constant_sigma_sound_row_at_each_radius(table):
    rows = {f"{r.method} {r.setting}": r for r in table.rows}
    assert constant_sigma(rows["cohen sigma=0.5"]) and not constant_sigma(rows["sukenik sigma=0.5"])
    # sukenik is best at 0.5 but its σ varies: the reference there is cohen σ = 0.5
    (references,) = table.references.values()  # one base model
    assert {r: _names([ref])[0] for r, ref in references.items()} == {
        0.0: "cohen sigma=0.12", 0.25: "cohen sigma=0.12", 0.5: "cohen sigma=0.5",
        0.75: "cohen sigma=0.5", 1.0: "cohen sigma=0.5",
    }  # fmt: skip
    sukenik = rows["sukenik sigma=0.5"].differences[0.5]
    # at 0.5: both certify inputs 0, 1; sukenik input 2 too: a = 2, b = 1, c = 0, d = 1
    assert (sukenik.row_only, sukenik.reference_only, sukenik.difference) == (1, 0, 0.25)
    assert sukenik.reading == "not separated"  # 4 inputs: the interval contains 0
    assert rows["cohen sigma=0.5"].differences[0.5] is None  # the reference itself
    text = render_markdown(build_board(table.runs), "t")
    section = text.split("### Paired differences from the best constant-σ row")[1]
    assert "(radii 0–0.25: cohen (sigma=0.12); radii 0.5–1: cohen (sigma=0.5))" in section
    assert "| sukenik | sigma=0.5 | -0.250 [" in section and "| reference | reference |" in section
    assert "tie (" not in section


def test_sigma_as_a_distribution_over_the_inputs(table):
    rows = {f"{r.method} {r.setting}": r for r in table.rows}
    chen = rows["chen-fgss sigma=0.5"].metrics
    assert (chen["sigma_min"], chen["sigma_median"], chen["sigma_max"]) == (0.5, 0.7, 1.9)
    text = render_markdown(build_board(table.runs), "t")
    assert "| chen-fgss | sigma=0.5 | violated | 0.500 / 0.700 / 1.900 |" in text
    assert "| cohen | sigma=0.5 | sound | 0.500 |" in text  # one σ: one number


def test_sigma_of_a_published_row_is_its_certificates_distribution():
    """quick's chen-fgss (setting sigma=0.25): σ(x) read straight from the export."""
    runs = read_export(BOARDS / "quick.run.json")
    raw = next(run for run in json.loads((BOARDS / "quick.run.json").read_text())["runs"]
               if any(c["method"] == "chen-fgss" for c in run["certificates"]))  # fmt: skip
    sigma = next(c["columns"]["sigma"] for c in raw["certificates"]
                 if (c["method"], c["setting"]) == ("chen-fgss", "sigma=0.25"))  # fmt: skip
    (table,) = build_board(runs).tables
    (row,) = [r for r in table.rows
              if r.method == "chen-fgss" and r.run_id == raw["run"]["run_id"]]  # fmt: skip
    assert (row.metrics["sigma_min"], row.metrics["sigma_median"], row.metrics["sigma_max"]) == (
        min(sigma), statistics.median(sigma), max(sigma))  # fmt: skip
    assert row.metrics["sigma_median"] > 2 * 0.25  # what "sigma=0.25" alone would hide


def test_the_header_says_what_verify_establishes_as_the_command_prints_it(db_board, capsys):
    from harness.reports.leaderboard.cli import add_leaderboard_parser

    header = db_board.read_text().split("\n## ")[0]
    assert (
        "`idrs-bench leaderboard --verify golden.md` re-derives every certificate and the "
        "verdicts of S0 and the replay check from the evidence in `golden.run.json`"
    ) in header
    assert "the other checks' verdicts are read as recorded, and re-run only with `--reaudit`" \
        in header  # fmt: skip
    parser = argparse.ArgumentParser()
    add_leaderboard_parser(parser.add_subparsers())
    args = parser.parse_args(["leaderboard", "--verify", str(db_board)])
    assert args.handler(args) == 0
    out = capsys.readouterr().out
    assert "and the verdicts of S0 and the replay check re-derived from the run export" in out
    assert "read as recorded, not re-run: --reaudit re-runs every check" in out


@pytest.fixture
def db_board(tmp_path, monkeypatch, make_run):
    from harness.reports.leaderboard.render import write_board

    make_run(tmp_path / "g.sqlite", monkeypatch)
    out = tmp_path / "board" / "golden.md"
    write_board(load_runs(tmp_path / "g.sqlite"), out, plots=False)
    for name in ("golden-1-certified-accuracy.png", "golden-1-classwise-accuracy.png"):
        (out.parent / name).write_bytes(b"\x89PNG\r\n\x1a\n")  # --verify wants them there
    return out


def test_the_weights_are_named_for_what_each_digest_hashes():
    """quick's protocol: the parameters' digest (not a file's) and the shipped file's
    SHA-256, which is what sha256sum gives for the shipped quick.weights-RUN.pt."""
    runs = read_export(BOARDS / "quick.run.json")
    text = render_markdown(build_board(runs), "quick")
    shipped = BOARDS / f"quick.weights-{runs[0].run_id[:12]}.pt"
    file_digest = hashlib.sha256(shipped.read_bytes()).hexdigest()
    parameters = runs[0].run["weights_digest"]
    assert parameters != file_digest
    assert (f"| weights: parameters' digest | `{parameters}` (SHA-256 over each tensor's name, "
            "dtype, shape and bytes; not the file's) |") in text  # fmt: skip
    assert f"| weights file: SHA-256 | `{file_digest}` (of the shipped file" in text
    assert "weights (SHA-256)" not in text


def test_the_headline_names_the_sound_rows_above_the_constant_sigma_reference():
    """cone (N = 60): sukenik certifies at radius 4 where the best cohen row certifies
    little; the paired intervals exclude 0 there, and the headline says so, radius by
    radius, with the interval."""
    text = render_markdown(build_board(read_export(BOARDS / "cone.run.json")), "cone")
    second = text.split("\n## 2. ")[1].split("### Verified sound")[0]
    assert "radius 4: sukenik (max\\_ratio=5.0,rate=0.03,sigma=1.0), 0.140 [0.111, 0.174]" in second
    assert (
        "above it by its 95% interval: sukenik (max\\_ratio=5.0,rate=0.03,sigma=0.8) at radius "
        "0 (+0.024 [+0.010, +0.039])"
    ) in second
    assert "sukenik (max\\_ratio=5.0,rate=0.03,sigma=1.0) at radius 4 (+0.140 [" in second


def test_a_board_of_several_runs_names_the_weights_files_it_ships():
    """quick (nine runs): the header names one weights file per run, and each is there."""
    runs = read_export(BOARDS / "quick.run.json")
    header = render_markdown(build_board(runs), "quick").split("\n## ")[0]
    assert "`quick.weights-RUN.pt`, one per run" in header and "`quick.weights.pt`" not in header
    assert all((BOARDS / f"quick.weights-{run.run_id[:12]}.pt").is_file() for run in runs)
