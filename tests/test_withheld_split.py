"""No plugin sees the test split (docs/plugins.md, "What a plugin sees of the dataset").

A third-party plugin that tries to read the test inputs or labels, in a σ-provider's or
certifier's factory or in a trainer, gets the error that names the rule, in a plugin host
and in the harness's process alike; a plugin written against contract 3 still runs and is
told how to port; the host is sent the training split and description only; stored
certificates reach a plugin's radius formula without labels; and a run records the rule.
"""

from __future__ import annotations

import sqlite3
import sys
import types

import pytest
import torch

from harness.foundation.data import Dataset, TrainingSplit
from harness.foundation.errors import ContractError
from harness.foundation.progress import Progress
from harness.plugin.manager import PluginManager

PEEKING = '''
"""Components that read the test split when built or when training."""
from harness import (COHEN, CertifierSpec, Constant, HardSmoothingCertifier, MethodSpec,
                     RadiusFormula, SigmaProviderSpec, TrainerSpec, cohen_radius, hookimpl)

IDRS_BENCH_CONTRACT = 4
FIELDS = ("test_x", "test_y")


class Flat:
    def __init__(self, sigma):
        self.sigma = sigma
        self.regularity = Constant(sigma)

    def __call__(self, x):
        import torch

        return torch.full((len(x),), self.sigma, device=x.device)


def peeking_provider(field):
    def build(context, params):
        getattr(context.dataset, field)  # e.g. to tune sigma on the test labels
        return Flat(params["sigma"])

    return build


def seeing(context, params):
    """Its σ says what it sees of the dataset: 0.001 per training point and per coordinate."""
    data = context.dataset
    return Flat(0.001 * (len(data.train_x) + data.dim + 100 * data.num_classes))


class Cohen(HardSmoothingCertifier):
    radius_formula = COHEN

    def radius(self, p_lower, sigma):
        return cohen_radius(p_lower, sigma)


def label_blind_recompute(rows, inputs, protocol, regularity):
    if any("label" in row for row in rows):
        raise ValueError("the formula was given the test labels")
    return COHEN.derive(rows, inputs, protocol, regularity)


class LabelBlind(Cohen):
    radius_formula = RadiusFormula("label-blind-cohen", label_blind_recompute)


def peeking_certifier(field):
    def build(context, params, provider):
        getattr(context.dataset, field)
        return Cohen()

    return build


def peeking_trainer(field):
    def train(model, dataset, params, context):
        getattr(dataset, field)  # e.g. to train on the test points

    return train


@hookimpl
def idrs_register_sigma_providers(register):
    for field in FIELDS:
        register(SigmaProviderSpec(f"peek-{field}", peeking_provider(field)))
    register(SigmaProviderSpec("seeing", seeing))


@hookimpl
def idrs_register_certifiers(register):
    for field in FIELDS:
        register(CertifierSpec(f"peek-{field}", peeking_certifier(field)))
    register(CertifierSpec("label-blind", lambda context, params, provider: LabelBlind()))


@hookimpl
def idrs_register_trainers(register):
    for field in FIELDS:
        register(TrainerSpec(f"peek-{field}", peeking_trainer(field)))


@hookimpl
def idrs_register_methods(register):
    for field in FIELDS:
        register(MethodSpec(f"sigma-peeks-{field}", f"peek-{field}", "cohen", {"sigma": 0.25}))
        register(MethodSpec(f"certifier-peeks-{field}", "constant", f"peek-{field}",
                            {"sigma": 0.25}))
    register(MethodSpec("seeing", "seeing", "cohen", {}))
    register(MethodSpec("label-blind", "constant", "label-blind", {"sigma": 0.25}))
'''


def _manager(where: str, install_plugin, contract: int = 4) -> PluginManager:
    """The built-ins and the peeking plugin: in a plugin host (installed as a package) or
    registered in this process."""
    source = PEEKING.replace("IDRS_BENCH_CONTRACT = 4", f"IDRS_BENCH_CONTRACT = {contract}")
    if where == "plugin host":
        install_plugin("idrs_test_peeking", source)
        manager = PluginManager()
        assert "peek-test_y" in manager.registry.names("sigma_providers")
        assert "idrs_test_peeking" not in sys.modules  # imported by its plugin host only
        return manager
    module = types.ModuleType("idrs_test_peeking_local")
    exec(compile(source, "idrs_test_peeking_local.py", "exec"), module.__dict__)
    manager = PluginManager(third_party=False)
    manager.register(module, name="idrs_test_peeking")
    return manager


