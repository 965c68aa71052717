"""The field's benchmark files end to end on tiny files in the real formats (small n)."""

from __future__ import annotations

import json

import pytest
import torch

from harness.cli.main import main
from harness.foundation.errors import IdrsError
from harness.running.benchmark import BENCHMARKS_DIR, load_benchmark
from harness.store.store import ResultStore

SMALL = ["--set", "certification.n0=10", "--set", "certification.n=100",
         "--set", "certification.batch_size=100"]  # fmt: skip


def _run(tmp_path, spec, *extra):
    db = tmp_path / "r.sqlite"
    args = ["run", str(BENCHMARKS_DIR / spec), "--db", str(db), "--device", "cpu",
            "--data-root", str(tmp_path / "data"), "--quiet", "--no-check", *SMALL, *extra]  # fmt: skip
    assert main(args) == 0
    store = ResultStore(db)
    try:
        run = store.run()
        certificates = list(store.certificates(run["run_id"]))
        failures = store.failures(run["run_id"])
    finally:
        store.close()
    assert not failures, failures
    return run, certificates


def test_set_overrides_are_toml_typed():
    spec = load_benchmark(BENCHMARKS_DIR / "mnist.toml", ["certification.n=200", "name=x",
                     "model.trainer_params.sigma=0.5", 'methods=[{name="cohen"}]'])  # fmt: skip
    assert spec.protocol.n == 200 and spec.name == "x"
    assert spec.model.trainer_params == {"sigma": 0.5, "epochs": 20}
    assert [m.name for m in spec.methods] == ["cohen"]
    with pytest.raises(IdrsError, match="KEY=VALUE"):
        load_benchmark(BENCHMARKS_DIR / "mnist.toml", ["certification.n"])


def test_test_count_all_is_the_whole_split():
    spec = load_benchmark(BENCHMARKS_DIR / "mnist.toml", ["dataset.test_count=all"])
    assert spec.dataset.test_count is None
    assert load_benchmark(BENCHMARKS_DIR / "mnist.toml", ['dataset.test_count="all"']).dataset == (
        spec.dataset
    )
    with pytest.raises(IdrsError, match='test_count must be a number >= 1 or "all"'):
        load_benchmark(BENCHMARKS_DIR / "mnist.toml", ["dataset.test_count=every"])


def test_cifar10_cohen_on_a_cohen_checkpoint(tmp_path, write_cifar10, write_cohen_checkpoint):
    write_cifar10(tmp_path / "data", per_batch=4, test=40)
    checkpoint = tmp_path / "checkpoint.pth.tar"
    write_cohen_checkpoint(checkpoint, "cifar_resnet20")
    with pytest.warns(UserWarning, match="MD5"):  # the file names no architecture: its arch does
        run, certs = _run(tmp_path, "cifar10-cohen.toml", "--set", f"model.checkpoint={checkpoint}")
    assert [c["input_id"] for c in certs] == [0, 20]  # every 20th test image
    model = run["config"]["model"]
    assert model["checkpoint"] == str(checkpoint) and model["architecture"] == "cifar-resnet"
    assert model["architecture_params"] == {"depth": 20, "normalization": "cifar10"}
    from harness.plugin.manager import PluginManager
    from harness.running.benchmark import benchmark_from_dict
    from harness.running.checkpoint import load_checkpoint
    from harness.running.weights import weights_digest
    from plugins.datasets.torchvision_sets import load_cifar10

    spec = benchmark_from_dict(run["config"])
    with pytest.warns(UserWarning):
        data = load_cifar10(tmp_path / "data")
    model, _ = load_checkpoint(spec.model, data, PluginManager().registry)
    assert run["weights_digest"] == weights_digest(model)


