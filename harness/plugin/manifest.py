"""What each third-party plugin provides, remembered so a spec is checked without importing it.

A benchmark file is checked against every component name and parameter before any work
(:func:`harness.running.benchmark.validate`), and its errors should come at once. Importing a
third-party plugin may take seconds (many import torch at module level), so the names,
parameter defaults and method compositions each one registered are kept in
``<cache root>/plugin-manifest.json`` and the check runs against stand-ins built from
them (:func:`stand_in_registry`). An entry is valid while its **key** is unchanged: the
entry point, the plugin distribution's name and version, this harness's version, and
the size and modification time of every ``.py`` file of the plugin's top-level module
or package (an edit in an editable install changes it; for a plugin installed by
``idrs-bench plugins install``, the ``.py`` files its ``RECORD`` lists). A plugin
without a valid entry is imported as before, and the manifest is rewritten whenever the
full registry has been built (:meth:`harness.plugin.manager.PluginManager.registry`).

A plugin that fails keeps its last entry, made invalid (no key): what it provided then
names it when a benchmark file asks for one of its components (:func:`recorded_names`).
An entry that names a method by a name the harness refuses
(:func:`~harness.plugin.entry_points.name_problem`) is not used: the full registry, which
refuses the plugin and says why, is built instead. The entry points read here are those
the plugin loader accepted (a refused name is never recorded).

Only names and parameters are checked from the manifest. A method whose ``check``
validates parameter values imports its plugin when the check runs; a name a stand-in
does not know is an error only if the full registry agrees (the stand-ins hold exactly
what the plugin registered when its key was recorded).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from harness.foundation.errors import DuplicateNameError
from harness.foundation.version import __version__
from harness.plugin.entry_points import name_problem
from harness.plugin.registry import COMPONENT_KINDS, Registry

FORMAT = 1
FILE_NAME = "plugin-manifest.json"


def manifest_path() -> Path:
    """``<cache root>/plugin-manifest.json`` (see :func:`harness.foundation.artifacts.cache_root`)."""
    from harness.foundation.artifacts import cache_root

    return cache_root() / FILE_NAME


def plugin_key(entry_point: importlib.metadata.EntryPoint) -> str | None:
    """The SHA-256 of everything an entry stays valid for (module doc); None when the
    plugin's files cannot be found without importing it."""
    module = entry_point.value.split(":")[0].strip()
    dist = getattr(entry_point, "dist", None)
    try:
        found = importlib.util.find_spec(module.split(".")[0])  # a top-level name: not run
    except (ImportError, ValueError):
        return None
    if found is None:  # installed in a private prefix: the files its RECORD lists
        files = (dist.files or []) if dist is not None else []
        paths = [Path(dist.locate_file(f)) for f in files if f.suffix == ".py"]
    else:
        paths = [Path(found.origin)] if found.origin and found.has_location else []
        for folder in found.submodule_search_locations or []:
            for root, dirs, names in os.walk(folder):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                paths += [Path(root) / f for f in sorted(names) if f.endswith(".py")]
    if not paths:
        return None
    stamps = []
    for path in paths:
        try:
            stat = path.stat()
        except OSError:
            return None
        stamps.append([str(path), stat.st_size, stat.st_mtime_ns])
    record = {
        "format": FORMAT,
        "harness": __version__,
        "entry_point": [entry_point.name, entry_point.value],
        "distribution": [dist.name, dist.version] if dist is not None else None,
        "files": stamps,
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def read_entries(
    entry_points: Iterable[importlib.metadata.EntryPoint],
) -> dict[str, dict[str, dict[str, Any]]] | None:
    """The recorded components of each entry point, by plugin name (kind -> name ->
    metadata), or None when any of them has no valid entry."""
    try:
        data = json.loads(manifest_path().read_text())
    except (OSError, ValueError):
        return None
    plugins = data.get("plugins", {}) if data.get("format") == FORMAT else {}
    out = {}
    for ep in entry_points:
        entry = plugins.get(ep.name)
        key = entry.get("key") if isinstance(entry, dict) else None
        if key is None or key != plugin_key(ep):  # a failed plugin's entry has no key
            return None
        components = entry.get("components")
        methods = components.get("methods", {}) if isinstance(components, dict) else None
        if not isinstance(methods, dict) or any(name_problem(m) is not None for m in methods):
            return None  # (a plugin naming a method so is refused when loaded)
        out[ep.name] = components
    return out


def recorded_names(plugin: str) -> dict[str, tuple[str, ...]] | None:
    """kind -> the names ``plugin`` registered when the manifest last recorded it, valid or
    not (a plugin that fails now keeps its last record); None when it has none."""
    try:
        data = json.loads(manifest_path().read_text())
    except (OSError, ValueError):
        return None
    entry = (data.get("plugins", {}) if data.get("format") == FORMAT else {}).get(plugin)
    components = entry.get("components") if isinstance(entry, dict) else None
    if not isinstance(components, dict):
        return None
    return {kind: tuple(names) for kind, names in components.items() if isinstance(names, dict)}


def write_entries(
    registry: Registry, entry_points: Iterable[importlib.metadata.EntryPoint], failed: set[str]
) -> None:
    """Record what each loaded third-party plugin provides in ``registry`` (plugins that
    failed, or whose parameters do not survive JSON, are left out: they are imported)."""
    path = manifest_path()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    old = data.get("plugins", {}) if data.get("format") == FORMAT else {}
    plugins = dict(old)
    for ep in entry_points:
        key = plugin_key(ep)
        components = _components(registry, ep.name)
        if ep.name in failed and isinstance(old.get(ep.name), dict):
            plugins[ep.name] = {"key": None, "components": old[ep.name].get("components", {})}
        elif key is None or ep.name in failed or components is None:
            plugins.pop(ep.name, None)
        else:
            plugins[ep.name] = {"key": key, "components": components}
    if plugins == old:
        return
    try:  # a cache that cannot be written only costs speed
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"format": FORMAT, "plugins": plugins}, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass


