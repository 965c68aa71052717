"""``idrs-bench plugins install PATH``: a plugin built confined, into a prefix only its host imports.

A package's build backend (an sdist's ``setup.py``, or any PEP 517 backend) runs Python
of the plugin's author when it is built, before the harness could confine anything, and
``pip install`` writes wherever the environment lets it. :func:`install` instead builds
the wheel of a source folder or sdist, or takes a wheel, and installs it in a process
confined as a plugin host is (:mod:`harness.plugin.hosting.in_host.confinement`, its policy
:func:`~harness.plugin.hosting.shared.policy.install_build_policy`; no network: the build
uses this environment's build backend, ``pip wheel --no-build-isolation --no-index``,
and refuses a package whose backend is not installed here), writing only a staging
folder of the harness's. The installed files then move to the **private prefix**
``<cache root>/plugin-packages/<name>/`` (:mod:`harness.plugin.entry_points`), one
folder per distribution, which is never on the harness's module path: the harness reads
the entry points there and only that distribution's confined plugin host imports from it (a folder on
``sys.path``, not a site folder: a ``.pth`` file there is never run).

The package's dependencies are not installed: each must already be satisfied by this
environment (idrs-bench's own, numpy, torch, ...), else the install is refused, naming
them. What remains outside (a ``pip install`` the user runs, the harness's own
dependencies) is listed in docs/threat-model.md.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.foundation.errors import IdrsError, pip_command
from harness.plugin.entry_points import (
    ENTRY_POINT_GROUP,
    NAMING,
    PluginNameError,
    installed_prefixes,
    name_problem,
    normalized,
    prefix_root,
)
from harness.plugin.hosting.in_host.confinement import confine
from harness.plugin.hosting.shared import landlock
from harness.plugin.hosting.shared.policy import install_build_policy, refusal

DISTRIBUTION_NAME = re.compile(r"[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9]")
"""A distribution's name as the core metadata specification allows it (PEP 508): its
normalized form names the private prefix, one folder beneath ``plugin-packages``."""


def install(source: Path, quiet: bool = False) -> tuple[str, str, Path]:
    """Build (a source folder or sdist) and install (a wheel) ``source`` confined, into its
    private prefix; (name, version, prefix). A distribution installed so before is
    replaced."""
    source = Path(source).resolve()
    if not source.exists():
        raise IdrsError(f"{source} does not exist; give a plugin's source folder, sdist or wheel")
    reason = refusal(landlock.landlock_abi())
    if reason is not None:
        raise IdrsError(f"`idrs-bench plugins install` builds a plugin confined, and {reason}. "
                        "Install it with pip yourself instead (its build then runs unconfined)")  # fmt: skip
    if source.suffix != ".whl":
        missing = unmet_requirements(build_requirements(source))
        if missing:
            raise IdrsError(f"{source.name} is built by {', '.join(missing)}, not installed in "
                            "idrs-bench's environment; a plugin is built without network, with "
                            "this environment's build backend: install it there first (pip "
                            "install ...), or install the plugin's wheel")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="idrs-plugin-install-") as folder:
        staging = Path(folder)
        if source.is_dir():  # a copy: an in-tree build writes build/ and *.egg-info there
            copied = staging / "source" / source.name
            shutil.copytree(source, copied, symlinks=True,
                            ignore=shutil.ignore_patterns(".git", "build", "dist", "*.egg-info"))  # fmt: skip
        else:
            copied = staging / "source" / source.name
            copied.parent.mkdir()
            shutil.copyfile(source, copied)
        job = {"source": str(copied), "staging": str(staging), "wheel": source.suffix == ".whl"}
        done = subprocess.run([sys.executable, "-m", "harness.plugin.private_install",
                               json.dumps(job)], capture_output=True, text=True,
                              env=_environment(staging), cwd=staging)  # fmt: skip
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-12:])
            raise IdrsError(f"building or installing {source.name} failed (confined, without "
                            f"network, with this environment's build backend):\n{tail}")  # fmt: skip
        if not quiet and done.stdout.strip():
            print(done.stdout.strip().splitlines()[-1])
        target = staging / "target"
        name, version = _checked(target)
        prefix = prefix_root() / normalized(name)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        if prefix.is_symlink() or prefix.parent.resolve() / prefix.name != prefix.resolve():
            raise IdrsError(f"{prefix} is a symbolic link; remove it")  # (never written through)
        old = prefix.with_name(f".{prefix.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if prefix.exists():
            prefix.rename(old)
        shutil.move(str(target), str(prefix))
        shutil.rmtree(old, ignore_errors=True)
    return name, version, prefix


def uninstall(name: str) -> Path:
    """Remove the distribution ``name`` installed by :func:`install`; its former prefix."""
    prefixes = {normalized(k): v for k, v in installed_prefixes().items()}
    prefix = prefixes.get(normalized(name))
    if prefix is None:
        known = ", ".join(sorted(installed_prefixes())) or "none"
        raise IdrsError(f"no plugin {name!r} was installed by `idrs-bench plugins install` "
                        f"(installed so: {known}); one installed with pip is removed with "
                        "pip uninstall")  # fmt: skip
    shutil.rmtree(prefix)
    return prefix


def _environment(staging: Path) -> dict[str, str]:
    from harness.foundation.threads import child_environment

    env = child_environment()
    for name, sub in (("TMPDIR", "tmp"), ("HOME", "home"), ("XDG_CACHE_HOME", "cache")):
        (staging / "scratch" / sub).mkdir(parents=True, exist_ok=True)
        env[name] = str(staging / "scratch" / sub)
    return env | {"PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                  "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1"}  # fmt: skip


def _checked(target: Path) -> tuple[str, str]:
    """The one distribution pip installed in ``target``, checked: an idrs-bench plugin whose
    name and entry points' names are plain names (they name folders:
    :func:`~harness.plugin.entry_points.name_problem`), no symbolic link among its files,
    not installed in this environment already, and every requirement met by this
    environment."""
    links = [p for p in target.rglob("*") if p.is_symlink()]
    if links:
        raise IdrsError(f"the installed package holds symbolic links ({links[0].name}, ...); "
                        "refused: a plugin's files are its own")  # fmt: skip
    dists = list(importlib.metadata.distributions(path=[str(target)]))
    if len(dists) != 1:
        raise IdrsError(f"the build installed {len(dists)} distributions; expected one")
    dist = dists[0]
    name, version = dist.metadata["Name"], dist.version
    if not isinstance(name, str) or not DISTRIBUTION_NAME.fullmatch(name):
        raise IdrsError(f"the distribution's name {name!r} is not a valid distribution name "
                        "(letters, digits, '.', '_' and '-', beginning and ending with a "
                        "letter or digit: the packaging specifications' rule); refused: it "
                        "names its private prefix")  # fmt: skip
    entry_points = [ep for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP]
    if not entry_points:
        raise IdrsError(f"{name} {version} declares no {ENTRY_POINT_GROUP!r} entry point: it is "
                        "not an idrs-bench plugin")  # fmt: skip
    for ep in entry_points:
        problem = name_problem(ep.name)
        if problem is not None:
            raise PluginNameError(f"{name} {version} declares the entry point {ep.name!r}, "
                                  f"refused: {problem}; rename it ({NAMING})")  # fmt: skip
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        pass
    else:
        raise IdrsError(f"{name} is installed in idrs-bench's environment already (pip); "
                        f"`{pip_command('uninstall ' + name)}` first, so that only one copy "
                        "provides its plugins")  # fmt: skip
    missing = unmet_requirements(dist.requires or [])
    if missing:
        raise IdrsError(f"{name} {version} requires {', '.join(missing)}, not installed in "
                        "idrs-bench's environment; a plugin installed privately uses the "
                        "environment's packages: install them there first "
                        f"({pip_command('install ...')})")  # fmt: skip
    return name, version


def build_requirements(source: Path) -> list[str]:
    """What building a source folder or sdist needs (``[build-system] requires`` of its
    ``pyproject.toml``; setuptools without one, PEP 518), read without running it."""
    import tarfile
    import tomllib
    import zipfile

    text = None
    if source.is_dir():
        path = source / "pyproject.toml"
        text = path.read_text() if path.is_file() else None
    elif zipfile.is_zipfile(source):
        with zipfile.ZipFile(source) as archive:
            names = [n for n in archive.namelist() if n.count("/") == 1
                     and n.endswith("/pyproject.toml")]  # fmt: skip
            text = archive.read(names[0]).decode() if names else None
    else:
        try:
            with tarfile.open(source) as archive:
                members = [m for m in archive.getmembers() if m.isfile()
                           and m.name.count("/") == 1 and m.name.endswith("/pyproject.toml")]  # fmt: skip
                text = archive.extractfile(members[0]).read().decode() if members else None
        except tarfile.TarError:
            raise IdrsError(f"{source} is neither a folder, an sdist nor a wheel") from None
    if text is None:
        return ["setuptools>=40.8.0"]
    return list(tomllib.loads(text).get("build-system", {}).get("requires", ["setuptools>=40.8.0"]))


def unmet_requirements(requirements: list[str]) -> list[str]:
    """The requirements (PEP 508 strings) this environment does not satisfy; those of
    extras and of other platforms (markers) are left out."""
    from packaging.requirements import Requirement

    out = []
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            out.append(text)
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            out.append(f"{text} (here {version})")
    return out


def main(argv: list[str] | None = None) -> int:
    """The confined build: ``python -m harness.plugin.private_install JOB``, confined to
    read its Python and the source and to write the staging folder; pip builds the wheel
    (unless given one) and installs it into ``<staging>/target``."""
    job = json.loads((sys.argv[1:] if argv is None else argv)[0])
    staging, source = Path(job["staging"]), job["source"]
    confine(install_build_policy(str(staging)).landlock())  # (its build folder, no dataset)
    pip = [sys.executable, "-m", "pip", "--no-cache-dir", "--isolated"]
    wheel = source
    if not job["wheel"]:
        wheels = staging / "wheels"
        subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                        "--wheel-dir", str(wheels), source], check=True)  # fmt: skip
        [wheel] = [str(p) for p in wheels.glob("*.whl")]
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--no-compile", "--target",
                    str(staging / "target"), wheel], check=True)  # fmt: skip
    print(f"installed {Path(wheel).name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
