"""Training UCAN's noise generators on the frozen base model, and the σ-provider they answer.

UCAN's certification-wise noise (its ``train_certification_noise.py``, method
``PersNoise_isoR``; Gaussian noise, λ = σ by ``noises.transform_lambda``) draws
x + μ(x) + λ·v(x)⊙ε with μ(x) = λ·G1(x), v(x) = |G2(x + μ(x))|, and trains on batches of
the training split with

    loss = Σ_{k=1..5} [ CE(f(x + μ + λ·v⊙ε_k), y) − m(v) ],   m(v) = mean|v|, or min|v|
           (``IsoMeasure``, the measure of the ℓ2 radius; the min over the whole batch),

SGD at lr 0.001 (hard-coded: its ``--lr`` is not read), momentum 0.9, weight decay 1e-4,
batches of 256 (its default; its README's command: 100), 200 epochs, the classifier
fine-tuned jointly. Here, as this harness decided (the plugin's docstring), the
classifier is frozen (every method is compared on one base model). The σ-provider
``ucan-npg-centred`` trains G1 and G2 together as the code does and answers the centre μ(x)
(:mod:`harness.engine.centre`) beside the scale; ``ucan-npg`` is the ablation μ ≡ 0
(``mean = mean*0``, which UCAN's ``core.py`` keeps commented out): only G2 is trained,
applied to x itself. The code builds StepLR(20, 0.9) schedulers but never steps them: its
learning rate stays 0.001, and so does this one's (one SGD over both generators' weights,
as its two optimizers at the same settings step together).

Randomness (streams of this plugin, seeded by ``harness.noise_seed`` from the run's seed):
stream 120 G2's initial weights, stream 121 the training subset and each epoch's batch
order, stream 122 the training noise ε, stream 123 G1's initial weights. Certification
noise is the harness's.
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
STREAM_MEAN_INIT = 123

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
    lam: float, measure: str, eps: torch.Tensor, mean: torch.nn.Module | None = None,
) -> torch.Tensor:  # fmt: skip
    """UCAN's loss of one batch: Σ_k [CE(f(x + μ + λ·v⊙ε_k), y) − m(v)], μ = λ·G1(x)
    (``mean``; μ ≡ 0 without it), v = |G2(x + μ)|, ``eps`` [K, B, *input_shape] the K
    draws, m = min|v| (``smallest``) or mean|v|."""
    centre = x if mean is None else x + lam * mean(x)
    v = generator(centre).abs()
    term = v.min() if measure == "smallest" else v.mean()
    loss = x.new_zeros(())
    for draw in eps:
        loss = loss + F.cross_entropy(model(centre + lam * draw * v), y) - term
    return loss


def fit_generators(
    model: torch.nn.Module, dataset: TrainingSplit, params: Mapping[str, Any],
    device: torch.device, seed: int, progress: Progress, centred: bool = False,
) -> tuple[torch.nn.Module | None, torch.nn.Module, list[float]]:  # fmt: skip
    """Train G2 (and, ``centred``, G1 with it) on the frozen ``model`` with UCAN's loss;
    return G1 (None at μ ≡ 0), G2 and each step's loss."""
    lam, measure = float(params["sigma"]), str(params["measure"])
    epochs, batch, samples = (
        int(params["epochs"]),
        int(params["batch"]),
        int(params["train_samples"]),
    )
    generator = initial_generator(dataset.input_shape, noise_seed(seed, STREAM_INIT, 0, 0))
    generator = generator.to(device).train()
    mean = None
    if centred:
        mean = initial_generator(dataset.input_shape, noise_seed(seed, STREAM_MEAN_INIT, 0, 0))
        mean = mean.to(device).train()
    weights = [*generator.parameters(), *([] if mean is None else mean.parameters())]
    x_all, y_all, order = fitting_examples(dataset, params, device, seed)
    count = len(x_all)
    noise = torch.Generator(device=device).manual_seed(noise_seed(seed, STREAM_NOISE, 0, 0))
    optimizer = torch.optim.SGD(weights, lr=float(params["lr"]), momentum=MOMENTUM,
                                weight_decay=WEIGHT_DECAY)  # fmt: skip
    losses: list[float] = []
    steps = epochs * math.ceil(count / batch)
    with (
        frozen(model),
        progress.task(
            f"ucan: training the {'noise generators' if centred else 'scale generator'}",
            total=steps,
            unit="steps",
        ) as advance,
    ):
        for _ in range(epochs):
            permutation = torch.randperm(count, generator=order).to(device)
            for start in range(0, count, batch):  # the last batch may be short (drop_last off)
                index = permutation[start : start + batch]
                x, y = x_all[index], y_all[index]
                eps = torch.randn((samples, *x.shape), generator=noise, device=device)
                loss = ucan_loss(model, generator, x, y, lam, measure, eps, mean)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                losses.append(float(loss.detach()))
                advance(1)
    return None if mean is None else mean.eval(), generator.eval(), losses


