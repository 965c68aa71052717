"""Training the σ-estimator of dual randomized smoothing against the frozen base model.

Dual RS (Sun et al. 2026) trains a variance estimator that predicts, for each input,
the noise level at which the classifier certifies it best, and trains it under noise so
that its smoothed version is the one used at certification. The paper alternates this
with training the classifier; here the classifier is the benchmark's shared base model,
fixed for every method, so one round of the estimator's training is what remains.
Scaled to the benchmark:

1. **Labels.** For ``train_examples`` training inputs (x_i, y_i) and every level σ_k,
   ``label_samples`` noisy copies x_i + σ_k ε go through the base model f (as the run
   queries it: ``context.engine.model``), c_ik = #{f(x_i + σ_k ε) = y_i}; with
   p̂_ik = (c_ik + 1/2) / (label_samples + 1) the estimated radius is
   R̂_ik = σ_k Φ⁻¹(p̂_ik) (Cohen et al. 2019, Thm 1, at the point estimate; negative
   where the true class loses), and the label is k_i = argmax_k R̂_ik, the level with the
   largest certified radius of the true class (the first on ties).
2. **Fit.** The estimator (a registered architecture with K = len(levels) classes) is
   trained by cross-entropy on (x_i + σ_v ε, k_i), Gaussian augmentation at its own
   noise level σ_v (:func:`harness.train_with_gaussian_augmentation`), so that its
   smoothed choice at σ_v is the label.

Randomness (all seeded from the run's seed by :func:`harness.noise_seed`): stream 120
the initial weights, 121 the training subset, 122 the labelling noise, 123 the order and noise of the fit. The fitted estimator is cached under the
base model's recipe hash (:meth:`harness.BuildContext.artifact_dir`), so a resumed run
and the soundness checks smooth the very estimator the certificates were drawn from.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from scipy.special import ndtri

from harness import (
    BuildContext,
    IdrsError,
    TrainContext,
    TrainingSplit,
    load_artifact,
    noise_seed,
    save_artifact,
    train_with_gaussian_augmentation,
)
from plugins.dual_rs.estimator import SmoothedSigmaChoice

STREAM_INIT = 120
STREAM_SUBSET = 121
STREAM_LABELS = 122
STREAM_FIT = 123

FIT_KEYS = ("levels", "estimator_sigma", "estimator", "estimator_params", "train_examples",
            "label_samples", "epochs", "batch_size", "lr")  # fmt: skip
"""The method parameters that determine the fitted σ-estimator (not ``alpha_split``)."""


def level_labels(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    levels,
    samples: int,
    generator: torch.Generator,
    batch_size: int = 4096,
    advance=lambda done: None,
) -> tuple[np.ndarray, np.ndarray]:
    """(labels [B], estimated radii R̂ [B, K]) of step 1 above: ``samples`` noisy copies
    of each input per level through the base ``model`` (as the run queries it), noise
    from ``generator`` (on the model's device); ``advance(k)`` reports k more inputs done."""
    device = generator.device
    levels_t = torch.tensor(levels, dtype=torch.float32, device=device)
    classes = len(levels)
    correct = torch.zeros(len(x), classes, dtype=torch.int64)
    per_batch = max(1, batch_size // (samples * classes))
    with torch.no_grad():
        for start in range(0, len(x), per_batch):
            xb = x[start : start + per_batch].to(device, torch.float32)
            yb = y[start : start + per_batch].to(device).long()
            shape = (samples, classes, len(xb), *xb.shape[1:])
            eps = torch.randn(shape, generator=generator, device=device)
            scale = levels_t.view(1, classes, *([1] * xb.dim()))
            noisy = (xb[None, None] + scale * eps).flatten(0, 2)
            guess = model(noisy).argmax(1).view(samples, classes, len(xb))
            hits = (guess == yb[None, None]).sum(0).T  # [B, K]
            correct[start : start + len(xb)] = hits.cpu()
            advance(len(xb))
    p_hat = (correct.numpy() + 0.5) / (samples + 1)
    radii = np.asarray(levels, dtype=np.float64)[None] * ndtri(p_hat)
    return np.argmax(radii, axis=1), radii


def build_estimator(context: BuildContext, params: Mapping[str, Any]) -> torch.nn.Module:
    """The estimator's architecture with ``len(levels)`` classes, initialized from stream 120
    (the global torch generator is left as it was)."""
    if context.registry is None:
        raise IdrsError("dual-rs builds its σ-estimator from the registry's architectures; "
                        "the build context has no registry")  # fmt: skip
    spec = context.registry.get("models", params["estimator"])
    arch_params = {**spec.defaults, **params["estimator_params"]}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(noise_seed(context.seed, STREAM_INIT, 0, 0))
        network = spec.build(context.dataset.input_shape, len(params["levels"]), arch_params)
    return network.to(context.device)


def fit_estimator(context: BuildContext, params: Mapping[str, Any]) -> tuple[torch.nn.Module, dict]:
    """Label and fit the σ-estimator on the frozen base model (steps 1–2 above); returns
    the network (eval mode) and a summary (label histogram, seconds per step)."""
    dataset, levels = context.dataset, [float(v) for v in params["levels"]]
    if len(dataset.train_x) == 0:
        raise IdrsError(f"dual-rs trains its σ-estimator on training data; dataset "
                        f"{dataset.name!r} has no training split here")  # fmt: skip
    order = torch.Generator().manual_seed(noise_seed(context.seed, STREAM_SUBSET, 0, 0))
    count = min(int(params["train_examples"]), len(dataset.train_x))
    ids = torch.randperm(len(dataset.train_x), generator=order)[:count]
    x, y = dataset.train_x[ids].float(), dataset.train_y[ids]
    start = time.perf_counter()
    noise = torch.Generator(device=context.device)
    noise.manual_seed(noise_seed(context.seed, STREAM_LABELS, 0, 0))
    with context.progress.task(
        "dual-rs: labelling σ levels", total=count, unit="inputs"
    ) as advance:
        labels, _ = level_labels(context.engine.model, x, y, levels, int(params["label_samples"]),
                                 noise, advance=advance)  # fmt: skip
    labelled = time.perf_counter()
    network = build_estimator(context, params)
    train = TrainingSplit(f"{dataset.name}-sigma-levels", x, torch.from_numpy(labels), len(levels),
                          dataset.input_shape)  # fmt: skip
    sigma_v = float(params["estimator_sigma"])
    fit = TrainContext(context.device, noise_seed(context.seed, STREAM_FIT, 0, 0), context.progress)
    train_with_gaussian_augmentation(
        network, train, lambda index, batch, epoch: torch.full((len(index),), sigma_v), fit,
        epochs=int(params["epochs"]), batch_size=int(params["batch_size"]), lr=float(params["lr"]),
    )  # fmt: skip
    network.eval()
    summary = {"labels": np.bincount(labels, minlength=len(levels)).tolist(),
               "label_seconds": labelled - start, "fit_seconds": time.perf_counter() - labelled}  # fmt: skip
    return network, summary


def obtain_estimator(context: BuildContext, params: Mapping[str, Any]) -> SmoothedSigmaChoice:
    """The σ-provider: the fitted σ-estimator for this base model and these parameters,
    with α_σ = ``alpha_split`` · the run's α.

    Fitted once per run (``context.memo``) and kept in the plugin's artifact directory
    (keyed by the base model's recipe hash; the file is named by everything else the fit
    depends on), loaded with ``torch.load(..., weights_only=True)`` after its digest is
    checked (:func:`harness.load_artifact`): a damaged file is moved aside and refitted.
    A CPU fit is not guaranteed bit-identical across processes (threaded reductions), so
    the stored weights, not a refit, are what a resumed run and the checks use.
    """
    key = (
        context.dataset.name, context.dataset.dim, context.seed, str(context.device),
        context.engine.noise, getattr(context.protocol, "precision", "fp32"),
        json.dumps([[k, params[k]] for k in FIT_KEYS], sort_keys=True, default=str),
    )  # fmt: skip
    network = context.memo("dual-rs", key, lambda: _stored_or_fitted(context, params, key))
    alpha = float(params["alpha_split"]) * float(context.protocol.alpha)
    return SmoothedSigmaChoice(network, params["levels"], params["estimator_sigma"], alpha,
                               params["estimator"], params["estimator_params"])  # fmt: skip


def _stored_or_fitted(context: BuildContext, params: Mapping[str, Any], key: tuple):
    directory = context.artifact_dir("dual-rs")
    name = hashlib.sha256(json.dumps(key, default=str).encode()).hexdigest()
    path = None if directory is None else directory / f"sigma-estimator-{name}.pt"
    saved = None if path is None else load_artifact(path, context.progress, "cached σ-estimator")
    if saved is not None:
        network = build_estimator(context, params)
        network.load_state_dict({k: v.to(context.device) for k, v in saved.items()})
        return network.eval()
    network, summary = fit_estimator(context, params)
    context.progress.log(
        f"dual-rs: fitted the σ-estimator on {sum(summary['labels'])} labelled inputs "
        f"(labels per level {summary['labels']}; labelling {summary['label_seconds']:.1f} s, "
        f"fit {summary['fit_seconds']:.1f} s)"
    )
    if path is not None:
        save_artifact(path, {k: v.detach().cpu() for k, v in network.state_dict().items()})
    return network
