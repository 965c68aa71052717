"""The core's layers (harness/README.md, "Layout"): imports only go down.

Each folder of ``harness/`` is one layer; the list below orders them along the data
path, lowest first. A module may import from its own layer and the layers below it,
never from a layer above (imports inside functions and under ``TYPE_CHECKING``
included), and never from ``plugins``: the core reaches a plugin only through the
registry. ``harness/__init__.py`` (the plugin API) and ``harness/api.py`` (the API for
scripts) sit on top. Within a layer no two modules import each other, directly or through
others (top-level imports and imports inside functions; one under ``TYPE_CHECKING`` never
runs, so it names a type without making a cycle).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = [
    "foundation",  # errors, progress, files, the protocol, the vocabulary of a run
    "mathematics",  # radii, worst case, statistics, certified accuracy
    "engine",  # noise, sampling, precision, batch size, the harness's draws
    "plugin",  # hookspecs, components and contracts, registry, loader; hosting/; manager
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


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """The ids of the nodes inside ``if TYPE_CHECKING:`` blocks."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(test):
            for child in node.body:
                inside |= {id(n) for n in ast.walk(child)}
    return inside


def imports(
    source: str, name: str, is_package: bool, known: set[str], type_checking: bool = True
) -> list[tuple[int, str]]:
    """(line, module) for every import of a ``harness`` or ``plugins`` module in a
    module's source: top-level, inside functions, relative, ``from X import module``,
    and ``importlib.import_module`` of a literal name; under ``TYPE_CHECKING`` too unless
    ``type_checking`` is false."""
    found = []
    tree = ast.parse(source)
    skipped = set() if type_checking else _type_checking_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
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


def import_cycles(root: Path = ROOT) -> list[list[str]]:
    """The groups of ``harness`` modules that import each other at run time, directly or
    through others (strongly connected components of the import graph, Tarjan's algorithm),
    each sorted, with more than one module."""
    files = sorted((root / "harness").rglob("*.py"))
    known = {module_name(p, root) for p in files}
    graph = {}
    for path in files:
        name = module_name(path, root)
        found = imports(path.read_text(), name, path.name == "__init__.py", known, False)
        graph[name] = sorted({m for _, m in found if m in known and m != name})
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return sorted(cycles)


def test_imports_only_go_down():
    assert upward_imports() == []


PLUGIN_PARTS = [
    {"hookspecs", "components", "registry", "entry_points", "loader"},  # what a plugin meets
    {"manifest", "model_description"},  # plugins' names remembered; a base model as data
    {"hosting"},  # the machinery that runs third-party code apart
    {"manager", "private_install"},  # the built-ins here, third-party plugins in hosts
]
"""The plugin layer's parts, lowest first (harness/README.md, "Layout")."""
HOSTING_SIDES = {"shared": set(), "in_host": {"shared"}, "in_harness": {"shared"}}
"""The folders of ``plugin/hosting/``, each with those it may import besides itself: both
processes import the shared wire, protocol and policy, and neither side the other's."""


def test_the_plugin_layer_reads_apart():
    """The contract a plugin author reads imports nothing of the machinery that runs plugins
    apart (``plugin/hosting/``), which imports nothing of the manager above both."""

    def part(module: str) -> int:
        name = module.split(".")[2]
        return next(i for i, names in enumerate(PLUGIN_PARTS) if name in names)

    files = sorted((ROOT / "harness").rglob("*.py"))
    known = {module_name(p) for p in files}
    offenders = []
    for path in sorted((ROOT / "harness" / "plugin").rglob("*.py")):
        name = module_name(path)
        if name == "harness.plugin":
            continue
        for line, target in imports(path.read_text(), name, path.name == "__init__.py", known):
            if target.startswith("harness.plugin.") and part(target) > part(name):
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert offenders == []


