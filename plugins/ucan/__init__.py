"""UCAN (Hong, Kundu, Payani, Wang, Hong, "Towards Strong Certified Defense with Universal
Asymmetric Randomization", arXiv 2510.19977, 2025): anisotropic Gaussian noise whose
per-dimension scale a trained noise parameter generator (NPG) chooses per input; its
"certification-wise" NPG, as its code (github.com/youbin2014/UCAN) trains and certifies it.

UCAN's noise is x + μ(x) + λ·v(x)⊙ε, μ = λ·G1(x), v = |G2(x + μ)| ∈ [0, 1]^d (tanh
outputs), λ = σ for Gaussian noise; its ℓ2 certificate is R = λ·Φ⁻¹(p_A_lower)·term, term =
min_i v_i (``IsoMeasure``) or the geometric mean of v (its default). What this plugin
registers, and where it departs from the code (decisions of this harness):

- (a) the base classifier is frozen: the board compares every method on one base model,
  so only the generator is trained (UCAN fine-tunes the classifier jointly);
- (b) the σ-provider ``ucan-npg-centred`` trains G1 and G2 together and answers the
  centre μ(x) = λ·G1(x) (:mod:`harness.engine.centre`: the harness draws at x + μ(x)) beside
  the diagonal scale σ_i(x) = λ·max(v_i(x), floor), v = |G2(x + μ)| (float32
  [B, *input_shape]; ``floor`` = 1e-3 by default keeps σ_i in (0, λ], tanh may answer
  0); ``ucan-npg`` is the ablation μ ≡ 0 (``mean = mean*0``, which UCAN's ``core.py``
  keeps commented out): G2 alone, applied to x itself, the rows the boards published
  before the noise contract had a centre. Both are declared ``Unregularized`` (nothing
  bounds how μ or v changes with x);
- training runs on a subset of the training split (``train_examples``) for ``epochs``
  epochs sized for a CPU (UCAN: the whole split, 200 epochs), seeded (:mod:`.fit`).

Methods: ``ucan-centred`` (``measure = "smallest"``: the loss −min|v|, and the
``anisotropic`` certifier: R = σ_min·Φ⁻¹(p_A_lower) = λ·min_i v_i·Φ⁻¹(p_A_lower), UCAN's
``IsoMeasure`` certificate, plus the ellipsoid) and ``ucan-centred-geometric``
(``measure = "geometric"``: the loss −mean|v|, and the certifier ``ucan-geometric``, which
claims UCAN's geometric-mean radius as its ℓ2 radius while declaring Cohen's formula at
σ_min, so that S0 flags it: :mod:`.certifier`); ``ucan`` and ``ucan-geometric`` are the
same with μ ≡ 0.

Modules: ``generator`` (the NPG networks), ``fit`` (training, the stored generator, the
σ-provider), ``certifier`` (the geometric claim).
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

MEASURES = ("smallest", "geometric")
"""``measure``: the loss's −min|v| (UCAN's ``IsoMeasure``) or −mean|v| (its default)."""
SIGMA_MAX = 1e30
"""The largest σ a provider may answer (``harness.foundation.protocol.SIGMA_MAX``)."""
FLOAT32_TINY = 2.0**-126
"""The smallest normal float32: λ·floor must stay above it (a scale is held in float32)."""

METHOD_DEFAULTS: dict[str, Any] = {
    "sigma": 0.25,  # λ (Gaussian: λ = σ); σ_i = λ·v_i <= λ
    "measure": "smallest",
    "epochs": 1,  # UCAN: 200 on the whole training split (a CPU budget here)
    "train_examples": 4096,  # a seeded subset of the training split
    "batch": 256,  # UCAN's --batch
    "train_samples": 5,  # noise draws per batch, UCAN's
    "lr": 1e-3,  # UCAN's SGD lr (momentum 0.9, weight decay 1e-4; its StepLR never steps)
    "floor": 1e-3,  # σ_i = λ·max(v_i, floor)
}
"""Every parameter of ``ucan``; ``ucan-geometric`` differs in ``measure`` alone."""


def check_params(params: Mapping[str, Any]) -> None:
    """Raise ParameterError for values the training or the scale cannot take."""

    def number(name: str, low: float, high: float, high_open: bool = False) -> float:
        value = params[name]
        real = isinstance(value, int | float) and not isinstance(value, bool)
        if not (real and math.isfinite(value) and low < value
                and (value < high if high_open else value <= high)):  # fmt: skip
            bracket = ")" if high_open else "]"
            raise ParameterError(
                f"ucan: {name} must lie in ({low:g}, {high:g}{bracket}, got {value!r}"
            )
        return float(value)

    def integer(name: str) -> None:
        value = params[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ParameterError(f"ucan: {name} must be an integer >= 1, got {value!r}")

    lam = number("sigma", 0.0, SIGMA_MAX)
    floor = number("floor", 0.0, 1.0)
    number("lr", 0.0, math.inf, high_open=True)
    for name in ("epochs", "train_examples", "batch", "train_samples"):
        integer(name)
    if params["measure"] not in MEASURES:
        raise ParameterError(f"ucan: measure must be one of {', '.join(map(repr, MEASURES))} "
                             f"(UCAN's IsoMeasure, or its geometric mean), got {params['measure']!r}")  # fmt: skip
    if lam * floor < FLOAT32_TINY:
        raise ParameterError(f"ucan: sigma·floor = {lam * floor:g} is not a positive float32 "
                             "scale; raise sigma or floor")  # fmt: skip


def _npg(context: BuildContext, params: Mapping[str, Any]):
    from plugins.ucan.fit import noise_provider

    return noise_provider(context, params, centred=False)


def _npg_centred(context: BuildContext, params: Mapping[str, Any]):
    from plugins.ucan.fit import noise_provider

    return noise_provider(context, params, centred=True)


def _geometric(context: BuildContext, params: Mapping[str, Any], sigma_provider):
    from plugins.ucan.certifier import GeometricCertifier

    return GeometricCertifier()


@hookimpl
def idrs_register_sigma_providers(register) -> None:
    register(SigmaProviderSpec("ucan-npg", _npg,
                               "UCAN's certification-wise NPG (scale only, μ ≡ 0): σ_i(x) = "
                               "λ·max(|G2(x)|_i, floor), G2 trained on the frozen base model"))  # fmt: skip
    register(SigmaProviderSpec("ucan-npg-centred", _npg_centred,
                               "UCAN's certification-wise NPGs: the centre μ(x) = λ·G1(x) and "
                               "σ_i(x) = λ·max(|G2(x + μ)|_i, floor), G1 and G2 trained together "
                               "on the frozen base model"))  # fmt: skip


@hookimpl
def idrs_register_certifiers(register) -> None:
    register(CertifierSpec("ucan-geometric", _geometric,
                           "UCAN's radius λ·Φ⁻¹(p_A_lower)·geomean(v) claimed as ℓ2 (declared "
                           "Cohen's at σ_min: S0 flags it), plus the ellipsoid"))  # fmt: skip


@hookimpl
def idrs_register_methods(register) -> None:
    register(MethodSpec("ucan", "ucan-npg", "anisotropic", METHOD_DEFAULTS,
                        "UCAN (Hong et al. 2025), IsoMeasure: the NPG trained with −min|v|, "
                        "R = λ·min v·Φ⁻¹(p_A_lower) (the ball inside the ellipsoid)",
                        check_params))  # fmt: skip
    register(MethodSpec("ucan-geometric", "ucan-npg", "ucan-geometric",
                        {**METHOD_DEFAULTS, "measure": "geometric"},
                        "UCAN (Hong et al. 2025), geometric measure: the NPG trained with "
                        "−mean|v|, R = λ·geomean(v)·Φ⁻¹(p_A_lower) claimed as ℓ2 (not valid)",
                        check_params))  # fmt: skip
    register(MethodSpec("ucan-centred", "ucan-npg-centred", "anisotropic", METHOD_DEFAULTS,
                        "UCAN (Hong et al. 2025) as its code certifies, IsoMeasure: noise "
                        "x + μ(x) + λ·v⊙ε, R = λ·min v·Φ⁻¹(p_A_lower)", check_params))  # fmt: skip
    register(MethodSpec("ucan-centred-geometric", "ucan-npg-centred", "ucan-geometric",
                        {**METHOD_DEFAULTS, "measure": "geometric"},
                        "UCAN (Hong et al. 2025) as its code certifies, geometric measure: "
                        "noise x + μ(x) + λ·v⊙ε, R = λ·geomean(v)·Φ⁻¹(p_A_lower) claimed as ℓ2 "
                        "(not valid)", check_params))  # fmt: skip
