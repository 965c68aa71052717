"""The plugin loader: the plugins of this process, loaded from the ``idrs_bench`` entry points.

Built-in and third-party plugins are found the same way (:mod:`harness.plugin.entry_points`:
this environment's entry points and the private prefixes of ``idrs-bench plugins
install``); a plugin is *built-in* when its entry point is this distribution's
(``idrs-bench``). ``IDRS_BENCH_PLUGINS`` restricts which third-party plugins load (unset:
all, ``""``: none, ``"a,b"``: ``a`` and ``b``); built-ins always load. A third-party entry
point whose name is refused (not a plain name, a built-in's, another distribution's:
:func:`~harness.plugin.entry_points.refusals`) is never imported and is recorded as a
failure naming its distribution (stage ``name``). A plugin that fails
to import or to register is recorded in :attr:`PluginLoader.failures` and skipped;
everything else keeps working. A component name provided twice fails naming both plugins
(:class:`~harness.foundation.errors.DuplicateNameError`).

:class:`PluginLoader` imports the plugins it loads into this process: a plugin host does so
for its distribution (:mod:`harness.plugin.hosting.in_host.host_requests`), and the harness for the
built-ins. The harness's own processes use :class:`~harness.plugin.manager.PluginManager`,
which adds the plugin hosts of the third-party plugins (harness/README.md, "Plugin host").

Every plugin declares the version of the plugin contract it was written against, as
``IDRS_BENCH_CONTRACT = 4`` in its module (:data:`~harness.plugin.hookspecs.CONTRACT`;
contract 3 is accepted too: :data:`~harness.plugin.hookspecs.ACCEPTED`); an entry point
that declares another version or none is refused when it is loaded, with one message
naming the plugin, the versions and the porting section of docs/plugins.md.
What a plugin that was refused or failed would provide is kept with its failure
(:class:`~harness.plugin.registry.PluginFailure`): the names its refused module's hooks
register, what its failed registration staged, else what the plugin manifest last
recorded; a spec naming one of them is told which plugin provides it and why it is
missing.

Tests and scripts register plugins of their own in this process with
:meth:`PluginLoader.register` (code the caller already runs here: nothing to isolate
it from).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Collection, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from harness.foundation.errors import ContractError, DuplicateNameError
from harness.plugin import hookspecs
from harness.plugin.entry_points import (
    ARTIFACT_FOLDER,
    DISTRIBUTION,
    ENTRY_POINT_GROUP,
    PLUGINS_ENV_VAR,
    allowed_external_plugins,
    distribution_of,
    is_builtin,
    plugin_entry_points,
    refusals,
)
from harness.plugin.hookspecs import ACCEPTED, CONTRACT, CONTRACT_ATTRIBUTE, PORTING
from harness.plugin.registry import COMPONENT_KINDS, PluginFailure, Registry


class PluginLoader:
    """pluggy's manager plus the component registry built from the register hooks, for the
    plugins imported into this process."""

    def __init__(self, third_party: bool = True, distribution: str | None = None,
                 prefixes: Mapping[str, Path] | None = None,
                 plugins: Collection[str] | None = None) -> None:  # fmt: skip
        """Load the built-in plugins and, unless ``third_party`` is False, the others (only
        ``distribution``'s when given: a plugin host's; of them only ``plugins`` when given,
        those the harness accepted), found also in the private ``prefixes`` (distribution ->
        its prefix); third-party ones are imported when first needed (:meth:`load_all`)."""
        self.pm = pluggy.PluginManager("idrs_bench")
        self.pm.add_hookspecs(hookspecs)
        self._failures: list[PluginFailure] = []
        self._versions: dict[str, str] = {}
        self._distributions: dict[str, str] = {}  # plugin -> the distribution declaring it
        self._registry: Registry | None = None
        self._pending: list[importlib.metadata.EntryPoint] = []  # third-party, not loaded yet
        self._third_party: list[importlib.metadata.EntryPoint] = []
        self._builtin: list[str] = []
        self._distribution = distribution
        self._only = None if plugins is None else set(plugins)
        self._prefixes: dict[str, Path] = dict(prefixes or {})
        self._local: set[str] = set()  # registered by the caller, not from an entry point
        self._load_entry_points(third_party)

    @property
    def failures(self) -> list[PluginFailure]:
        """Plugins that failed to import or register (every plugin is loaded first)."""
        self.load_all()
        return list(self._failures)

    def load_all(self) -> None:
        """Import the third-party plugins not loaded yet."""
        pending, self._pending = self._pending, []
        for ep in pending:
            self._load(ep)

    def builtin_plugins(self) -> list[str]:
        """The plugins of this distribution's entry points loaded here."""
        return list(self._builtin)

    def register(
        self, plugin: ModuleType | object, name: str, version: str = "",
        distribution: str | None = None,
    ) -> None:  # fmt: skip
        """Register a plugin object (usually a module with ``@hookimpl`` functions) in this
        process; ``distribution``: the installed package that declares it, when known. One
        that declares a contract version this harness does not accept is refused."""
        self._add(plugin, name, version, distribution)
        self._local.add(name)

    def _add(self, plugin: Any, name: str, version: str, distribution: str | None) -> None:
        if getattr(plugin, CONTRACT_ATTRIBUTE, CONTRACT) not in ACCEPTED:
            check_contract(plugin, name)
        self.pm.register(plugin, name=name)
        self._versions[name] = version
        if distribution:
            self._distributions[name] = distribution
        self._registry = None

    def unregister(self, name: str) -> None:
        self.pm.unregister(name=name)
        self._local.discard(name)
        self._versions.pop(name, None)
        self._distributions.pop(name, None)
        self._registry = None

    @property
    def registry(self) -> Registry:
        """The components of every plugin loaded here (built on first use)."""
        self.load_all()
        if self._registry is None:
            self._registry = self._build_registry()
            self._registry.set_failures(self._failures)
        return self._registry

    def plugin_names(self) -> list[str]:
        self.load_all()
        return sorted(name for name, _ in self.pm.list_name_plugin())

    def describe(self) -> list[dict[str, Any]]:
        """Name, version, implemented hooks and provided components of every plugin loaded
        here (``runs_in``: ``here``)."""
        registry = self.registry  # (loads every plugin)
        rows = []
        for name, plugin in sorted(self.pm.list_name_plugin()):
            hooks = sorted(h.name for h in self.pm.get_hookcallers(plugin) or [])
            rows.append({"name": name, "version": self._versions.get(name, ""), "hooks": hooks,
                         "distribution": self._distributions.get(name),
                         "provides": registry.provided_by(name), "runs_in": "here"})  # fmt: skip
        return rows

    def _load_entry_points(self, third_party: bool) -> None:
        allowed = allowed_external_plugins() if third_party else set()
        entry_points = plugin_entry_points(self._prefixes.values())
        builtins = [ep for ep in entry_points if is_builtin(ep)]
        others = [ep for ep in entry_points
                  if not is_builtin(ep) and (allowed is None or ep.name in allowed)]  # fmt: skip
        for ep in builtins:  # built-ins first: they keep their names
            self._load(ep)
            self._builtin.append(ep.name)
        # the harness checks where each name's folder leads; a plugin host loads only what
        # the harness accepted (``plugins``), its own distribution's
        folder = None
        if self._distribution is None and others:
            from harness.foundation.artifacts import cache_root

            folder = cache_root() / ARTIFACT_FOLDER
        refused = refusals(builtins, others, folder)
        ours = [ep for ep in others if (self._distribution is None
                                        or distribution_of(ep) == self._distribution)
                and (self._only is None or ep.name in self._only)]  # fmt: skip
        for ep, error in refused:
            if any(ep is o for o in ours):
                dist = getattr(ep, "dist", None)
                self._failures.append(PluginFailure(ep.name, _describe(error), "name",
                                                    dist.name if dist else None,
                                                    dist.version if dist else None))  # fmt: skip
        self._third_party = [ep for ep in ours if not any(ep is r for r, _ in refused)]
        self._pending = list(self._third_party)
        if not builtins:
            self._failures.append(
                PluginFailure(
                    DISTRIBUTION,
                    f"no {ENTRY_POINT_GROUP!r} entry points of the {DISTRIBUTION!r} distribution "
                    "were found, so no built-in plugin is loaded; install the package as "
                    "README.md's first command does (in the repository: python3 -m venv .venv "
                    "&& .venv/bin/python -m pip install -e .)",
                )
            )

    def _load(self, ep: importlib.metadata.EntryPoint) -> None:
        """Import and register one entry point; a failure is recorded, not raised."""
        try:  # a broken plugin, built-in or not, must not take the CLI down
            taken = self.pm.get_plugin(ep.name)
            if taken is not None:
                raise DuplicateNameError(
                    f"plugin name {ep.name!r} is declared twice: by "
                    f"{getattr(taken, '__name__', repr(taken))!r} and by entry point "
                    f"{ep.value!r}; rename one or leave a third-party plugin out with "
                    f"{PLUGINS_ENV_VAR}"
                )
            plugin = ep.load()
        except Exception as exc:
            self._fail(ep, exc, "load")
            return
        try:
            check_contract(plugin, ep.name)
        except ContractError as exc:
            self._fail(ep, exc, "contract", _would_register(plugin))
            return
        try:
            self._add(plugin, ep.name, ep.dist.version if ep.dist else "",
                      ep.dist.name if ep.dist else None)  # fmt: skip
        except Exception as exc:
            self._fail(ep, exc, "load")

    def _build_registry(self) -> Registry:
        """Call every plugin's register hooks through pluggy's hook caller (restricted to
        that plugin, so that one plugin's failure does not stop the others), collect what
        it registers, and add it whole or, when a hook raises or a registration is
        refused, not at all (the failure is recorded)."""
        registry = Registry()
        self._failures = [f for f in self._failures if f.stage != "register"]
        plugins = [p for _, p in self.pm.list_name_plugin() if p is not None]  # in order
        for plugin in plugins:
            name = self.pm.get_name(plugin)
            staged: list[tuple[str, Any]] = []
            try:
                for kind in COMPONENT_KINDS:
                    hook = f"idrs_register_{kind}"
                    impls = self._impls(hook)
                    if not any(i.plugin is plugin and not _wraps(i) for i in impls):
                        continue
                    others = [i.plugin for i in impls if i.plugin is not plugin and not _wraps(i)]
                    only = self.pm.subset_hook_caller(hook, remove_plugins=others)  # wrappers stay
                    only(register=lambda spec, _k=kind, _s=staged: _s.append((_k, spec)))
                registry.add_all(name, staged)
                registry.set_origin(name, self._distributions.get(name), self._versions.get(name))
            except Exception as exc:
                self._failures.append(PluginFailure(
                    name, _describe(exc), "register",
                    self._distributions.get(name), self._versions.get(name) or None,
                    _names(staged),
                ))  # fmt: skip
        return registry

    def _impls(self, hook: str) -> list[Any]:
        return getattr(self.pm.hook, hook).get_hookimpls()

    def _fail(
        self, ep: importlib.metadata.EntryPoint, exc: BaseException, stage: str,
        provides: dict[str, tuple[str, ...]] | None = None,
    ) -> None:  # fmt: skip
        dist = getattr(ep, "dist", None)
        self._failures.append(PluginFailure(
            ep.name, _describe(exc), stage, dist.name if dist else None,
            dist.version if dist else None, provides,
        ))  # fmt: skip


