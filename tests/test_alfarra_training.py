"""The trainer ``alfarra-ds`` (Alfarra et al. 2022, Alg. 2): per-example σ, warm starts,
K = 0 for the first epochs, and the train-and-certify benchmark."""

import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import norm

from harness.foundation.data import Dataset
from harness.foundation.errors import ParameterError
from harness.foundation.progress import Progress
from harness.plugin.components import TrainContext
from harness.plugin.manager import PluginManager
from harness.running.benchmark import parse_benchmark, validate
from plugins.alfarra import TRAINER_DEFAULTS
from plugins.alfarra.training import DataDependentSigmas, train_alfarra_ds

BENCHMARK = Path(__file__).parents[1] / "plugins" / "alfarra" / "benchmarks" / "alfarra-ds2.toml"


pytestmark = pytest.mark.usefixtures("one_thread")


class FarFromBall(torch.nn.Module):
    """f = [‖x‖ <= 1] with a dummy parameter; on inputs far from the ball E_A is clamped."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(20.0))

    def forward(self, x):
        margin = self.scale * (1 - x.flatten(1).norm(dim=1))
        return torch.stack([torch.zeros_like(margin), margin], dim=1)


def test_sigma_per_example_is_warm_started_and_frozen_during_warmup():
    """Far from the ball ∂R/∂σ = Φ⁻¹(0.98) exactly, so σ_i counts the optimization steps."""
    model = FarFromBall().train()
    sigmas = DataDependentSigmas(
        model, 6, 0.25, warmup_epochs=2, steps=3, samples=4, beta=0.01, sigma_min=1e-3,
        seed=0, device=torch.device("cpu"),
    )  # fmt: skip
    x = torch.full((6, 2), 30.0)
    step = 0.01 * norm.ppf(0.98)
    first, rest = torch.tensor([0, 2, 4]), torch.tensor([1, 3, 5])
    for epoch in range(2):  # K = 0: σ_0 for everyone
        assert sigmas(first, x[first], epoch).tolist() == [0.25] * 3
    assert sigmas(first, x[first], 2) == pytest.approx([0.25 + 3 * step] * 3, rel=1e-9)
    assert sigmas(rest, x[rest], 2) == pytest.approx([0.25 + 3 * step] * 3, rel=1e-9)
    # epoch 3 starts from epoch 2's σ of each example; examples outside the batch keep theirs
    assert sigmas(first[:1], x[:1], 3) == pytest.approx([0.25 + 6 * step], rel=1e-9)
    assert sigmas.sigmas.tolist() == pytest.approx(
        [0.25 + 6 * step] + [0.25 + 3 * step] * 5, rel=1e-9
    )
    assert model.training  # OptimizeSigma ran in eval mode and gave the model back in train mode


def _tiny_dataset(n=256, d=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen)
    y = (x[:, 0] > 0).long()
    return Dataset("tiny", x, y, x[:16], y[:16], 2)


def _train(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    params = {**TRAINER_DEFAULTS, "epochs": 3, "warmup_share": 0.25, "beta": 0.05, "samples": 2}
    context = TrainContext(torch.device("cpu"), seed, Progress(enabled=False))
    sigmas = train_alfarra_ds(model, _tiny_dataset(), params, context)
    return model, sigmas.sigmas


def test_training_is_seeded_and_moves_sigma_after_the_warmup():
    model_a, sigma_a = _train(0)
    model_b, sigma_b = _train(0)
    for p, q in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert torch.equal(p, q)
    assert torch.equal(sigma_a, sigma_b)
    assert not model_a.training
    moved = (sigma_a - 0.25).abs()
    assert bool((moved > 0).all()) and len(np.unique(sigma_a.numpy())) > 100
    assert bool((sigma_a >= TRAINER_DEFAULTS["sigma_min"]).all())


def test_invalid_trainer_parameters_are_rejected():
    context = TrainContext(torch.device("cpu"), 0, Progress(enabled=False))
    model = torch.nn.Linear(4, 2)
    for bad in (
        {"warmup_share": -0.1},
        {"warmup_share": 1.5},
        {"steps": -2},
        {"sigma": 0},
        {"sigma_min": -1.0},
    ):
        with pytest.raises(ParameterError):
            train_alfarra_ds(model, _tiny_dataset(), {**TRAINER_DEFAULTS, **bad}, context)


def test_the_train_and_certify_benchmark_names_the_trainer_and_both_methods():
    manager = PluginManager(third_party=False)
    spec = parse_benchmark(tomllib.loads(BENCHMARK.read_text()))
    validate(spec, manager.registry)
    assert spec.model.trainer == "alfarra-ds"
    assert {m.name for m in spec.methods} >= {"cohen", "alfarra-ds", "alfarra-ds-memory"}


def test_warmup_is_the_papers_quarter_of_the_epochs():
    from plugins.alfarra.training import warmup_epochs

    assert TRAINER_DEFAULTS["warmup_share"] == 0.25
    assert warmup_epochs(200, 0.25) == 50  # §4.1: K = 0 for 50 of 200 CIFAR-10 epochs
    assert [warmup_epochs(e, 0.25) for e in (1, 2, 3, 4, 10, 12)] == [0, 1, 1, 1, 3, 3]
