"""Fitting σ_θ to the frozen base model: the ``lipschitz-sigma`` training of §4.

Bergstrom et al. §4 learn θ by optimizing −(1/N)·Σ_i r̄(x_i, y_i) + λ·Σ_j ‖W_j‖ (printed
as a sup; read as the minimization it must be: maximize the mean radius, penalize the norms)
with r̄ the radius of Thm 3, λ = 0.01 "in addition to the spectral weight normalization".
Here (a differentiable surrogate of the certified radius):

    ḡ(x_i) ≈ (1/m)·Σ_k g(x_i + σ_θ(x_i)·ε_k),  ε_k ~ N(0, I)  (reparameterized),
    r̄_i    = (Φ⁻¹(ḡ_{y_i}) − Φ⁻¹(max_{j≠y_i} ḡ_j)) / (2L),
    loss   = −mean_i r̄_i + λ·(‖W1‖₂ + ‖W2‖₂),

with g the normalized base output (Remark 2), y_i the true label, and L from Thm 2 at the
*declared* Lip(σ) (the paper fixes Lip(σ) = 0.5; L is then a constant scale). r̄_i is signed,
so misclassified examples are pushed back as well. Adam on θ; the base model is frozen
(its parameters' ``requires_grad`` is switched off for the fit and restored after).

What to expect: Thm 3's L depends on σ only through σ_min and Lip(σ), so a larger σ(x) pays
off only where more noise widens ḡ's margin. On the quick benchmark's base model the fit
drives h_θ below 0 everywhere (σ_θ ≡ σ_min), after which only the λ-term has a gradient and
Adam (scale-free) shrinks the weights, so the certified Lip(σ) ends near 4e-4.

Design: this is a σ-provider fit, not a base-model trainer (a ``TrainerSpec`` trains the
shared base model in place, which this must not touch), so it runs inside the σ-provider's
build, when the method runs, with a progress bar. A fitted network is kept for the run
(``BuildContext.memo``) per base model, dataset, seed and fitting parameters, so the
certifier's build and further settings with the same fitting parameters reuse it.

Randomness (noise streams of this plugin, all seeded by ``harness.noise_seed`` from
the run's seed): stream 100 the initial weights, stream 101 the training subset and batch
order, stream 102 the training noise ε. Certification noise is the harness's streams 0/1.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import torch

from harness import Progress, TrainingSplit, load_artifact, noise_seed, save_artifact
from plugins.lipschitz.constant import lipschitz_constant
from plugins.lipschitz.network import (
    CertifiedSigma,
    SigmaNetwork,
    certify_sigma_network,
    sigma_forward,
)
from plugins.lipschitz.normalization import NormalizedModel

STREAM_INIT = 100
STREAM_ORDER = 101
STREAM_NOISE = 102

FIT_KEYS = (
    "sigma_min", "lip_sigma", "p_min", "width", "train_examples", "train_steps",
    "train_batch", "train_samples", "lr", "spectral_reg",
)  # fmt: skip
"""The method parameters that determine the fitted σ_θ."""


def fit_lipschitz_sigma(
    model: torch.nn.Module,
    dataset: TrainingSplit,
    params: Mapping[str, Any],
    device: torch.device,
    seed: int,
    progress: Progress,
) -> tuple[CertifiedSigma, list[float]]:
    """Train σ_θ on the frozen ``model`` (§4 objective); return it certified, and the losses."""
    sigma_min, lip, p_min = (
        float(params["sigma_min"]),
        float(params["lip_sigma"]),
        float(params["p_min"]),
    )
    steps, batch = int(params["train_steps"]), int(params["train_batch"])
    samples, lam = int(params["train_samples"]), float(params["spectral_reg"])
    dim, classes = dataset.dim, dataset.num_classes
    L = lipschitz_constant(sigma_min, lip, p_min, dim)

    init = torch.Generator().manual_seed(noise_seed(seed, STREAM_INIT, 0, 0))
    network = SigmaNetwork(dim, int(params["width"]), sigma_min, lip, init).to(device)
    order = torch.Generator().manual_seed(noise_seed(seed, STREAM_ORDER, 0, 0))
    noise = torch.Generator(device=device).manual_seed(noise_seed(seed, STREAM_NOISE, 0, 0))
    count = min(int(params["train_examples"]), len(dataset.train_x))
    subset = torch.randperm(len(dataset.train_x), generator=order)[:count]
    x_all = dataset.train_x[subset].to(device, torch.float32)
    y_all = dataset.train_y[subset].to(device).long()
    normalized = NormalizedModel(model, classes, p_min)
    optimizer = torch.optim.Adam(network.parameters(), lr=float(params["lr"]))
    losses: list[float] = []

    frozen = [(p, p.requires_grad) for p in model.parameters()]
    was_training = model.training
    model.eval()
    for p, _ in frozen:
        p.requires_grad_(False)
    try:
        permutation = torch.randperm(count, generator=order)
        cursor = 0
        with progress.task("lipschitz-sigma: fitting σ_θ", total=steps, unit="steps") as advance:
            for _ in range(steps):
                if cursor + batch > count:
                    permutation, cursor = torch.randperm(count, generator=order), 0
                index = permutation[cursor : cursor + batch].to(device)
                cursor += batch
                x, y = x_all[index], y_all[index]
                w1, w2, norm1, norm2 = network.normalized_layers()
                sigma = sigma_forward(x, w1, network.b1, w2, network.b2, sigma_min).float()
                eps = torch.randn((samples, *x.shape), generator=noise, device=device)
                noisy = x.unsqueeze(0) + sigma.view(1, -1, *([1] * (x.dim() - 1))) * eps
                g = normalized.probabilities(noisy.flatten(0, 1)).view(samples, len(x), classes)
                g_bar = g.mean(0)
                g_y = g_bar.gather(1, y[:, None])[:, 0]
                others = g_bar.masked_fill(torch.nn.functional.one_hot(y, classes).bool(), -1.0)
                g_runner_up = others.max(1).values
                radius = (torch.special.ndtri(g_y) - torch.special.ndtri(g_runner_up)) / (2 * L)
                penalty = lam * (norm1 + norm2)
                loss = -radius.mean() + penalty
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                losses.append(float(loss.detach()))
                advance(1)
    finally:
        for p, flag in frozen:
            p.requires_grad_(flag)
        model.train(was_training)
    return certify_sigma_network(network), losses


def obtain_sigma_network(context, params: Mapping[str, Any]) -> CertifiedSigma:
    """The fitted, certified σ_θ for this base model and these parameters.

    Fitted once per run (``context.memo``), and stored in the plugin's artifact
    directory (``context.artifact_dir``, keyed by the base model's recipe hash; the
    file is named by the fitting parameters) so that a resumed run and the soundness
    checks use the very σ_θ the certificates were issued with: a CPU fit is not
    bit-reproducible across processes (threaded reductions), and σ must be one function.
    Loaded with ``torch.load(..., weights_only=True)`` after its digest is checked
    (:func:`harness.load_artifact`: a damaged file is moved aside and refitted).
    """
    key = (
        context.dataset.name, context.dataset.dim, context.seed, str(context.device),
        tuple((k, params[k]) for k in FIT_KEYS),
    )  # fmt: skip
    return context.memo("lipschitz", key, lambda: _stored_or_fitted(context, params, key))


def _stored_or_fitted(context, params: Mapping[str, Any], key: tuple) -> CertifiedSigma:
    directory = context.artifact_dir("lipschitz")
    name = hashlib.sha256(json.dumps(key, default=str).encode()).hexdigest()
    path = None if directory is None else directory / f"sigma-net-{name}.pt"
    saved = None if path is None else load_artifact(path, context.progress, "cached σ-network")
    if saved is not None:  # σ_min and Lip in float64: L of Thm 2 must be the run's exactly
        sigma = CertifiedSigma(saved["w1"], saved["b1"], saved["w2"], saved["b2"],
                               float(saved["sigma_min"]), float(saved["declared_lip"]))  # fmt: skip
        return sigma.to(context.device)
    sigma, losses = fit_lipschitz_sigma(
        context.model, context.dataset, params, context.device, context.seed, context.progress
    )
    context.progress.log(
        f"lipschitz-sigma: fitted σ_θ ({len(losses)} steps, final loss "
        f"{losses[-1] if losses else float('nan'):.4g}); certified Lip(σ) = "
        f"{sigma.regularity.lip:.6g} (declared {sigma.declared_lip:g}"
        f"{', last layer rescaled' if sigma.rescaled else ''})"
    )
    if path is not None:
        save_artifact(path, {"w1": sigma.w1.cpu(), "b1": sigma.b1.cpu(), "w2": sigma.w2.cpu(),
                             "b2": sigma.b2.cpu(), "sigma_min": torch.tensor(sigma.sigma_min, dtype=torch.float64),
                             "declared_lip": torch.tensor(sigma.declared_lip, dtype=torch.float64)})  # fmt: skip
    return sigma