def hosting_side_offenders(root: Path = ROOT) -> list[str]:
    """The imports across the folders of ``plugin/hosting/`` that :data:`HOSTING_SIDES`
    does not allow, and the modules of it in no folder of it."""
    files = sorted((root / "harness").rglob("*.py"))
    known = {module_name(p, root) for p in files}
    offenders = []
    for path in sorted((root / "harness" / "plugin" / "hosting").rglob("*.py")):
        name = module_name(path, root)
        if name == "harness.plugin.hosting":
            continue
        side = name.split(".")[3]
        if side not in HOSTING_SIDES or (name.count(".") < 4 and path.name != "__init__.py"):
            offenders.append(f"{path.relative_to(root)} is in no folder of {sorted(HOSTING_SIDES)}")
            continue
        for line, target in imports(path.read_text(), name, path.name == "__init__.py", known):
            if not target.startswith("harness.plugin.hosting."):
                continue
            other = target.split(".")[3]
            if other != side and other not in HOSTING_SIDES[side]:
                offenders.append(f"{path.relative_to(root)}:{line} ({side}) imports {target}")
    return offenders


def test_the_host_and_the_harness_share_only_the_protocol_wire_and_policy():
    """What runs in a plugin host (``in_host/``) imports nothing of the harness's side
    (``in_harness/``) nor the reverse: only ``shared/``, which imports neither."""
    assert hosting_side_offenders() == []


def test_the_side_check_sees_a_host_module_importing_the_harness_side(tmp_path):
    hosting = tmp_path / "harness" / "plugin" / "hosting"
    for side in HOSTING_SIDES:
        (hosting / side).mkdir(parents=True)
    for name in ("__init__", "plugin/__init__", "plugin/hosting/__init__",
                 *(f"plugin/hosting/{side}/__init__" for side in HOSTING_SIDES)):  # fmt: skip
        (tmp_path / "harness" / f"{name}.py").write_text("")
    files = {
        "in_host/a.py": "from harness.plugin.hosting.shared import wire\n",
        "in_host/b.py": "def f():\n    from harness.plugin.hosting.in_harness import c\n",
        "in_harness/c.py": "from harness.plugin.hosting.in_host import a\n",
        "shared/wire.py": "from harness.plugin.hosting.in_host.a import X\n",
        "loose.py": "",
    }
    for name, text in files.items():
        (hosting / name).write_text(text)
    assert hosting_side_offenders(tmp_path) == [
        "harness/plugin/hosting/in_harness/c.py:1 (in_harness) imports "
        "harness.plugin.hosting.in_host.a",
        "harness/plugin/hosting/in_host/b.py:2 (in_host) imports "
        "harness.plugin.hosting.in_harness.c",
        "harness/plugin/hosting/loose.py is in no folder of ['in_harness', 'in_host', 'shared']",
        "harness/plugin/hosting/shared/wire.py:1 (shared) imports harness.plugin.hosting.in_host.a",
    ]


def test_no_modules_import_each_other():
    assert import_cycles() == [], "split what these share into a module below them"


def test_the_cycle_check_sees_imports_inside_functions_and_through_others(tmp_path):
    (tmp_path / "harness" / "engine").mkdir(parents=True)
    (tmp_path / "harness" / "cli").mkdir()
    for name in ("__init__", "engine/__init__", "cli/__init__"):
        (tmp_path / "harness" / f"{name}.py").write_text("")
    files = {
        "engine/a.py": "from harness.engine.b import X\n",
        "engine/b.py": "def f():\n    from harness.engine import a\n",  # inside a function
        "cli/c.py": "from harness.cli import d\n",
        "cli/d.py": "import harness.cli.e\n",
        "cli/e.py": "def g():\n    from . import c\n",  # relative, through d
        "cli/f.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                    "    from harness.cli.g import G\n",  # a type only
        "cli/g.py": "from harness.cli.f import F\n",
    }  # fmt: skip
    for name, text in files.items():
        (tmp_path / "harness" / name).write_text(text)
    assert import_cycles(tmp_path) == [
        ["harness.cli.c", "harness.cli.d", "harness.cli.e"],
        ["harness.engine.a", "harness.engine.b"],
    ]


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
