"""The plugin manager: loads every plugin from the ``idrs_bench`` entry points.

Built-in and third-party plugins are found the same way (:mod:`harness.plugin.entry_points`:
this environment's entry points and the private prefixes of ``idrs-bench plugins
install``); a plugin is *built-in* when its entry point is this distribution's
(``idrs-bench``). ``IDRS_BENCH_PLUGINS`` restricts which third-party plugins load (unset:
all, ``""``: none, ``"a,b"``: ``a`` and ``b``); built-ins always load. A plugin that fails
to import or to register is recorded in :attr:`PluginManager.failures` and skipped;
everything else keeps working. A component name provided twice fails naming both plugins
(:class:`~harness.foundation.errors.DuplicateNameError`).

Third-party plugins are never imported by the harness's own process: plugin hosts
(:mod:`harness.plugin.host`, one per distribution, confined by the kernel:
:mod:`harness.plugin.confinement`; started when first needed: :attr:`PluginManager.registry`,
:meth:`PluginManager.describe`, :attr:`PluginManager.failures`) import them, and the
registry holds specs that ask them (:mod:`harness.plugin.hosted_components`;
harness/README.md, "Plugin host"). A plugin host's own manager is made with
``isolated=False`` and imports its distribution's plugins in its process. A benchmark
file is checked before that against what they registered last time
(:meth:`PluginManager.checking_registry`, :mod:`harness.plugin.manifest`).

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
:meth:`PluginManager.register` (code the caller already runs here: nothing to isolate).
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from harness.foundation.errors import ContractError, DuplicateNameError, IdrsError
from harness.plugin import confinement, hookspecs
from harness.plugin.confinement import hosts_confined
from harness.plugin.entry_points import (
    DISTRIBUTION,
    ENTRY_POINT_GROUP,
    PLUGINS_ENV_VAR,
    allowed_external_plugins,
    distribution_of,
    installed_prefixes,
    is_builtin,
    plugin_entry_points,
    top_module,
)
from harness.plugin.hookspecs import ACCEPTED, CONTRACT, CONTRACT_ATTRIBUTE, PORTING
from harness.plugin.registry import COMPONENT_KINDS, PluginFailure, Registry

ISOLATE_ENV = "IDRS_BENCH_ISOLATE"
"""``all``: the built-in σ-providers, certifiers and trainers are served by a plugin host
too (to exercise and measure the boundary); unset or ``third-party``: only third-party ones."""


class PluginManager:
    """pluggy's manager plus the component registry built from the register hooks."""

    def __init__(self, third_party: bool = True, isolated: bool = True,
                 distribution: str | None = None) -> None:  # fmt: skip
        """Load the built-in plugins and, unless ``third_party`` is False, the others: in
        plugin hosts (one per distribution), or in this process when ``isolated`` is False
        (a plugin host's own, which loads ``distribution``'s only)."""
        self.pm = pluggy.PluginManager("idrs_bench")
        self.pm.add_hookspecs(hookspecs)
        self._failures: list[PluginFailure] = []
        self._versions: dict[str, str] = {}
        self._distributions: dict[str, str] = {}  # plugin -> the distribution declaring it
        self._registry: Registry | None = None
        self._pending: list[importlib.metadata.EntryPoint] = []  # third-party, not loaded yet
        self._third_party: list[importlib.metadata.EntryPoint] = []
        self._builtin: list[str] = []
        self._isolated = isolated
        self._distribution = distribution
        self._prefixes: dict[str, Path] = (installed_prefixes() if isolated and third_party
                                           else {})  # distribution -> its private prefix  # fmt: skip
        self._serves_third_party = third_party  # (a manager of built-ins only never hosts)
        self._hosts: dict[str | None, Any] = {}  # distribution (None: built-ins) -> PluginHost
        self._hosted: dict[str | None, dict[str, Any]] = {}  # what each described
        self._host_failures: list[PluginFailure] = []  # what failed there
        self._taken: list[PluginFailure] = []  # plugins of hosts whose names were taken
        self.not_run: list[str] = []
        """Third-party checks the harness does not run (verdicts are the harness's own)."""
        self._local: set[str] = set()  # registered by the caller, not from an entry point
        self._load_entry_points(third_party)

    @property
    def third_party(self) -> bool:
        """Whether this manager serves the installed third-party plugins."""
        return self._serves_third_party

    @property
    def portable(self) -> bool:
        """Whether another process makes the same manager from the entry points alone
        (:meth:`PluginManager(third_party) <PluginManager>`, the same environment): no
        plugin was registered here by the caller, and third-party plugins are hosted."""
        return self._isolated and not self._local

    @property
    def failures(self) -> list[PluginFailure]:
        """Plugins that failed to import or register (every plugin is loaded first)."""
        self.load_all()
        if self._hosts or self._pending_hosted():
            self.registry  # noqa: B018 (a plugin host reports its plugins' failures)
        return [*self._failures, *self._host_failures, *self._taken]

    def load_all(self) -> None:
        """Load the third-party plugins not loaded yet: describe them by their plugin hosts,
        or (not ``isolated``) import them here."""
        pending, self._pending = self._pending, []
        if self._isolated:
            if pending:
                self._start_hosts()
            return
        for ep in pending:
            self._load(ep)

    def _pending_hosted(self) -> bool:
        return self._isolated and self._serves_third_party and isolate_builtins()

    def _start_hosts(self) -> None:
        """Start a plugin host per third-party distribution (and, with
        ``IDRS_BENCH_ISOLATE=all``, one for the built-ins), confined unless the user asked
        otherwise, and read what each loaded (their failures are reported here)."""
        if self._hosts:
            return
        from harness.plugin.host_process import PluginHost
        from harness.plugin.hosted_components import failures_from_host

        groups: dict[str, list[str]] = {}
        for ep in self._third_party:
            groups.setdefault(distribution_of(ep), []).append(ep.name)
        confined = hosts_confined(third_party=bool(groups))
        hosts: dict[str | None, PluginHost] = {}
        if isolate_builtins():
            hosts[None] = PluginHost(None, self._builtin, confined=confined)
        for name, plugins in sorted(groups.items()):
            hosts[name] = PluginHost(name, plugins, self._prefixes.get(name), confined,
                                     self._builtin)  # fmt: skip
        for host in hosts.values():
            host.start()  # (they import their plugins side by side)
        for key, host in hosts.items():
            self._hosted[key] = described = host.request("describe")
            host.abi = int(described.get("abi", 0))
            self._host_failures += failures_from_host(described, dict(self.pm.list_name_plugin()))
        self._hosts = hosts
        self._registry = None

    def stop_hosts(self) -> None:
        """End the hosts' processes; each starts again when asked, with that moment's cache root."""
        for host in self._hosts.values():
            host.stop()

    def hosting(self) -> dict[str, Any]:
        """How this process ran third-party plugins, as a run records it: the distributions
        (name and version) and their hosts' weakest confinement (``confinement.description``)."""
        self.registry  # noqa: B018 (starts the hosts)
        third = {k: h for k, h in self._hosts.items() if k is not None}
        versions = {p["distribution"]: p.get("version") for k in third
                    for p in self._hosted[k].get("plugins", ()) if p.get("distribution") == k}  # fmt: skip
        weakest = confinement.description(min(h.abi for h in third.values())) if third else None
        return {"third_party": [f"{name} {versions.get(name) or ''}".strip() for name in third],
                "confinement": weakest or "no third-party plugin"}  # fmt: skip

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
        """The components of every plugin (built on first use): this process's, and those the
        plugin hosts serve (:mod:`harness.plugin.hosted_components`)."""
        self.load_all()
        if self._pending_hosted():
            self._start_hosts()
        if self._registry is None:
            self._registry = self._build_registry()
            self.not_run, self._taken = [], []
            for key, host in self._hosts.items():
                from harness.plugin.hosted_components import hosted_registry  # (imports torch)

                self._registry, not_run, taken = hosted_registry(
                    self._registry, host, self._hosted[key], key is None
                )
                self.not_run += not_run
                self._taken += taken
            from harness.plugin import manifest as plugin_manifest

            failures = [*self._failures, *self._host_failures, *self._taken]
            self._registry.set_failures(failures)
            plugin_manifest.write_entries(
                self._registry, self._third_party, {f.plugin for f in failures}
            )
        return self._registry

    def checking_registry(self) -> Registry:
        """A registry to check a benchmark file against, without importing third-party
        plugins whose components :mod:`harness.plugin.manifest` recorded: theirs are
        stand-ins (names, defaults, compositions; a method's ``check`` imports them).
        The full :attr:`registry` when any of them has no valid record."""
        if not self._pending:
            return self.registry
        from harness.plugin import manifest as plugin_manifest

        entries = plugin_manifest.read_entries(self._pending)
        if entries is None:
            return self.registry
        base = self._registry if self._registry is not None else self._build_registry()

        def real_check(name: str):
            return lambda params: self.registry.get("methods", name).check(params)

        checking = plugin_manifest.stand_in_registry(base, entries, real_check)
        checking.set_failures(self._failures)
        return checking

    def formula(self, record: dict[str, Any]) -> Any:
        """The radius formula a record names (S0's declaration): idrs-bench's own, resolved
        here, or an installed plugin's, re-derived by the plugin host
        (:func:`harness.plugin.remote.resolve_formula`)."""
        from harness.mathematics.radius import (
            builtin_packages,
            formula_from_record,
            trusted_packages,
        )
        from harness.plugin.remote import resolve_formula

        top = str(record.get("recompute", "")).split(".")[0]
        if top in builtin_packages() or not self._isolated:
            return formula_from_record(record, None if self._isolated else trusted_packages())
        self.registry  # noqa: B018 (starts the plugin hosts of the installed plugins)
        hosts = [self._hosts.get(distribution_of(ep)) for ep in self._third_party
                 if top_module(ep) == top]  # fmt: skip
        host = next((h for h in hosts if h is not None), None)
        if host is None:
            return formula_from_record(record)  # (says which package is missing)
        return resolve_formula(record, host, [])

    def plugin_names(self) -> list[str]:
        self.load_all()
        hosted = {p["name"] for d in self._hosted.values() for p in d.get("plugins", ())}
        return sorted({name for name, _ in self.pm.list_name_plugin()} | hosted)

    def describe(self) -> list[dict[str, Any]]:
        """Name, version, implemented hooks, provided components and where it runs (``here``
        or ``plugin host``) of every plugin."""
        registry = self.registry  # (loads every plugin)
        rows = []
        for name, plugin in sorted(self.pm.list_name_plugin()):
            hooks = sorted(h.name for h in self.pm.get_hookcallers(plugin) or [])
            rows.append({"name": name, "version": self._versions.get(name, ""), "hooks": hooks,
                         "distribution": self._distributions.get(name),
                         "provides": registry.provided_by(name), "runs_in": "here"})  # fmt: skip
        local = {row["name"] for row in rows}
        for key, described in self._hosted.items():
            for hosted in described.get("plugins", ()):
                if hosted["name"] not in local:
                    rows.append({**hosted, "provides": registry.provided_by(hosted["name"]),
                                 "runs_in": "plugin host", "private": key in self._prefixes,
                                 "confinement": confinement.description(self._hosts[key].abi)})  # fmt: skip
        return sorted(rows, key=lambda row: row["name"])

    def _load_entry_points(self, third_party: bool) -> None:
        allowed = allowed_external_plugins() if third_party else set()
        entry_points = plugin_entry_points(self._prefixes.values())
        builtins = [ep for ep in entry_points if is_builtin(ep)]
        others = [ep for ep in entry_points if not is_builtin(ep)]
        if self._distribution is not None:  # a plugin host's: its distribution's only
            others = [ep for ep in others if distribution_of(ep) == self._distribution]
        for ep in builtins:  # built-ins first: they keep their names
            self._load(ep)
            self._builtin.append(ep.name)
        self._third_party = [ep for ep in others if allowed is None or ep.name in allowed]
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


def isolate_builtins() -> bool:
    """Whether ``IDRS_BENCH_ISOLATE=all`` asks for the built-ins in the plugin host too."""
    value = os.environ.get(ISOLATE_ENV, "third-party")
    if value not in ("all", "third-party"):
        raise IdrsError(f"{ISOLATE_ENV}={value!r}; use 'all' or 'third-party'")
    return value == "all"


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
