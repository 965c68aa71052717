"""Dual randomized smoothing (Sun, Mao & Vechev, ICLR 2026, arXiv 2512.01782).

σ(x) is the choice of a *smoothed* σ-estimator among a discrete set of noise levels,
and the benchmark's base model is smoothed at that σ(x). The paper proves that
randomized smoothing stays valid with input-dependent noise levels provided the level
is locally constant around each input (its Theorems 4.1 and 4.2); smoothing the
estimator itself certifies that constancy (Cohen et al. 2019, Thm 1 applied to the
estimator). The certificate is

    R = min(R_σ, R_c),  R_σ = σ_v Φ⁻¹(p_σ lower at α_σ),  R_c = σ(x) Φ⁻¹(p_A lower at α − α_σ),

with σ_v the estimator's own noise level and α_σ = ``alpha_split`` · α the share of the
run's α spent on the σ choice, so that the whole certificate fails with probability at
most α (a union bound over the two smoothings).

Registers the σ-provider ``dual-rs-estimator`` (the trained σ-estimator, declared to the
harness as a :class:`harness.SigmaSmoothing`: the harness draws its samples), the
certifier ``dual-rs`` (Cohen's CERTIFY at σ(x), capped at R_σ) and the method
``dual-rs``. Modules: ``estimator`` (the σ-provider), ``training`` (labels and fit of
the σ-estimator, cached per base model), ``certifier``.

Source: the paper's abstract and its ICLR 2026 reviews, which cite the local-constancy
results as Theorems 4.1 and 4.2 (the body and the reference code,
eth-sri/Dual-Randomized-Smoothing, were not reachable here); the certificate above is
that result combined with Cohen et al.'s, and the checks verify its hypothesis
themselves (harness/README.md, "Soundness checks").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from harness import (
    BuildContext,
    CertifierSpec,
    MethodSpec,
    ParameterError,
    SigmaProviderSpec,
    hookimpl,
)

IDRS_BENCH_CONTRACT = 4
"""The plugin contract this plugin is written against (docs/plugins.md)."""

METHOD_DEFAULTS: dict[str, Any] = {
    "levels": [0.12, 0.25, 0.5],  # the σ the estimator chooses among (the quick board's cohen σ)
    "estimator_sigma": 0.5,  # σ_v: the noise the σ-estimator is trained and smoothed at
    "alpha_split": 0.5,  # α_σ = alpha_split · α for the σ choice, the rest for the classifier
    "estimator": "mlp",  # a registered architecture, with `levels` as its classes
    "estimator_params": {"width": 100},
    "train_examples": 4096,  # training inputs labelled with their best level
    "label_samples": 64,  # noisy samples of the base model per input and level for a label
    "epochs": 20,
    "batch_size": 128,
    "lr": 1e-3,
}
"""Every parameter of ``dual-rs`` (the training budget is sized for a 2-core CPU)."""


def check_params(params: Mapping[str, Any]) -> None:
    """Raise ParameterError (one line naming the value and the fix) before any work."""

    def real(value) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool)

    levels = params["levels"]
    if not isinstance(levels, list | tuple) or len(levels) < 2:
        raise ParameterError(
            f"levels must be a list of at least two noise levels, e.g. [0.12, 0.25, 0.5]; got {levels!r}"
        )
    bad = [v for v in levels if not (real(v) and 0 < v < math.inf)]
    if bad:
        raise ParameterError(
            f"levels must be positive finite numbers; {bad[0]!r} in {levels!r} is not"
        )
    if len(set(levels)) != len(levels):
        raise ParameterError(f"levels must be distinct, got {levels!r}")
    sigma_v = params["estimator_sigma"]
    if not (real(sigma_v) and 0 < sigma_v < math.inf):
        raise ParameterError(
            f"estimator_sigma (the σ-estimator's own noise level) must be > 0, got {sigma_v!r}"
        )
    split = params["alpha_split"]
    if not (real(split) and 0 < split < 1):
        raise ParameterError(
            f"alpha_split (the share of α spent on the σ choice) must lie in (0, 1), got {split!r}"
        )
    if not isinstance(params["estimator"], str):
        raise ParameterError(f"estimator must be an architecture name, got {params['estimator']!r}")
    if not isinstance(params["estimator_params"], Mapping):
        raise ParameterError(
            f"estimator_params must be a table, got {params['estimator_params']!r}"
        )
    for name, low in (
        ("train_examples", 1),
        ("label_samples", 1),
        ("epochs", 0),
        ("batch_size", 1),
    ):
        value = params[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ParameterError(f"{name} must be an integer >= {low}, got {value!r}")
    if not (real(params["lr"]) and params["lr"] > 0):
        raise ParameterError(f"lr must be > 0, got {params['lr']!r}")


def _estimator(context: BuildContext, params: Mapping[str, Any]):
    from plugins.dual_rs.training import obtain_estimator

    return obtain_estimator(context, params)


def _certifier(context: BuildContext, params: Mapping[str, Any], sigma_provider):
    from plugins.dual_rs.certifier import DualCertifier

    return DualCertifier()


@hookimpl
def idrs_register_sigma_providers(register) -> None:
    register(
        SigmaProviderSpec(
            "dual-rs-estimator",
            _estimator,
            "σ(x) = the level a smoothed σ-estimator chooses (drawn by the harness)",
        )
    )


@hookimpl
def idrs_register_certifiers(register) -> None:
    register(
        CertifierSpec(
            "dual-rs",
            _certifier,
            "CERTIFY at σ(x), R = min(σ_v Φ⁻¹(p_σ lower), σ(x) Φ⁻¹(p_A lower)), α split",
        )
    )


@hookimpl
def idrs_register_methods(register) -> None:
    register(
        MethodSpec(
            "dual-rs",
            sigma_provider="dual-rs-estimator",
            certifier="dual-rs",
            defaults=METHOD_DEFAULTS,
            description="Sun et al. 2026: dual randomized smoothing (smoothed σ-estimator)",
            check=check_params,
        )
    )