def _inline(value) -> str:
    """``value`` as a TOML inline value (strings quoted, tables inline)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_inline(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_inline(v) for v in value) + "]"
    return json.dumps(value)


def test_cifar10_idrs_every_method_on_one_checkpoint(
    tmp_path, write_cifar10, write_cohen_checkpoint
):
    """Every built-in method, with its costly loops shortened for a CPU test."""
    write_cifar10(tmp_path / "data", per_batch=8, test=20)
    checkpoint = tmp_path / "checkpoint.pth.tar"
    write_cohen_checkpoint(checkpoint, "cifar_resnet20")
    spec = load_benchmark(BENCHMARKS_DIR / "cifar10-idrs.toml")
    short = {"chen-fgss": {"num_starts": 1, "num_samples": 8, "max_steps": 2},
             "alfarra-ds": {"steps": 2}, "alfarra-ds-memory": {"steps": 2},
             "lipschitz-sigma-net": {"train_examples": 8, "train_steps": 2, "train_batch": 4,
                                     "train_samples": 2},
             "sukenik": {"k": 5},
             "dual-rs": {"train_examples": 8, "label_samples": 2, "epochs": 1}}  # fmt: skip
    methods = ", ".join(
        f'{{name="{m.name}", settings=[{_inline({**s, **short.get(m.name, {})})}]}}'
        for m in spec.methods for s in m.settings[:1]
    )  # fmt: skip
    with pytest.warns(UserWarning, match="MD5"):
        _, certs = _run(tmp_path, "cifar10-idrs.toml", "--set", f"model.checkpoint={checkpoint}",
                          "--set", "model.architecture_params.depth=20",
                          "--set", f"methods=[{methods}]")  # fmt: skip
    assert {c["method"] for c in certs} == {m.name for m in spec.methods}
    assert all(c["input_id"] == 0 for c in certs)


def test_mnist_trains_a_lenet_for_one_epoch(tmp_path, write_mnist):
    write_mnist(tmp_path / "data", train=40, test=40)
    run, certs = _run(tmp_path, "mnist.toml", "--set", "model.trainer_params.epochs=1",
                      "--set", 'methods=[{name="cohen", settings=[{sigma=0.25}]}]')  # fmt: skip
    assert [c["input_id"] for c in certs] == [0, 20] and run["weights_digest"]


@pytest.mark.long
@pytest.mark.slow
def test_imagenet_cohen_on_a_resnet50_checkpoint(
    tmp_path, capsys, write_imagenet, write_cohen_checkpoint
):
    write_imagenet(tmp_path / "data", classes=3, per_class=2)
    checkpoint = tmp_path / "checkpoint.pth.tar"
    write_cohen_checkpoint(checkpoint, "resnet50")
    # the tiny folder has 3 classes; the 1000-class checkpoint does not fit it
    args = ["run", str(BENCHMARKS_DIR / "imagenet-cohen.toml"), "--db", str(tmp_path / "r.sqlite"),
            "--data-root", str(tmp_path / "data"), "--quiet", "--no-check",
            "--set", f"model.checkpoint={checkpoint}"]  # fmt: skip
    assert main(args) == 2
    assert "wrong shape" in capsys.readouterr().err
    for c in range(3, 1000):
        (tmp_path / "data" / "val" / f"n{c:08d}").mkdir()
    from PIL import Image

    for c in range(3, 1000):  # ImageFolder needs an image in every class folder
        Image.new("RGB", (8, 8)).save(tmp_path / "data" / "val" / f"n{c:08d}" / "x.JPEG")
    _, certs = _run(tmp_path, "imagenet-cohen.toml", "--set", f"model.checkpoint={checkpoint}",
                      "--set", "certification.n=20", "--set", "certification.batch_size=20",
                      "--set", "dataset.test_count=1")  # fmt: skip
    assert [c["input_id"] for c in certs] == [0] and certs[0]["label"] == 0


@pytest.mark.parametrize("writer, name", [("write_cifar10", "cifar10"), ("write_svhn", "svhn")])
def test_gaussian_augmentation_trains_on_image_datasets(manager, tmp_path, writer, name, request):
    from harness.foundation.progress import Progress
    from harness.plugin.components import TrainContext

    request.getfixturevalue(writer)(tmp_path)
    with pytest.warns(UserWarning):
        data = manager.registry.get("datasets", name).load(data_root=str(tmp_path))
    torch.manual_seed(0)
    model = manager.registry.get("models", "cifar-resnet").build(data.input_shape, 10, {"depth": 8})
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = manager.registry.get("trainers", "gaussian-augmentation")
    params = {**trainer.defaults, "epochs": 1, "batch_size": 8}
    trainer.train(model, data, params, TrainContext(torch.device("cpu"), 0, Progress(False)))
    assert not torch.equal(before["1.conv1.weight"], model.state_dict()["1.conv1.weight"])
    assert torch.isfinite(model(data.test_x)).all()


def test_run_json_reports_the_weights_digest(tmp_path, capsys, write_mnist):
    write_mnist(tmp_path / "data", train=20, test=20)
    run, _ = _run(tmp_path, "mnist.toml", "--set", "model.trainer_params.epochs=1",
                  "--set", 'methods=[{name="cohen", settings=[{sigma=0.25}]}]')  # fmt: skip
    capsys.readouterr()
    assert main(["results", "--db", str(tmp_path / "r.sqlite"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["weights_digest"] == run["weights_digest"]
