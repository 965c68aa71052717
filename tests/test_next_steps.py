"""The commands `run` prints to go on with can be typed as printed, also from a virtual
environment that is not activated (the README's commands run `.venv/bin/idrs-bench`)."""

import os
import sys

from harness.cli.results_table import typed_program


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