def _components(registry: Registry, plugin: str) -> dict[str, dict[str, Any]] | None:
    """kind -> name -> {defaults, sigma_provider, certifier, check} of ``plugin``."""
    out: dict[str, dict[str, Any]] = {}
    for kind, names in registry.provided_by(plugin).items():
        out[kind] = {}
        for name in names:
            spec = registry.get(kind, name)
            meta: dict[str, Any] = {}
            if hasattr(spec, "defaults"):
                meta["defaults"] = dict(spec.defaults)
            if kind == "methods":
                meta |= {"sigma_provider": spec.sigma_provider, "certifier": spec.certifier,
                         "check": spec.check is not None}  # fmt: skip
            out[kind][name] = meta
    try:
        if json.loads(json.dumps(out)) != out:  # e.g. a tuple default would come back a list
            return None
    except (TypeError, ValueError):
        return None
    return out


def stand_in_registry(
    base: Registry,
    entries: Mapping[str, Mapping[str, Mapping[str, Any]]],
    check: Callable[[str], Callable[[Mapping[str, Any]], None]],
) -> Registry:
    """``base`` (the loaded plugins' registry) plus a stand-in spec for every recorded
    component; a stand-in method's ``check`` is ``check(name)``, which runs the real one."""
    registry = Registry()
    for kind in COMPONENT_KINDS:
        for name in base.names(kind):
            registry.add(kind, base.get(kind, name), base.provider(kind, name))
    for plugin, components in entries.items():
        for kind, names in components.items():
            for name, meta in names.items():
                try:
                    registry.add(kind, _stand_in(kind, name, meta, check), plugin)
                except DuplicateNameError:  # as in the full registry: the first one keeps it
                    continue
    return registry


def _stand_in(kind: str, name: str, meta: Mapping[str, Any], check) -> Any:
    """A spec of ``kind`` with the recorded name, defaults and composition; its factories
    raise (a stand-in is only read, never built)."""
    cls = COMPONENT_KINDS[kind]
    values: dict[str, Any] = {"name": name}
    for f in fields(cls):
        if f.name == "name":
            continue
        if f.name == "defaults":
            values[f.name] = dict(meta.get("defaults", {}))
        elif f.name in ("sigma_provider", "certifier"):
            values[f.name] = meta[f.name]
        elif f.name == "check":
            values[f.name] = check(name) if meta.get("check") else None
        elif f.default is MISSING and f.default_factory is MISSING:
            values[f.name] = _not_loaded
    return cls(**values)


def _not_loaded(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a plugin stand-in is only for checking a spec; load the plugin to use it")
