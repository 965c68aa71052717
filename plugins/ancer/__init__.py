"""Eiras, Alfarra, Kumar, Torr, Dokania, Ghanem, Bibi (2022), "ANCER: Anisotropic
Certification via Sample-wise Volume Maximization" (TMLR; arXiv 2107.04570).

Registers the σ-provider ``ancer-opt`` (a diagonal scale Θ(x) per input: the isotropic
σ(x) of ``alfarra-opt`` on every axis, then ANCER's projected Adam on the relaxed volume
objective of §5, :mod:`plugins.ancer.optimize`) and the methods

- ``ancer``: Θ(x), then the certifier ``anisotropic`` (Thm 1: the ellipsoid of semi-axes
  κ·θ_i, κ = Φ⁻¹(p_A_lower), and the ℓ2 ball κ·min θ_i inside it), without memory, as the
  released code certifies (``scripts/certify_dataset.py``);
- ``ancer-memory``: the same through the certifier wrapper ``memory`` (Alfarra et al.'s
  Alg. 3), which ANCER's memory-based certification generalizes (abstract, §5). The
  wrapper keeps the ℓ2 balls of different classes disjoint; the ellipsoids are not
  intersected with one another: a certificate the memory changes (``inside``, ``shrunk``)
  loses its ellipsoid, whose claim held only for the ball it came with, and keeps the
  ball the memory gives it. What remains sound is exactly what the memory checks.

Both are unsound as certificates of a fixed classifier (Θ(x) is unregularized, as σ(x) of
``alfarra-opt``). The isotropic stage takes ``alfarra-opt``'s parameters and defaults
(``sigma``, ``steps``, ``samples``, ``beta``, ``sigma_min``; ``steps = "cross-validated"``
too); ANCER's scripts ran theirs with 900 steps of size 0.04 on 100 samples and
ddsmoothing's clamp 0.001/0.999 (set ``steps``, ``beta``, ``samples`` to follow them).

Noise streams used here (see :mod:`harness.engine.sampling`): 104 = ANCER's optimization
(keyed by a content hash of x), besides ``alfarra-opt``'s 100 (and 102/103 when K is
cross-validated) for the isotropic stage. CERTIFY itself uses the core's streams 0 and 1.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from harness import BuildContext, MethodSpec, ParameterError, SigmaProviderSpec, hookimpl
from plugins.alfarra import MEMORY_DEFAULTS, OPTIMIZER_DEFAULTS, check_optimizer

IDRS_BENCH_CONTRACT = 4
"""The plugin contract this plugin is written against (docs/plugins.md)."""

ANCER_DEFAULTS = {"iterations": 100, "lr": 0.04, "ancer_samples": 100, "regularization": 2.0}
"""ANCER's optimization with the released scripts' values (``run_optimization_dataset.py``:
100 iterations, learning rate 0.04, 100 samples per iteration, regularization weight κ = 2)."""

DEFAULTS = {**OPTIMIZER_DEFAULTS, **ANCER_DEFAULTS}
"""Every parameter of ``ancer-opt``: the isotropic stage's (``alfarra-opt``) and ANCER's."""

MEMORY_METHOD_DEFAULTS = {**DEFAULTS, **MEMORY_DEFAULTS, "memory_certifier": "anisotropic"}
"""``ancer-memory``: the memory wraps the certifier ``anisotropic``."""


def _positive_real(value: Any) -> bool:
    real = isinstance(value, int | float) and not isinstance(value, bool)
    return real and 0.0 < value < float("inf")


def check_ancer(params: Mapping[str, Any]) -> None:
    """Parameters of ``ancer-opt``: those of ``alfarra-opt``, then ``iterations`` an integer
    >= 0, ``lr`` > 0, ``ancer_samples`` an integer >= 1 and ``regularization`` (κ) >= 0."""
    check_optimizer(params)
    iterations = params["iterations"]
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 0:
        raise ParameterError(
            f"ancer: iterations (ANCER's Adam steps) must be an integer >= 0, got {iterations!r}"
        )
    if not _positive_real(params["lr"]):
        raise ParameterError(
            f"ancer: lr (ANCER's Adam learning rate) must be a finite number > 0, "
            f"got {params['lr']!r}"
        )
    samples = params["ancer_samples"]
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ParameterError(
            f"ancer: ancer_samples (noise samples per input and iteration) must be an integer "
            f">= 1, got {samples!r}"
        )
    kappa = params["regularization"]
    if not (_positive_real(kappa) or (not isinstance(kappa, bool) and kappa in (0, 0.0))):
        raise ParameterError(
            f"ancer: regularization (κ, the weight of the smallest axis) must be a finite "
            f"number >= 0, got {kappa!r}"
        )


def check_ancer_memory(params: Mapping[str, Any]) -> None:
    check_ancer(params)
    inner = params["memory_certifier"]
    if not isinstance(inner, str) or inner == "memory":
        raise ParameterError(
            f"memory_certifier must name a registered certifier other than 'memory' (one "
            f"that declares a diagonal scale, such as 'anisotropic'), got {inner!r}"
        )


def _ancer_sigma(context: BuildContext, params: Mapping[str, Any]):
    from plugins.alfarra import _optimized_sigma
    from plugins.ancer.optimize import AncerSigma, ScaleCache

    params = {**DEFAULTS, **params}
    check_ancer(params)
    isotropic = _optimized_sigma(context, params)
    # Θ(x) depends on x, the seed and these parameters alone: ancer and ancer-memory at one
    # setting share their scales in a run (one optimization per input, not one per method)
    key = json.dumps({name: params[name] for name in DEFAULTS}, sort_keys=True)
    return AncerSigma(
        isotropic, context.engine.model, params["iterations"], float(params["lr"]),
        params["ancer_samples"], float(params["regularization"]), context.seed,
        float(params["sigma_min"]), cache=context.memo("ancer", ("scales", key), ScaleCache),
    )  # fmt: skip


@hookimpl
def idrs_register_sigma_providers(register) -> None:
    register(
        SigmaProviderSpec(
            "ancer-opt",
            _ancer_sigma,
            "a diagonal scale per input: the isotropic σ(x), then ANCER's volume maximization",
        )
    )


@hookimpl
def idrs_register_methods(register) -> None:
    register(
        MethodSpec(
            "ancer",
            sigma_provider="ancer-opt",
            certifier="anisotropic",
            defaults=dict(DEFAULTS),
            description="Eiras et al. (2022): ANCER's Θ(x), then the ellipsoid of Thm 1",
            check=check_ancer,
        )
    )
    register(
        MethodSpec(
            "ancer-memory",
            sigma_provider="ancer-opt",
            certifier="memory",
            defaults=dict(MEMORY_METHOD_DEFAULTS),
            description="Eiras et al. (2022): ancer with memory-based certification",
            check=check_ancer_memory,
        )
    )
