"""The README and the documentation say what the code does.

The CLI reference's usage lines are argparse's and every command has one; every
``idrs-bench`` command the pages show parses with the CLI's parser (a benchmark file it
names loads and validates against the built-in plugins, a repository path it names
exists) and every ``python3 -m`` module exists; every Python example runs, the examples
of a page one after another as a reader would run them; the plugin example registers,
imports torch only where it is used and runs in the plugin host; CI runs the README's
test command; the board rows the README shows are the published board's; every page is
in the site's navigation.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import shlex
from pathlib import Path

import pytest
import torch

from harness.cli.main import _parser
from harness.plugin.manager import PluginManager

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [
    README,
    ROOT / "harness" / "README.md",
    ROOT / "leaderboards" / "README.md",
    *sorted(DOCS.glob("*.md")),
]
"""The pages written by hand (the site's boards/ is leaderboards/, its generated boards
besides its README; docs/architecture.md includes harness/README.md)."""
REPOSITORY_PATHS = ("harness/", "plugins/", "leaderboards/", "tests/", "docs/", "tools/")
VENV = {".venv/bin/idrs-bench": "idrs-bench", ".venv/bin/python": "python3"}
"""The README's virtual environment's commands, called without activating it, and what
they are once it is activated."""

_SNIPPET = re.compile(r'^--8<-- "(?P<file>[^":]+):(?P<section>[\w-]+)"$', re.M)
_FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.M | re.S)


def _section(path: Path, name: str) -> str:
    """The lines of ``path`` between its ``--8<-- [start:name]`` and ``[end:name]`` markers
    (pymdownx.snippets' sections, which the site includes)."""
    lines = path.read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if f"--8<-- [start:{name}]" in line)
    end = next(i for i, line in enumerate(lines) if f"--8<-- [end:{name}]" in line)
    return "".join(lines[start + 1 : end])


def _text(page: Path) -> str:
    """A page as the site shows it: its snippets included."""
    return _SNIPPET.sub(lambda m: _section(ROOT / m["file"], m["section"]), page.read_text())


def _blocks(page: Path, *langs: str) -> list[str]:
    return [m["body"] for m in _FENCE.finditer(_text(page)) if m["lang"] in langs]


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


# --- the CLI reference ---------------------------------------------------------------


def _usage_lines() -> dict[str, str]:
    """command -> its usage line in docs/cli.md's block (continuations joined)."""
    block = (DOCS / "cli.md").read_text().split("## Every command", 1)[1]
    block = block.split("```text\n", 1)[1].split("```")[0]
    lines: list[str] = []
    for line in block.splitlines():
        if line.startswith("idrs-bench "):
            lines.append(line)
        elif line.strip():
            lines[-1] += " " + line.strip()
    out = {}
    for line in lines:
        command = line.split()[1]
        assert command not in out, f"two usage lines for {command}"
        out[command] = " ".join(line.split())
    return out


def _argparse_lines() -> dict[str, str]:
    """command -> argparse's usage line (without ``-h``)."""
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    out = {}
    for name, parser in sub.choices.items():
        usage = " ".join(parser.format_usage().split()).removeprefix("usage: ")
        out[name] = usage.replace(" [-h]", "")
    return out


def test_every_command_has_its_usage_line_as_argparse_has_it():
    documented, actual = _usage_lines(), _argparse_lines()
    assert sorted(documented) == sorted(actual)
    for command, line in actual.items():
        assert documented[command] == line, command


# --- every command shown runs ----------------------------------------------------------


def _shell_commands(page: Path) -> list[str]:
    """The commands of a page: each line (continuations joined) of its sh blocks, split at
    ``&&``, ``;`` and a trailing ``&``, and its inline code spans that are commands."""
    commands = []
    for block in _blocks(page, "sh"):
        for line in block.replace("\\\n", " ").splitlines():
            line = "" if line.lstrip().startswith("#") else line.split("  #")[0]  # comments
            for part in re.split(r"&&|;", line):
                part = part.strip().removesuffix("&").strip()
                if part:
                    commands.append(part)
    prose = _FENCE.sub("", _text(page))
    commands += re.findall(r"`((?:idrs-bench|python3 -m) [^`]+)`", prose)
    return commands


