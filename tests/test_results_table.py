"""The results table (`idrs-bench results`, the end of `idrs-bench run`) fits the terminal,
a pipe and $COLUMNS: every row's method, setting and verdict are shown whole, then as many
of the other columns as fit, a line names those left out, and `--wide` shows them all."""

import io

import pytest
from rich.console import Console

from harness.cli.console import RUN_WIDTH
from harness.cli.main import main
from harness.cli.results_table import print_results, print_table

LONG = ("alfarra-ds-memory", "num_samples=64,sigma=0.25")
HEADERS = ["inputs", "clean acc", "cert@0", "cert@0.25", "cert@0.5", "cert@0.75", "cert@1",
           "ACR", "abstain", "misclass", "mean σ", "s/input"]  # fmt: skip
QUICK = [("cohen", "sigma=0.12"), ("cohen", "sigma=0.25"), ("cohen", "sigma=0.5"),
         ("sukenik", "sigma=0.12"), ("sukenik", "sigma=0.25"), ("sukenik", "sigma=0.5"),
         ("chen-fgss", "sigma=0.25"), ("alfarra-ds", "sigma=0.25"),
         ("alfarra-ds-memory", "sigma=0.25"), ("lipschitz-sigma-net", "default"),
         ("dual-rs", "default")]  # fmt: skip
"""The quick board's rows."""


@pytest.fixture
def db(tmp_path, monkeypatch, make_run, golden_run):
    """The golden run (one row's verdict with flags, a failed row) and a row of long names."""
    path = tmp_path / "results.sqlite"
    rows = golden_run.rows
    make_run(path, monkeypatch, rows=rows | {LONG: rows["cohen", "sigma=0.5"]})
    return path


def _row(method: str, setting: str, verdict: str = "sound", flags: tuple = ()) -> dict:
    """A row of the table as :func:`print_results` makes it."""
    accuracy = {r: 0.5 for r in ("0", "0.25", "0.5", "0.75", "1")}
    return {"method": method, "setting": setting, "inputs": 200, "clean_accuracy": 0.71,
            "clean_accuracy_interval": [0.642, 0.772], "certified_accuracy": accuracy,
            "certified_accuracy_interval": {r: [0.43, 0.57] for r in accuracy}, "acr": 0.4,
            "abstention_rate": 0.1, "misclassification_rate": 0.2, "mean_sigma": 0.25,
            "seconds_per_input": 0.01, "complete": True, "verdict_brief": verdict,
            "flags": list(flags),
            "verdict": verdict + (f" ({', '.join(flags)})" if flags else "")}  # fmt: skip


def _table_lines(text: str) -> list[str]:
    """The lines of ``text`` before the list of checks applied (the table, its caption and
    the line naming the columns left out)."""
    lines = text.splitlines()
    end = next((k for k, line in enumerate(lines) if line.startswith("checks applied")), None)
    return lines[:end]


def _assert_whole(text: str, rows: list[dict], verdict: str = "verdict_brief") -> None:
    """Every row is a line of ``text`` that shows its method, setting and verdict whole (a
    setting of several parameters possibly one per line, the next ones on the lines below)."""
    assert "…" not in text, text
    lines = text.splitlines()
    for row in rows:
        found = False
        for k, line in enumerate(lines):
            words = line.split()
            if words[:1] != [row["method"]] or len(words) < 2 or row[verdict] not in line:
                continue
            setting, below = words[1], k + 1
            while setting != row["setting"] and below < len(lines) and lines[below][:1] == " ":
                setting += lines[below].split()[0]  # the setting's next parameter
                below += 1
            found = found or setting == row["setting"]
        assert found, (row["method"], row["setting"], row[verdict], text)


def _header(text: str) -> list[str]:
    """The headers of the table in ``text`` (its line that begins with ``method``)."""
    line = next(line for line in text.splitlines() if line.startswith("method "))
    return [h for h in HEADERS if f" {h} " in f" {line} "]


def _render(db, width: int, **options) -> tuple[str, list[dict]]:
    out = io.StringIO()
    rows = print_results(db, None, as_json=False, console=Console(file=out, width=width),
                         **options)  # fmt: skip
    return out.getvalue(), rows


