"""Training UCAN's scale generator on the frozen base model, and the σ-provider it answers.

UCAN's certification-wise noise (its ``train_certification_noise.py``, method
``PersNoise_isoR``; Gaussian noise, λ = σ by ``noises.transform_lambda``) draws
x + μ(x) + λ·v(x)⊙ε with μ(x) = λ·G1(x), v(x) = |G2(x + μ(x))|, and trains on batches of
the training split with

    loss = Σ_{k=1..5} [ CE(f(x + μ + λ·v⊙ε_k), y) − m(v) ],   m(v) = mean|v|, or min|v|
           (``IsoMeasure``, the measure of the ℓ2 radius; the min over the whole batch),

SGD at lr 0.001 (hard-coded: its ``--lr`` is not read), momentum 0.9, weight decay 1e-4,
batches of 256 (its default; its README's command: 100), 200 epochs, the classifier
fine-tuned jointly. Here, as this harness decided (the plugin's docstring):
the classifier is frozen (every method is compared on one base model) and μ ≡ 0 (the
noise contract has no per-input centre; the ablation ``mean = mean*0``, which UCAN's
``core.py`` keeps commented out), so only G2 is trained, applied to x itself. The code
builds StepLR(20, 0.9) schedulers but never steps them: its learning rate stays 0.001, and
so does this one's.

Randomness (streams of this plugin, seeded by ``harness.noise_seed`` from the run's seed):
stream 120 the generator's initial weights, stream 121 the training subset and each
epoch's batch order, stream 122 the training noise ε. Certification noise is the harness's.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from harness import (
    Progress,
    TrainingSplit,
    Unregularized,
    frozen,
    load_artifact,
    noise_seed,
    save_artifact,
)
from plugins.ucan.generator import build_generator, initial_generator

STREAM_INIT = 120
STREAM_ORDER = 121
STREAM_NOISE = 122

MOMENTUM = 0.9
WEIGHT_DECAY = 1e-4
"""SGD's momentum and weight decay, UCAN's (``--momentum``, ``--weight-decay``)."""

FIT_KEYS = ("sigma", "measure", "epochs", "train_examples", "batch", "train_samples", "lr")
"""The method parameters that determine the trained generator (``floor`` does not)."""


def fitting_examples(
    dataset: TrainingSplit, params: Mapping[str, Any], device: torch.device, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Generator]:
    """The ``train_examples`` training inputs and labels G2 is trained on, and the generator
    (stream 121) that drew them, which then draws each epoch's batch order."""
    order = torch.Generator().manual_seed(noise_seed(seed, STREAM_ORDER, 0, 0))
    count = min(int(params["train_examples"]), len(dataset.train_x))
    subset = torch.randperm(len(dataset.train_x), generator=order)[:count]
    x = dataset.train_x[subset].to(device, torch.float32)
    return x, dataset.train_y[subset].to(device).long(), order


