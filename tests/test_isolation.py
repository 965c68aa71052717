"""Plugins that forge verdicts when imported cannot reach the harness's verdicts (issue:
third-party code never runs where verdicts are made; harness/README.md, "Plugin host").

Two rigged third-party plugins, written against the public API, certify Cohen's radius
× 1.15 under a radius formula of their own; when imported, one replaces every soundness
check's function with one that answers ``sound``, the other patches the store and the
verdict code so that every stored verdict reads ``sound``. Installed as packages, they run in a plugin host: their rows
are judged by the harness's own checks, and every other row keeps its verdict.
"""

from __future__ import annotations

import sqlite3

import pytest

from harness.audit.audit import Budget
from harness.audit.auditor import run_checks
from harness.foundation.progress import Progress
from harness.foundation.verdict import Verdict, overall
from harness.plugin.manager import PluginManager
from harness.running.benchmark import parse_benchmark
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark

INFLATED = '''
"""Cohen's radius × 1.15, under a radius formula of its own."""
import numpy as np

from harness import (CertifierSpec, HardSmoothingCertifier, MethodSpec, RadiusFormula,
                     Recomputed, cohen_radius, hookimpl)

IDRS_BENCH_CONTRACT = 3
INFLATION = 1.15


def inflated_recompute(rows, inputs, protocol, regularity):
    from harness import COHEN

    out = COHEN.derive(rows, inputs, protocol, regularity)
    return Recomputed(out.n0, out.n, out.bound, out.prediction, out.radius * INFLATION)


class Inflated(HardSmoothingCertifier):
    radius_formula = RadiusFormula("inflated-cohen", inflated_recompute)

    def radius(self, p_lower, sigma):
        return INFLATION * np.asarray(cohen_radius(p_lower, sigma))


@hookimpl
def idrs_register_certifiers(register):
    register(CertifierSpec(NAME, lambda context, params, provider: Inflated()))


@hookimpl
def idrs_register_methods(register):
    register(MethodSpec(NAME, sigma_provider="constant", certifier=NAME, defaults={"sigma": 0.25}))
'''

AUDIT_PATCH = (
    INFLATED.replace("NAME", '"audit-patch"')
    + """

# --- when imported: every soundness check answers `sound` ----------------------------
import importlib

from harness.foundation.verdict import CheckResult, Verdict

CHECKS = {"evidence": "evidence", "coverage": "coverage", "sigma_regularity": "sigma-regularity",
          "justification": "worst-case-justification", "counterexamples": "counterexamples",
          "order": "memory-order", "replay": "replay"}


def _sound(name):
    return lambda audit: CheckResult(name, Verdict.SOUND, "sound", {})


for _module, _name in CHECKS.items():
    setattr(importlib.import_module(f"harness.audit.{_module}"), f"check_{_module}", _sound(_name))
"""
)

STORE_PATCH = (
    INFLATED.replace("NAME", '"store-patch"')
    + """

# --- when imported: every stored verdict reads `sound` --------------------------------
import dataclasses

from harness.foundation import verdict
from harness.store.store import ResultStore

_add_check = ResultStore.add_check


def _forged(self, run_id, method, setting, result, budget):
    forged = dataclasses.replace(result, verdict=verdict.Verdict.SOUND, flags=[])
    return _add_check(self, run_id, method, setting, forged, budget)


ResultStore.add_check = _forged
verdict.overall = lambda results: verdict.Verdict.SOUND
"""
)

TINY = Budget("tiny", coverage_trials=80, coverage_n=400, pairs=4, ascent_steps=4,
              audited_inputs=8, attack_steps=5, attack_samples=32, orders=5)  # fmt: skip
ENTROPY = 0x5EED_1DE5
HONEST = [{"name": "cohen", "settings": [{"sigma": 0.25}]},
          {"name": "sukenik", "settings": [{"sigma": 0.25, "rate": 0.2, "k": 5}]}]  # fmt: skip


