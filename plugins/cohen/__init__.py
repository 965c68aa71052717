"""Cohen et al. (2019): constant σ, Gaussian augmentation, CERTIFY and PREDICT.

Also Súkeník et al. (2022), Alg. 3 with r = 0. Registers the σ-provider ``constant``,
the trainer ``gaussian-augmentation``, the certifier ``cohen`` and the method ``cohen``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness import (
    BuildContext,
    CertifierSpec,
    MethodSpec,
    ParameterError,
    SigmaProviderSpec,
    TrainContext,
    TrainerSpec,
    check_sigma,
    hookimpl,
)

IDRS_BENCH_CONTRACT = 4
"""The plugin contract this plugin is written against (docs/plugins.md)."""

TRAINER_DEFAULTS = {"sigma": 0.25, "epochs": 10, "batch_size": 128, "lr": 1e-3}


def _constant_sigma(context: BuildContext, params: Mapping[str, Any]):
    from plugins.cohen.certifier import ConstantSigma

    return ConstantSigma(params["sigma"])


def _cohen_certifier(context: BuildContext, params: Mapping[str, Any], sigma_provider):
    from plugins.cohen.certifier import CohenCertifier

    return CohenCertifier()


def train_gaussian_augmentation(model, dataset, params: Mapping[str, Any], context: TrainContext):
    """Gaussian augmentation with constant σ (Cohen et al. 2019, §4); σ = 0 trains on clean data."""
    import torch

    from harness import train_with_gaussian_augmentation

    sigma = params["sigma"]
    if not isinstance(sigma, int | float) or sigma < 0:
        raise ParameterError(f"training sigma must be >= 0 (0 trains without noise), got {sigma!r}")
    train_with_gaussian_augmentation(
        model,
        dataset,
        lambda index, x, epoch: torch.full((len(index),), sigma),
        context,
        epochs=int(params["epochs"]),
        batch_size=int(params["batch_size"]),
        lr=float(params["lr"]),
    )


@hookimpl
def idrs_register_sigma_providers(register) -> None:
    register(SigmaProviderSpec("constant", _constant_sigma, "σ(x) = sigma"))


@hookimpl
def idrs_register_trainers(register) -> None:
    register(
        TrainerSpec(
            "gaussian-augmentation",
            train_gaussian_augmentation,
            TRAINER_DEFAULTS,
            "cross-entropy on x + σε, constant σ (Cohen et al. 2019)",
        )
    )


@hookimpl
def idrs_register_certifiers(register) -> None:
    register(CertifierSpec("cohen", _cohen_certifier, "CERTIFY with R = σ Φ⁻¹(p_A_lower)"))


@hookimpl
def idrs_register_methods(register) -> None:
    register(
        MethodSpec(
            "cohen",
            sigma_provider="constant",
            certifier="cohen",
            defaults={"sigma": 0.25},
            description="Cohen et al. (2019): constant σ",
            check=lambda params: check_sigma(params["sigma"]),
        )
    )