def _dataset() -> Dataset:
    from harness.audit.analytic import load_ball_dataset

    return load_ball_dataset(2, seed=0, train_size=40, test_size=10)


def _context(manager: PluginManager, method: str):
    from harness.engine.sampling import SamplingEngine
    from harness.foundation.protocol import CertificationProtocol
    from harness.plugin.components import BuildContext
    from harness.plugin.hosting.model_description import build_model

    model = build_model(manager.registry, "ball-N", (2,), 2, {})
    protocol = CertificationProtocol(n0=10, n=100, batch_size=64)
    return BuildContext(_dataset(), model, torch.device("cpu"), 0, protocol,
                        SamplingEngine(model, 2, torch.device("cpu"), 64, 0),
                        Progress(enabled=False), manager.registry, method=method)  # fmt: skip


WHERE = ["plugin host", "in process"]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("component", ["sigma", "certifier"])
def test_a_sigma_provider_or_certifier_that_reads_the_test_split_gets_the_error(
    where, component, install_plugin
):
    from harness.certification.method import build_method

    manager = _manager(where, install_plugin)
    for field in ("test_x", "test_y"):  # the test inputs, the test labels
        method = f"{component}-peeks-{field}"
        with pytest.raises(ContractError) as caught:
            build_method(manager.registry, method, {}, _context(manager, method))
        said = str(caught.value)
        assert f"dataset 'ball-2': {field} is withheld from plugins" in said
        assert "Porting a plugin to contract 4" in said


@pytest.mark.parametrize("where", WHERE)
def test_a_trainer_that_reads_the_test_split_gets_the_error(
    where, install_plugin, tmp_path, monkeypatch
):
    from harness.running.benchmark import parse_benchmark
    from harness.running.preparation import RunOptions
    from harness.running.runner import run_benchmark

    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path / "cache"))  # (trained, not cached)
    manager = _manager(where, install_plugin)
    for field in ("test_x", "test_y"):
        raw = {"name": "peek", "seed": 0, "dataset": {"name": "ball-2", "test_count": 4},
               "model": {"architecture": "mlp", "trainer": f"peek-{field}",
                         "architecture_params": {"width": 4}},
               "certification": {"n0": 10, "n": 100, "alpha": 0.01},
               "methods": [{"name": "cohen", "settings": [{"sigma": 0.25}]}]}  # fmt: skip
        with pytest.raises(ContractError, match=f"{field} is withheld from plugins"):
            run_benchmark(parse_benchmark(raw), RunOptions(db=tmp_path / "r.sqlite"),
                          Progress(enabled=False), manager)  # fmt: skip


def test_a_contract_3_plugin_runs_and_is_told_how_to_port_where_it_reads_the_test_split(
    install_plugin,
):
    from harness.certification.method import build_method

    manager = _manager("plugin host", install_plugin, contract=3)
    assert [f for f in manager.failures if f.plugin == "idrs_test_peeking"] == []
    provider, _ = build_method(manager.registry, "seeing", {}, _context(manager, "seeing"))
    assert provider(torch.zeros(1, 2)).tolist() == pytest.approx([0.001 * (40 + 2 + 200)])
    with pytest.raises(ContractError, match="written against contract 3 that read the test"):
        build_method(manager.registry, "sigma-peeks-test_y", {},
                     _context(manager, "sigma-peeks-test_y"))  # fmt: skip


def test_the_plugin_host_is_sent_the_training_split_and_description_only(install_plugin):
    """What crosses to the host: no test array; what a hosted σ-provider sees of the dataset
    (its σ is 0.001 × (training points + dimension + 100 × classes)) is the harness's."""
    from harness.certification.method import build_method
    from harness.plugin.hosting.host_process import PluginHost

    data = _dataset()
    sent = PluginHost()._dataset(data.training_split())
    assert set(sent) == {"name", "train_x", "train_y", "num_classes", "input_shape",
                         "class_names", "files"}  # fmt: skip
    assert torch.equal(sent["train_x"], data.train_x) and sent["input_shape"] == [2]
    manager = _manager("plugin host", install_plugin)
    provider, _ = build_method(manager.registry, "seeing", {}, _context(manager, "seeing"))
    assert provider(torch.zeros(3, 2)).tolist() == pytest.approx([0.001 * (40 + 2 + 200)] * 3)