def _ball(methods: list[dict]) -> dict:
    return {"name": "ball", "seed": 0, "dataset": {"name": "ball-2", "test_count": 40},
            "model": {"architecture": "ball-N", "trainer": "none"},
            "certification": {"n0": 32, "n": 2000, "alpha": 0.01, "batch_size": 4096},
            "methods": methods}  # fmt: skip


def _audited(tmp_path, name: str, methods: list[dict], manager: PluginManager):
    db = tmp_path / f"{name}.sqlite"
    quiet = Progress(enabled=False)
    run_id = run_benchmark(parse_benchmark(_ball(methods)), RunOptions(db=db), quiet, manager)
    results = run_checks(db, run_id, RunOptions(db=db), quiet, manager, budget=TINY,
                         entropy=ENTROPY, attack=False)  # fmt: skip
    with sqlite3.connect(db) as con:
        stored = dict(((m, s, c), v) for m, s, c, v in con.execute(
            "SELECT method, setting, check_name, verdict FROM checks"))  # fmt: skip
    return results, stored


@pytest.fixture
def rigged(install_plugin):
    install_plugin("idrs_test_audit_patch", AUDIT_PATCH)
    install_plugin("idrs_test_store_patch", STORE_PATCH)


@pytest.mark.long
@pytest.mark.slow
def test_plugins_that_forge_verdicts_at_import_are_judged_by_the_harness(tmp_path, rigged):
    manager = PluginManager()
    rows = {row["name"]: row["runs_in"] for row in manager.describe()}
    assert rows["idrs_test_audit_patch"] == rows["idrs_test_store_patch"] == "plugin host"
    rigged_methods = [{"name": "audit-patch", "settings": [{"sigma": 0.25}]},
                      {"name": "store-patch", "settings": [{"sigma": 0.25}]}]  # fmt: skip
    results, stored = _audited(tmp_path, "rigged", HONEST + rigged_methods, manager)
    for method in ("audit-patch", "store-patch"):
        verdict = overall(results[method, "sigma=0.25"])
        assert verdict in (Verdict.VIOLATED, Verdict.NOT_VERIFIED), (
            method,
            [(r.check, r.verdict, r.summary) for r in results[method, "sigma=0.25"]],
        )
        for check in results[method, "sigma=0.25"]:  # as stored: the store was not patched
            assert stored[method, "sigma=0.25", check.check] == str(check.verdict)
    honest, _ = _audited(tmp_path, "honest", HONEST, PluginManager(third_party=False))
    for key, checks in honest.items():  # every other row: the same verdicts, check by check
        assert [(r.check, r.verdict) for r in results[key]] == [
            (r.check, r.verdict) for r in checks
        ]
        assert overall(checks) == Verdict.SOUND


@pytest.fixture
def restored():
    """Undo what a rigged module patches when it is imported into this process."""
    import importlib

    from harness.foundation import verdict
    from harness.store.store import ResultStore

    modules = ["evidence", "coverage", "sigma_regularity", "justification", "counterexamples",
               "order", "replay"]  # fmt: skip
    saved = [(importlib.import_module(f"harness.audit.{m}"), f"check_{m}") for m in modules]
    saved = [(obj, name, getattr(obj, name)) for obj, name in saved]
    saved += [(ResultStore, "add_check", ResultStore.add_check),
              (verdict, "overall", verdict.overall)]  # fmt: skip
    yield
    for obj, name, value in saved:
        setattr(obj, name, value)


def test_the_same_plugins_registered_in_process_forge_their_verdicts(tmp_path, restored):
    """The control: registered in the harness's own process (as a test or script may do,
    trusted by the caller), the same modules do launder their rows, so the test above
    would fail if a third-party plugin ever ran where verdicts are made."""
    import importlib.util

    manager = PluginManager(third_party=False)
    for name, source in (("idrs_test_audit_patch", AUDIT_PATCH),):
        path = tmp_path / f"{name}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        manager.register(module, name)
    methods = [*HONEST[:1], {"name": "audit-patch", "settings": [{"sigma": 0.25}]}]
    results, _ = _audited(tmp_path, "in-process", methods, manager)
    assert {r.verdict for r in results["audit-patch", "sigma=0.25"]} == {Verdict.SOUND}
