"""The public plugin API (``harness``'s namespace) and the built-in plugins' use of it."""

import ast
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import harness
from harness.engine.sampling import SamplingEngine
from harness.foundation.data import Dataset
from harness.foundation.progress import Progress
from harness.foundation.protocol import CertificationProtocol
from harness.plugin.components import BuildContext, RunMemo

ROOT = Path(__file__).resolve().parents[1]


PUBLIC = {"harness", "harness.api"}  # the plugin API; the API for scripts and notebooks


def _harness_submodule_imports(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line module`` for every import of a ``harness.<submodule>`` in ``path``
    other than :mod:`harness.api` (the public API a reproduction script drives)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        found += [f"{path.relative_to(root)}:{node.lineno} {m}" for m in modules
                  if m.startswith("harness.") and m not in PUBLIC]  # fmt: skip
    return found


def test_builtin_plugins_import_only_the_public_api():
    files = sorted((ROOT / "plugins").rglob("*.py"))
    assert len(files) > 30
    offenders = [hit for path in files for hit in _harness_submodule_imports(path)]
    assert offenders == [], "plugins must import only `harness` (the API):\n" + "\n".join(offenders)
    unknown = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "harness" and node.level == 0:
                unknown += [f"{path.relative_to(ROOT)}:{node.lineno} {a.name}"
                            for a in node.names if a.name not in harness.__all__]  # fmt: skip
    assert unknown == [], "not in harness.__all__:\n" + "\n".join(unknown)


def test_the_check_names_file_and_line(tmp_path):
    bad = tmp_path / "plugins" / "probe.py"
    bad.parent.mkdir()
    bad.write_text("from harness import hookimpl\nfrom harness.api import run\n\n\n"
                   "def f():\n    import harness.running.benchmark\n")  # fmt: skip
    assert _harness_submodule_imports(bad, tmp_path) == [
        "plugins/probe.py:6 harness.running.benchmark"
    ]


def test_every_exported_name_resolves_and_is_listed_once():
    listed = [name for names in harness._MODULES.values() for name in names]
    assert len(listed) == len(set(listed)) == len(harness._EXPORTS)
    submodules = {p.stem for p in (ROOT / "harness").iterdir()}
    assert not submodules & set(harness.__all__)  # importing one would shadow the export
    for name in harness.__all__:
        value = getattr(harness, name)
        if name != "__version__":
            assert value is getattr(sys.modules[harness._EXPORTS[name]], name)
    with pytest.raises(AttributeError, match="no attribute 'default_cache_dir'"):
        harness.default_cache_dir  # noqa: B018


def test_importing_harness_imports_neither_torch_nor_scipy():
    code = (
        "import sys, harness; from harness import hookimpl, MethodSpec, ParameterError; "
        "print([m for m in ('torch', 'scipy', 'numpy') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr


def _context(recipe_hash=None, model=None):
    model = model or torch.nn.Linear(2, 2)
    dataset = Dataset("toy", torch.zeros(4, 2), torch.zeros(4, dtype=torch.long),
                      torch.zeros(2, 2), torch.zeros(2, dtype=torch.long), 2)  # fmt: skip
    return BuildContext(
        dataset, model, torch.device("cpu"), 0, CertificationProtocol(n0=10, n=20),
        SamplingEngine(model, 2, torch.device("cpu"), 8, 0), Progress(enabled=False),
        recipe_hash=recipe_hash,
    )  # fmt: skip


def test_artifact_dir_is_per_plugin_and_base_model(monkeypatch, tmp_path):
    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path))
    assert _context().artifact_dir("mine") is None  # no content hash: nothing to find again
    path = _context("ab" * 32).artifact_dir("mine")
    assert path == tmp_path / "plugins" / "mine" / ("ab" * 32) and path.is_dir()
    assert _context("cd" * 32).artifact_dir("mine") != path


def test_memo_builds_once_per_key_and_run_and_is_shared_by_copies():
    calls = []

    def build(value):
        calls.append(value)
        return [value]

    context = _context()
    first = context.memo("p", "k", lambda: build(1))
    setting = dataclasses.replace(context, method="m", setting="sigma=0.5")
    assert setting.memo("p", "k", lambda: build(2)) is first
    assert context.memo("other", "k", lambda: build(3)) == [3]
    assert context.memo("p", "k2", lambda: build(4)) == [4]
    other_model = dataclasses.replace(context, model=torch.nn.Linear(2, 2), memos=RunMemo())
    assert other_model.memo("p", "k", lambda: build(5)) == [5]
    assert calls == [1, 3, 4, 5]
    assert _context().memo("p", "k", lambda: build(6)) == [6]  # a new run starts empty


