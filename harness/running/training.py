"""The training loop shared by trainers: cross-entropy under Gaussian augmentation.

Gaussian augmentation (Cohen et al. 2019, §4; Súkeník et al. 2022, §4) trains the base
model on x + σ·ε, ε ~ N(0, I), with σ per example (constant for Cohen, σ(x) for
input-dependent trainers). :func:`frozen` holds a base model fixed while a method trains a
network of its own on it (the Lipschitz σ-network, UCAN's noise generator).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from harness.foundation.data import TrainingSplit
from harness.foundation.errors import ParameterError
from harness.plugin.components import TrainContext


@contextlib.contextmanager
def frozen(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``model`` in eval mode with no parameter requiring a gradient, as it was on exit."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    was_training = model.training
    model.eval()
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        model.train(was_training)


SigmaForBatch = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
"""(example indices, inputs, epoch) -> σ per example, shape [B]."""


def train_with_gaussian_augmentation(
    model: torch.nn.Module,
    dataset: TrainingSplit,
    sigma_for_batch: SigmaForBatch,
    context: TrainContext,
    epochs: int,
    batch_size: int = 128,
    lr: float = 1e-3,
) -> None:
    """Adam on cross-entropy of f(x + σ·ε), seeded by ``context.seed``; trains in place."""
    if epochs < 0 or batch_size < 1 or lr <= 0:
        raise ParameterError(
            f"need epochs >= 0, batch_size >= 1 and lr > 0; got {epochs}, {batch_size}, {lr}"
        )
    if len(dataset.train_x) == 0:
        raise ParameterError(
            f"dataset {dataset.name!r} has no training split here; give the model as "
            "[model] checkpoint = PATH instead of training it"
        )
    device = context.device
    torch.manual_seed(context.seed)  # parameter initialization is done; this seeds dropout etc.
    order = torch.Generator().manual_seed(context.seed)
    noise = torch.Generator(device=device).manual_seed(context.seed + 1)
    x_all = dataset.train_x.to(device)
    y_all = dataset.train_y.to(device)
    model.to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    steps = (len(x_all) + batch_size - 1) // batch_size
    with context.progress.task("training", total=epochs * steps, unit="batches") as advance:
        for epoch in range(epochs):
            permutation = torch.randperm(len(x_all), generator=order).to(device)
            for start in range(0, len(x_all), batch_size):
                index = permutation[start : start + batch_size]
                x = x_all[index]
                sigma = sigma_for_batch(index, x, epoch).to(device, x.dtype)
                eps = torch.randn(x.shape, generator=noise, device=device, dtype=x.dtype)
                x = x + sigma.view(-1, *([1] * (x.dim() - 1))) * eps
                loss = torch.nn.functional.cross_entropy(model(x), y_all[index])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                advance(1)
    model.eval()
