"""The core's layers (docs/architecture.md, "Layout"): imports only go down.

Each folder of ``harness/`` is one layer; the list below orders them along the data
path, lowest first. A module may import from its own layer and the layers below it,
never from a layer above (imports inside functions and under ``TYPE_CHECKING``
included), and never from ``plugins``: the core reaches a plugin only through the
registry. ``harness/__init__.py`` (the plugin API) and ``harness/api.py`` (the API for
scripts) sit on top.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = [
    "foundation",  # errors, progress, files, the protocol, the vocabulary of a run
    "mathematics",  # radii, worst case, statistics, certified accuracy
    "engine",  # noise, sampling, precision, batch size, the harness's draws
    "plugin",  # hookspecs, components and contracts, registry, manager
    "certification",  # σ then the certifier's claims, checked against the contract
    "store",  # every SQL statement, the typed read side
    "running",  # benchmark files, models, runner, executors, replay
    "audit",  # the soundness checks and the empirical attack
    "reports",  # leaderboards, imported logs, precision report
    "cli",  # the command line and developer tools
]
TOP = len(LAYERS)  # harness/__init__.py and harness/api.py


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    """The layer index of a ``harness`` module (TOP for the package and ``harness.api``)."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "api":
        return TOP
    if parts[1] not in LAYERS:
        raise AssertionError(f"{module} is in no layer; add its folder to LAYERS")
    return LAYERS.index(parts[1])


def imports(source: str, name: str, is_package: bool, known: set[str]) -> list[tuple[int, str]]:
    """(line, module) for every import of a ``harness`` or ``plugins`` module in a
    module's source: top-level, inside functions, relative, ``from X import module``,
    and ``importlib.import_module`` of a literal name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join([*package, *([node.module] if node.module else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((node.lineno, sub if sub in known else base))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return sorted((line, m) for line, m in found if m.split(".")[0] in ("harness", "plugins"))


def upward_imports(root: Path = ROOT) -> list[str]:
    files = sorted((root / "harness").rglob("*.py"))
    known = {module_name(p, root) for p in files}
    offenders = []
    for path in files:
        name = module_name(path, root)
        own = layer_of(name)
        for line, target in imports(path.read_text(), name, path.name == "__init__.py", known):
            where = f"{path.relative_to(root)}:{line}"
            if target.split(".")[0] == "plugins":
                offenders.append(f"{where} imports the plugin {target}")
            elif layer_of(target) > own:
                offenders.append(f"{where} ({LAYERS[own]}) imports {target} from above")
    return offenders


def test_imports_only_go_down():
    assert upward_imports() == []


def test_no_module_is_over_450_lines():
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "harness").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 450}  # fmt: skip
    assert long == {}, "split these by concept: " + str(long)


def test_no_two_modules_of_harness_share_a_name():
    seen: dict[str, list[str]] = {}
    for path in (ROOT / "harness").rglob("*.py"):
        if path.name != "__init__.py":
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_every_folder_of_harness_is_a_layer():
    folders = {p.name for p in (ROOT / "harness").iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(LAYERS)
    top = {p.name for p in (ROOT / "harness").glob("*.py")}
    assert top == {"__init__.py", "api.py"}


def test_the_check_sees_every_form_of_import(tmp_path):
    (tmp_path / "harness" / "engine").mkdir(parents=True)
    (tmp_path / "harness" / "store").mkdir()
    for name in ("__init__", "engine/__init__", "store/__init__", "store/store"):
        (tmp_path / "harness" / f"{name}.py").write_text("")
    (tmp_path / "harness" / "engine" / "low.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from harness.engine import sampling\n"
        "if TYPE_CHECKING:\n    from harness.store.store import ResultStore\n"
        "def f():\n    from ..store import store\n"
        "def g():\n    import importlib\n    importlib.import_module('harness.api')\n"
        "def h():\n    from plugins.cohen import certifier\n"
    )  # fmt: skip
    assert upward_imports(tmp_path) == [
        "harness/engine/low.py:4 (engine) imports harness.store.store from above",
        "harness/engine/low.py:6 (engine) imports harness.store.store from above",
        "harness/engine/low.py:9 (engine) imports harness.api from above",
        "harness/engine/low.py:11 imports the plugin plugins.cohen",
    ]


def test_a_formula_recorded_before_the_layout_still_resolves():
    from harness.mathematics.radius import COHEN, formula_from_record

    record = {"name": "cohen", "recompute": "harness.radius.cohen_recompute"}
    assert formula_from_record(record).recompute is COHEN.recompute


SQL = ("SELECT ", "INSERT ", "UPDATE ", "DELETE ", "CREATE ", "ALTER ", "BEGIN ")


def test_every_sql_statement_is_in_the_store():
    outside = []
    for path in sorted((ROOT / "harness").rglob("*.py")):
        if path.parent.name == "store":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            text = node.value if isinstance(node, ast.Constant) else None
            if isinstance(text, str) and text.lstrip().upper().startswith(SQL):
                outside.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert outside == [], "SQL outside harness/store/: " + ", ".join(outside)
