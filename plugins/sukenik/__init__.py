"""Súkeník, Kuvshinov & Günnemann (2022): semi-elastic input-dependent smoothing.

Registers the σ-provider ``sukenik-knn`` (eq. 1), the certifier ``sukenik`` (Alg. 3
with Thm 3.2), the trainers ``sukenik-augmentation`` (App. E.4) and
``sukenik-increased`` (App. E.6.3), and the method ``sukenik``. The ξ functions and the
certified radius are the harness's (``harness.xi``, ``harness.certified_radius``): the
soundness checks use them too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from harness import (
    BuildContext,
    CertifierSpec,
    MethodSpec,
    ParameterError,
    SigmaProviderSpec,
    TrainerSpec,
    check_sigma,
    hookimpl,
)

IDRS_BENCH_CONTRACT = 4
"""The plugin contract this plugin is written against (docs/plugins.md)."""

METHOD_DEFAULTS = {"sigma": 0.25, "rate": 0.01, "k": 20, "m": "min", "max_ratio": 0.0}


def check_params(params: Mapping[str, Any]) -> None:
    check_sigma(params["sigma"])
    if not isinstance(params["rate"], int | float) or params["rate"] < 0:
        raise ParameterError(f"rate must be a number >= 0, got {params['rate']!r}")
    if not isinstance(params["k"], int) or params["k"] < 1:
        raise ParameterError(f"k must be an integer >= 1, got {params['k']!r}")
    if not (isinstance(params["m"], int | float) or params["m"] in ("min", "median")):
        raise ParameterError(f"m must be a number, 'min' or 'median'; got {params['m']!r}")
    if not isinstance(params["max_ratio"], int | float) or params["max_ratio"] < 0:
        raise ParameterError(f"max_ratio must be >= 0 (0 = no clamp), got {params['max_ratio']!r}")


def _proposed_m(context: BuildContext, train, k: int, rule: str) -> float:
    """m by ``rule`` (App. E.1), computed once per run and kept in the plugin's artifact
    directory, so later runs and their checks use the very same m. It depends on the
    training inputs alone, so the checks' rebuilds on analytic base models share it."""

    def stored_or_computed() -> float:
        from plugins.sukenik.knn_sigma import propose_m

        directory = context.artifact_dir("sukenik")
        name = f"m-{rule}-k{k}-{context.dataset.name}-{len(train)}.json"
        path = None if directory is None else directory / name
        if path is not None and path.is_file():
            try:
                return float(json.loads(path.read_text())["m"])
            except (OSError, ValueError, KeyError, TypeError):
                pass  # a damaged file: m is computed and written again
        m = propose_m(train, k, rule)
        if path is not None:
            path.write_text(json.dumps({"m": m}))  # repr of a float: read back exactly
        return m

    return context.memo("sukenik", ("m", context.dataset.name, len(train), k, rule),
                        stored_or_computed, inputs_only=True)  # fmt: skip


def _knn_sigma(context: BuildContext, params: Mapping[str, Any]):
    from plugins.sukenik.knn_sigma import KnnSigma

    train = context.dataset.train_x.to(context.device)
    m = params["m"]
    if isinstance(m, str):
        m = _proposed_m(context, train, int(params["k"]), m)
    return KnnSigma(train, float(params["sigma"]), float(params["rate"]), int(params["k"]), float(m),
                    float(params["max_ratio"]))  # fmt: skip


def _certifier(context, params: Mapping[str, Any], sigma_provider):
    """Thm 3.2 at the rate r the σ-provider declares (``sigma_provider.regularity``)."""
    from plugins.sukenik.certifier import SukenikCertifier

    return SukenikCertifier(sigma_provider.regularity, context.dataset.dim)


def _train_input_dependent(model, dataset, params, context):
    from plugins.sukenik.training import train_input_dependent

    train_input_dependent(model, dataset, params, context)


def _train_increased(model, dataset, params, context):
    from plugins.sukenik.training import train_constant_increased

    train_constant_increased(model, dataset, params, context)


_TRAIN_DEFAULTS = {
    "sigma": 0.25,
    "trr": 0.0,
    "k": 20,
    "m": "min",
    "epochs": 10,
    "batch_size": 128,
    "lr": 1e-3,
}


@hookimpl
def idrs_register_sigma_providers(register) -> None:
    register(
        SigmaProviderSpec(
            "sukenik-knn", _knn_sigma, "σ_b exp(r(mean kNN distance − m)), r-semi-elastic"
        )
    )


@hookimpl
def idrs_register_certifiers(register) -> None:
    register(
        CertifierSpec("sukenik", _certifier, "CERTIFY with the semi-elastic radius of Thm 3.2")
    )


@hookimpl
def idrs_register_trainers(register) -> None:
    register(TrainerSpec("sukenik-augmentation", _train_input_dependent, _TRAIN_DEFAULTS,
                         "Gaussian augmentation with σ(x) at train rate trr (App. E.4)"))  # fmt: skip
    register(TrainerSpec("sukenik-increased", _train_increased, {**_TRAIN_DEFAULTS, "rate": 0.01},
                         "constant augmentation at C·σ_b, C = median exp(r(d̄ − m)) (App. E.6.3)"))  # fmt: skip


@hookimpl
def idrs_register_methods(register) -> None:
    register(MethodSpec("sukenik", "sukenik-knn", "sukenik", METHOD_DEFAULTS,
                        "Súkeník et al. (2022): kNN σ(x), semi-elastic certificate", check_params))  # fmt: skip