class _Delegating:
    """A component wrapping another by delegation: every member through ``__getattr__``."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _PropertySigma:
    """A σ-provider whose ``regularity`` is a property."""

    @property
    def regularity(self):
        return harness.Constant(0.25)

    def __call__(self, x):
        return torch.full((len(x),), 0.25)


class _Partial:
    """A certifier with only ``smoothing`` and ``certify``; with ``order_dependent`` but no
    ``ball_sigmas``/``order_replays`` when ``memory``."""

    smoothing = "hard"

    def __init__(self, memory=False):
        if memory:
            self.order_dependent, self.radius_formula = True, None

    def certify(self, evidence):
        return []


def _components_plugin():
    from harness import CertifierSpec, MethodSpec, SigmaProviderSpec, hookimpl

    class Plugin:
        @hookimpl
        def idrs_register_sigma_providers(self, register):
            register(SigmaProviderSpec("property-sigma", lambda context, params: _PropertySigma()))
            register(SigmaProviderSpec("callable-by-getattr",
                                       lambda context, params: _Delegating(_PropertySigma())))  # fmt: skip

        @hookimpl
        def idrs_register_certifiers(self, register):
            def delegating(context, params, provider):
                cohen = context.registry.get("certifiers", "cohen")
                return _Delegating(cohen.build(context, params, provider))

            register(CertifierSpec("delegating-cohen", delegating))
            register(CertifierSpec("partial", lambda context, params, provider: _Partial()))
            register(CertifierSpec("partial-memory",
                                   lambda context, params, provider: _Partial(memory=True)))  # fmt: skip

        @hookimpl
        def idrs_register_methods(self, register):
            for name, sigma, certifier in (
                ("wrapped", "property-sigma", "delegating-cohen"),
                ("not-callable", "callable-by-getattr", "cohen"),
                ("partial", "constant", "partial"),
                ("partial-memory", "constant", "partial-memory"),
            ):
                register(MethodSpec(name, sigma, certifier, {"sigma": 0.25}))

    return Plugin()


def _build(method):
    from harness.certification.method import build_method
    from harness.plugin.manager import PluginManager

    manager = PluginManager(third_party=False)
    manager.register(_components_plugin(), name="components")
    context = dataclasses.replace(_context(), registry=manager.registry)
    return build_method(manager.registry, method, {}, context)


def test_a_component_is_accepted_however_it_provides_its_members():
    """A certifier that delegates every member to a built-in one through ``__getattr__``
    (how one wraps a certifier), and a σ-provider whose ``regularity`` is a property, are
    built: their members are found by ordinary attribute lookup, on Python 3.11 as on 3.12,
    where ``isinstance`` on a runtime-checkable protocol looks members up with
    ``inspect.getattr_static``, which sees neither (shown here)."""
    import inspect

    from harness.plugin.components import Certifier, SigmaProvider, missing_members

    provider, certifier = _build("wrapped")
    assert isinstance(certifier, _Delegating) and certifier.smoothing == "hard"
    assert missing_members(certifier, Certifier) == [] == missing_members(provider, SigmaProvider)
    for name in ("smoothing", "order_dependent", "radius_formula", "certify"):
        with pytest.raises(AttributeError):  # Python 3.12's isinstance(certifier, Certifier)
            inspect.getattr_static(certifier, name)
    assert inspect.getattr_static(provider, "regularity") is type(provider).regularity  # (no value)


@pytest.mark.parametrize("method, missing, protocol", [
    ("partial", "order_dependent, radius_formula", "Certifier"),
    ("partial-memory", "ball_sigmas, order_replays", "OrderDependentCertifier"),
    ("not-callable", "__call__", "SigmaProvider"),  # Python calls type(provider).__call__
])  # fmt: skip
def test_a_component_that_lacks_members_is_refused_naming_each(method, missing, protocol):
    from harness.foundation.errors import IdrsError

    with pytest.raises(IdrsError, match=rf"lacks the declared member\(s\) {missing} of "
                       rf"harness\.plugin\.components\.{protocol}; see docs/plugins\.md"):  # fmt: skip
        _build(method)


DECLARED = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("components", sys.argv[1])
components = importlib.util.module_from_spec(spec)
sys.modules["components"] = components
spec.loader.exec_module(components)  # (the standard library only, outside type checking)


class Delegating:
    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)


class Inner:
    smoothing, order_dependent, radius_formula = "hard", False, None

    def certify(self, evidence):
        return []


protocols = (components.SigmaProvider, components.Certifier, components.OrderDependentCertifier)
print(json.dumps({"declared": [components.declared_members(p) for p in protocols],
                  "missing": components.missing_members(Delegating(Inner()), components.Certifier)}))
"""


def _other_pythons() -> list[str]:
    """Python 3.12+ interpreters on this machine: on ``PATH``, or beside this one (pyenv)."""
    import glob
    import shutil

    found = [shutil.which(f"python3.{minor}") for minor in range(12, 16)]
    found += sorted(glob.glob(str(Path(sys.base_prefix).parent / "3.1[2-9]*" / "bin" / "python3")))
    works = []
    for python in dict.fromkeys(p for p in found if p):
        done = subprocess.run([python, "-c", "import sys; print(sys.version_info >= (3, 12))"],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode == 0 and done.stdout.strip() == "True":
            works.append(python)
    return works


def test_the_declared_members_are_the_same_on_python_3_12_and_later():
    """:func:`declared_members` reads the protocols' class bodies (no private helper of
    ``typing``, whose names change between versions): the same members, and the same
    acceptance of a delegating certifier, on every Python 3.12+ this machine has."""
    from harness.plugin.components import (
        Certifier,
        OrderDependentCertifier,
        SigmaProvider,
        declared_members,
    )

    pythons = _other_pythons()
    if not pythons:
        pytest.skip("no Python >= 3.12 on this machine (the GPU machines run the suite on 3.12)")
    expected = [
        list(declared_members(p)) for p in (SigmaProvider, Certifier, OrderDependentCertifier)
    ]
    assert expected[0] == ["regularity", "__call__"]
    assert expected[2] == [*expected[1], "ball_sigmas", "order_replays"]
    source = ROOT / "harness" / "plugin" / "components.py"
    for python in pythons:
        done = subprocess.run([python, "-c", DECLARED, str(source)], capture_output=True,
                              text=True)  # fmt: skip
        assert done.returncode == 0, done.stderr
        said = json.loads(done.stdout)
        assert said["declared"] == expected and said["missing"] == [], (python, said)
