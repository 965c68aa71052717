"""Architectures, checkpoints in each format, and the weights digest."""

from __future__ import annotations

import copy

import pytest
import torch

from harness.foundation.data import Dataset
from harness.foundation.errors import SpecError
from harness.running.benchmark import AUTO_ARCHITECTURE, ModelConfig, parse_benchmark
from harness.running.checkpoint import CheckpointError, load_checkpoint, resolve_architecture
from harness.running.weights import weights_digest


def _images(shape, classes, count=2):
    return Dataset("cifar10", torch.empty(0, *shape), torch.empty(0, dtype=torch.long),
                   torch.rand(count, *shape), torch.zeros(count, dtype=torch.long), classes)  # fmt: skip


@pytest.mark.parametrize("depth, millions", [(20, 0.27), (56, 0.85), (110, 1.7)])
def test_cifar_resnet_sizes_match_he_et_al(manager, depth, millions):
    """He et al. (2016) Table 6: ResNet-20/56/110 have 0.27M/0.85M/1.7M parameters."""
    model = manager.registry.get("models", "cifar-resnet").build((3, 32, 32), 10, {"depth": depth})
    count = sum(p.numel() for p in model.parameters()) / 1e6
    assert count == pytest.approx(millions, rel=0.03)
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 10)


def test_normalization_is_inside_the_model(manager):
    model = manager.registry.get("models", "cifar-resnet").build((3, 32, 32), 10, {"depth": 20})
    x = torch.full((1, 3, 32, 32), 0.5)
    expected = (0.5 - torch.tensor([0.4914, 0.4822, 0.4465])) / torch.tensor(
        [0.2023, 0.1994, 0.2010]
    )
    assert torch.allclose(model[0](x)[0, :, 0, 0], expected)
    assert not any(k.startswith("0.") for k in model.state_dict())


def test_cohen_checkpoint_loads_into_the_matching_architecture(
    manager, tmp_path, write_cohen_checkpoint
):
    path = tmp_path / "checkpoint.pth.tar"
    state = write_cohen_checkpoint(path, "cifar_resnet20")
    config = ModelConfig("cifar-resnet", "none", architecture_params={"depth": 20},
                         checkpoint=str(path), format="cohen")  # fmt: skip
    data = _images((3, 32, 32), 10)
    model, _ = load_checkpoint(config, data, manager.registry)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    reference = manager.registry.get("models", "cifar-resnet").build((3, 32, 32), 10, {"depth": 20})
    reference.load_state_dict(state)
    reference.eval()
    assert torch.equal(model(data.test_x), reference(data.test_x))
    assert weights_digest(model) == weights_digest(reference)
    wrong = ModelConfig("cifar-resnet", "none", architecture_params={"depth": 110},
                        checkpoint=str(path), format="cohen")  # fmt: skip
    with pytest.raises(CheckpointError, match="cifar_resnet20"):
        load_checkpoint(wrong, data, manager.registry)


def test_cohen_imagenet_checkpoint_with_data_parallel_keys(
    manager, tmp_path, write_cohen_checkpoint
):
    path = tmp_path / "checkpoint.pth.tar"
    state = write_cohen_checkpoint(path, "resnet50")
    assert next(iter(state)).startswith("1.module.")
    data = Dataset("imagenet", torch.empty(0, 3, 224, 224), torch.empty(0, dtype=torch.long),
                   torch.rand(1, 3, 224, 224), torch.zeros(1, dtype=torch.long), 1000)  # fmt: skip
    config = ModelConfig("resnet50", "none", checkpoint=str(path), format="cohen")
    model, _ = load_checkpoint(config, data, manager.registry)
    assert torch.equal(model.state_dict()["1.conv1.weight"], state["1.module.conv1.weight"])