def ucan_loss(
    model: torch.nn.Module, generator: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
    lam: float, measure: str, eps: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """UCAN's loss of one batch at μ ≡ 0: Σ_k [CE(f(x + λ·v⊙ε_k), y) − m(v)], v = |G2(x)|,
    ``eps`` [K, B, *input_shape] the K draws, m = min|v| (``smallest``) or mean|v|."""
    v = generator(x).abs()
    term = v.min() if measure == "smallest" else v.mean()
    loss = x.new_zeros(())
    for draw in eps:
        loss = loss + F.cross_entropy(model(x + lam * draw * v), y) - term
    return loss


def fit_scale_generator(
    model: torch.nn.Module, dataset: TrainingSplit, params: Mapping[str, Any],
    device: torch.device, seed: int, progress: Progress,
) -> tuple[torch.nn.Module, list[float]]:  # fmt: skip
    """Train G2 on the frozen ``model`` (UCAN's loss at μ ≡ 0); return it and each step's loss."""
    lam, measure = float(params["sigma"]), str(params["measure"])
    epochs, batch, samples = (
        int(params["epochs"]),
        int(params["batch"]),
        int(params["train_samples"]),
    )
    generator = initial_generator(dataset.input_shape, noise_seed(seed, STREAM_INIT, 0, 0))
    generator = generator.to(device).train()
    x_all, y_all, order = fitting_examples(dataset, params, device, seed)
    count = len(x_all)
    noise = torch.Generator(device=device).manual_seed(noise_seed(seed, STREAM_NOISE, 0, 0))
    optimizer = torch.optim.SGD(generator.parameters(), lr=float(params["lr"]), momentum=MOMENTUM,
                                weight_decay=WEIGHT_DECAY)  # fmt: skip
    losses: list[float] = []
    steps = epochs * math.ceil(count / batch)
    with (
        frozen(model),
        progress.task("ucan: training the scale generator", total=steps, unit="steps") as advance,
    ):
        for _ in range(epochs):
            permutation = torch.randperm(count, generator=order).to(device)
            for start in range(0, count, batch):  # the last batch may be short (drop_last off)
                index = permutation[start : start + batch]
                x, y = x_all[index], y_all[index]
                eps = torch.randn((samples, *x.shape), generator=noise, device=device)
                loss = ucan_loss(model, generator, x, y, lam, measure, eps)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                losses.append(float(loss.detach()))
                advance(1)
    return generator.eval(), losses


class UcanScale:
    """σ_i(x) = λ·max(|G2(x)|_i, floor): a diagonal scale [B, *input_shape] in float32.

    G2 is evaluated in float64 (a copy of its weights), so that a row's scale does not
    depend on the rows asked with it beyond float32 rounding (replay holds every axis to a
    relative 1e-6; at an axis near the floor a float32 convolution's batch-dependent
    rounding would exceed it). The floor keeps σ_i in (0, λ]: tanh may answer 0.
    """

    regularity = Unregularized()

    def __init__(self, generator: torch.nn.Module, lam: float, floor: float) -> None:
        self.generator = generator.double().eval()
        for p in self.generator.parameters():
            p.requires_grad_(False)
        self.lam, self.floor = float(lam), float(floor)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            v = self.generator(x.to(torch.float64)).abs()
            return (self.lam * v.clamp_min(self.floor)).to(torch.float32)


def obtain_scale_generator(context, params: Mapping[str, Any]) -> torch.nn.Module:
    """The trained G2 for this base model and these parameters (float32, eval mode).

    Trained once per run (``context.memo``) and stored in the plugin's artifact directory
    (keyed by the base model's recipe hash, the file named by the training parameters), so
    that a resumed run and the soundness checks use the very G2 the certificates were
    issued with (a CPU training is not bit-reproducible across processes). Loaded with
    :func:`harness.load_artifact` (a damaged file is moved aside and trained again).
    """
    key = (
        context.dataset.name, context.dataset.dim, context.seed, str(context.device),
        tuple((k, params[k]) for k in FIT_KEYS),
    )  # fmt: skip
    return context.memo("ucan", key, lambda: _stored_or_trained(context, params, key))


def _stored_or_trained(context, params: Mapping[str, Any], key: tuple) -> torch.nn.Module:
    directory = context.artifact_dir("ucan")
    name = hashlib.sha256(json.dumps(key, default=str).encode()).hexdigest()
    path = None if directory is None else directory / f"scale-generator-{name}.pt"
    saved = None if path is None else load_artifact(path, context.progress, "cached UCAN generator")
    if saved is not None:
        generator = build_generator(context.dataset.input_shape)
        generator.load_state_dict(saved)
        return generator.to(context.device).eval()
    generator, losses = fit_scale_generator(
        context.model, context.dataset, params, context.device, context.seed, context.progress
    )
    context.progress.log(
        f"ucan: trained the scale generator ({len(losses)} steps, {params['epochs']} epochs on "
        f"{min(int(params['train_examples']), len(context.dataset.train_x))} training inputs; "
        f"loss {losses[0] if losses else float('nan'):.4g} → "
        f"{losses[-1] if losses else float('nan'):.4g})"
    )
    if path is not None:
        save_artifact(path, {k: v.detach().cpu() for k, v in generator.state_dict().items()})
    return generator


def scale_provider(context, params: Mapping[str, Any]) -> UcanScale:
    """The σ-provider ``ucan-npg``: the trained G2 (a float64 copy) at λ = ``sigma``."""
    generator = build_generator(context.dataset.input_shape)
    generator.load_state_dict(obtain_scale_generator(context, params).state_dict())
    return UcanScale(generator.to(context.device), float(params["sigma"]), float(params["floor"]))
