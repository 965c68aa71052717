"""Trainers of Súkeník et al. (2022): input-dependent augmentation (App. E.4) and the
constant augmentation at the "increased" level C·σ_b (App. E.6.3)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness import TrainContext, TrainingSplit, train_with_gaussian_augmentation
from plugins.sukenik.knn_sigma import knn_mean_distance, propose_m


def training_mean_distances(dataset: TrainingSplit, k: int) -> torch.Tensor:
    """Mean distance of every training example to its k nearest *other* training examples."""
    train = dataset.train_x
    return torch.cat([
        knn_mean_distance(train[i : i + 1024], train, k, exclude_self=True, dtype=torch.float32)
        for i in range(0, len(train), 1024)
    ])  # fmt: skip


def _m(dataset: TrainingSplit, params: Mapping[str, Any]) -> float:
    m = params["m"]
    return (
        float(m) if isinstance(m, int | float) else propose_m(dataset.train_x, int(params["k"]), m)
    )


def train_input_dependent(
    model, dataset: TrainingSplit, params: Mapping[str, Any], context: TrainContext
) -> None:
    """Gaussian augmentation with σ(x_i) = σ_b exp(trr (d̄_k(x_i) − m)) per training example.

    The train-time rate ``trr`` plays the role of r at training only (App. E.4); with
    trr = 0 this is Cohen's constant augmentation at σ_b.
    """
    sigma_b, trr = float(params["sigma"]), float(params["trr"])
    if trr:
        d = training_mean_distances(dataset, int(params["k"]))
        sigma = sigma_b * torch.exp(trr * (d - _m(dataset, params)))
    else:
        sigma = torch.full((len(dataset.train_x),), sigma_b)
    train_with_gaussian_augmentation(
        model, dataset, lambda index, x, epoch: sigma[index.cpu()], context,
        epochs=int(params["epochs"]), batch_size=int(params["batch_size"]), lr=float(params["lr"]),
    )  # fmt: skip


def increased_level(dataset: TrainingSplit, params: Mapping[str, Any]) -> float:
    """C = median over the training set of exp(r (d̄_k(x_i) − m)) (App. E.6.3)."""
    d = training_mean_distances(dataset, int(params["k"]))
    return float(torch.exp(float(params["rate"]) * (d - _m(dataset, params))).median())


def train_constant_increased(
    model, dataset: TrainingSplit, params: Mapping[str, Any], context: TrainContext
) -> None:
    """Constant Gaussian augmentation at C·σ_b, C from :func:`increased_level`."""
    level = increased_level(dataset, params) * float(params["sigma"])
    context.progress.log(f"constant augmentation at C·σ_b = {level:.4g}")
    train_with_gaussian_augmentation(
        model, dataset, lambda index, x, epoch: torch.full((len(index),), level), context,
        epochs=int(params["epochs"]), batch_size=int(params["batch_size"]), lr=float(params["lr"]),
    )  # fmt: skip