@pytest.mark.parametrize("width", [80, 120])
def test_a_terminal_of_80_or_120_columns_shows_every_name_and_verdict_whole(db, width):
    text, rows = _render(db, width)
    assert {(r["method"], r["setting"]) for r in rows} >= {LONG, ("chen-fgss", "sigma=0.25")}
    _assert_whole(text, rows)
    assert max(map(len, _table_lines(text))) <= width, text
    left_out = [h for h in HEADERS if h not in _header(text)]
    assert left_out, text  # (the golden run's intervals and radii do not fit 120 columns)
    note = " ".join(" ".join(_table_lines(text)[-3:]).split())
    assert f"left out to fit {width} columns: {', '.join(left_out)}; --wide" in note, text
    # the flags the verdict column leaves out are listed below the table, by row
    chen = next(line for line in text.splitlines() if line.startswith("  chen-fgss sigma=0.25"))
    assert chen.endswith("; flags: counterexample, sigma-search"), chen


def test_the_quick_boards_rows_at_80_columns_show_the_headline_metrics():
    rows = [_row(m, s, "unsound" if m == "sukenik" else "sound") for m, s in QUICK]
    out = io.StringIO()
    left_out = print_table(Console(file=out, width=80), "run · quick", rows, 0.5)
    text = out.getvalue()
    _assert_whole(text, rows)
    assert max(map(len, text.splitlines())) <= 80, text
    assert _header(text)[:4] == ["inputs", "clean acc", "cert@0.5", "ACR"], text
    assert left_out == [h for h in HEADERS if h not in _header(text)]


def test_piped_the_table_fits_100_columns_and_shows_every_name_and_verdict(db, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["results", "--db", str(db)]) == 0
    text = capsys.readouterr().out
    _, rows = _render(db, RUN_WIDTH)
    _assert_whole(text, rows)
    assert max(map(len, _table_lines(text))) <= RUN_WIDTH, text
    assert "--wide shows every column" in text


def test_at_300_columns_every_column_is_shown_with_its_interval(db, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    assert main(["results", "--db", str(db)]) == 0
    text = capsys.readouterr().out
    _, rows = _render(db, 300)
    _assert_whole(text, rows)
    assert _header(text) == HEADERS and "left out" not in text, text
    assert "0.750 [0.194, 0.994]" in text and "95 % Clopper–Pearson interval" in text
    assert max(map(len, _table_lines(text))) <= 300


def test_wide_shows_every_column_and_the_verdicts_flags(db, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["results", "--db", str(db), "--wide"]) == 0
    text = capsys.readouterr().out
    _, rows = _render(db, 80, wide=True)
    _assert_whole(text, rows, verdict="verdict")
    assert _header(text) == HEADERS and "left out" not in text, text
    assert "violated (counterexample, sigma-search)" in text
    assert max(map(len, _table_lines(text))) > 80  # wider than asked: every column


def test_names_wider_than_the_terminal_are_still_whole():
    rows = [_row("a-plugin-method-with-a-very-long-name", "sigma_min=0.1,train_steps=2000",
                 "violated", ("counterexample",))]  # fmt: skip
    out = io.StringIO()
    left_out = print_table(Console(file=out, width=40), "run", rows, 0.5)
    _assert_whole(out.getvalue(), rows)
    assert left_out == HEADERS


def test_runs_compact_table_names_the_command_that_shows_every_column():
    rows = [_row(m, s) for m, s in QUICK]
    out = io.StringIO()
    wider = "`idrs-bench results 0123456789ab --wide`"
    left_out = print_table(Console(file=out, width=60), "run", rows, 0.5, compact=True,
                           wider=wider)  # fmt: skip
    text = out.getvalue()
    _assert_whole(text, rows)
    assert left_out and set(left_out) <= {"inputs", "clean acc", "cert@0.5", "ACR"}
    assert wider in " ".join(" ".join(text.splitlines()[-3:]).split()), text


def test_long_settings_fold_at_their_commas_so_that_the_headline_fits_80_columns():
    rows = [_row(m, s) for m, s in QUICK]
    rows += [_row("alfarra-ds", "sigma=0.25,steps=cross-validated"),
             _row("lipschitz-sigma-net", "active_start=True,train_steps=2000")]  # fmt: skip
    out = io.StringIO()
    print_table(Console(file=out, width=80), "run · quick", rows, 0.5)
    text = out.getvalue()
    _assert_whole(text, rows)
    assert max(map(len, text.splitlines())) <= 80, text
    assert {"clean acc", "cert@0.5"} <= set(_header(text)), text
    assert "steps=cross-validated" in text and "sigma=0.25,steps" not in text
