"""Insta-RS training: Gaussian augmentation with per-example σ from the same search.

Súkeník et al. (2022), App. E.4: Chen et al. (2021) train with input-dependent
Gaussian augmentation whose σ(x) is obtained "similarly as during test time", i.e. by
the multiple-start FGSS of Alg. 2 (App. C.3) on the training examples. Here:

- the first ``warmup_epochs`` epochs use σ = σ0 for every example (the search needs a
  model that already classifies something; the original work trains in two stages);
- afterwards each example's σ is searched with the model being trained (in eval mode,
  batched over the minibatch, through a :class:`~harness.engine.sampling.SamplingEngine` on
  that model) the first time the example is seen in a refresh period of
  ``refresh_every`` epochs, and kept for the rest of the period;
- the noise of period p is salted with p, so each refresh draws fresh Monte Carlo noise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness import (
    ParameterError,
    SamplingEngine,
    TrainContext,
    TrainingSplit,
    train_with_gaussian_augmentation,
)
from plugins.chen.config import TRAINER_DEFAULTS, SearchConfig
from plugins.chen.search import search_sigma


class PerExampleSigma:
    """``sigma_for_batch`` for :func:`train_with_gaussian_augmentation` (see module doc)."""

    def __init__(
        self,
        model: torch.nn.Module,
        dataset: TrainingSplit,
        config: SearchConfig,
        engine: SamplingEngine,
        seed: int,
        warmup_epochs: int,
        refresh_every: int,
    ) -> None:
        self.model = model
        self.config = config
        self.engine = engine
        self.seed = seed
        self.warmup_epochs = warmup_epochs
        self.refresh_every = refresh_every
        self.sigma = torch.full((len(dataset.train_x),), config.sigma0, dtype=torch.float64)
        self.period = torch.full((len(dataset.train_x),), -1, dtype=torch.int64)

    def __call__(self, index: torch.Tensor, x: torch.Tensor, epoch: int) -> torch.Tensor:
        index = index.cpu()
        if epoch < self.warmup_epochs:
            return torch.full((len(index),), self.config.sigma0, dtype=torch.float64)
        period = (epoch - self.warmup_epochs) // self.refresh_every
        stale = self.period[index] != period
        if bool(stale.any()):
            was_training = self.model.training
            self.model.eval()
            try:
                chosen = stale.to(x.device)
                result = search_sigma(self.engine, x[chosen], self.config, self.seed, salt=period)
            finally:
                self.model.train(was_training)
            self.sigma[index[stale]] = torch.from_numpy(result.sigma)
            self.period[index[stale]] = period
        return self.sigma[index]


def train_chen_instance(
    model: torch.nn.Module, dataset: TrainingSplit, params: Mapping[str, Any], context: TrainContext
) -> None:
    """Trainer ``chen-instance``: Gaussian augmentation with σ(x) from Alg. 2, refreshed every E epochs."""
    p = {**TRAINER_DEFAULTS, **params}
    config = SearchConfig.from_params(p)
    for key in ("warmup_epochs", "refresh_every", "search_batch_size"):
        value = p[key]
        low = 0 if key == "warmup_epochs" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ParameterError(f"{key} must be an integer >= {low}, got {value!r}")
    model.to(context.device)
    engine = SamplingEngine(
        model, dataset.num_classes, context.device, p["search_batch_size"], context.seed
    )
    sigma_for_batch = PerExampleSigma(
        model, dataset, config, engine, context.seed, p["warmup_epochs"], p["refresh_every"]
    )
    train_with_gaussian_augmentation(
        model,
        dataset,
        sigma_for_batch,
        context,
        epochs=int(p["epochs"]),
        batch_size=int(p["batch_size"]),
        lr=float(p["lr"]),
    )