def test_a_training_split_describes_the_dataset_and_withholds_the_test_split():
    from dataclasses import replace

    from harness.plugin.components import BuildContext

    data = Dataset("d", torch.zeros(5, 3, 2), torch.zeros(5, dtype=torch.long),
                   torch.ones(7, 3, 2), torch.ones(7, dtype=torch.long), 4, ("a", "b", "c", "d"),
                   {"f": "00"})  # fmt: skip
    view = data.training_split()
    assert (view.name, view.input_shape, view.dim, view.num_classes) == ("d", (3, 2), 6, 4)
    assert view.class_names == ("a", "b", "c", "d") and view.files == {"f": "00"}
    assert torch.equal(view.train_x, data.train_x) and torch.equal(view.train_y, data.train_y)
    for read in (lambda: view.test_x, lambda: view.test_y, lambda: view.test_subset(1, 2)):
        with pytest.raises(ContractError, match="withheld from plugins"):
            read()
    assert torch.equal(replace(view, train_y=torch.ones(5)).train_y, torch.ones(5))
    context = BuildContext(data, None, torch.device("cpu"), 0, None, None, Progress(False))
    assert isinstance(context.dataset, TrainingSplit)  # a Dataset given is reduced
    assert isinstance(replace(context, dataset=data).dataset, TrainingSplit)


def test_a_radius_formula_sees_the_certificates_without_their_labels():
    from harness.foundation.protocol import CertificationProtocol
    from harness.foundation.regularity import Constant
    from harness.mathematics.radius import COHEN, RadiusFormula

    seen = []

    def recording(rows, inputs, protocol, regularity):
        seen.extend(rows)
        return COHEN.recompute(rows, inputs, protocol, regularity)

    rows = [{"input_id": 0, "label": 1, "sigma": 0.5, "alpha": 0.001,
             "draws": {"base": {"kind": "counts", "n0": 10, "n": 100, "sigma": 0.5,
                                "selection": [0, 10], "estimation": [1, 99]}}}]  # fmt: skip
    out = RadiusFormula("recording", recording).derive(
        rows, None, CertificationProtocol(n0=10, n=100), Constant(0.5)
    )
    assert [set(r) for r in seen] == [{"input_id", "sigma", "alpha", "draws"}]
    assert rows[0]["label"] == 1 and len(out.prediction) == 1  # (the stored row is kept)


def test_a_run_records_the_rule_and_a_peeking_method_costs_its_own_row(install_plugin, tmp_path):
    """In a plugin host: the peeking σ-provider's setting fails with the rule and the others
    certify; a hosted radius formula re-derives (S0) without seeing a label."""
    from harness.audit.audit import BUDGETS
    from harness.audit.evidence import check_evidence
    from harness.audit.session import audits
    from harness.foundation.verdict import Verdict
    from harness.running.benchmark import parse_benchmark
    from harness.running.preparation import RunOptions
    from harness.running.runner import run_benchmark
    from harness.store.store import ResultStore

    manager = _manager("plugin host", install_plugin)
    raw = {"name": "peek", "seed": 0, "dataset": {"name": "ball-2", "test_count": 6},
           "model": {"architecture": "ball-N", "trainer": "none"},
           "certification": {"n0": 10, "n": 200, "alpha": 0.01},
           "methods": [{"name": "cohen", "settings": [{"sigma": 0.25}]},
                       {"name": "sigma-peeks-test_y", "settings": [{}]},
                       {"name": "label-blind", "settings": [{}]}]}  # fmt: skip
    db = tmp_path / "r.sqlite"
    quiet = Progress(enabled=False)
    run_id = run_benchmark(parse_benchmark(raw), RunOptions(db=db), quiet, manager)
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT test_split FROM runs").fetchall() == [("withheld",)]
        failed = con.execute("SELECT method, error FROM failures").fetchall()
        certified = dict(con.execute("SELECT method, COUNT(*) FROM certificates GROUP BY method"))
    assert [m for m, _ in failed] == ["sigma-peeks-test_y"]
    assert "test_y is withheld from plugins" in failed[0][1]
    assert certified == {"cohen": 6, "label-blind": 6}
    store = ResultStore(db)
    try:
        results = {a.method.name: check_evidence(a) for a in
                   audits(store, run_id, RunOptions(db=db), quiet, manager, budget=BUDGETS["small"])}  # fmt: skip
    finally:
        store.close()
    assert results["label-blind"].verdict == Verdict.SOUND, results["label-blind"].summary
