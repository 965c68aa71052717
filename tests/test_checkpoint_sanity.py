"""A checkpoint near chance: each usual cause made on a tiny trained model, and found."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.running.checkpoint_sanity import best_relabelling, check_base_model

CLASSES = 10


def _data(count: int, seed: int):
    """Images [3, 4, 4] in [0, 1] around 0.5 whose class is their brightness (a small,
    ordered signal, as natural images' classes are small signals around the mean), with noise."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(count) % CLASSES
    brightness = ((labels.float() - 4.5) / 4.5).view(-1, 1, 1, 1)
    noise = 0.1 * torch.randn(count, 3, 4, 4, generator=gen)
    return (0.5 + 0.1 * (brightness + noise)).clamp(0, 1), labels


_TRAIN_X, _TRAIN_Y = _data(600, seed=1)
MEAN = _TRAIN_X.mean(dim=(0, 2, 3), keepdim=True)  # the dataset's per-channel statistics
STD = _TRAIN_X.std(dim=(0, 2, 3), keepdim=True)


def _normalize(x):
    return (x - MEAN) / STD


def _train(transform, target=lambda y: y) -> torch.nn.Module:
    """A tiny network (linear, batch norm, ReLU, linear) trained on transform(x) -> target(y)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(48, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
        torch.nn.Linear(32, CLASSES),
    )  # fmt: skip
    optimizer = torch.optim.Adam(net.parameters(), lr=0.02)
    for _ in range(500):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(transform(_TRAIN_X)), target(_TRAIN_Y))
        loss.backward()
        optimizer.step()
    return net.eval()


class Lambda(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


PERMUTATION = torch.tensor([3, 7, 0, 9, 1, 2, 8, 4, 6, 5])  # no fixed point


def _check(model):
    x, y = _data(200, seed=2)
    return check_base_model(model, x, y, CLASSES, torch.device("cpu"))


def test_a_healthy_model_passes():
    report = _check(_train(lambda x: x))
    assert report.accuracy > 0.85 and not report.near_chance
    assert report.warning("m.pt") is None and report.corrected == {}


@pytest.mark.parametrize(
    "cause, model",
    [
        # trained with the classes in another order (e.g. other ImageNet folder names)
        ("label order", lambda: _train(lambda x: x, lambda y: PERMUTATION[y])),
        # trained on normalized inputs; the checkpoint lost its normalization layer
        ("missing normalization", lambda: _train(_normalize)),
        # trained on raw pixels; the harness's model normalizes once more
        ("doubled normalization",
         lambda: torch.nn.Sequential(Lambda(_normalize), _train(lambda x: x))),
        # trained on pixels in [0, 255]
        ("pixel range", lambda: _train(lambda x: 255 * x)),
    ],
)  # fmt: skip
def test_each_cause_is_found_by_correcting_it(cause, model):
    report = _check(model())
    assert report.near_chance, report
    assert report.likely_cause() == cause, report
    assert report.corrected[cause] > 0.85
    warning = report.warning("ckpt.pth.tar")
    assert "\n" not in warning and "ckpt.pth.tar" in warning and f"likely cause: {cause}" in warning


def test_an_unknown_cause_is_said_so():
    torch.manual_seed(3)  # an untrained network
    report = _check(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, CLASSES)))
    assert report.near_chance and report.likely_cause() is None
    assert "no usual cause recovers it" in report.warning("m.pt")


def test_best_relabelling_against_brute_force():
    rng = np.random.default_rng(0)
    labels, predictions = rng.integers(0, 4, 40), rng.integers(0, 4, 40)
    from itertools import permutations

    brute = max(np.mean(np.array(p)[predictions] == labels) for p in permutations(range(4)))
    assert best_relabelling(labels, predictions, 4) == pytest.approx(brute)


def test_a_run_on_a_near_chance_checkpoint_warns(tmp_path, capsys, write_cifar10,
                                                  write_cohen_checkpoint):  # fmt: skip
    """Random weights certify at chance: the run says so before certifying."""
    from harness.cli.main import main
    from harness.running.benchmark import BENCHMARKS_DIR

    write_cifar10(tmp_path / "data", per_batch=4, test=40)
    checkpoint = tmp_path / "checkpoint.pth.tar"
    write_cohen_checkpoint(checkpoint, "cifar_resnet20")
    with pytest.warns(UserWarning, match="MD5"):
        assert main(["run", str(BENCHMARKS_DIR / "cifar10-cohen.toml"), "--db",
                     str(tmp_path / "r.sqlite"), "--device", "cpu", "--data-root",
                     str(tmp_path / "data"), "--quiet", "--no-check",
                     "--set", f"model.checkpoint={checkpoint}", "--set", "certification.n0=10",
                     "--set", "certification.n=20", "--set", "certification.batch_size=20"]) == 0  # fmt: skip
    err = capsys.readouterr()
    assert f"the base model from {checkpoint}" in err.out + err.err
