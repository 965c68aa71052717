"""The test suite's layout: modules share helpers through fixtures, never through imports.

Shared helpers are fixtures of ``tests/conftest.py`` or of the fixture modules it names
in ``pytest_plugins``. A test module that imports another module of ``tests/`` (as
``tests.x``, as a top-level ``x`` through the folder pytest puts on ``sys.path``, or
relatively) would load a second copy of it and couple test files to each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent


def _local_names() -> set[str]:
    """Names under which a module or folder of ``tests/`` can be imported."""
    names = {"tests"}
    for path in TESTS.rglob("*"):
        if path.suffix == ".py" and path.stem != "__init__":
            names.add(path.stem)
        elif path.is_dir() and path.name != "__pycache__":
            names.add(path.name)
    return names


def imported_test_modules(source: str, local: set[str]) -> list[str]:
    """The imports in ``source`` that load a module of ``tests/`` (including imports
    inside functions and ``importlib.import_module``/``__import__`` of a literal name)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from . import x
                found.append("." * node.level + (node.module or ""))
                continue
            names = [node.module or ""]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        else:
            continue
        found.extend(n for n in names if n.split(".")[0] in local)
    return found


def test_no_test_file_imports_another_test_module():
    local = _local_names()
    offenders = {
        str(path.relative_to(TESTS.parent)): imports
        for path in sorted(TESTS.rglob("*.py"))
        if (imports := imported_test_modules(path.read_text(), local))
    }
    assert offenders == {}, (
        "test files import other test modules; make the helper a fixture in "
        f"tests/conftest.py (or a fixture module in its pytest_plugins): {offenders}"
    )


def test_the_check_sees_every_form_of_import():
    local = {"tests", "conftest", "field_files", "test_cli_errors"}
    source = """
import numpy
from harness.foundation.data import Dataset
from tests.conftest import LinearModel
from tests import soundness_plugins
import field_files
from . import helpers


def f():
    from test_cli_errors import BASE
    importlib.import_module("tests.golden_run")
    pytest_plugins = ["tests.field_files"]  # a string, not an import
"""
    assert imported_test_modules(source, local) == [
        "tests.conftest", "tests", "field_files", ".", "test_cli_errors", "tests.golden_run",
    ]  # fmt: skip
