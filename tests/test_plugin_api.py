"""The public plugin API (``harness``'s namespace) and the built-in plugins' use of it."""

import ast
import dataclasses
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