class UcanScale:
    """σ_i(x) = λ·max(|G2(x + μ(x))|_i, floor): a diagonal scale [B, *input_shape] in
    float32, and with G1 (``mean``) the centre μ(x) = λ·G1(x) (:meth:`centre`; the
    attribute exists only then, :mod:`harness.engine.centre`).

    The generators are evaluated in float64 (copies of their weights), so that a row's
    scale and centre do not depend on the rows asked with it beyond float32 rounding
    (replay holds every axis and dimension to a relative 1e-6; at an axis near the floor a
    float32 convolution's batch-dependent rounding would exceed it). The floor keeps σ_i in
    (0, λ]: tanh may answer 0.
    """

    regularity = Unregularized()

    def __init__(
        self, generator: torch.nn.Module, lam: float, floor: float,
        mean: torch.nn.Module | None = None,
    ) -> None:  # fmt: skip
        self.generator = _frozen64(generator)
        self.lam, self.floor = float(lam), float(floor)
        if mean is not None:
            self.mean = _frozen64(mean)
            self.centre = self._centre

    def _centre(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return (self.lam * self.mean(x.to(torch.float64))).to(torch.float32)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            x = x.to(torch.float64)
            if hasattr(self, "mean"):  # G2 reads x + μ(x) (UCAN's ``noisegenerator2(x+mean)``)
                x = x + self.lam * self.mean(x)
            v = self.generator(x).abs()
            return (self.lam * v.clamp_min(self.floor)).to(torch.float32)


def _frozen64(module: torch.nn.Module) -> torch.nn.Module:
    module = module.double().eval()
    for p in module.parameters():
        p.requires_grad_(False)
    return module


def obtain_generators(
    context, params: Mapping[str, Any], centred: bool
) -> tuple[torch.nn.Module | None, torch.nn.Module]:  # fmt: skip
    """The trained (G1, G2) for this base model and these parameters (float32, eval mode;
    G1 None unless ``centred``).

    Trained once per run (``context.memo``) and stored in the plugin's artifact directory
    (keyed by the base model's recipe hash, the file named by the training parameters), so
    that a resumed run and the soundness checks use the very generators the certificates
    were issued with (a CPU training is not bit-reproducible across processes). Loaded with
    :func:`harness.load_artifact` (a damaged file is moved aside and trained again).
    """
    key = (
        context.dataset.name, context.dataset.dim, context.seed, str(context.device),
        tuple((k, params[k]) for k in FIT_KEYS),
    ) + ((("centred", True),) if centred else ())  # fmt: skip
    return context.memo("ucan", key, lambda: _stored_or_trained(context, params, key, centred))


def _stored_or_trained(
    context, params: Mapping[str, Any], key: tuple, centred: bool
) -> tuple[torch.nn.Module | None, torch.nn.Module]:  # fmt: skip
    directory = context.artifact_dir("ucan")
    name = hashlib.sha256(json.dumps(key, default=str).encode()).hexdigest()
    stem = "noise-generators" if centred else "scale-generator"
    path = None if directory is None else directory / f"{stem}-{name}.pt"
    saved = None if path is None else load_artifact(path, context.progress, "cached UCAN generator")
    if saved is not None:
        return _loaded(saved, context, centred)
    mean, generator, losses = fit_generators(context.model, context.dataset, params,
                                             context.device, context.seed, context.progress,
                                             centred)  # fmt: skip
    context.progress.log(
        f"ucan: trained the {'noise generators' if centred else 'scale generator'} "
        f"({len(losses)} steps, {params['epochs']} epochs on "
        f"{min(int(params['train_examples']), len(context.dataset.train_x))} training inputs; "
        f"loss {losses[0] if losses else float('nan'):.4g} → "
        f"{losses[-1] if losses else float('nan'):.4g})"
    )
    if path is not None:
        state = {k: v.detach().cpu() for k, v in generator.state_dict().items()}
        if mean is not None:  # both, prefixed (G2's state alone is the uncentred file)
            state = {f"scale.{k}": v for k, v in state.items()} | {
                f"mean.{k}": v.detach().cpu() for k, v in mean.state_dict().items()}  # fmt: skip
        save_artifact(path, state)
    return mean, generator


def _part(state: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) + 1 :]: v for k, v in state.items() if k.startswith(prefix + ".")}


def _loaded(saved: Mapping[str, torch.Tensor], context, centred: bool):
    """(G1, G2) from a stored file: G2's state alone, or both prefixed ``mean.``/``scale.``."""
    shape = context.dataset.input_shape
    generator = build_generator(shape)
    generator.load_state_dict(_part(saved, "scale") if centred else saved)
    mean = None
    if centred:
        mean = build_generator(shape)
        mean.load_state_dict(_part(saved, "mean"))
        mean = mean.to(context.device).eval()
    return mean, generator.to(context.device).eval()


def noise_provider(context, params: Mapping[str, Any], centred: bool) -> UcanScale:
    """The σ-provider ``ucan-npg`` (G2 alone, μ ≡ 0) or ``ucan-npg-centred`` (G1 and G2):
    float64 copies of the trained generators at λ = ``sigma``."""
    shape = context.dataset.input_shape
    trained_mean, trained = obtain_generators(context, params, centred)
    generator = build_generator(shape)
    generator.load_state_dict(trained.state_dict())
    mean = None
    if trained_mean is not None:
        mean = build_generator(shape)
        mean.load_state_dict(trained_mean.state_dict())
        mean = mean.to(context.device)
    return UcanScale(generator.to(context.device), float(params["sigma"]), float(params["floor"]),
                     mean)  # fmt: skip