@pytest.fixture(scope="module")
def registry():
    return PluginManager(third_party=False).registry


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_command_shown_parses(page, registry, monkeypatch):
    from harness.running.benchmark import DEFAULT_BENCHMARK, load_benchmark

    monkeypatch.chdir(ROOT)  # paths in the commands are relative to the repository
    parser = _parser()
    for command in _shell_commands(page):
        tokens = shlex.split(command)
        tokens[:1] = [VENV.get(tokens[0], tokens[0])]  # README's environment, not activated
        for before, token in zip(["", *tokens], tokens, strict=False):
            path = token.split("=", 1)[-1]
            written = before in ("--out", "--db", "--db-b") or token.startswith("--out=")
            if path.startswith(REPOSITORY_PATHS) and not written and "$" not in path:
                assert (ROOT / path).exists(), f"{_name(page)}: {command!r} names {path}"
        if tokens[:2] == ["python3", "-m"]:
            if tokens[2] != "pytest":
                assert importlib.util.find_spec(tokens[2]) is not None, command
            continue
        if tokens[0] != "idrs-bench":
            continue
        try:
            args = parser.parse_args(tokens[1:])
        except SystemExit as exc:  # --help exits with 0
            assert exc.code == 0, f"{_name(page)}: {command!r} does not parse"
            continue
        if tokens[1] == "run" and "$" not in command:
            spec = args.spec or DEFAULT_BENCHMARK
            if Path(spec).is_file():
                _validate(load_benchmark(spec, args.set), registry)


def _validate(spec, registry) -> None:
    """Validate ``spec``; a checkpoint it names outside the repository is the user's file
    (e.g. Cohen et al.'s released models), not there to be found."""
    from harness.foundation.errors import SpecError
    from harness.running.benchmark import validate

    try:
        validate(spec, registry)
    except SpecError as exc:
        checkpoint = str(spec.model.checkpoint)
        if checkpoint.startswith(REPOSITORY_PATHS) or "model.checkpoint" not in str(exc):
            raise


# --- every Python example runs ----------------------------------------------------------


def _pages_with_python() -> list[Path]:
    return [page for page in PAGES if _blocks(page, "python")]


@pytest.mark.parametrize("page", _pages_with_python(), ids=_name)
def test_every_python_example_runs(page, tmp_path, monkeypatch):
    """The examples of a page, one after another in one namespace (in a scratch folder)."""
    from harness.api import CERTIFICATE_COLUMNS

    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    for k, code in enumerate(_blocks(page, "python")):
        exec(compile(code, f"{_name(page)}, example {k + 1}", "exec"), namespace)
    if "table" in namespace:  # the certify example: Cohen's method unless another is named
        table = namespace["table"]
        assert list(table.columns) == list(CERTIFICATE_COLUMNS) and len(table) == 8
        assert set(table["method"]) == {"cohen"}
    if "idrs" in namespace:
        assert len(namespace["idrs"]) == 8 and (namespace["idrs"]["sigma"] > 0).all()
    if "verdicts" in namespace:  # run, then check: one row per check of the one setting
        assert namespace["out"]["summary"]["inputs"].tolist() == [4]
        verdicts = namespace["verdicts"]
        assert "evidence" in set(verdicts["check"]) and set(verdicts["setting"]) == {"sigma=0.5"}


# --- the plugin example --------------------------------------------------------------


def _plugin_example() -> str:
    section = README.read_text().split("## A plugin in thirty lines", 1)[1]
    return re.search(r"```python\n(# idrs_half_sigma\.py.*?)```", section, re.S).group(1)


def test_the_plugin_example_is_thirty_lines_and_imports_torch_only_where_used(tmp_path):
    source = _plugin_example()
    assert len(source.splitlines()) <= 30
    top_level = [
        node for node in ast.parse(source).body if isinstance(node, ast.Import | ast.ImportFrom)
    ]
    imported = {alias.name for node in top_level for alias in node.names}
    imported |= {node.module for node in top_level if isinstance(node, ast.ImportFrom)}
    assert "torch" not in imported and imported <= {"harness", "Constant", "MethodSpec",
                                                    "SigmaProviderSpec", "hookimpl"}  # fmt: skip
    path = tmp_path / "idrs_half_sigma.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("idrs_half_sigma", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    manager = PluginManager(third_party=False)
    manager.register(module, "half", "0.1")
    registry = manager.registry
    method = registry.get("methods", "cohen-half")
    assert (method.sigma_provider, method.certifier) == ("half", "cohen")
    provider = registry.get("sigma_providers", "half").build(None, {"sigma": 0.5})
    assert torch.equal(provider(torch.zeros(3, 2)), torch.full((3,), 0.25))
    assert provider.regularity.sigma == 0.25


