"""Soundness checks on methods whose status is known: Cohen sound, a doubled radius violated."""

import types

import numpy as np
import pytest
import torch

from harness import hookimpl
from harness.audit.auditor import run_checks
from harness.audit.counterexamples import intersecting_pairs
from harness.foundation.progress import Progress
from harness.foundation.verdict import CheckResult, Verdict, overall
from harness.plugin.components import CertifierSpec, MethodSpec
from harness.running.benchmark import parse_benchmark
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark


def _doubled_plugin():
    module = types.ModuleType("doubled")

    def build(context, params, sigma_provider):
        from plugins.cohen.certifier import CohenCertifier

        class Doubled(CohenCertifier):
            def radius(self, p_lower, sigma):
                return 2 * super().radius(p_lower, sigma)

        return Doubled()

    @hookimpl
    def idrs_register_certifiers(register):
        register(CertifierSpec("cohen-doubled", build))

    @hookimpl
    def idrs_register_methods(register):
        register(MethodSpec("doubled", "constant", "cohen-doubled", {"sigma": 0.5}))

    module.idrs_register_certifiers = idrs_register_certifiers
    module.idrs_register_methods = idrs_register_methods
    return module


def _ball_spec(seed: int, methods: list[dict]) -> dict:
    return {
        "name": "ball", "seed": seed,
        "dataset": {"name": "ball-2", "test_count": 40},
        "model": {"architecture": "ball-N", "trainer": "none"},
        "certification": {"n0": 32, "n": 500, "alpha": 0.01, "batch_size": 4096},
        "methods": methods,
    }  # fmt: skip


ENTROPY = 0x47_C0E
"""The audits' entropy: fixed, so that the verdicts asserted here are the same every time
(with fresh entropy a sound row is flagged 1 time in 1,000, as the checks promise)."""


def _check(tmp_path, manager, raw) -> dict:
    db = tmp_path / f"r{raw['seed']}.sqlite"
    run_id = run_benchmark(
        parse_benchmark(raw), RunOptions(db=db), Progress(enabled=False), manager
    )
    return run_checks(db, run_id, RunOptions(db=db), Progress(enabled=False), manager,
                      entropy=ENTROPY)  # fmt: skip


@pytest.mark.slow
def test_doubled_radius_is_violated_by_coverage(tmp_path, manager):
    manager.register(_doubled_plugin(), name="doubled")
    results = _check(tmp_path, manager, _ball_spec(0, [{"name": "doubled"}]))
    [(_, checks)] = results.items()
    by_name = {r.check: r for r in checks}
    assert by_name["coverage"].verdict == Verdict.VIOLATED
    assert by_name["coverage"].evidence["linear-2"]["failures"] > 10
    assert overall(checks) == Verdict.VIOLATED


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cohen_is_never_flagged(tmp_path, manager, seed):
    results = _check(
        tmp_path,
        manager,
        _ball_spec(seed, [{"name": "cohen", "settings": [{"sigma": 0.25}, {"sigma": 0.5}]}]),
    )
    for checks in results.values():
        assert {r.check for r in checks} >= {"coverage", "sigma-regularity", "counterexamples"}
        assert overall(checks) == Verdict.SOUND, [(r.check, r.summary) for r in checks]


def test_intersecting_pairs_against_brute_force():
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.normal(size=(30, 3)))
    r = torch.tensor(rng.uniform(0, 1, 30))
    p = torch.tensor(rng.integers(0, 3, 30))
    i, j, _, _ = intersecting_pairs(x, r, p)
    expected = {(a, b) for a in range(30) for b in range(a + 1, 30)
                if p[a] != p[b] and np.linalg.norm(x[a] - x[b]) < r[a] + r[b]}  # fmt: skip
    assert set(zip(i.tolist(), j.tolist(), strict=True)) == expected


def test_overall_verdict_is_the_worst_applicable():
    def r(v):
        return CheckResult("c", v, "")

    assert overall([r(Verdict.SOUND), r(Verdict.NOT_APPLICABLE)]) == Verdict.SOUND
    assert overall([r(Verdict.SOUND), r(Verdict.UNJUSTIFIED)]) == Verdict.UNJUSTIFIED
    assert overall([r(Verdict.VIOLATED), r(Verdict.UNJUSTIFIED)]) == Verdict.VIOLATED
    # a check that raised, or no check applying, leaves the row not verified
    assert overall([r(Verdict.NOT_APPLICABLE)]) == Verdict.NOT_VERIFIED
    assert overall([r(Verdict.SOUND), r(Verdict.ERROR)]) == Verdict.NOT_VERIFIED
    assert overall([r(Verdict.ERROR), r(Verdict.VIOLATED)]) == Verdict.VIOLATED
    assert overall([r(Verdict.SOUND), r(Verdict.ORDER_DEPENDENT)]) == Verdict.ORDER_DEPENDENT
    assert overall([r(Verdict.ORDER_DEPENDENT), r(Verdict.ERROR)]) == Verdict.NOT_VERIFIED
