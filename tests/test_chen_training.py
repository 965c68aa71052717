"""Trainer ``chen-instance``: Gaussian augmentation with σ(x) from the Insta-RS search."""

import math

import pytest
import torch

from harness.engine.sampling import SamplingEngine
from harness.foundation.data import Dataset
from harness.foundation.errors import ParameterError
from harness.foundation.progress import Progress
from harness.plugin.components import TrainContext
from harness.plugin.manager import PluginManager
from plugins.chen.config import SEARCH_DEFAULTS, SearchConfig
from plugins.chen.search import search_sigma
from plugins.chen.training import PerExampleSigma

CPU = torch.device("cpu")


def _blobs(n=256, seed=0) -> Dataset:
    """Two Gaussian blobs at ±(2, 0) in 2-D."""
    gen = torch.Generator().manual_seed(seed)

    def sample(count):
        y = torch.arange(count) % 2
        x = torch.randn(count, 2, generator=gen) * 0.7
        x[:, 0] += 4.0 * y - 2.0
        return x, y

    train_x, train_y = sample(n)
    test_x, test_y = sample(n)
    return Dataset("blobs", train_x, train_y, test_x, test_y, 2)


class Recording(torch.nn.Module):
    """A small MLP that records (training mode, grad enabled) at every forward pass."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(2, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)
        )
        self.calls: list[tuple[bool, bool]] = []

    def forward(self, x):
        self.calls.append((self.training, torch.is_grad_enabled()))
        return self.net(x)


def _config(**overrides) -> SearchConfig:
    return SearchConfig.from_params(
        {**SEARCH_DEFAULTS, "num_samples": 32, "num_starts": 2, "max_steps": 4, **overrides}
    )


def test_sigma_is_searched_once_per_refresh_period_with_the_model_in_eval_mode():
    data = _blobs(64)
    model = Recording().train()
    config = _config()
    engine = SamplingEngine(model, 2, CPU, batch_size=256, seed=7)
    sigma_for_batch = PerExampleSigma(
        model, data, config, engine, seed=7, warmup_epochs=1, refresh_every=2
    )
    index = torch.tensor([3, 10, 20, 33])
    x = data.train_x[index]
    # warm-up: σ0 for everyone, no search
    assert torch.equal(sigma_for_batch(index, x, 0), torch.full((4,), 0.25, dtype=torch.float64))
    assert model.calls == []
    # period 0 (epochs 1 and 2): searched once with the model as it is, in eval mode
    first = sigma_for_batch(index, x, 1)
    assert model.training
    assert model.calls and all(not training and not grad for training, grad in model.calls)
    expected = search_sigma(engine, x, config, seed=7, salt=0).sigma
    assert first.numpy() == pytest.approx(expected, rel=1e-12)
    model.calls.clear()
    assert torch.equal(sigma_for_batch(index, x, 2), first)
    assert model.calls == []  # kept for the rest of the period
    # a batch mixing searched and fresh examples searches only the fresh ones
    mixed = torch.tensor([3, 40])
    out = sigma_for_batch(mixed, data.train_x[mixed], 2)
    assert out[0] == first[0]
    fresh = search_sigma(engine, data.train_x[mixed][1:], config, seed=7, salt=0).sigma
    assert float(out[1]) == pytest.approx(fresh[0], rel=1e-12)
    # period 1 (epoch 3): refreshed with fresh noise
    again = sigma_for_batch(index, x, 3)
    expected = search_sigma(engine, x, config, seed=7, salt=1).sigma
    assert again.numpy() == pytest.approx(expected, rel=1e-12)
    bound = (config.sigma0, math.sqrt(config.max_level) * config.sigma0)
    assert bool(((again >= bound[0] - 1e-12) & (again <= bound[1] + 1e-12)).all())


def test_trainer_trains_through_the_registry():
    manager = PluginManager(third_party=False)
    trainer = manager.registry.get("trainers", "chen-instance")
    data = _blobs(256)
    model = Recording()
    params = {
        **trainer.defaults,
        "epochs": 3,
        "batch_size": 64,
        "lr": 1e-2,
        "num_samples": 32,
        "num_starts": 2,
        "max_steps": 4,
    }
    trainer.train(model, data, params, TrainContext(CPU, seed=0, progress=Progress(False)))
    assert not model.training
    searched = sum(1 for training, grad in model.calls if not grad)
    assert searched > 0  # the search ran during training
    with torch.no_grad():
        accuracy = (model(data.test_x).argmax(1) == data.test_y).float().mean()
    assert accuracy > 0.9


@pytest.mark.parametrize(
    ("key", "value"), [("refresh_every", 0), ("warmup_epochs", -1), ("num_samples", 0)]
)
def test_trainer_rejects_invalid_parameters(key, value):
    from plugins.chen.training import train_chen_instance

    with pytest.raises(ParameterError, match=key):
        train_chen_instance(
            Recording(), _blobs(8), {key: value}, TrainContext(CPU, 0, Progress(False))
        )
