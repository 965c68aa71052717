"""Which files a run records for its replay: its weights, and the artifacts of the plugins
it used, never another method's artifacts for the same base model (harness/running/runfiles.py)."""

from __future__ import annotations

import json

import torch

from harness import BuildContext, MethodSpec, SigmaProviderSpec, hookimpl
from harness.foundation.progress import Progress
from harness.foundation.regularity import Constant
from harness.plugin.manager import PluginManager
from harness.running.benchmark import parse_benchmark
from harness.running.preparation import RunOptions
from harness.running.runfiles import PLUGIN_ARTIFACT
from harness.running.runner import run_benchmark
from harness.store.store import ResultStore


class _Borrowed:
    """σ = 0.25, built after reading a file another plugin (``stranger``) keeps."""

    regularity = Constant(0.25)

    def __call__(self, x):
        return torch.full((len(x),), 0.25, device=x.device)


def _borrowing(context: BuildContext, params):
    folder = context.artifact_dir("stranger")
    assert json.loads((folder / "s.json").read_text()) == {"k": 1}
    return _Borrowed()


class Borrower:
    @hookimpl
    def idrs_register_sigma_providers(self, register):
        register(SigmaProviderSpec("borrowing", _borrowing))

    @hookimpl
    def idrs_register_methods(self, register):
        register(MethodSpec("borrower", "borrowing", "cohen", {}))


def _run(tmp_path, methods) -> tuple[str, list[str]]:
    raw = {"name": "files", "seed": 0, "dataset": {"name": "ball-2", "test_count": 2},
           "model": {"architecture": "ball-N", "trainer": "none"},
           "certification": {"n0": 16, "n": 64, "alpha": 0.01, "batch_size": 64},
           "methods": [{"name": m, "settings": [{"sigma": 0.25}] if m == "cohen" else [{}]}
                       for m in methods]}  # fmt: skip
    db = tmp_path / "runs.sqlite"
    with PluginManager(third_party=False) as manager:
        manager.register(Borrower(), name="borrower")
        run_id = run_benchmark(parse_benchmark(raw), RunOptions(db=db), Progress(enabled=False),
                               manager)  # fmt: skip
    store = ResultStore(db)
    try:
        names = sorted(f["name"] for f in store.files(run_id) if f["role"] == PLUGIN_ARTIFACT)
        return store.run(run_id)["recipe_hash"], names
    finally:
        store.close()


def test_a_run_records_its_plugins_artifacts_and_those_its_methods_read(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("IDRS_BENCH_CACHE", str(cache))
    recipe, names = _run(tmp_path, ["cohen"])
    assert names == []
    for plugin, name, body in (("stranger", "s.json", {"k": 1}), ("cohen", "c.json", {"k": 2})):
        folder = cache / "plugins" / plugin / recipe
        folder.mkdir(parents=True)
        (folder / name).write_text(json.dumps(body))
    # resumed: the cohen plugin's file is the run's, the stranger's belongs to no method of it
    assert _run(tmp_path, ["cohen"]) == (recipe, ["cohen/c.json"])
    # a method that reads the stranger's folder (certified by cohen): the run ships it too
    assert _run(tmp_path, ["borrower"])[1] == ["cohen/c.json", "stranger/s.json"]
