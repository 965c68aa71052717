"""Where plugins are found: the ``idrs_bench`` entry points of this environment and of the
distributions ``idrs-bench plugins install`` put in private prefixes.

A plugin is the object an entry point of the group :data:`ENTRY_POINT_GROUP` names
(``[project.entry-points.idrs_bench]`` in its package's ``pyproject.toml``; the built-ins
are declared so in this repository's). A distribution installed privately lives in
``<cache root>/plugin-packages/<name>/`` (:func:`prefix_root`), one folder per
distribution, never on the harness's module path: its metadata is read from there
(:func:`plugin_entry_points`) and only its confined plugin host imports its code
(:mod:`harness.plugin.private_install`). ``$IDRS_BENCH_PLUGINS`` restricts which
third-party plugins load (:func:`allowed_external_plugins`).

A plugin's name (its entry point's) is the folder its plugin host may write,
``<cache root>/plugins/<name>/``: a third-party entry point whose name is not a plain name
(:func:`name_problem`), is a built-in's, is declared by another distribution too, or whose
folder resolves elsewhere (:func:`artifact_folder`) is refused before anything of it runs
(:func:`refusals`), and the refusal names its distribution.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from harness.foundation.errors import DuplicateNameError, IdrsError

ENTRY_POINT_GROUP = "idrs_bench"
DISTRIBUTION = "idrs-bench"
PLUGINS_ENV_VAR = "IDRS_BENCH_PLUGINS"
PREFIX_FOLDER = "plugin-packages"
ARTIFACT_FOLDER = "plugins"
"""``<cache root>/plugins/<plugin>/``: each plugin's artifact folder (the only folder of the
cache root a confined plugin host writes, its own plugins')."""
NAMING = "docs/plugins.md, 'Plugin names'"
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")
"""A plugin's (or a method's) name: ASCII letters, digits, '.', '_' and '-', not beginning
with '.' (so never '.' or '..'), at most 100 characters: one path component, hidden by no
listing."""


class PluginNameError(IdrsError):
    """A plugin (or method) name the harness refuses: it would not name a folder of the
    plugin's own (:func:`name_problem`, :func:`artifact_folder`)."""


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


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a plugin or a method (None: it can). A plugin's name is the
    folder ``<cache root>/plugins/<name>/`` its plugin host may write, so it must be one
    plain path component."""
    if isinstance(name, str) and _NAME.fullmatch(name):
        return None
    return (f"{name!r} is not a plain name: a plugin's (and a method's) name is ASCII letters, "
            "digits, '.', '_' and '-', not beginning with '.', at most 100 characters (a "
            "plugin's name is the folder <cache root>/plugins/<name>/ its plugin host may "
            "write)")  # fmt: skip


def artifact_folder(plugins: Path, name: str, create: bool = False) -> Path:
    """``<plugins>/<name>`` (``plugins``: ``<cache root>/plugins``), resolved and checked: the
    folder exactly beneath the resolved ``plugins``, neither a symbolic link nor reached
    through one (created first with ``create``); else a :class:`PluginNameError`. The folder
    a plugin host of ``name`` may be granted."""
    problem = name_problem(name)
    if problem is not None:
        raise PluginNameError(problem)
    if create:
        plugins.mkdir(parents=True, exist_ok=True)
    base = plugins.resolve()
    folder = plugins / name
    if create and not folder.is_symlink():
        try:
            folder.mkdir(exist_ok=True)
        except FileExistsError:
            raise PluginNameError(f"{folder} is not a folder; remove it") from None
    if folder.is_symlink() or (folder.exists() and folder.resolve() != base / name):
        raise PluginNameError(f"the artifact folder {folder} is a symbolic link (to "
                              f"{folder.resolve()}), never granted to a plugin host; "
                              "remove the link")  # fmt: skip
    return base / name


def artifact_grants(
    root: Path, plugins: Sequence[str], builtins: Sequence[str]
) -> tuple[list[Path], list[Path]]:
    """The artifact folders a confined host may write (its ``plugins``') and read (the
    ``builtins``'), ``<root>/plugins/<name>``, created, resolved and each checked to be that
    folder beneath the resolved ``<root>/plugins`` (no name that is not a plain name, no
    symbolic link: :func:`artifact_folder`); a plugin named like a built-in is refused,
    never given the built-in's folder. Raises :class:`PluginNameError`. What
    :class:`~harness.plugin.hosting.in_harness.host_process.PluginHost` grants its host."""
    taken = sorted(set(plugins) & set(builtins))
    if taken:
        raise PluginNameError(f"plugin name(s) {', '.join(map(repr, taken))} are built-in "
                              f"plugins' (their artifact folders are the built-ins'); rename "
                              f"them ({NAMING})")  # fmt: skip
    folder = root / ARTIFACT_FOLDER
    return ([artifact_folder(folder, p, create=True) for p in plugins],
            [artifact_folder(folder, p, create=True) for p in builtins])  # fmt: skip


def refusals(
    builtins: Sequence[importlib.metadata.EntryPoint],
    others: Sequence[importlib.metadata.EntryPoint],
    plugins: Path | None = None,
) -> list[tuple[importlib.metadata.EntryPoint, IdrsError]]:
    """The third-party entry points of ``others`` the harness refuses, each with the error
    that says why (naming its distribution): a name that is not a plain name
    (:func:`name_problem`), a built-in's name (of ``builtins``) or one another distribution
    declares too (a :class:`DuplicateNameError`), or, given ``plugins`` (``<cache
    root>/plugins``), one whose artifact folder exists and resolves elsewhere
    (:func:`artifact_folder`). Such a plugin is never loaded: its name would name a folder
    it does not own."""
    builtin = {ep.name: ep for ep in builtins}
    declared: dict[str, set[str]] = {}
    for ep in others:
        declared.setdefault(ep.name, set()).add(distribution_of(ep))
    out: list[tuple[importlib.metadata.EntryPoint, IdrsError]] = []
    for ep in others:
        kind: type[IdrsError] = PluginNameError
        why = name_problem(ep.name)
        if why is None and ep.name in builtin:
            kind = DuplicateNameError
            why = (f"{ep.name!r} is the built-in plugin {builtin[ep.name].value!r} of "
                   f"{DISTRIBUTION} (its artifact folder <cache root>/plugins/{ep.name}/ is "
                   "the built-in's)")  # fmt: skip
        elif why is None and len(declared[ep.name]) > 1:
            kind = DuplicateNameError
            names = " and ".join(repr(d) for d in sorted(declared[ep.name]))
            why = (f"{ep.name!r} is declared by the distributions {names}, and a name is one "
                   "plugin's artifact folder: none of them is loaded")  # fmt: skip
        elif why is None and plugins is not None:
            try:
                artifact_folder(plugins, ep.name)
            except PluginNameError as exc:
                why = str(exc)
        if why is not None:
            out.append((ep, kind(f"the entry point {ep.name!r} = {ep.value!r} of the "
                                 f"distribution {distribution_of(ep)!r} is refused: {why}; "
                                 f"rename it (or uninstall the distribution), {NAMING}")))  # fmt: skip
    return out
