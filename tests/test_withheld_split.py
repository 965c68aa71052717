"""No plugin sees the test split (docs/plugins.md, "What a plugin sees of the dataset").

A third-party plugin that tries to read the test inputs or labels, in a σ-provider's or
certifier's factory or in a trainer, gets the error that names the rule, in a plugin host
and in the harness's process alike; a plugin written against contract 3 still runs and is
told how to port; the host is sent the training split and description only (no data
file's path), and a hosted plugin that tries its registry's dataset loaders and the
installed datasets' files finds no test split; stored
certificates reach a plugin's radius formula without labels; and a run records the rule.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import types
from pathlib import Path

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
    from harness.plugin.model_description import build_model

    model = build_model(manager.registry, "ball-N", (2,), 2, {})
    protocol = CertificationProtocol(n0=10, n=100, batch_size=64)
    return BuildContext(_dataset(), model, torch.device("cpu"), 0, protocol,
                        SamplingEngine(model, 2, torch.device("cpu"), 64, 0),
                        Progress(enabled=False), manager.registry, method=method)  # fmt: skip


WHERE = ["plugin host", "in process"]


@pytest.mark.slow
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


@pytest.mark.slow
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
    from harness.plugin.hosting.in_harness.host_process import PluginHost

    data = _dataset()
    data.files = {"/data/train-images": "aa", "/data/t10k-labels": "bb"}
    sent = PluginHost()._dataset(data.training_split())
    assert set(sent) == {"name", "train_x", "train_y", "num_classes", "input_shape",
                         "class_names", "files"}  # fmt: skip
    assert torch.equal(sent["train_x"], data.train_x) and sent["input_shape"] == [2]
    assert sent["files"] == {}  # (no path: they name the test split's files too)
    manager = _manager("plugin host", install_plugin)
    provider, _ = build_method(manager.registry, "seeing", {}, _context(manager, "seeing"))
    assert provider(torch.zeros(3, 2)).tolist() == pytest.approx([0.001 * (40 + 2 + 200)] * 3)


SNOOPING = '''
"""A σ-provider whose factory looks for the test split through what the harness hands it,
and reports (as its error) what it found."""
import dataclasses
import json
import os

from harness import MethodSpec, SigmaProviderSpec, hookimpl
from harness.foundation.errors import IdrsError

IDRS_BENCH_CONTRACT = 4


def _try(read):
    try:
        value = read()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    test_y = getattr(value, "test_y", None)
    return f"read {len(test_y)} test labels" if test_y is not None else f"read {value!r}"


def snoop(context, params):
    data = context.dataset
    registry = context.registry
    seen = {
        "view": {f.name: (len(getattr(data, f.name)) if f.name.startswith("train") else
                          getattr(data, f.name)) for f in dataclasses.fields(data)},
        "test_y": _try(lambda: data.test_y),
        "datasets": registry.names("datasets"),
        "loaded": {name: _try(lambda: registry.get("datasets", name).load(seed=context.seed))
                   for name in [*registry.names("datasets"), "cone-2", "ball-2"]},
        "disk": _try(lambda: os.listdir("/usr/share/datasets")),
    }
    from plugins.datasets.fashion_mnist import load_fashion_mnist  # the built-in's code

    seen["built-in loader"] = _try(load_fashion_mnist)
    raise IdrsError("REPORT" + json.dumps(seen))


@hookimpl
def idrs_register_sigma_providers(register):
    register(SigmaProviderSpec("snoop", snoop))


@hookimpl
def idrs_register_methods(register):
    register(MethodSpec("snoop", "snoop", "cohen", {}))
'''


def test_a_hosted_plugin_finds_no_test_split_through_the_registry_or_the_dataset(
    install_plugin,
):
    """A hostile plugin in a confined host tries every dataset loader of its context's
    registry, the dataset's fields and files, and the Fashion-MNIST files on disk (also
    through the built-in loader's code): it sees the training split and the description,
    no data file's path, and an error wherever a test split would be."""
    from harness.certification.method import build_method
    from harness.foundation.errors import IdrsError
    from harness.plugin.hosting.in_harness.confinement_options import unconfined_requested
    from harness.plugin.hosting.shared.landlock import landlock_abi

    install_plugin("idrs_test_snooping", SNOOPING)
    manager = PluginManager()
    data = _dataset()
    data.files = {"/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte": "00" * 32}
    context = _context(manager, "snoop")
    from dataclasses import replace

    context = replace(context, dataset=data)
    with pytest.raises(IdrsError) as caught:
        build_method(manager.registry, "snoop", {}, context)
    seen, _ = json.JSONDecoder().raw_decode(str(caught.value).split("REPORT", 1)[1])
    assert seen["view"] == {"name": "ball-2", "train_x": 40, "train_y": 40, "num_classes": 2,
                            "input_shape": [2], "class_names": ["outside", "inside"],
                            "files": {}}  # fmt: skip
    assert seen["test_y"].startswith("ContractError: dataset 'ball-2': test_y is withheld")
    assert set(seen["datasets"]) == set(manager.registry.names("datasets"))
    assert "fashion-mnist" in seen["datasets"] and "cone-N" in seen["datasets"]
    for name, said in seen["loaded"].items():
        family = name if name in seen["datasets"] else name.rsplit("-", 1)[0] + "-N"
        assert said.startswith(f"ContractError: dataset {family!r} is not loaded in a plugin "
                               "host: a dataset's loader returns its test split"), (name, said)  # fmt: skip
    confined = landlock_abi() >= 3 and not unconfined_requested()
    fashion = Path("/usr/share/datasets/fashion-mnist")
    if confined and fashion.is_dir():  # the files on disk: the read grant leaves them out
        assert (
            seen["disk"] == "PermissionError: [Errno 13] Permission denied: '/usr/share/datasets'"
        )
        assert "[Errno 13] Permission denied: '/usr/share/datasets/fashion-mnist/" in seen[
            "built-in loader"]  # fmt: skip
    elif not fashion.is_dir():
        assert seen["built-in loader"].startswith("DatasetMissingError: fashion-mnist not found")
    with PluginManager(third_party=False) as here:  # the harness's own loaders still load
        assert len(here.registry.get("datasets", "cone-2").load(seed=0).test_y) > 0


def test_the_read_grant_leaves_out_the_installed_datasets_and_nothing_else(tmp_path):
    """``narrowed``: a path holding a withheld folder becomes its other entries (symbolic
    links among them left out: a rule on one would grant its target); a path beside it
    is kept as it is, and one into it is dropped."""
    from harness.plugin.hosting.shared.withheld_data import narrowed

    tmp_path = tmp_path.resolve()  # (compared resolved)
    usr = tmp_path / "usr"
    for folder in ("bin", "lib/python3", "share/datasets/fashion-mnist", "share/zoneinfo"):
        (usr / folder).mkdir(parents=True)
    (usr / "share" / "into-datasets").symlink_to(usr / "share" / "datasets")
    (usr / "share" / "to-etc").symlink_to(tmp_path)
    (tmp_path / "via").symlink_to(usr / "share")
    withheld = [str(usr / "share" / "datasets")]
    got = narrowed([str(usr), str(tmp_path / "via"), str(usr / "share/datasets/fashion-mnist"),
                    str(usr / "lib"), str(tmp_path / "absent")], withheld)  # fmt: skip
    share = usr / "share"
    assert got == [str(usr / "bin"), str(usr / "lib"), str(share / "zoneinfo"),
                   str(share / "zoneinfo"), str(usr / "lib")]  # fmt: skip
    assert narrowed(["/usr"], []) == ["/usr"]


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
