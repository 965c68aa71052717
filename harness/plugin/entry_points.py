"""Where plugins are found: the ``idrs_bench`` entry points of this environment and of the
distributions ``idrs-bench plugins install`` put in private prefixes.

A plugin is the object an entry point of the group :data:`ENTRY_POINT_GROUP` names
(``[project.entry-points.idrs_bench]`` in its package's ``pyproject.toml``; the built-ins
are declared so in this repository's). A distribution installed privately lives in
``<cache root>/plugin-packages/<name>/`` (:func:`prefix_root`), one folder per
distribution, never on the harness's module path: its metadata is read from there
(:func:`plugin_entry_points`) and only its confined plugin host imports its code
(:mod:`harness.plugin.hosting.private_install`). ``$IDRS_BENCH_PLUGINS`` restricts which
third-party plugins load (:func:`allowed_external_plugins`).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from collections.abc import Iterable
from pathlib import Path

ENTRY_POINT_GROUP = "idrs_bench"
DISTRIBUTION = "idrs-bench"
PLUGINS_ENV_VAR = "IDRS_BENCH_PLUGINS"
PREFIX_FOLDER = "plugin-packages"


def plugin_entry_points(prefixes: Iterable[Path] = ()) -> list[importlib.metadata.EntryPoint]:
    """The ``idrs_bench`` entry points of this environment and of the distributions
    installed in the private ``prefixes`` (read, never put on this process's path)."""
    found = list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    for prefix in prefixes:
        for dist in importlib.metadata.distributions(path=[str(prefix)]):
            found += [ep for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP]
    return found


def is_builtin(entry_point: importlib.metadata.EntryPoint) -> bool:
    """Whether ``entry_point`` is declared by this distribution (a built-in plugin)."""
    dist = getattr(entry_point, "dist", None)
    return dist is not None and dist.name == DISTRIBUTION


def distribution_of(entry_point: importlib.metadata.EntryPoint) -> str:
    """The name of the distribution declaring ``entry_point`` (its own name when unknown)."""
    dist = getattr(entry_point, "dist", None)
    return dist.name if dist is not None else entry_point.name


def top_module(entry_point: importlib.metadata.EntryPoint) -> str:
    """The top-level module of the object ``entry_point`` names."""
    return entry_point.value.split(":")[0].strip().split(".")[0]


def allowed_external_plugins() -> set[str] | None:
    """The third-party plugins ``$IDRS_BENCH_PLUGINS`` lets load (None: all)."""
    value = os.environ.get(PLUGINS_ENV_VAR)
    if value is None:
        return None
    return {name.strip() for name in value.split(",") if name.strip()}


def prefix_root() -> Path:
    """``<cache root>/plugin-packages``: one private prefix per installed distribution."""
    from harness.foundation.artifacts import cache_root

    return cache_root() / PREFIX_FOLDER


def normalized(name: str) -> str:
    """A distribution's name as the packaging specifications compare it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_prefixes() -> dict[str, Path]:
    """Each distribution installed in a private prefix (its metadata's name) and its prefix."""
    root = prefix_root()
    if not root.is_dir():
        return {}
    out = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for dist in importlib.metadata.distributions(path=[str(folder)]):
            out[dist.metadata["Name"]] = folder
    return out
