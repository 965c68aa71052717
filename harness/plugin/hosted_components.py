"""The registry entries of plugins that run in a plugin host (harness/README.md, "Plugin host").

:func:`hosted_registry` adds, for each component a plugin host describes, a spec of the
usual type whose callable asks the host: a σ-provider's or certifier's ``build``
(returning the proxies of :mod:`harness.plugin.remote`), a trainer's ``train``, a
dataset's ``load``, a method's ``check``. Two kinds stay out of the harness's process:

- a third-party **model architecture**: the harness evaluates the base model wherever
  it draws samples, so its spec refuses to build (a checkpoint of a built-in
  architecture is the way to certify a model of one's own);
- a third-party **check**: verdicts rest only on what the harness computes itself, so
  the harness does not run it (``idrs-bench plugins`` lists it as not run).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness.foundation.data import Dataset
from harness.foundation.errors import ContractError, IdrsError
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
from harness.plugin.registry import COMPONENT_KINDS, Registry
from harness.plugin.remote import PluginHost, RemoteCertifier, RemoteSigmaProvider, _Bound

SERVED = ("sigma_providers", "certifiers", "trainers", "methods", "datasets")
"""What a plugin host serves of a third-party plugin (models are refused, checks not run)."""
BUILTINS_SERVED = ("sigma_providers", "certifiers", "trainers")
"""What it serves of a built-in plugin with ``IDRS_BENCH_ISOLATE=all``."""


class _Factory:
    """A component's callable, answered by the plugin host."""

    def __init__(self, host: PluginHost, kind: str, name: str, plugin: str) -> None:
        self.host, self.kind, self.name, self.plugin = host, kind, name, plugin

    def who(self) -> str:
        singular = {"sigma_providers": "σ-provider", "certifiers": "certifier",
                    "trainers": "trainer", "datasets": "dataset", "methods": "method"}  # fmt: skip
        return f"{singular[self.kind]} {self.name!r} (plugin {self.plugin!r}, in its plugin host)"

    def _build(self, op: str, context: BuildContext, **fields: Any) -> tuple[_Bound, dict]:
        token = self.host.context(context)
        answer = self.host.request(op, context=token, name=self.name,
                                   updates=self.host.updates(context), **fields)  # fmt: skip
        bound = _Bound(self.host, int(answer["handle"]), self.host.generation, context, token,
                       self.who())  # fmt: skip
        return bound, answer["declaration"]


class SigmaProviderFactory(_Factory):
    def __call__(self, context: BuildContext, params: Mapping[str, Any]) -> RemoteSigmaProvider:
        bound, declaration = self._build("build_sigma_provider", context, params=dict(params))
        return RemoteSigmaProvider(bound, declaration, context.registry)


class CertifierFactory(_Factory):
    """Builds a certifier in the host with the σ-provider it certifies: the host's own one
    behind a proxy, or, for a σ-provider this process built (the method's, named by
    ``context.method``), a copy the host builds by name."""

    def __call__(
        self, context: BuildContext, params: Mapping[str, Any], sigma_provider: Any
    ) -> RemoteCertifier:
        if isinstance(sigma_provider, RemoteSigmaProvider):
            provider: dict[str, Any] = {"handle": sigma_provider._bound.handle}
        elif context.method is not None and context.registry is not None:
            provider = {"name": context.registry.get("methods", context.method).sigma_provider}
        else:
            raise ContractError(f"{self.who()} is built in a plugin host, which needs the "
                                "method (context.method) to build its σ-provider there")  # fmt: skip
        bound, declaration = self._build("build_certifier", context, params=dict(params),
                                         provider=provider)  # fmt: skip
        return RemoteCertifier(bound, declaration)


class Trainer(_Factory):
    def __call__(self, model: torch.nn.Module, dataset: Dataset, params: Mapping[str, Any],
                 context: TrainContext) -> None:  # fmt: skip
        """Train ``model`` in place: its description and state go out, the trained state
        comes back."""
        described = {"description": model_description.describe(model),
                     "state": model_description.state_of(model)}  # fmt: skip
        answer = self.host.request("train", trainer=self.name, model=described,
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
        answer = self.host.request("load_dataset", name=self.name, data_root=data_root,
                                   download=download, seed=seed, family=family)["dataset"]  # fmt: skip
        tensors = [answer.get(k) for k in ("train_x", "train_y", "test_x", "test_y")]
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            raise ContractError(f"{self.who()} loaded something other than tensors")
        return Dataset(str(answer["name"]), *tensors, int(answer["num_classes"]),
                       tuple(str(c) for c in answer.get("class_names", ())),
                       {str(k): str(v) for k, v in dict(answer.get("files", {})).items()})  # fmt: skip


class ParameterCheck(_Factory):
    def __call__(self, params: Mapping[str, Any]) -> None:
        self.host.request("check_params", method=self.name, params=dict(params))


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
) -> tuple[Registry, list[str]]:
    """``local`` (the plugins of this process) plus the host's components: every served
    kind of a third-party plugin, and with ``builtins_too`` a built-in plugin's σ-providers,
    certifiers and trainers in place of this process's. Returns the registry and the
    third-party checks it leaves out."""
    builtin = set(described.get("builtin", ()))
    remote: list[tuple[str, Any, str]] = []
    not_run: list[str] = []
    for item in described.get("components", ()):
        kind, name, plugin = item["kind"], item["name"], item["plugin"]
        third = plugin not in builtin
        if kind == "checks" and third:
            not_run.append(f"{name} (plugin {plugin!r})")
        elif kind == "models" and third:
            remote.append((kind, ModelSpec(name, _refused_model(name, plugin),
                                           item.get("defaults", {}), item["description"]), plugin))  # fmt: skip
        elif (third and kind in SERVED) or (builtins_too and kind in BUILTINS_SERVED):
            remote.append((kind, _spec(host, item), plugin))
    replaced = {(kind, spec.name) for kind, spec, _ in remote}
    registry = Registry()
    for kind in COMPONENT_KINDS:
        for name in local.names(kind):
            if (kind, name) not in replaced:
                registry.add(kind, local.get(kind, name), local.provider(kind, name))
    for kind, spec, plugin in remote:
        if spec.name not in registry.names(kind):  # a name this process already has keeps it
            registry.add(kind, spec, plugin)
    local.copy_origins(registry)
    for hosted in described.get("plugins", ()):
        if hosted["name"] not in builtin:
            registry.set_origin(hosted["name"], hosted.get("distribution"), hosted.get("version"))
    return registry, not_run


def _spec(host: PluginHost, item: Mapping[str, Any]) -> Any:
    kind, name, plugin = item["kind"], item["name"], item["plugin"]
    description = str(item.get("description", ""))
    defaults = dict(item.get("defaults", {}))
    if kind == "sigma_providers":
        return SigmaProviderSpec(name, SigmaProviderFactory(host, kind, name, plugin), description)
    if kind == "certifiers":
        return CertifierSpec(name, CertifierFactory(host, kind, name, plugin), description)
    if kind == "trainers":
        return TrainerSpec(name, Trainer(host, kind, name, plugin), defaults, description)
    if kind == "datasets":
        return DatasetSpec(name, DatasetLoader(host, kind, name, plugin), description,
                           tuple(item.get("class_names", ())))  # fmt: skip
    check = ParameterCheck(host, kind, name, plugin) if item.get("check") else None
    return MethodSpec(name, item["sigma_provider"], item["certifier"], defaults, description, check)