def check_contract(plugin: Any, name: str) -> None:
    """Raise a :class:`ContractError` unless ``plugin`` declares a contract in ``ACCEPTED``."""
    declared = getattr(plugin, CONTRACT_ATTRIBUTE, None)
    if declared in ACCEPTED:
        return
    written = (f"declares {CONTRACT_ATTRIBUTE} = {declared!r}" if declared is not None else
               f"declares no {CONTRACT_ATTRIBUTE}, so it was written against contract 1 or 2 "
               "(before plugins declared one)")  # fmt: skip
    raise ContractError(f"plugin {name!r} {written}; this idrs-bench implements plugin contract "
                        f"{CONTRACT} (and runs plugins of contract {ACCEPTED[0]}): see "
                        f"{PORTING}")  # fmt: skip


def _names(registrations: list[tuple[str, Any]]) -> dict[str, tuple[str, ...]]:
    """kind -> the names of ``registrations`` ((kind, spec) pairs)."""
    out: dict[str, tuple[str, ...]] = {}
    for kind, spec in registrations:
        name = getattr(spec, "name", None)
        if isinstance(name, str):
            out[kind] = (*out.get(kind, ()), name)
    return out


def _would_register(plugin: Any) -> dict[str, tuple[str, ...]] | None:
    """What a refused plugin's register hooks name (called with a recording ``register``;
    nothing they register is kept); None when none could be called. Only the process that
    imported the plugin calls this: for a third-party plugin, the plugin host."""
    staged: list[tuple[str, Any]] = []
    called = False
    for kind in COMPONENT_KINDS:
        hook = getattr(plugin, f"idrs_register_{kind}", None)
        if not callable(hook):
            continue
        try:
            hook(register=lambda spec, _k=kind: staged.append((_k, spec)))
            called = True
        except Exception:  # a hook of another contract may fail here: its names are unknown
            return None
    return _names(staged) if called else None


def _wraps(impl: Any) -> bool:
    """Whether a hook implementation is a wrapper (it sees the others' calls)."""
    return bool(getattr(impl, "wrapper", False) or getattr(impl, "hookwrapper", False))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
