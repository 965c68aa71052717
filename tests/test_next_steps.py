"""The commands `run` prints to go on with can be typed as printed, also from a virtual
environment that is not activated (the README's commands run `.venv/bin/idrs-bench`): the
board it suggests is a new file, never a published board (nor any tracked file), which
`leaderboard --out` overwrites only with `--force`; the pages its footer names exist and
the command it names runs with the Python that runs idrs-bench."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.audit.audit import BUDGETS
from harness.cli.main import main
from harness.cli.next_steps import print_next_steps, typed_program, typed_python
from harness.cli.results_table import attack_statement
from harness.store.store import DEFAULT_DB


def _script(folder, name="idrs-bench"):
    path = folder / name
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_a_script_not_on_path_is_named_by_the_path_it_was_started_by(tmp_path, monkeypatch):
    (tmp_path / "venv-bin").mkdir()
    script = _script(tmp_path / "venv-bin")
    monkeypatch.setattr(sys, "argv", [str(script), "run"])
    monkeypatch.setenv("PATH", str(tmp_path / "elsewhere"))
    assert typed_program() == str(script)


def test_the_script_on_path_is_named_by_its_name(tmp_path, monkeypatch):
    (tmp_path / "bin").mkdir()
    script = _script(tmp_path / "bin")
    monkeypatch.setattr(sys, "argv", [str(script), "run"])
    monkeypatch.setenv("PATH", str(tmp_path / "bin") + os.pathsep + "/usr/bin")
    assert typed_program() == "idrs-bench"


def test_another_idrs_bench_on_path_is_not_this_one(tmp_path, monkeypatch):
    for folder in ("venv", "other"):
        (tmp_path / folder).mkdir()
    mine, other = _script(tmp_path / "venv"), _script(tmp_path / "other")
    monkeypatch.setattr(sys, "argv", [str(mine), "run"])
    monkeypatch.setenv("PATH", str(other.parent))
    assert typed_program() == str(mine)


def test_a_path_with_spaces_is_quoted_for_the_shell(tmp_path, monkeypatch):
    (tmp_path / "my venv").mkdir()
    script = _script(tmp_path / "my venv")
    monkeypatch.setattr(sys, "argv", [str(script), "run"])
    monkeypatch.setenv("PATH", "/nonexistent")
    assert typed_program() == f"'{script}'"


def test_python_dash_m_keeps_the_command_name(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/somewhere/harness/cli/main.py", "run"])
    assert typed_program() == "idrs-bench"


ROOT = Path(__file__).resolve().parents[1]
RUN_ID = "0123456789ab" + "c" * 52


def _tracked() -> set[str] | None:
    """The repository's tracked files (None outside a git checkout)."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        return None
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True,
                            text=True, check=True)  # fmt: skip
    return set(listed.stdout.splitlines())


def _board_hint(capsys, db: Path, name: str = "quick", run_id: str = RUN_ID) -> list[str]:
    """The `leaderboard` command `run` prints, as the shell splits it."""
    print_next_steps(db, run_id, name, [])
    line = next(li for li in capsys.readouterr().out.splitlines() if " leaderboard " in li)
    return shlex.split(line)


@pytest.mark.parametrize("db", [DEFAULT_DB, Path("runs/quick.sqlite")])
def test_the_board_hint_writes_a_new_board_not_a_published_one(db, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # as typed in the checkout
    tokens = _board_hint(capsys, db)
    out = tokens[tokens.index("--out") + 1]
    assert out == str(db.parent / "boards" / f"quick-{RUN_ID[:12]}.md")
    assert not out.startswith("leaderboards/") and not (ROOT / out).exists()
    tracked = _tracked()
    if tracked is not None:
        assert out not in tracked and not any(t.startswith(out) for t in tracked)


def test_typing_the_board_hint_writes_the_board_and_overwrites_only_with_force(
    tmp_path, capsys, monkeypatch, make_run
):
    db = tmp_path / "results.sqlite"
    run_id = make_run(db, monkeypatch)
    monkeypatch.chdir(tmp_path)
    tokens = _board_hint(capsys, db, "golden", run_id)
    board = Path(tokens[tokens.index("--out") + 1])
    assert tokens[:2] == ["idrs-bench", "leaderboard"]
    assert main([*tokens[1:], "--no-plots"]) == 0
    assert board.is_file() and board.with_suffix(".json").is_file()
    capsys.readouterr()
    assert main([*tokens[1:], "--no-plots"]) == 2  # typed twice: refused, nothing written
    assert f"'{board}' exists: pass --force" in capsys.readouterr().err


def test_leaderboard_out_refuses_an_existing_board_without_force(
    tmp_path, capsys, monkeypatch, make_run
):
    db = tmp_path / "results.sqlite"
    make_run(db, monkeypatch)
    board = tmp_path / "boards" / "b.md"
    board.parent.mkdir()
    board.write_text("a published board\n")
    argv = ["leaderboard", "--db", str(db), "--out", str(board), "--no-plots"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert str(board) in err and "--force" in err, err
    assert board.read_text() == "a published board\n"
    assert main([*argv, "--force"]) == 0
    assert board.read_text().startswith("#") and board.with_suffix(".json").is_file()
    # a board whose markdown is gone but its files are there is a board too
    board.unlink()
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert str(board.with_suffix(".json")) in err and "--force" in err, err
    assert not board.exists()


def test_force_without_out_is_an_error(tmp_path, capsys, monkeypatch, make_run):
    db = tmp_path / "results.sqlite"
    make_run(db, monkeypatch)
    assert main(["leaderboard", "--db", str(db), "--force"]) == 2
    assert "--force overwrites the board --out names" in capsys.readouterr().err


def test_the_pages_the_footer_names_exist():
    text = BUDGETS["small"].statement(typed_python()) + attack_statement("small")
    pages = re.findall(r"[\w./-]+\.md\b", text)
    assert pages, text
    for page in pages:
        assert (ROOT / page).is_file(), f"the footer names {page}, which is not in the repository"
    assert "Detection power of the checks" in (ROOT / "leaderboards/README.md").read_text()


def test_the_footers_command_runs_with_the_python_that_runs_idrs_bench(monkeypatch):
    monkeypatch.chdir(ROOT)  # (tests/ is in a checkout, not installed)
    text = BUDGETS["small"].statement(typed_python())
    (command,) = re.findall(r"`([^`]* -m tests\.rigged_methods[^`]*)`", text)
    tokens = shlex.split(command)
    python = shutil.which(tokens[0]) if os.sep not in tokens[0] else tokens[0]
    assert python is not None and os.path.abspath(python) == os.path.abspath(sys.executable)
    done = subprocess.run([*tokens, "--help"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "--budget" in done.stdout, done.stderr[-2000:]


def test_the_python_is_named_as_typed_where_it_was_started(tmp_path, monkeypatch):
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    python = _script(tmp_path / "venv" / "bin", "python3")
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.setenv("PATH", str(python.parent))
    assert typed_python() == "python3"  # an activated environment, or the system's
    monkeypatch.setenv("PATH", str(tmp_path / "elsewhere"))
    monkeypatch.chdir(tmp_path)
    assert typed_python() == "venv/bin/python3"  # not activated, typed from its checkout
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path / "other")
    assert typed_python() == str(python)
