"""Alfarra et al. (2022), "Data Dependent Randomized Smoothing" (UAI), with its critique.

Registers the σ-provider ``alfarra-opt`` (OptimizeSigma, Alg. 1), the trainer
``alfarra-ds`` (Alg. 2), the certifier wrapper ``memory`` (memory-based
certification, Alg. 3 / App. C) and the methods ``alfarra-ds`` (σ(x) from OptimizeSigma,
then Cohen's CERTIFY at σ(x) with no memory, as the paper's first version certified)
and ``alfarra-ds-memory`` (the same through ``memory``). Both methods are unsound as
certificates of a fixed classifier: σ(x) is unregularized (Súkeník et al. 2022, App.
C.2); the memory only makes one run's certificates mutually consistent, and its
answers depend on the input order (:func:`plugins.alfarra.order.replay_orders`).

K, the number of ascent steps, is a number (``steps = 100``, App. B's value and the default)
or ``steps = "cross-validated"``: chosen once per base model on inputs of the training
split by the certified result it gives, as the paper's Table 1 cross-validates it
(:mod:`plugins.alfarra.cross_validation`), kept in the plugin's artifact directory so that
the checks and a replay use the very K the run used.

Noise streams used here (see :mod:`harness.engine.sampling`): 100 = OptimizeSigma at
certification (keyed by a content hash of x), 101 = OptimizeSigma in training (keyed
by the training example index), 102 and 103 = the cross-validation's CERTIFY (selection
and estimation, keyed by the training index). CERTIFY itself uses the core's streams 0 and 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness import (
    BuildContext,
    CertifierSpec,
    IdrsError,
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

OPTIMIZER_DEFAULTS = {
    "sigma": 0.25,
    "steps": 100,
    "samples": 1,
    "beta": 1e-4,
    "sigma_min": 1e-3,
    "steps_candidates": (25, 50, 100, 200, 400, 800, 1600, 3200),
    "cv_examples": 100,
}
"""Alg. 1 with the paper's values (§4: β = 1e-4, M = 1; σ_0 = the training σ; K = 100 as
App. B certifies). ``steps = "cross-validated"`` chooses K among ``steps_candidates`` on
``cv_examples`` training inputs (Table 1); the default K = 100 is kept so that boards
published with it replay."""

CROSS_VALIDATED = "cross-validated"
"""The value of ``steps`` that chooses K on the training split (Table 1)."""

TRAINER_DEFAULTS = {
    "sigma": 0.25,
    "epochs": 10,
    "batch_size": 128,
    "lr": 1e-3,
    "warmup_share": 0.25,
    "steps": 1,
    "samples": 1,
    "beta": 1e-4,
    "sigma_min": 1e-3,
}
"""Alg. 2: K = 0 for the first quarter of the epochs (``warmup_share``), then K = 1
(§4.1: 50 of 200 epochs)."""

MEMORY_DEFAULTS = {"memory_certifier": "cohen"}
"""The certifier wrapped by ``memory`` (any registered certifier but ``memory``)."""


def check_optimizer_params(steps: int, samples: int, beta: float, sigma_min: float) -> None:
    """Raise :class:`ParameterError` unless K >= 0, M >= 1, β >= 0 and σ_min > 0."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ParameterError(f"steps (K) must be an integer >= 0, got {steps!r}")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ParameterError(f"samples (M) must be an integer >= 1, got {samples!r}")
    if not isinstance(beta, int | float) or not 0.0 <= beta < float("inf"):
        raise ParameterError(f"beta must be a finite number >= 0, got {beta!r}")
    if not isinstance(sigma_min, int | float) or not 0.0 < sigma_min < float("inf"):
        raise ParameterError(f"sigma_min must be a positive number, got {sigma_min!r}")


def check_candidates(candidates: Sequence[int]) -> tuple[int, ...]:
    """``candidates`` of K as an increasing tuple of distinct integers >= 1 (else ParameterError)."""
    if isinstance(candidates, str | bytes) or not isinstance(candidates, Sequence) or any(
        isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in candidates
    ) or len(set(candidates)) != len(candidates) or not candidates:  # fmt: skip
        raise ParameterError(
            f"steps_candidates must be a non-empty list of distinct integers >= 1 (the values "
            f"of K to cross-validate), got {candidates!r}"
        )
    return tuple(sorted(candidates))


