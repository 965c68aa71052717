"""The plugin manager: the plugins of the harness's processes, third-party ones in plugin hosts.

A :class:`PluginManager` is the :class:`~harness.plugin.loader.PluginLoader` of the
built-in plugins (imported here) plus a plugin host per installed third-party distribution
(:mod:`harness.plugin.hosting.in_host.host`, confined by the kernel:
:mod:`harness.plugin.hosting.in_host.confinement`): third-party plugins are never imported by the
harness's own process. The hosts start when first needed (:attr:`PluginManager.registry`,
:meth:`PluginManager.describe`, :attr:`PluginManager.failures`) and end when the manager
is closed (:meth:`PluginManager.close`; ``with PluginManager() as manager:``), so a host
lives no longer than the command or API call that made its manager; the registry holds
specs that ask them (:mod:`harness.plugin.hosting.in_harness.hosted_components`; harness/README.md,
"Plugin host"). A benchmark file is checked before that against what they registered last
time (:meth:`PluginManager.checking_registry`, :mod:`harness.plugin.manifest`).

Imports go down: the contract (hookspecs, components, registry, entry points, the loader)
below the machinery that runs plugins apart (:mod:`harness.plugin.hosting`), this module on
top (``tests/test_layers.py``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from harness.foundation.errors import IdrsError
from harness.plugin.entry_points import (
    NAMING,
    PluginNameError,
    distribution_of,
    installed_prefixes,
    name_problem,
    top_module,
)
from harness.plugin.hosting.in_harness.confinement_options import description, hosts_confined
from harness.plugin.hosting.in_harness.limits import plugin_timeout
from harness.plugin.loader import PluginLoader
from harness.plugin.registry import PluginFailure, Registry

ISOLATE_ENV = "IDRS_BENCH_ISOLATE"
"""``all``: the built-in σ-providers, certifiers and trainers are served by a plugin host
too (to exercise and measure the boundary); unset or ``third-party``: only third-party ones."""


class PluginManager(PluginLoader):
    """The plugin loader of the built-ins, plus the plugin hosts of the third-party plugins;
    close it (or use it as a context manager) to end its hosts."""

    def __init__(self, third_party: bool = True) -> None:
        """Load the built-in plugins and, unless ``third_party`` is False, describe the
        others by their plugin hosts (one per distribution) when first needed."""
        super().__init__(third_party, prefixes=installed_prefixes() if third_party else {})
        self._serves_third_party = third_party  # (a manager of built-ins only never hosts)
        self._hosts: dict[str | None, Any] = {}  # distribution (None: built-ins) -> PluginHost
        self._hosted: dict[str | None, dict[str, Any]] = {}  # what each described
        self._host_failures: list[PluginFailure] = []  # what failed there
        self._taken: list[PluginFailure] = []  # plugins of hosts whose names were taken
        self.not_run: list[str] = []
        """Third-party checks the harness does not run (verdicts are the harness's own)."""

    def __enter__(self) -> PluginManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the plugin hosts and remove their folders (also on an exception: ``with``);
        the manager can still be used, and starts hosts again when asked."""
        hosts, self._hosts = self._hosts, {}
        for host in hosts.values():
            host.close()
        if hosts:  # (the registry's specs ask hosts that are gone)
            self._hosted, self._registry, self._host_failures = {}, None, []
            self._pending = list(self._third_party)

    @property
    def third_party(self) -> bool:
        """Whether this manager serves the installed third-party plugins."""
        return self._serves_third_party

    @property
    def portable(self) -> bool:
        """Whether another process makes the same manager from the entry points alone
        (:meth:`PluginManager(third_party) <PluginManager>`, the same environment): no
        plugin was registered here by the caller (third-party plugins are hosted)."""
        return not self._local

    @property
    def failures(self) -> list[PluginFailure]:
        """Plugins that failed to import or register (every plugin is loaded first)."""
        self.load_all()
        if self._hosts or self._pending_hosted():
            self.registry  # noqa: B018 (a plugin host reports its plugins' failures)
        return [*self._failures, *self._host_failures, *self._taken]

    def load_all(self) -> None:
        """Describe the third-party plugins not described yet by their plugin hosts (never
        imported here)."""
        pending, self._pending = self._pending, []
        if pending:
            self._start_hosts()

    def _pending_hosted(self) -> bool:
        return self._serves_third_party and isolate_builtins()

    def _start_hosts(self) -> None:
        """Start a plugin host per third-party distribution (and, with
        ``IDRS_BENCH_ISOLATE=all``, one for the built-ins), confined unless the user asked
        otherwise, and read what each loaded (their failures are reported here)."""
        if self._hosts:
            return
        from harness.plugin.hosting.in_harness.host_process import PluginHost
        from harness.plugin.hosting.in_harness.hosted_components import failures_from_host

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
            # (they import their plugins side by side; a host whose folders cannot be
            # granted starts nothing, and its describe below fails the same way)
            with contextlib.suppress(PluginNameError):
                host.start()
        for key, host in list(hosts.items()):
            try:
                described = host.describe()
            except IdrsError as exc:  # (hung, died or broke the wire while importing)
                if key is None:
                    raise
                host.close()
                del hosts[key]
                kind, stage = (("PluginNameError", "name") if isinstance(exc, PluginNameError)
                               else ("IdrsError", "load"))  # fmt: skip
                self._host_failures += [PluginFailure(plugin, f"{kind}: {exc}", stage, key)
                                        for plugin in groups[key]]  # fmt: skip
                continue
            if key is not None:
                described = self._screened(described, key, groups[key])
            self._hosted[key] = described
            host.abi = int(described.get("abi", 0))
            self._host_failures += failures_from_host(described, dict(self.pm.list_name_plugin()))
        self._hosts = hosts
        self._registry = None

    def _screened(
        self, described: dict[str, Any], distribution: str, plugins: list[str]
    ) -> dict[str, Any]:
        """What the host of ``distribution`` described, less what the harness refuses: the
        plugins and components of plugins it was not asked to load (only ``plugins`` and
        the built-ins load there), and every plugin that names a method by a name that is
        not a plain name (:func:`~harness.plugin.entry_points.name_problem`), refused whole
        and reported with its distribution."""
        accepted = {*plugins, *self._builtin}
        components = [c for c in described.get("components", ()) if c.get("plugin") in accepted]
        refused: dict[str, list[str]] = {}
        for item in components:
            method = item["plugin"] in plugins and item["kind"] == "methods"
            if method and name_problem(item["name"]) is not None:
                refused.setdefault(item["plugin"], []).append(item["name"])
        versions = {p.get("name"): p.get("version") for p in described.get("plugins", ())}
        for plugin, names in refused.items():
            self._host_failures.append(PluginFailure(
                plugin, f"PluginNameError: the plugin {plugin!r} of the distribution "
                f"{distribution!r} is refused: its method {name_problem(names[0])}; rename "
                f"the method ({NAMING})", "name", distribution, versions.get(plugin),
                {"methods": tuple(names)},
            ))  # fmt: skip
        return {**described,
                "components": [c for c in components if c["plugin"] not in refused],
                "plugins": [p for p in described.get("plugins", ())
                            if p.get("name") in accepted and p.get("name") not in refused]}  # fmt: skip

    def stop_hosts(self) -> None:
        """End the hosts' processes; each starts again when asked, with that moment's cache root."""
        for host in self._hosts.values():
            host.stop()

    def hosting(self) -> dict[str, Any]:
        """How this process ran third-party plugins, as a run records it: the distributions
        (name and version), their hosts' weakest confinement (``confinement_options.description``)
        and, when plugin hosts served it, the time limit of a request to one
        (``plugin_timeout``, seconds: :mod:`harness.plugin.hosting.in_harness.limits`)."""
        self.registry  # noqa: B018 (starts the hosts)
        third = {k: h for k, h in self._hosts.items() if k is not None}
        versions = {p["distribution"]: p.get("version") for k in third
                    for p in self._hosted[k].get("plugins", ()) if p.get("distribution") == k}  # fmt: skip
        weakest = description(min(h.abi for h in third.values())) if third else None
        record = {"third_party": [f"{name} {versions.get(name) or ''}".strip() for name in third],
                  "confinement": weakest or "no third-party plugin"}  # fmt: skip
        if self._hosts:
            record["plugin_timeout"] = plugin_timeout()
        return record

    @property
    def registry(self) -> Registry:
        """The components of every plugin (built on first use): this process's, and those the
        plugin hosts serve (:mod:`harness.plugin.hosting.in_harness.hosted_components`)."""
        self.load_all()
        if self._pending_hosted():
            self._start_hosts()
        if self._registry is None:
            self._registry = self._build_registry()
            self.not_run, self._taken = [], []
            for key, host in self._hosts.items():
                from harness.plugin.hosting.in_harness.hosted_components import (
                    hosted_registry,  # (imports torch)
                )

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
        (:func:`harness.plugin.hosting.in_harness.remote.resolve_formula`)."""
        from harness.mathematics.radius import builtin_packages, formula_from_record
        from harness.plugin.hosting.in_harness.remote import resolve_formula

        top = str(record.get("recompute", "")).split(".")[0]
        if top in builtin_packages():
            return formula_from_record(record)
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
        rows = super().describe()
        registry = self.registry
        local = {row["name"] for row in rows}
        for key, described in self._hosted.items():
            for hosted in described.get("plugins", ()):
                if hosted["name"] not in local:
                    rows.append({**hosted, "provides": registry.provided_by(hosted["name"]),
                                 "runs_in": "plugin host", "private": key in self._prefixes,
                                 "confinement": description(self._hosts[key].abi)})  # fmt: skip
        return sorted(rows, key=lambda row: row["name"])


@contextmanager
def managed(manager: PluginManager | None = None) -> Iterator[PluginManager]:
    """``manager`` as given (whoever made it ends its hosts), or a new one whose hosts end
    when the block does, also on an exception: a command or API call that makes its own
    manager leaves no plugin host behind."""
    if manager is not None:
        yield manager
        return
    with PluginManager() as made:
        yield made


def isolate_builtins() -> bool:
    """Whether ``IDRS_BENCH_ISOLATE=all`` asks for the built-ins in the plugin host too."""
    value = os.environ.get(ISOLATE_ENV, "third-party")
    if value not in ("all", "third-party"):
        raise IdrsError(f"{ISOLATE_ENV}={value!r}; use 'all' or 'third-party'")
    return value == "all"
