"""Certificates for anisotropic Gaussian smoothing: a diagonal scale σ_1(x) … σ_d(x).

Registers the certifier ``anisotropic``: for a σ-provider that answers a diagonal scale
(:mod:`harness.engine.scale`), CERTIFY's class with the ℓ2 ball of the smallest axis,
R = σ_min·Φ⁻¹(p_A_lower) (Cohen et al. 2019, Thm 1 at σ_min: the largest ball inside the
ellipsoid), and the ellipsoid itself, {δ : ‖Σ^{-1/2}δ‖₂ <= Φ⁻¹(p_A_lower)} (Eiras et al.,
ANCER, TMLR 2022, Thm 1), recorded beside the ball with its proxy radius, never ranked as
an ℓ2 radius; the σ-provider ``fixed-scale`` and the method ``anisotropic-fixed``: one
diagonal scale for every input (:mod:`plugins.anisotropic.fixed_scale`), the sound baseline
of anisotropic smoothing; and ``shifted-scale`` with the method ``anisotropic-shifted``:
that scale drawn around a constant noise centre x + offset·1 (:mod:`harness.engine.centre`),
the sound baseline of a centre, which shifts every input alike. The methods that choose
the scale (and UCAN its centre) per input (ANCER, UCAN) register their own σ-providers and
name this certifier.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness import BuildContext, CertifierSpec, MethodSpec, SigmaProviderSpec, hookimpl

IDRS_BENCH_CONTRACT = 4
"""The plugin contract this plugin is written against (docs/plugins.md)."""


def _anisotropic_certifier(context: BuildContext, params: Mapping[str, Any], sigma_provider):
    from plugins.anisotropic.certifier import AnisotropicCertifier

    return AnisotropicCertifier()


def _fixed_scale(context: BuildContext, params: Mapping[str, Any]):
    from plugins.anisotropic.fixed_scale import FixedScale

    return FixedScale(params["sigma"], params["ratio"])


def _shifted_scale(context: BuildContext, params: Mapping[str, Any]):
    from plugins.anisotropic.fixed_scale import ShiftedScale

    return ShiftedScale(params["sigma"], params["ratio"], params["offset"])


@hookimpl
def idrs_register_sigma_providers(register) -> None:
    register(SigmaProviderSpec("fixed-scale", _fixed_scale,
                               "one diagonal scale for every input: σ·ratio^(i/(d−1)) on axis i"))  # fmt: skip
    register(SigmaProviderSpec("shifted-scale", _shifted_scale,
                               "fixed-scale's scale around the constant centre x + offset·1"))  # fmt: skip


@hookimpl
def idrs_register_certifiers(register) -> None:
    register(CertifierSpec("anisotropic", _anisotropic_certifier,
                           "CERTIFY at a diagonal scale: the ball R = σ_min Φ⁻¹(p_A_lower) and "
                           "the ellipsoid of semi-axes σ_i Φ⁻¹(p_A_lower) (ANCER)"))  # fmt: skip


@hookimpl
def idrs_register_methods(register) -> None:
    register(MethodSpec("anisotropic-fixed", sigma_provider="fixed-scale",
                        certifier="anisotropic", defaults={"sigma": 0.25, "ratio": 2.0},
                        description="a fixed diagonal scale (σ … 2σ) and the anisotropic "
                        "certificate: ball and ellipsoid (Eiras et al. 2022, Thm 1)"))  # fmt: skip
    register(MethodSpec("anisotropic-shifted", sigma_provider="shifted-scale",
                        certifier="anisotropic",
                        defaults={"sigma": 0.25, "ratio": 2.0, "offset": 0.1},
                        description="anisotropic-fixed drawn around the constant noise centre "
                        "x + offset·1: the sound baseline of a centre"))  # fmt: skip
