"""The plugin manager: loads built-in and third-party plugins and their components.

Built-in plugins are the modules in :data:`BUILTIN_PLUGINS`; they are registered
under the same names as their entry points in ``pyproject.toml``, so an installed
copy is not registered twice. Third-party plugins declare an entry point in the
``idrs_bench`` group. The environment variable ``IDRS_BENCH_PLUGINS`` restricts
which third-party plugins load: unset loads all, ``""`` loads none, ``"a,b"`` loads
only ``a`` and ``b``. A plugin that fails to import or to register is recorded in
:attr:`PluginManager.failures` and skipped; everything else keeps working.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any

import pluggy

from harness import __version__, hookspecs
from harness.components import COMPONENT_KINDS
from harness.errors import DuplicateNameError, UnknownNameError

ENTRY_POINT_GROUP = "idrs_bench"
PLUGINS_ENV_VAR = "IDRS_BENCH_PLUGINS"
BUILTIN_PLUGINS: dict[str, str] = {
    "cohen": "plugins.cohen",
    "datasets": "plugins.datasets",
    "models": "plugins.models",
    "soundness": "harness.soundness",
    "sukenik": "plugins.sukenik",
    "chen": "plugins.chen",
    "alfarra": "plugins.alfarra",
    "lipschitz": "plugins.lipschitz",
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


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be loaded or whose registration raised."""

    plugin: str
    error: str


class Registry:
    """Components by kind and name, each with the name of the plugin that provided it."""

    def __init__(self) -> None:
        self._items: dict[str, dict[str, tuple[Any, str]]] = {k: {} for k in COMPONENT_KINDS}

    def add(self, kind: str, spec: Any, plugin: str) -> None:
        """Store ``spec`` under its name; a name already taken raises, naming both."""
        expected = COMPONENT_KINDS[kind]
        if not isinstance(spec, expected):
            raise TypeError(
                f"plugin {plugin!r} registered {spec!r} as a {_SINGULAR[kind]}; "
                f"expected a {expected.__name__}"
            )
        taken = self._items[kind].get(spec.name)
        if taken is not None:
            raise DuplicateNameError(
                f"{_SINGULAR[kind]} {spec.name!r} is provided twice: by plugin "
                f"{taken[1]!r} and by plugin {plugin!r}; rename one or disable a plugin "
                f"with {PLUGINS_ENV_VAR}"
            )
        self._items[kind][spec.name] = (spec, plugin)

    def names(self, kind: str) -> list[str]:
        return sorted(self._items[kind])

    def get(self, kind: str, name: str) -> Any:
        """The spec named ``name``; ``cone-60`` finds the family ``cone-N``."""
        return self._lookup(kind, name)[0]

    def provider(self, kind: str, name: str) -> str:
        return self._lookup(kind, name)[1]

    def family_args(self, kind: str, name: str) -> dict[str, int]:
        """``{"dim": 60}`` for ``cone-60`` when only the family ``cone-N`` exists."""
        if name in self._items[kind]:
            return {}
        match = _FAMILY_SUFFIX.match(name)
        return {"dim": int(match["dim"])} if match else {}

    def _lookup(self, kind: str, name: str) -> tuple[Any, str]:
        items = self._items[kind]
        if name in items:
            return items[name]
        match = _FAMILY_SUFFIX.match(name)
        if match and f"{match['stem']}-N" in items:
            return items[f"{match['stem']}-N"]
        raise UnknownNameError(_SINGULAR[kind], name, list(items))

    def provided_by(self, plugin: str) -> dict[str, list[str]]:
        """What ``plugin`` provides, by kind (kinds it provides nothing of are left out)."""
        out = {}
        for kind, items in self._items.items():
            names = sorted(n for n, (_, p) in items.items() if p == plugin)
            if names:
                out[kind] = names
        return out


class PluginManager:
    """pluggy's manager plus the component registry built from the register hooks."""

    def __init__(
        self,
        builtins: dict[str, str] | None = None,
        load_entry_points: bool = True,
    ) -> None:
        self.pm = pluggy.PluginManager("idrs_bench")
        self.pm.add_hookspecs(hookspecs)
        self.failures: list[PluginFailure] = []
        self._versions: dict[str, str] = {}
        self._registry: Registry | None = None
        for name, module in (BUILTIN_PLUGINS if builtins is None else builtins).items():
            try:
                self.register(importlib.import_module(module), name=name, version=__version__)
            except Exception as exc:  # a broken built-in must not take the CLI down
                self._fail(name, exc)
        if load_entry_points:
            self._load_entry_points()

    def register(self, plugin: ModuleType | object, name: str, version: str = "") -> None:
        """Register a plugin object (usually a module with ``@hookimpl`` functions)."""
        self.pm.register(plugin, name=name)
        self._versions[name] = version
        self._registry = None

    def unregister(self, name: str) -> None:
        self.pm.unregister(name=name)
        self._versions.pop(name, None)
        self._registry = None

    @property
    def registry(self) -> Registry:
        """The components of every loaded plugin (built on first use)."""
        if self._registry is None:
            self._registry = self._build_registry()
        return self._registry

    def plugin_names(self) -> list[str]:
        return sorted(name for name, _ in self.pm.list_name_plugin())

    def describe(self) -> list[dict[str, Any]]:
        """Name, version, implemented hooks and provided components of every plugin."""
        registry = self.registry
        rows = []
        for name, plugin in sorted(self.pm.list_name_plugin()):
            hooks = sorted(h.name for h in self.pm.get_hookcallers(plugin) or [])
            rows.append(
                {
                    "name": name,
                    "version": self._versions.get(name, ""),
                    "hooks": hooks,
                    "provides": registry.provided_by(name),
                }
            )
        return rows

    def _load_entry_points(self) -> None:
        allowed = _allowed_external_plugins()
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if self.pm.has_plugin(ep.name) or (allowed is not None and ep.name not in allowed):
                continue
            try:
                plugin = ep.load()
                version = ep.dist.version if ep.dist else ""
                self.register(plugin, name=ep.name, version=version)
            except Exception as exc:
                self._fail(ep.name, exc)

    def _build_registry(self) -> Registry:
        registry = Registry()
        self.failures = [f for f in self.failures if not f.error.startswith("register: ")]
        for kind in COMPONENT_KINDS:
            caller = getattr(self.pm.hook, f"idrs_register_{kind}")
            for impl in caller.get_hookimpls():  # in registration order

                def register(spec: Any, _plugin: str = impl.plugin_name, _kind: str = kind) -> None:
                    registry.add(_kind, spec, _plugin)

                try:
                    impl.function(register=register)
                except Exception as exc:
                    self.failures.append(
                        PluginFailure(impl.plugin_name, f"register: {_describe(exc)}")
                    )
        return registry

    def _fail(self, name: str, exc: BaseException) -> None:
        self.failures.append(PluginFailure(name, _describe(exc)))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _allowed_external_plugins() -> set[str] | None:
    value = os.environ.get(PLUGINS_ENV_VAR)
    if value is None:
        return None
    return {name.strip() for name in value.split(",") if name.strip()}


@cache
def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager used by the CLI and the runner."""
    return PluginManager()
