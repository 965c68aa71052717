"""The registry entries of plugins that run in a plugin host (harness/README.md, "Plugin host").

:func:`hosted_registry` adds, for each component a plugin host describes, a spec of the
usual type whose callable asks the host: a σ-provider's or certifier's ``build``
(returning the proxies of :mod:`harness.plugin.hosting.in_harness.remote`), a trainer's ``train``, a
dataset's ``load``, a method's ``check``. Two kinds stay out of the harness's process:

- a third-party **model architecture**: the harness evaluates the base model wherever
  it draws samples, so its spec refuses to build (a checkpoint of a built-in
  architecture is the way to certify a model of one's own);
- a third-party **check**: verdicts rest only on what the harness computes itself, so
  the harness does not run it (``idrs-bench plugins`` lists it as not run).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

import torch

from harness.foundation.data import Dataset
from harness.foundation.errors import ContractError, DuplicateNameError, IdrsError
from harness.plugin import manifest as plugin_manifest
from harness.plugin import model_description
from harness.plugin.components import (
    BuildContext,
    CertifierSpec,
    DatasetSpec,
    MethodSpec,
    ModelSpec,
    SigmaProviderSpec,
    TrainContext,
    TrainerSpec,
)
from harness.plugin.hosting.in_harness.host_client import HostClient
from harness.plugin.hosting.in_harness.host_process import HostStopped, PluginHost
from harness.plugin.hosting.in_harness.remote import RemoteCertifier, RemoteSigmaProvider, _Bound
from harness.plugin.registry import COMPONENT_KINDS, PluginFailure, Registry

SERVED = ("sigma_providers", "certifiers", "trainers", "methods", "datasets")
"""What a plugin host serves of a third-party plugin (models are refused, checks not run)."""
BUILTINS_SERVED = ("sigma_providers", "certifiers", "trainers")
"""What it serves of a built-in plugin with ``IDRS_BENCH_ISOLATE=all``."""
MAX_CLASSES = 1 << 20
"""The most classes a hosted dataset may say it has (ImageNet-21k has some 21,800)."""
T = TypeVar("T")


class _Factory:
    """A component's callable, answered by the plugin host (``builtin``: of a built-in
    plugin, served by a host with ``IDRS_BENCH_ISOLATE=all``)."""

    def __init__(self, host: PluginHost, kind: str, name: str, plugin: str,
                 builtin: bool = False) -> None:  # fmt: skip
        self.host, self.kind, self.name, self.plugin = host, kind, name, plugin
        self.builtin = builtin

    def who(self, host: PluginHost | None = None) -> str:
        """The component as errors name it: its name, its plugin and the plugin host it
        runs in (``host``, else its own), which names its distribution."""
        singular = {"sigma_providers": "σ-provider", "certifiers": "certifier",
                    "trainers": "trainer", "datasets": "dataset", "methods": "method"}  # fmt: skip
        where = (host or self.host).name
        return f"{singular[self.kind]} {self.name!r} (plugin {self.plugin!r}, in {where})"

    def _build(self, build: Callable[..., dict[str, Any]], context: BuildContext,
               host: PluginHost | None = None, **fields: Any) -> tuple[_Bound, dict]:  # fmt: skip
        """``build`` (a :class:`HostClient` method of a build request) of this component in
        ``context``, with ``fields``, in ``host`` (default its own)."""
        host = host or self.host
        for retry in (False, True):  # once more when the host stopped after the context
            token = host.token(context)
            generation = host.generation  # (the token's: a host started again knows none)
            try:
                answer = build(host, token, self.name, **fields, generation=generation,
                               updates=host.updates(context))  # fmt: skip
                break
            except HostStopped:
                if retry:
                    raise
        handle, declaration = answer.get("handle"), answer.get("declaration")
        if not (type(handle) is int and isinstance(declaration, dict)):
            raise ContractError(f"{self.who(host)} answered its build without a handle and a "
                                f"declaration: {answer!r:.200}")  # fmt: skip
        bound = _Bound(host, handle, generation, context, token, self.who(host), self.builtin)
        return bound, declaration


def _declared(who: str, proxy: Callable[[], T]) -> T:
    """``proxy()``, the proxy of a component built in a host from its declaration; one that
    does not have the declaration's form is a :class:`ContractError` naming ``who``."""
    try:
        return proxy()
    except IdrsError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as exc:
        raise ContractError(f"{who} declared itself in a form the harness does not read "
                            f"({type(exc).__name__}: {exc!s:.200})") from None  # fmt: skip