def test_the_plugin_example_is_installed_and_runs_in_the_plugin_host(install_plugin):
    install_plugin("idrs_half_sigma", _plugin_example(), "idrs-half-sigma", entry_point="half")
    manager = PluginManager()
    rows = {row["name"]: row for row in manager.describe()}
    assert rows["half"]["runs_in"] == "plugin host" and rows["half"]["version"] == "0.1"
    assert [f for f in manager.failures if f.plugin == "half"] == []
    method = manager.registry.get("methods", "cohen-half")
    assert (method.sigma_provider, method.certifier) == ("half", "cohen")


def test_every_hook_is_documented_in_hookspecs_and_on_the_plugin_page():
    from harness.plugin import hookspecs
    from harness.plugin.registry import COMPONENT_KINDS

    tree = ast.parse(Path(hookspecs.__file__).read_text())
    hooks = {f.name: ast.get_docstring(f) for f in tree.body
             if isinstance(f, ast.FunctionDef) and f.name.startswith("idrs_")}  # fmt: skip
    assert set(hooks) == {f"idrs_register_{kind}" for kind in COMPONENT_KINDS}
    assert all(doc and len(doc) > 20 for doc in hooks.values()), hooks
    page = _text(DOCS / "plugins.md")
    assert [h for h in hooks if f"`{h}`" not in page] == []


# --- the front page ------------------------------------------------------------------


def test_ci_runs_both_readme_commands_with_the_distributions_python_and_builds_the_site():
    """.ci/run finds the README's two commands (one line each, in a virtual environment of
    the distribution's own Python: no ``--break-system-packages``) and runs them with
    /usr/bin first on PATH: the suite once, then the tests that end processes or assert
    verdicts again with every core kept busy (each of them a test file that exists)."""
    script = (ROOT / ".ci" / "run").read_text()
    patterns = re.findall(r"grep -m1 -E '([^']+)' README\.md", script)
    text = README.read_text()
    commands = [_FENCE.search(text.split(heading, 1)[1])["body"].strip()
                for heading in ("Set up and run the default", "Set up and run the tests")]  # fmt: skip
    for pattern, command in zip(patterns, commands, strict=True):
        assert [line for line in text.splitlines() if re.search(pattern, line)] == [command]
    run, test = commands
    for command in commands:
        assert "\n" not in command and "break-system-packages" not in command
        assert "python3-venv dataset-fashion-mnist && python3 -m venv .venv &&" in command
    assert run.endswith(" && .venv/bin/idrs-bench run")
    assert test.endswith(" && .venv/bin/python -m pytest")
    assert 'export PATH="/usr/bin:$PATH"' in script and "!= /usr/bin/python3" in script
    assert 'bash -c "$setup"' in script and 'bash -c "$test_command"' in script
    assert "mkdocs build --strict" in script
    [repeated] = re.findall(r"REPEATED=\(([^)]*)\)", script)
    files = repeated.split()
    assert len(files) >= 5 and all((ROOT / f).is_file() for f in files), files
    assert "for ((c = 0; c < $(nproc); c++))" in script and '"${REPEATED[@]}"' in script


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_the_board_rows_on_the_front_page_are_the_published_boards():
    readme = README.read_text().splitlines()
    start = readme.index(next(line for line in readme if line.startswith("| model | method |")))
    header = _cells(readme[start])
    board = (ROOT / "leaderboards" / "quick.md").read_text().splitlines()
    board_header = _cells(next(line for line in board if line.startswith("| # | model |")))
    rows = []
    for line in readme[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line)
    assert len(rows) == 3
    for line in rows:
        shown = dict(zip(header, _cells(line), strict=True))
        published = next(
            dict(zip(board_header, _cells(b), strict=True)) for b in board
            if b.startswith("| ")
            and _cells(b)[1:4] == [shown["model"], shown["method"], shown["setting"]]
        )  # fmt: skip
        for column, value in shown.items():  # (headers escaped as the board's: cert\@0.5)
            if column == "verdict":
                assert published[column].split(" [^")[0] == value
            else:
                assert published[column] == value, (shown["method"], column)


def test_every_page_is_in_the_site_navigation():
    site = (ROOT / "mkdocs.yml").read_text()
    assert [p.name for p in DOCS.glob("*.md") if f": {p.name}" not in site] == []
    assert [p.name for p in (ROOT / "leaderboards").glob("*.md")
            if f"boards/{p.name}" not in site] == []  # fmt: skip
