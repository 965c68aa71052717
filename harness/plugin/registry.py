"""The component registry: one typed table per kind, each name with its plugin.

Every component a plugin registers lands in the table of its kind
(:data:`COMPONENT_KINDS`), e.g. ``registry.methods.get("cohen")`` is a
:class:`~harness.plugin.components.MethodSpec`; ``registry.get("methods", "cohen")``
is the same lookup by the kind's name. A name ending in ``-N`` is a family (``cone-60``
finds ``cone-N`` with ``dim=60``). A plugin's registrations are added all at once or not
at all (:meth:`Registry.add_all`). A name no table holds may belong to an installed
plugin that was not loaded (:class:`PluginFailure`): the error then names that plugin and
why, instead of suggesting a typo.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from harness.foundation.errors import DuplicateNameError, UnknownNameError, pip_command
from harness.plugin.components import (
    CertifierSpec,
    CheckSpec,
    DatasetSpec,
    MethodSpec,
    ModelSpec,
    SigmaProviderSpec,
    TrainerSpec,
)

COMPONENT_KINDS: dict[str, type] = {
    "sigma_providers": SigmaProviderSpec,
    "trainers": TrainerSpec,
    "certifiers": CertifierSpec,
    "methods": MethodSpec,
    "datasets": DatasetSpec,
    "models": ModelSpec,
    "checks": CheckSpec,
}
_SINGULAR = {
    "sigma_providers": "σ-provider",
    "trainers": "trainer",
    "certifiers": "certifier",
    "methods": "method",
    "datasets": "dataset",
    "models": "architecture",
    "checks": "check",
}
_FAMILY_SUFFIX = re.compile(r"^(?P<stem>.+)-(?P<dim>\d+)$")

SpecT = TypeVar("SpecT")

_STAGES = {
    "contract": "was refused when loaded",
    "name": "was refused",
    "load": "failed to load",
    "register": "failed to register its components",
}


@dataclass(frozen=True)
class PluginFailure:
    """An installed plugin that provides nothing here, and why.

    ``stage``: ``contract`` (refused: it declares another plugin contract), ``name`` (refused for
    a name: its own, before it was imported, is not a plain name or is another plugin's
    (:func:`~harness.plugin.entry_points.refusals`), or a method's is not a plain name), ``load`` (its import raised) or ``register`` (a register hook raised, or a name it registers is
    taken). ``provides`` (kind -> names) is what it registers where that is known: the
    names its refused module's hooks register, what its failed registration staged, or
    what the plugin manifest last recorded for it; None when unknown.
    ``distribution`` and ``version``: the installed package that declares it."""

    plugin: str
    error: str
    stage: str = "load"
    distribution: str | None = None
    version: str | None = None
    provides: Mapping[str, tuple[str, ...]] | None = None

    def origin(self) -> str:
        """``plugin 'p' (package idrs-p 0.1)``."""
        package = ""
        if self.distribution:
            version = f" {self.version}" if self.version else ""
            package = f" (package {self.distribution}{version})"
        return f"plugin {self.plugin!r}{package}"

    def why(self) -> str:
        """``was refused when loaded: ContractError: ...``."""
        return f"{_STAGES.get(self.stage, 'failed')}: {self.error}"


def _missing(kind: str, name: str, available: Iterable[str], failures: list[PluginFailure]) -> str:
    """Why no table holds ``name``: the plugin that provides it and why it was not loaded,
    else the available names and the plugins not loaded that may provide it."""
    for failure in failures:
        if name in (failure.provides or {}).get(kind, ()):
            return (f"{_SINGULAR[kind]} {name!r} is provided by {failure.origin()}, which "
                    f"{failure.why()} (`idrs-bench plugins` lists every plugin)")  # fmt: skip
    names = ", ".join(sorted(available)) or "(none loaded)"
    text = f"unknown {_SINGULAR[kind]} {name!r}; available: {names}"
    unknown = [f for f in failures if f.provides is None]
    if unknown:
        text += "; plugins that were not loaded may provide it: " + "; ".join(
            f"{f.origin()} {f.why()}" for f in unknown
        )
    return text


class ComponentTable(Generic[SpecT]):
    """The components of one kind by name, each with the name of its plugin;
    ``failures``: the plugins not loaded (shared with the registry)."""

    def __init__(self, kind: str, failures: list[PluginFailure] | None = None) -> None:
        self.kind = kind
        self.spec_type: type = COMPONENT_KINDS[kind]
        self._items: dict[str, tuple[SpecT, str]] = {}
        self._failures = failures if failures is not None else []

    def check(self, spec: Any, plugin: str) -> None:
        """Raise unless ``spec`` is of this kind and its name is free."""
        if not isinstance(spec, self.spec_type):
            raise TypeError(
                f"plugin {plugin!r} registered {spec!r} as a {_SINGULAR[self.kind]}; "
                f"expected a {self.spec_type.__name__}"
            )
        taken = self._items.get(spec.name)
        if taken is not None:
            raise DuplicateNameError(
                f"{_SINGULAR[self.kind]} {spec.name!r} is provided twice: by plugin "
                f"{taken[1]!r} and by plugin {plugin!r}; rename one or leave a "
                "third-party plugin out with IDRS_BENCH_PLUGINS"
            )

    def add(self, spec: SpecT, plugin: str) -> None:
        """Store ``spec`` under its name; a name already taken raises, naming both."""
        self.check(spec, plugin)
        self._items[spec.name] = (spec, plugin)  # type: ignore[attr-defined]

    def remove(self, name: str) -> None:
        del self._items[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def get(self, name: str) -> SpecT:
        """The spec named ``name``; ``cone-60`` finds the family ``cone-N``."""
        return self._lookup(name)[0]

    def provider(self, name: str) -> str:
        return self._lookup(name)[1]

    def family_args(self, name: str) -> dict[str, int]:
        """``{"dim": 60}`` for ``cone-60`` when only the family ``cone-N`` exists."""
        if name in self._items:
            return {}
        match = _FAMILY_SUFFIX.match(name)
        return {"dim": int(match["dim"])} if match else {}

    def provided_by(self, plugin: str) -> list[str]:
        return sorted(n for n, (_, p) in self._items.items() if p == plugin)

    def _lookup(self, name: str) -> tuple[SpecT, str]:
        if name in self._items:
            return self._items[name]
        match = _FAMILY_SUFFIX.match(name)
        if match and f"{match['stem']}-N" in self._items:
            return self._items[f"{match['stem']}-N"]
        raise UnknownNameError(_missing(self.kind, name, self._items, self._failures))


class Registry:
    """Every registered component: one :class:`ComponentTable` per kind."""

    def __init__(self) -> None:
        self.failures: list[PluginFailure] = []
        """The installed plugins not loaded (:meth:`set_failures`); a lookup of a name
        one of them provides names it and why."""
        failures = self.failures
        self.sigma_providers: ComponentTable[SigmaProviderSpec] = ComponentTable(
            "sigma_providers", failures
        )
        self.trainers: ComponentTable[TrainerSpec] = ComponentTable("trainers", failures)
        self.certifiers: ComponentTable[CertifierSpec] = ComponentTable("certifiers", failures)
        self.methods: ComponentTable[MethodSpec] = ComponentTable("methods", failures)
        self.datasets: ComponentTable[DatasetSpec] = ComponentTable("datasets", failures)
        self.models: ComponentTable[ModelSpec] = ComponentTable("models", failures)
        self.checks: ComponentTable[CheckSpec] = ComponentTable("checks", failures)
        self._origins: dict[str, tuple[str | None, str | None]] = {}

    def set_failures(self, failures: Iterable[PluginFailure]) -> None:
        """The installed plugins that were not loaded, and why (read by every lookup)."""
        self.failures[:] = list(failures)

    def set_origin(self, plugin: str, distribution: str | None, version: str | None) -> None:
        """Record the installed package (distribution) that declares ``plugin``, and its version."""
        self._origins[plugin] = (distribution, version or None)

    def copy_origins(self, other: Registry) -> None:
        """Give ``other`` the packages recorded here (:meth:`set_origin`)."""
        for plugin, (distribution, version) in self._origins.items():
            other.set_origin(plugin, distribution, version)

    def provenance(self, kind: str, name: str) -> dict[str, str | None]:
        """Where a component comes from: its ``plugin``, the ``distribution`` (the package
        to install, as ``importlib.metadata`` names it; None when the plugin was registered
        without one) and its ``version``."""
        plugin = self.provider(kind, name)
        distribution, version = self._origins.get(plugin, (None, None))
        return {"plugin": plugin, "distribution": distribution, "version": version}

    def absent(
        self, wanted: Iterable[tuple[str, str]], recorded: dict[str, Any] | None
    ) -> str | None:
        """Which of the ``wanted`` (kind, name) components no installed plugin registers,
        each with the package to install as the run recorded it (``recorded``: kind ->
        name -> :meth:`provenance`; None for a run made before it was recorded); None when
        every one is installed. A method stands for its σ-provider and certifier too."""
        wanted = list(wanted)
        for kind, name in list(wanted):
            if kind == "methods" and self._known(kind, name):
                method = self.get(kind, name)
                wanted += [("sigma_providers", method.sigma_provider),
                           ("certifiers", method.certifier)]  # fmt: skip
        missing = []
        for kind, name in dict.fromkeys(wanted):
            if self._known(kind, name):
                continue
            origin = ((recorded or {}).get(kind) or {}).get(name)
            what = f"{_SINGULAR[kind]} {name!r}"
            if origin is None:
                missing.append(f"{what} is provided by no plugin installed here (the run did not "
                               "record which package provided it)")  # fmt: skip
            elif origin.get("distribution"):
                version = f" {origin['version']}" if origin.get("version") else ""
                missing.append(f"{what} comes from plugin {origin['plugin']!r} of the package "
                               f"{origin['distribution']!r}{version}, which is not installed "
                               f"here ({pip_command('install ' + origin['distribution'])})")  # fmt: skip
            else:
                missing.append(f"{what} comes from plugin {origin['plugin']!r} (registered "
                               "without a package), which is not installed here")  # fmt: skip
        return "; ".join(missing) or None

    def _known(self, kind: str, name: str) -> bool:
        try:
            self.get(kind, name)
        except UnknownNameError:
            return False
        return True

    def table(self, kind: str) -> ComponentTable[Any]:
        """The table of ``kind`` (one of :data:`COMPONENT_KINDS`)."""
        if kind not in COMPONENT_KINDS:
            raise KeyError(f"unknown component kind {kind!r}; known: {', '.join(COMPONENT_KINDS)}")
        return getattr(self, kind)

    def add(self, kind: str, spec: Any, plugin: str) -> None:
        self.table(kind).add(spec, plugin)

    def add_all(self, plugin: str, registrations: Iterable[tuple[str, Any]]) -> None:
        """Add every (kind, spec) ``plugin`` registered, or, when one is refused (a wrong
        type, a name taken), none of them: the error is raised and nothing is left behind."""
        added: list[tuple[str, str]] = []
        try:
            for kind, spec in registrations:
                self.table(kind).add(spec, plugin)
                added.append((kind, spec.name))
        except Exception:
            for kind, name in added:
                self.table(kind).remove(name)
            raise

    def names(self, kind: str) -> list[str]:
        return self.table(kind).names()

    def get(self, kind: str, name: str) -> Any:
        """The spec named ``name``; ``cone-60`` finds the family ``cone-N``."""
        return self.table(kind).get(name)

    def provider(self, kind: str, name: str) -> str:
        return self.table(kind).provider(name)

    def family_args(self, kind: str, name: str) -> dict[str, int]:
        return self.table(kind).family_args(name)

    def provided_by(self, plugin: str) -> dict[str, list[str]]:
        """What ``plugin`` provides, by kind (kinds it provides nothing of are left out)."""
        out = {}
        for kind in COMPONENT_KINDS:
            names = self.table(kind).provided_by(plugin)
            if names:
                out[kind] = names
        return out