class SigmaProviderFactory(_Factory):
    def __call__(self, context: BuildContext, params: Mapping[str, Any]) -> RemoteSigmaProvider:
        bound, declaration = self._build(HostClient.build_sigma_provider, context,
                                         params=dict(params))  # fmt: skip
        return _declared(bound.who, lambda: RemoteSigmaProvider(bound, declaration,
                                                                context.registry))  # fmt: skip


class CertifierFactory(_Factory):
    """Builds a certifier in a host with the σ-provider it certifies: that host's own one
    behind a proxy, or, for a σ-provider this process or another host built (the method's,
    named by ``context.method``), a copy the host builds by name (a built-in one: every
    host loads the built-ins). A built-in certifier is built in the host of a hosted
    σ-provider; two third-party distributions never share a host."""

    def __call__(
        self, context: BuildContext, params: Mapping[str, Any], sigma_provider: Any
    ) -> RemoteCertifier:
        host = self.host
        provider: dict[str, Any] | None = None
        if isinstance(sigma_provider, RemoteSigmaProvider):
            theirs = sigma_provider._bound
            if theirs.host is not host and self.builtin:
                host = theirs.host
            if theirs.host is host:
                provider = {"handle": theirs.handle}
            elif not theirs.builtin:
                raise ContractError(
                    f"{self.who()} certifies {theirs.who}, of another plugin distribution; each "
                    "distribution runs in a plugin host of its own, so a method composes the "
                    "components of one distribution and the built-ins"
                )
        if provider is None:
            if context.method is None or context.registry is None:
                raise ContractError(f"{self.who()} is built in a plugin host, which needs the "
                                    "method (context.method) to build its σ-provider there")  # fmt: skip
            provider = {"name": context.registry.get("methods", context.method).sigma_provider}
        bound, declaration = self._build(HostClient.build_certifier, context, host=host,
                                         params=dict(params), provider=provider)  # fmt: skip
        return _declared(bound.who, lambda: RemoteCertifier(bound, declaration))


class Trainer(_Factory):
    def __call__(self, model: torch.nn.Module, dataset: Dataset, params: Mapping[str, Any],
                 context: TrainContext) -> None:  # fmt: skip
        """Train ``model`` in place: its description and state go out, the trained state
        comes back."""
        described = {"description": model_description.describe(model),
                     "state": model_description.state_of(model)}  # fmt: skip
        answer = self.host.train(trainer=self.name, model=described,
                                 dataset=self.host._dataset(dataset), params=dict(params),
                                 seed=int(context.seed), device=str(context.device),
                                 quiet=not context.progress.enabled)  # fmt: skip
        try:
            model.load_state_dict(answer["state"])
        except Exception as exc:
            raise ContractError(f"{self.who()} returned a state that does not fit the model: "
                                f"{exc}") from None  # fmt: skip


class DatasetLoader(_Factory):
    def __call__(self, data_root: str | None = None, download: bool = False, seed: int = 0,
                 **family: Any) -> Dataset:  # fmt: skip
        if data_root is not None:
            self.host.grant_read(data_root)
        answer = self.host.load_dataset(name=self.name, data_root=data_root, download=download,
                                        seed=seed, family=family)["dataset"]  # fmt: skip
        if not isinstance(answer, dict):
            raise ContractError(f"{self.who()} loaded a {type(answer).__name__}, not a dataset")
        tensors = [answer.get(k) for k in ("train_x", "train_y", "test_x", "test_y")]
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            raise ContractError(f"{self.who()} loaded something other than tensors")
        classes = answer.get("num_classes")
        if not (type(classes) is int and 1 <= classes <= MAX_CLASSES):
            raise ContractError(f"{self.who()} loaded a dataset of {classes!r:.40} classes; a "
                                f"dataset has 1 to {MAX_CLASSES} classes")  # fmt: skip
        return _declared(self.who(), lambda: Dataset(
            str(answer["name"]), *tensors, classes,
            tuple(str(c) for c in answer.get("class_names", ())),
            {str(k): str(v) for k, v in dict(answer.get("files", {})).items()}))  # fmt: skip


class ParameterCheck(_Factory):
    def __call__(self, params: Mapping[str, Any]) -> None:
        self.host.check_params(method=self.name, params=dict(params))


def _refused_model(name: str, plugin: str):
    def build(*_: Any, **__: Any) -> Any:
        raise IdrsError(
            f"architecture {name!r} comes from the third-party plugin {plugin!r}; the harness "
            "evaluates the base model where it draws samples, in a process that loads no "
            "third-party code, so certify a built-in architecture (`idrs-bench plugins` "
            "lists them; a checkpoint of one is `[model] checkpoint = PATH`)"
        )

    return build