@pytest.mark.parametrize("arch, depth", [("cifar_resnet20", 20), ("cifar_resnet110", 110)])
def test_cohen_checkpoint_names_its_architecture(
    manager, tmp_path, write_cohen_checkpoint, arch, depth
):
    """format = "cohen" alone: the file's 'arch' picks the architecture (the issue's case)."""
    path = tmp_path / "checkpoint.pth.tar"
    state = write_cohen_checkpoint(path, arch)
    config = ModelConfig(AUTO_ARCHITECTURE, "none", checkpoint=str(path), format="cohen")
    resolved = resolve_architecture(config, "cifar10", manager.registry)
    assert resolved.architecture == "cifar-resnet"
    assert resolved.architecture_params == {"depth": depth, "normalization": "cifar10"}
    data = _images((3, 32, 32), 10)
    model, _ = load_checkpoint(config, data, manager.registry)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    # Cohen et al.'s model: Sequential(NormalizeLayer(CIFAR-10 statistics), net)
    x = data.test_x
    mean = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
    sd = torch.tensor([0.2023, 0.1994, 0.2010]).view(1, 3, 1, 1)
    assert torch.allclose(model(x), model[1]((x - mean) / sd), atol=1e-6)


def test_unknown_arch_names_it_and_the_fix(manager, tmp_path, write_cohen_checkpoint):
    path = tmp_path / "checkpoint.pth.tar"
    write_cohen_checkpoint(path, "cifar_resnet20")
    content = torch.load(path, weights_only=True)
    torch.save(content | {"arch": "cifar_resnet56"}, path)
    config = ModelConfig(AUTO_ARCHITECTURE, "none", checkpoint=str(path), format="cohen")
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(config, _images((3, 32, 32), 10), manager.registry)
    message = str(info.value)
    assert "\n" not in message and "'cifar_resnet56'" in message
    assert "cifar_resnet110, cifar_resnet20, resnet50" in message
    assert "architecture = NAME" in message
    # given by hand (here wrongly: the weights are a ResNet-20's), the state dict is read
    by_hand = ModelConfig("cifar-resnet", "none", architecture_params={"depth": 20},
                          checkpoint=str(path), format="cohen")  # fmt: skip
    model, _ = load_checkpoint(by_hand, _images((3, 32, 32), 10), manager.registry)
    assert torch.equal(model.state_dict()["1.fc.weight"], content["state_dict"]["1.fc.weight"])


def test_spec_architecture_must_agree_with_the_file(manager, tmp_path, write_cohen_checkpoint):
    path = tmp_path / "checkpoint.pth.tar"
    write_cohen_checkpoint(path, "cifar_resnet20")
    for arch, params in (("resnet50", {}), ("cifar-resnet", {"depth": 110})):
        config = ModelConfig(arch, "none", architecture_params=params, checkpoint=str(path),
                             format="cohen")  # fmt: skip
        with pytest.raises(CheckpointError, match="holds a cifar_resnet20.*architecture_params = "
                           r"\{'depth': 20\}"):  # fmt: skip
            resolve_architecture(config, "cifar10", manager.registry)


def test_smoothadv_centering_layer_by_normalization(manager, tmp_path, write_cohen_checkpoint):
    """SmoothAdv's InputCenterLayer models (their README's list): mean subtracted, no division."""
    path = tmp_path / "checkpoint.pth.tar"
    write_cohen_checkpoint(path, "cifar_resnet20")
    config = ModelConfig(AUTO_ARCHITECTURE, "none", checkpoint=str(path), format="cohen",
                         architecture_params={"normalization": "cifar10-centered"})  # fmt: skip
    data = _images((3, 32, 32), 10)
    model, _ = load_checkpoint(config, data, manager.registry)
    mean = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
    assert torch.allclose(model(data.test_x), model[1](data.test_x - mean), atol=1e-6)


