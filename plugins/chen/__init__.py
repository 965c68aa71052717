"""Chen et al. (2021), Insta-RS, as specified in Súkeník et al. (2022), App. C.3, Alg. 2.

Registers the σ-provider ``chen-fgss`` (instance-wise multiple-start FGSS on the base
model, declared unregularized), the trainer ``chen-instance`` (Gaussian augmentation
with per-example σ from the same search) and the method ``chen-fgss``: σ(x) from the
search, then Cohen's CERTIFY at σ(x) (the ``cohen`` certifier, R = σ(x)·Φ⁻¹(p_A_lower)),
as the original work claimed its radii. Implemented faithfully, unsoundness included:
Cohen's radius assumes σ constant around x, which the search does not provide.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness import BuildContext, MethodSpec, SigmaProviderSpec, TrainerSpec, hookimpl
from plugins.chen.config import SEARCH_DEFAULTS, TRAINER_DEFAULTS, SearchConfig

IDRS_BENCH_CONTRACT = 4
"""The plugin contract this plugin is written against (docs/plugins.md)."""


def check_params(params: Mapping[str, Any]) -> None:
    """Raise :class:`~harness.foundation.errors.ParameterError` for invalid search parameters."""
    SearchConfig.from_params(params)


def _fgss_sigma(context: BuildContext, params: Mapping[str, Any]):
    from plugins.chen.search import InstanceSigma

    return InstanceSigma(context.engine.padded(), SearchConfig.from_params(params), context.seed)


def _train(model, dataset, params, context) -> None:
    from plugins.chen.training import train_chen_instance

    train_chen_instance(model, dataset, params, context)


@hookimpl
def idrs_register_sigma_providers(register) -> None:
    register(
        SigmaProviderSpec(
            "chen-fgss",
            _fgss_sigma,
            "σ(x) by instance-wise multiple-start FGSS over σ² = l·σ0² (Insta-RS; Súkeník App. C.3, Alg. 2)",
        )
    )


@hookimpl
def idrs_register_trainers(register) -> None:
    register(
        TrainerSpec(
            "chen-instance",
            _train,
            TRAINER_DEFAULTS,
            "Gaussian augmentation with per-example σ from the Insta-RS search, refreshed every E epochs",
        )
    )


@hookimpl
def idrs_register_methods(register) -> None:
    register(
        MethodSpec(
            "chen-fgss",
            sigma_provider="chen-fgss",
            certifier="cohen",
            defaults=SEARCH_DEFAULTS,
            description="Chen et al. (2021) Insta-RS: searched σ(x), Cohen's radius at σ(x) (unsound)",
            check=check_params,
        )
    )
