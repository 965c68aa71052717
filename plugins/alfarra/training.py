"""The trainer ``alfarra-ds``: Gaussian augmentation with data-dependent σ (Alfarra et al. 2022, Alg. 2).

Each training example i keeps its own σ_i, initialized to the training σ_0. In every
batch, σ_i is refined by OptimizeSigma (Alg. 1) on the current model, warm-started from
σ_i of the previous epoch (§3.6), and the model is trained on x_i + σ_i ε with cross
entropy (Cohen's Gaussian augmentation, §4.1). During the first warm-up epochs
OptimizeSigma runs with K = 0, i.e. σ_i = σ_0 (§4.1: K = 0 for the first 50 of 200
CIFAR-10 epochs, then K = 1): the parameter ``warmup_share`` (default 0.25, the paper's
share) gives the warm-up as a share of the epochs, :func:`warmup_epochs` rounds it
half up (10 epochs: 3 warm-up epochs).

Decisions where the paper is silent: OptimizeSigma runs with the model in eval mode
(so that batch-norm statistics are not updated by its forward passes) and then
switches back to train mode; its noise uses the stream :data:`STREAM_TRAIN` keyed by
the example index, step ``epoch · K + k``, seeded by the trainer's seed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from harness import (
    ParameterError,
    TrainContext,
    TrainingSplit,
    check_sigma,
    train_with_gaussian_augmentation,
)
from plugins.alfarra.optimize_sigma import STREAM_TRAIN, check_optimizer_params, optimize_sigma


class DataDependentSigmas:
    """``sigma_for_batch(index, x, epoch)`` of Alg. 2, holding σ_i for every training example."""

    def __init__(
        self,
        model: torch.nn.Module,
        count: int,
        sigma0: float,
        warmup_epochs: int,
        steps: int,
        samples: int,
        beta: float,
        sigma_min: float,
        seed: int,
        device: torch.device,
    ) -> None:
        self.model = model
        self.sigmas = torch.full((count,), float(sigma0), dtype=torch.float64, device=device)
        self.warmup_epochs = warmup_epochs
        self.steps, self.samples, self.beta, self.sigma_min = steps, samples, beta, sigma_min
        self.seed = seed

    def __call__(self, index: torch.Tensor, x: torch.Tensor, epoch: int) -> torch.Tensor:
        steps = 0 if epoch < self.warmup_epochs else self.steps
        if steps == 0:
            return self.sigmas[index].clone()
        was_training = self.model.training
        self.model.eval()
        try:
            sigma = optimize_sigma(
                self.model, x, self.sigmas[index], index.tolist(), seed=self.seed,
                stream=STREAM_TRAIN, steps=steps, samples=self.samples, beta=self.beta,
                sigma_min=self.sigma_min, first_step=epoch * steps, max_batch=len(x) * self.samples,
                fixed_shape=False,
            )  # fmt: skip
        finally:
            self.model.train(was_training)
        self.sigmas[index] = sigma
        return sigma.clone()


def check_trainer_params(params: Mapping[str, Any]) -> None:
    """Raise :class:`ParameterError` for an invalid ``alfarra-ds`` trainer setting."""
    check_sigma(params["sigma"])
    check_optimizer_params(params["steps"], params["samples"], params["beta"], params["sigma_min"])
    share = params["warmup_share"]
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 1:
        raise ParameterError(f"warmup_share must be a number in [0, 1], got {share!r}")


def warmup_epochs(epochs: int, share: float) -> int:
    """Epochs with K = 0: ``share`` of ``epochs`` rounded half up (§4.1: 0.25 of 200 = 50)."""
    return math.floor(share * epochs + 0.5)


def train_alfarra_ds(
    model: torch.nn.Module, dataset: TrainingSplit, params: Mapping[str, Any], context: TrainContext
) -> DataDependentSigmas:
    """Alg. 2 with Cohen's Gaussian augmentation as TrainFunction; returns the final σ_i."""
    check_trainer_params(params)
    sigmas = DataDependentSigmas(
        model, len(dataset.train_x), params["sigma"],
        warmup_epochs(int(params["epochs"]), float(params["warmup_share"])), params["steps"],
        params["samples"], float(params["beta"]), float(params["sigma_min"]), context.seed,
        context.device,
    )  # fmt: skip
    train_with_gaussian_augmentation(
        model,
        dataset,
        sigmas,
        context,
        epochs=int(params["epochs"]),
        batch_size=int(params["batch_size"]),
        lr=float(params["lr"]),
    )
    return sigmas