def check_optimizer(params: Mapping[str, Any]) -> None:
    """Parameters of ``alfarra-opt``: σ_0 > 0, K >= 0 or ``"cross-validated"`` (then its
    candidates: distinct integers >= 1, and ``cv_examples`` >= 1), M >= 1, β >= 0, σ_min > 0."""
    check_sigma(params["sigma"])
    steps = params["steps"]
    if steps == CROSS_VALIDATED:
        check_candidates(params.get("steps_candidates", OPTIMIZER_DEFAULTS["steps_candidates"]))
        examples = params.get("cv_examples", OPTIMIZER_DEFAULTS["cv_examples"])
        if isinstance(examples, bool) or not isinstance(examples, int) or examples < 1:
            raise ParameterError(f"cv_examples must be an integer >= 1, got {examples!r}")
        steps = 0
    elif isinstance(steps, str):
        raise ParameterError(
            f"steps (K) must be an integer >= 0 or {CROSS_VALIDATED!r}, got {steps!r}"
        )
    check_optimizer_params(steps, params["samples"], params["beta"], params["sigma_min"])


def check_memory_method(params: Mapping[str, Any]) -> None:
    check_optimizer(params)
    inner = params["memory_certifier"]
    if not isinstance(inner, str) or inner == "memory":
        raise ParameterError(
            f"memory_certifier must name a registered certifier other than 'memory', got {inner!r}"
        )


def _optimized_sigma(context: BuildContext, params: Mapping[str, Any]):
    from plugins.alfarra.optimize_sigma import OptimizedSigma

    check_optimizer(params)
    steps = params["steps"]
    if steps == CROSS_VALIDATED:
        from plugins.alfarra.cross_validation import cross_validated_steps

        steps = cross_validated_steps(context, {**OPTIMIZER_DEFAULTS, **params})
    return OptimizedSigma(  # the base model as certified (the run's precision)
        context.engine.model, params["sigma"], steps, params["samples"], float(params["beta"]),
        float(params["sigma_min"]), context.seed,
    )  # fmt: skip


def _memory_certifier(context: BuildContext, params: Mapping[str, Any], sigma_provider):
    from plugins.alfarra.certifier import MemoryCertifier
    from plugins.alfarra.memory import Memory
    from plugins.alfarra.memory_store import restore

    params = {**MEMORY_DEFAULTS, **params}
    name = params["memory_certifier"]
    if name == "memory":
        raise ParameterError("the memory certifier cannot wrap itself; set memory_certifier")
    if context.registry is None:
        raise IdrsError(
            f"the memory certifier builds the certifier {name!r} by name: build it with a "
            "BuildContext that carries the plugin registry (context.registry)"
        )
    inner = context.registry.get("certifiers", name).build(context, params, sigma_provider)
    memory = Memory(context.device)
    state = context.state  # the setting's RunState in the run's database; None: no run
    if state is not None and restore(memory, state.records()):
        context.progress.log(f"memory: continuing with {len(memory)} certified inputs")
    return MemoryCertifier(inner, memory, state)


def _train_alfarra_ds(model, dataset, params: Mapping[str, Any], context: TrainContext) -> None:
    from plugins.alfarra.training import train_alfarra_ds

    train_alfarra_ds(model, dataset, params, context)


@hookimpl
def idrs_register_sigma_providers(register) -> None:
    register(
        SigmaProviderSpec(
            "alfarra-opt",
            _optimized_sigma,
            "σ(x) by K steps of gradient ascent on the soft radius (Alfarra et al. Alg. 1)",
        )
    )


@hookimpl
def idrs_register_trainers(register) -> None:
    register(
        TrainerSpec(
            "alfarra-ds",
            _train_alfarra_ds,
            TRAINER_DEFAULTS,
            "Gaussian augmentation with per-example σ from OptimizeSigma (Alfarra et al. Alg. 2)",
        )
    )


@hookimpl
def idrs_register_certifiers(register) -> None:
    register(
        CertifierSpec(
            "memory",
            _memory_certifier,
            "wraps memory_certifier; balls of different classes never meet (Alfarra et al. Alg. 3)",
        )
    )


@hookimpl
def idrs_register_methods(register) -> None:
    register(
        MethodSpec(
            "alfarra-ds",
            sigma_provider="alfarra-opt",
            certifier="cohen",
            defaults=dict(OPTIMIZER_DEFAULTS),
            description="Alfarra et al. (2022): OptimizeSigma, then Cohen's CERTIFY at σ(x)",
            check=check_optimizer,
        )
    )
    register(
        MethodSpec(
            "alfarra-ds-memory",
            sigma_provider="alfarra-opt",
            certifier="memory",
            defaults={**OPTIMIZER_DEFAULTS, **MEMORY_DEFAULTS},
            description="Alfarra et al. (2022): alfarra-ds with memory-based certification",
            check=check_memory_method,
        )
    )