def hosted_registry(
    local: Registry, host: PluginHost, described: Mapping[str, Any], builtins_too: bool
) -> tuple[Registry, list[str], list[PluginFailure]]:
    """``local`` (the plugins of this process, and of the hosts merged so far) plus the
    host's components: every served kind of a third-party plugin, and with ``builtins_too``
    a built-in plugin's σ-providers, certifiers and trainers in place of this process's.
    Returns the registry, the third-party checks it leaves out, and the failure of each
    plugin left out whole because a name it registers is taken (by a plugin of this
    process or of another host)."""
    builtin = set(described.get("builtin", ()))
    remote: dict[str, list[tuple[str, Any]]] = {}
    not_run: list[str] = []
    for item in described.get("components", ()):
        kind, name, plugin = item["kind"], item["name"], item["plugin"]
        third = plugin not in builtin
        if kind == "checks" and third:
            not_run.append(f"{name} (plugin {plugin!r})")
        elif kind == "models" and third:
            remote.setdefault(plugin, []).append((kind, ModelSpec(
                name, _refused_model(name, plugin), item.get("defaults", {}),
                item["description"])))  # fmt: skip
        elif (third and kind in SERVED) or (builtins_too and kind in BUILTINS_SERVED):
            remote.setdefault(plugin, []).append((kind, _spec(host, item, not third)))
    replaced = {(kind, spec.name) for specs in remote.values() for kind, spec in specs
                if builtins_too and spec.name in local.names(kind)}  # fmt: skip
    registry = Registry()
    for kind in COMPONENT_KINDS:
        for name in local.names(kind):
            if (kind, name) not in replaced:
                registry.add(kind, local.get(kind, name), local.provider(kind, name))
    failures = []
    origins = {p["name"]: p for p in described.get("plugins", ())}
    for plugin, specs in remote.items():
        try:
            registry.add_all(plugin, specs)
        except DuplicateNameError as exc:
            origin = origins.get(plugin, {})
            names: dict[str, tuple[str, ...]] = {}
            for kind, spec in specs:
                names[kind] = (*names.get(kind, ()), spec.name)
            failures.append(PluginFailure(plugin, f"DuplicateNameError: {exc}", "register",
                                          origin.get("distribution"), origin.get("version"),
                                          names))  # fmt: skip
    local.copy_origins(registry)
    for hosted in described.get("plugins", ()):
        if hosted["name"] not in builtin:
            registry.set_origin(hosted["name"], hosted.get("distribution"), hosted.get("version"))
    return registry, not_run, failures


def _spec(host: PluginHost, item: Mapping[str, Any], builtin: bool) -> Any:
    kind, name, plugin = item["kind"], item["name"], item["plugin"]
    description = str(item.get("description", ""))
    defaults = dict(item.get("defaults", {}))
    if kind == "sigma_providers":
        return SigmaProviderSpec(name, SigmaProviderFactory(host, kind, name, plugin, builtin),
                                 description)  # fmt: skip
    if kind == "certifiers":
        return CertifierSpec(name, CertifierFactory(host, kind, name, plugin, builtin), description)
    if kind == "trainers":
        return TrainerSpec(name, Trainer(host, kind, name, plugin, builtin), defaults, description)
    if kind == "datasets":
        return DatasetSpec(name, DatasetLoader(host, kind, name, plugin), description,
                           tuple(item.get("class_names", ())))  # fmt: skip
    check = ParameterCheck(host, kind, name, plugin) if item.get("check") else None
    return MethodSpec(name, item["sigma_provider"], item["certifier"], defaults, description, check)


def failures_from_host(
    described: Mapping[str, Any], local: Mapping[str, Any]
) -> list[PluginFailure]:
    """The plugins a host failed to load or register (but those of ``local``, this
    process's own), each with what the plugin manifest last recorded it provides when the
    host could not say (:meth:`harness.plugin.hosting.in_host.host_requests.Host.describe`)."""
    out = []
    for record in described.get("failures", ()):
        if record["plugin"] in local:
            continue
        provides = record.get("provides")
        failure = PluginFailure(
            str(record["plugin"]), str(record["error"]), str(record.get("stage", "load")),
            record.get("distribution"), record.get("version"),
            None if provides is None else {k: tuple(v) for k, v in provides.items()},
        )  # fmt: skip
        recorded = None if provides is not None else plugin_manifest.recorded_names(failure.plugin)
        out.append(failure if recorded is None else replace(failure, provides=recorded))
    return out
