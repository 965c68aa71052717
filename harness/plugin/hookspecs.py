"""Every hook an idrs-bench plugin can implement.

All hooks follow the register-callback style: the host calls the hook once per
plugin, when the plugin manager builds its registry (the first time a command needs
components), with a ``register`` callable. The plugin calls ``register(spec)`` once
per component it provides; the host records the plugin as the component's provider.
A name already registered by another plugin raises
:class:`harness.foundation.errors.DuplicateNameError` naming both providers. Hooks return nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import pluggy

from harness.foundation.data import PORTING as _PORTING
from harness.plugin.components import (
    CertifierSpec,
    CheckSpec,
    DatasetSpec,
    MethodSpec,
    ModelSpec,
    SigmaProviderSpec,
    TrainerSpec,
)

CONTRACT = 4
"""The version of the plugin contract these hooks and :mod:`harness.plugin.components`
define. 1: certifiers drew their own samples; 2: the harness draws every sample and a
certifier only claims; 3: plugins declare the version they were written against and
third-party plugins run in a plugin host, a process of their own; 4: the test split is
withheld from plugin code (a :class:`~harness.foundation.data.TrainingSplit` in place of
the dataset) and an order-dependent certifier replays orders without labels
(``order_replays``), the harness scoring them."""
ACCEPTED = (3, CONTRACT)
"""The contracts a plugin may declare. Contract 4 only takes away (the test split, the
labels of a memory's replays), so a contract-3 plugin that never read them runs unchanged;
one that did gets the error naming the rule and :data:`PORTING` where it reads them."""
CONTRACT_ATTRIBUTE = "IDRS_BENCH_CONTRACT"
"""The module attribute in which a plugin declares it: ``IDRS_BENCH_CONTRACT = 4``."""
PORTING = _PORTING
"""Where a plugin's author reads how to port it."""

hookspec = pluggy.HookspecMarker("idrs_bench")
hookimpl = pluggy.HookimplMarker("idrs_bench")
"""Marks a plugin's hook implementation (exported as ``harness.hookimpl``)."""


@hookspec
def idrs_register_sigma_providers(register: Callable[[SigmaProviderSpec], None]) -> None:
    """Register σ-providers.

    Called once per plugin when the registry is built.

    :param register: call with a :class:`~harness.plugin.components.SigmaProviderSpec` whose
        ``build(context, params)`` returns a :class:`~harness.plugin.components.SigmaProvider`
        (``regularity`` and ``__call__(x) -> sigma``, shape [B], on x's device; or a
        ``smoothing``, :class:`~harness.engine.draws.SigmaSmoothing`, whose σ choice the harness
        draws itself).
    """


@hookspec
def idrs_register_trainers(register: Callable[[TrainerSpec], None]) -> None:
    """Register trainers of base models.

    Called once per plugin when the registry is built.

    :param register: call with a :class:`~harness.plugin.components.TrainerSpec` whose
        ``train(model, dataset, params, context)`` trains the model in place.
    """


@hookspec
def idrs_register_certifiers(register: Callable[[CertifierSpec], None]) -> None:
    """Register certifiers.

    Called once per plugin when the registry is built.

    :param register: call with a :class:`~harness.plugin.components.CertifierSpec` whose
        ``build(context, params, sigma_provider)`` returns a
        :class:`~harness.plugin.components.Certifier`: ``certify(evidence)`` receives the samples
        the harness drew (:class:`~harness.engine.draws.Evidence`) and returns one
        :class:`~harness.engine.draws.Claim` per input (never samples or counts of its own), plus
        the declared ``smoothing``, ``order_dependent`` and ``radius_formula``; it takes
        what it relies on about σ from ``sigma_provider.regularity``.
    """


@hookspec
def idrs_register_methods(register: Callable[[MethodSpec], None]) -> None:
    """Register methods: a σ-provider and a certifier with default parameters.

    Called once per plugin when the registry is built. The components a method names
    may come from any plugin; they are resolved when a benchmark uses the method.

    :param register: call with a :class:`~harness.plugin.components.MethodSpec`.
    """


@hookspec
def idrs_register_datasets(register: Callable[[DatasetSpec], None]) -> None:
    """Register datasets.

    Called once per plugin when the registry is built.

    :param register: call with a :class:`~harness.plugin.components.DatasetSpec` whose
        ``load(data_root, **family_args)`` returns a :class:`~harness.foundation.data.Dataset`
        (inputs in [0, 1] or raw coordinates; never normalized outside the model).
    """


@hookspec
def idrs_register_models(register: Callable[[ModelSpec], None]) -> None:
    """Register base-model architectures.

    Called once per plugin when the registry is built.

    :param register: call with a :class:`~harness.plugin.components.ModelSpec` whose
        ``build(input_shape, num_classes, params)`` returns a torch module mapping
        [B, *input_shape] to logits [B, num_classes].
    """


@hookspec
def idrs_register_checks(register: Callable[[CheckSpec], None]) -> None:
    """Register soundness checks.

    Called once per plugin when the registry is built.

    :param register: call with a :class:`~harness.plugin.components.CheckSpec`.
    """