def test_macer_checkpoint(manager, tmp_path, write_macer_checkpoint):
    """MACER's {'net', 'epoch'}: its ResNet-110 on raw pixels, no normalization layer."""
    path = tmp_path / "440.pth"
    state = write_macer_checkpoint(path)
    config = ModelConfig(AUTO_ARCHITECTURE, "none", checkpoint=str(path), format="cohen")
    data = _images((3, 32, 32), 10)
    model, _ = load_checkpoint(config, data, manager.registry)
    assert all(torch.equal(model.state_dict()["1." + k], v) for k, v in state.items())
    assert torch.equal(model(data.test_x), model[1](data.test_x))
    imagenet = Dataset("imagenet", torch.empty(0, 3, 8, 8), torch.empty(0, dtype=torch.long),
                       torch.rand(1, 3, 8, 8), torch.zeros(1, dtype=torch.long), 1000)  # fmt: skip
    with pytest.raises(CheckpointError, match=r"MACER checkpoint.*cifar10 and svhn"):
        load_checkpoint(config, imagenet, manager.registry)


def test_checkpoint_without_an_architecture_in_the_spec():
    def spec(fmt):
        return parse_benchmark({"dataset": {"name": "cifar10"}, "methods": [{"name": "cohen"}],
                           "model": {"checkpoint": "m.pt", **fmt}})  # fmt: skip

    assert spec({"format": "cohen"}).model.architecture == AUTO_ARCHITECTURE
    assert spec({"format": "torchscript"}).model.architecture == "torchscript"
    with pytest.raises(SpecError, match=r'needs architecture = NAME.*format = "cohen" reads it'):
        spec({})


def test_not_a_published_file(manager, tmp_path):
    torch.save({"model": {}}, tmp_path / "m.pt")
    config = ModelConfig(AUTO_ARCHITECTURE, "none", checkpoint=str(tmp_path / "m.pt"),
                         format="cohen")  # fmt: skip
    with pytest.raises(CheckpointError, match=r"neither.*it holds \['model'\]"):
        load_checkpoint(config, _images((3, 32, 32), 10), manager.registry)


def test_state_dict_and_torchscript_formats(manager, tmp_path):
    source = manager.registry.get("models", "cifar-resnet").build((3, 32, 32), 10, {"depth": 20})
    source.eval()
    data = _images((3, 32, 32), 10)
    torch.save(source.state_dict(), tmp_path / "w.pt")
    config = ModelConfig("cifar-resnet", "none", architecture_params={"depth": 20},
                         checkpoint=str(tmp_path / "w.pt"))  # fmt: skip
    model, _ = load_checkpoint(config, data, manager.registry)
    assert torch.equal(model(data.test_x), source(data.test_x))
    torch.jit.save(torch.jit.trace(source, data.test_x), tmp_path / "m.ts")
    scripted, _ = load_checkpoint(
        ModelConfig("torchscript", "none", checkpoint=str(tmp_path / "m.ts"), format="torchscript"),
        data, manager.registry,
    )  # fmt: skip
    assert torch.allclose(scripted(data.test_x), source(data.test_x), atol=1e-5)


def test_key_mismatch_is_one_error_naming_keys(manager, tmp_path):
    source = manager.registry.get("models", "cifar-resnet").build((3, 32, 32), 10, {"depth": 20})
    state = {k.replace("1.fc.", "1.head."): v for k, v in source.state_dict().items()}
    torch.save(state, tmp_path / "w.pt")
    config = ModelConfig("cifar-resnet", "none", architecture_params={"depth": 20},
                         checkpoint=str(tmp_path / "w.pt"))  # fmt: skip
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(config, _images((3, 32, 32), 10), manager.registry)
    message = str(info.value)
    assert "\n" not in message and "1.fc.weight" in message and "1.head.weight" in message


def test_weights_digest_names_the_weights():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    twin = copy.deepcopy(model)
    assert weights_digest(model) == weights_digest(twin)
    with torch.no_grad():  # the smallest change: one ulp of one weight
        w = twin[0].weight
        w[0, 0] = torch.nextafter(w[0, 0], torch.tensor(float("inf")))
    assert weights_digest(model) != weights_digest(twin)
    assert weights_digest(model.double()) != weights_digest(copy.deepcopy(model).float())
