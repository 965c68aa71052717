"""Building a method: its σ-provider, then its certifier built with that provider; and
one (method, setting) of a run, as the local executor and every Ray worker build it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from harness.engine.draws import SigmaSmoothing
from harness.foundation.data import PORTING
from harness.foundation.errors import IdrsError
from harness.foundation.runstate import RunState, StateRecord
from harness.plugin.components import (
    BuildContext,
    Certifier,
    MethodSpec,
    OrderDependentCertifier,
    SigmaProvider,
    missing_members,
)
from harness.plugin.registry import Registry


def build_method(
    registry: Registry, method_name: str, params: Mapping[str, Any], context: BuildContext
) -> tuple[SigmaProvider, Certifier]:
    """(σ-provider, certifier) of ``method_name`` with ``params`` (the method's defaults
    overridden by ``params``), each checked against its declared protocol."""
    method = registry.get("methods", method_name)
    merged = {**method.defaults, **params}
    if context.method != method_name:  # what the components are built for (a plugin host reads it)
        context = replace(context, method=method_name)
    provider = registry.get("sigma_providers", method.sigma_provider).build(context, merged)
    _require(provider, SigmaProvider, f"σ-provider {method.sigma_provider!r}")
    smoothing = getattr(provider, "smoothing", None)
    if isinstance(smoothing, SigmaSmoothing) and isinstance(smoothing.model, torch.nn.Module):
        smoothing.model.to(context.device)  # the harness draws it where the run draws
    certifier = registry.get("certifiers", method.certifier).build(context, merged, provider)
    _require(certifier, Certifier, f"certifier {method.certifier!r}")
    if certifier.smoothing not in ("hard", "soft"):
        raise IdrsError(
            f"certifier {method.certifier!r} declares smoothing = {certifier.smoothing!r}; "
            "use 'hard' or 'soft'"
        )
    if certifier.order_dependent:
        _require(certifier, OrderDependentCertifier,
                 f"order-dependent certifier {method.certifier!r}",
                 "; contract 4 replaced order_spread (which saw the labels) by order_replays: "
                 f"{PORTING}" if hasattr(certifier, "order_spread") else "")  # fmt: skip
    return provider, certifier


@dataclass(frozen=True)
class BuiltSetting:
    """One (method, setting) of a run, ready to certify: its σ-provider and certifier,
    its run state and the build context they were built with."""

    method: MethodSpec
    provider: SigmaProvider
    certifier: Certifier
    state: RunState
    context: BuildContext


def build_setting(
    context: BuildContext, name: str, params: Mapping[str, Any], key: str,
    records: Iterable[StateRecord],
) -> BuiltSetting:  # fmt: skip
    """Method ``name`` with the setting ``params`` (named ``key``, its canonical key) on
    a run's ``context`` (whose registry resolves it), its run state restored from the
    committed ``records``."""
    state = RunState(list(records))
    context = replace(context, method=name, setting=key, state=state)
    provider, certifier = build_method(context.registry, name, params, context)
    check_sampling(context, name, provider, certifier)
    return BuiltSetting(context.registry.get("methods", name), provider, certifier, state, context)


def check_sampling(
    context: BuildContext, name: str, provider: SigmaProvider, certifier: Certifier
) -> None:
    """Raise an :class:`IdrsError` naming the method and the fix when the protocol's
    sampling cannot certify it (sequential sampling: a soft certifier, a σ-smoothing, a
    formula without threshold), before any sample is drawn."""
    if context.protocol.sampling != "sequential":
        return
    from harness.certification.certify import sigma_smoothing
    from harness.certification.rounds import unsupported

    why = unsupported(f"method {name!r}", certifier, sigma_smoothing(provider) is not None)
    if why:
        raise IdrsError(why)


def _require(obj: Any, protocol: type, what: str, hint: str = "") -> None:
    """Refuse ``obj`` naming each member of ``protocol`` it lacks
    (:func:`~harness.plugin.components.missing_members`: the same on every Python)."""
    missing = missing_members(obj, protocol)
    if missing:
        raise IdrsError(
            f"{what} lacks the declared member(s) {', '.join(missing)} of "
            f"harness.plugin.components.{protocol.__name__}{hint or '; see docs/plugins.md'}"
        )
