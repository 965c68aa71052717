"""What a confined plugin host may reach, in one place: :func:`host_policy`, read top to bottom.

Every path a confined host reads, writes or opens is one :class:`Grant` of the policy, with
what it is and why the host needs it; the system calls the seccomp filter refuses are
:data:`~harness.plugin.hosting.shared.process_privileges.SYSTEM_CALLS`, each with its rule
and reason; the host's memory is its memory cgroup's limit. docs/threat-model.md's tables
("What a host may reach, and why"; "What the seccomp filter refuses, and why") say the
same, and tests/test_confinement.py holds the two to each other.

The policy is made in the confined process (its Python's paths, its own pid are that
process's), from what only the harness knows of the host it starts (:class:`HostPaths`:
what it sends, the data roots, the artifact folders, the scratch folder, the GPU's device
files). Enforcing it is :func:`harness.plugin.hosting.in_host.confinement.confine`'s
(Landlock: :mod:`~harness.plugin.hosting.shared.landlock`; no capabilities and seccomp:
:mod:`~harness.plugin.hosting.shared.process_privileges`). A plugin's confined build
(``idrs-bench plugins install``) takes the same policy with only its build folder
(:func:`install_build_policy`).

Below :data:`MINIMUM_ABI` a third-party plugin is refused (:func:`refusal`) unless the
user opts out with ``--unconfined`` (:data:`UNCONFINED_ENV`;
:mod:`harness.plugin.hosting.in_harness.confinement_options`).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from harness.plugin.hosting.shared.landlock import FIRST_LINUX, LANDLOCK_LAYERS, Grants
from harness.plugin.hosting.shared.memory_cgroup import MemoryCgroup
from harness.plugin.hosting.shared.process_privileges import (
    SYSTEM_CALLS,
    SystemCall,
)
from harness.plugin.hosting.shared.withheld_data import narrowed

LAYERS = (*LANDLOCK_LAYERS, "capabilities", "seccomp")
"""The confinement's layers: Landlock's filesystem rules (step 1's files, devices and
threads, with its ptrace restriction); Landlock's TCP rules and its scoping of signals and
abstract UNIX sockets (step 1's rest); the emptied capability sets (step 2); the seccomp
filter (step 3)."""
MINIMUM_ABI = 3
"""The lowest Landlock ABI a third-party plugin host is confined with: ABI 3 (Linux 6.2)
governs ``truncate(2)``, without which a host could empty any file it can name (the run
database's path is on the harness's command line)."""
UNCONFINED_ENV = "IDRS_BENCH_UNCONFINED"
"""``1``: third-party plugins run in plugin hosts that are not confined (``--unconfined``);
every run made so records it."""

READ, WRITE, DEVICE, THREAD_NAMES = "read", "write", "device", "thread names"
"""The rights of a :class:`Grant`: read and execute beneath it; everything beneath it;
open the device file (or those of the folder) for reading, writing and ``ioctl``; write a
thread's name beneath it (Landlock's rights of each:
:data:`~harness.plugin.hosting.shared.landlock.READ`, all it governs,
:data:`~harness.plugin.hosting.shared.landlock.DEVICE`,
:data:`~harness.plugin.hosting.shared.landlock.THREAD_NAMES`)."""

SYSTEM_LIBRARIES = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin")
KERNEL_FILES = ("/proc", "/sys")
SYSTEM_CONFIGURATION = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
                        "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf",
                        "/etc/os-release", "/etc/lsb-release", "/etc/debian_version",
                        "/etc/redhat-release", "/etc/mime.types")  # fmt: skip
SYSTEM_READ = (*SYSTEM_LIBRARIES, *KERNEL_FILES, *SYSTEM_CONFIGURATION)
"""System paths a host reads: libraries and programs, ``/proc`` and ``/sys`` (another
process's memory, environment and file descriptors stay out of reach: Landlock refuses
the ptrace access they need), and the few files of ``/etc`` that the C library, Python
and torch read (never the whole of it: the host may run as root)."""
SYSTEM_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
GPU_DEVICE_PREFIX = "nvidia"
"""How NVIDIA's device files are named (:func:`gpu_devices`, :func:`grants_gpu`)."""


@dataclass(frozen=True)
class HostPaths:
    """What only the harness knows of a host it starts, sent in its start message: ``sent``,
    the folder the harness writes the host's inputs to; ``data_roots``, where its datasets
    are asked to load from; ``builtin_artifacts``, the built-in plugins' artifact folders;
    ``scratch``, its scratch folder; ``artifacts``, its plugins' artifact folders
    (:func:`~harness.plugin.entry_points.artifact_grants`); ``gpu``, NVIDIA's device files
    (:func:`gpu_devices`). :func:`host_policy` says what each is granted."""

    sent: str | None = None
    data_roots: tuple[str, ...] = ()
    builtin_artifacts: tuple[str, ...] = ()
    scratch: str | None = None
    artifacts: tuple[str, ...] = ()
    gpu: tuple[str, ...] = ()

    def to_message(self) -> dict[str, Any]:
        return {"sent": self.sent, "data_roots": list(self.data_roots),
                "builtin_artifacts": list(self.builtin_artifacts), "scratch": self.scratch,
                "artifacts": list(self.artifacts), "gpu": list(self.gpu)}  # fmt: skip

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> HostPaths:
        def paths(key: str) -> tuple[str, ...]:
            return tuple(str(p) for p in message.get(key) or ())

        def path(key: str) -> str | None:
            return None if message.get(key) is None else str(message[key])

        return cls(path("sent"), paths("data_roots"), paths("builtin_artifacts"),
                   path("scratch"), paths("artifacts"), paths("gpu"))  # fmt: skip


@dataclass(frozen=True)
class Grant:
    """Paths a confined host may reach: ``what`` they are (as docs/threat-model.md's table
    names them), the ``right`` it has beneath each (:data:`READ`, :data:`WRITE`,
    :data:`DEVICE`, :data:`THREAD_NAMES`), and ``why``."""

    what: str
    right: str
    paths: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Policy:
    """What a confined host may reach (:attr:`grants`, each path with its reason), the
    system calls its seccomp filter governs (:attr:`system_calls`) and its memory cgroup
    (:attr:`memory`; None: it has none)."""

    grants: tuple[Grant, ...]
    system_calls: tuple[SystemCall, ...] = SYSTEM_CALLS
    memory: MemoryCgroup | None = field(default=None)

    def landlock(self) -> Grants:
        """The grants as Landlock's rules take them: the paths of each right, each once."""
        by_right = {right: [p for g in self.grants if g.right == right for p in g.paths]
                    for right in (READ, WRITE, DEVICE, THREAD_NAMES)}  # fmt: skip
        return Grants(*(tuple(dict.fromkeys(paths)) for paths in by_right.values()))

    def cuda_socket(self) -> bool:
        """Whether the filter lets the CUDA driver's socket through (:func:`grants_gpu`)."""
        return grants_gpu(self.landlock())


def host_policy(paths: HostPaths, distribution: str | None = None, prefix: str | None = None,
                memory: MemoryCgroup | None = None) -> Policy:  # fmt: skip
    """What a confined plugin host may reach: ``paths`` (:class:`HostPaths`), its
    ``distribution``'s files (installed in ``prefix`` by ``idrs-bench plugins install``),
    and ``memory``, the cgroup it has joined. Called in the host, before it is confined: a
    path that does not exist is left out, and what the host reads of the system, its Python
    and its distribution is granted less the installed datasets
    (:func:`~harness.plugin.hosting.shared.withheld_data.narrowed`)."""

    def grant(what: str, right: str, granted: Iterable[str], why: str,
              withheld: bool = False) -> Grant:  # fmt: skip
        granted = list(granted)
        return Grant(what, right, existing(narrowed(granted) if withheld else granted), why)

    grants = (
        # --- read (and execute) -----------------------------------------------------------
        grant("its Python", READ, python_installation(),
              "its installation and every sys.path entry: the interpreter, the standard "
              "library, site-packages (numpy, torch, the plugins installed with pip)",
              withheld=True),
        grant("the harness's packages", READ, harness_packages(),
              "the folders of harness and the built-in plugins, which every host loads (an "
              "editable install maps them outside sys.path)", withheld=True),
        grant("system libraries and programs", READ, SYSTEM_LIBRARIES,
              "the C library, CUDA's and the other shared libraries torch loads, less "
              "/usr/share/datasets (the installed public datasets, test splits included)",
              withheld=True),
        grant("/proc and /sys", READ, KERNEL_FILES,
              "what the C library, Python, torch and the CUDA driver read of the system; "
              "another process's memory, environment and descriptors stay closed (Landlock's "
              "ptrace restriction)", withheld=True),
        grant("a few files of /etc", READ, SYSTEM_CONFIGURATION,
              "the loader's cache, passwd, group, localtime, ...: what the C library, Python "
              "and torch read; never the whole of /etc (the host may run as root)",
              withheld=True),
        grant("its distribution's files", READ, distribution_paths(distribution, prefix),
              "its private prefix (idrs-bench plugins install) and the source folder of an "
              "editable install: the plugins' code", withheld=True),
        grant("what the harness sends", READ, [paths.sent] if paths.sent else [],
              "large dataset arrays, as .npy files, in a folder the host cannot write (so "
              "nothing it does redirects the harness's writes)"),
        grant("its datasets' data roots", READ, paths.data_roots,
              "where a third-party dataset is asked to load from (a host asked for a new one "
              "is started again)"),
        grant("the built-in plugins' artifact folders", READ, paths.builtin_artifacts,
              "a built-in σ-provider built in the host by name finds what the harness's own "
              "copy fitted"),
        # --- write (everything beneath) ---------------------------------------------------
        grant("its scratch folder", WRITE, [paths.scratch] if paths.scratch else [],
              "its $TMPDIR, $HOME and caches, made by the harness and removed when the host "
              "ends"),
        grant("its plugins' artifact folders", WRITE, paths.artifacts,
              "<cache root>/plugins/<entry point>/, each a plain name of its own, resolved "
              "and checked to be that folder: where its plugins keep what they fit"),
        # --- device files -----------------------------------------------------------------
        grant("/dev/null, /dev/zero, /dev/full, /dev/random, /dev/urandom", DEVICE,
              SYSTEM_DEVICES, "what the C library and Python open"),
        grant("NVIDIA's device files", DEVICE, paths.gpu,
              "where the harness runs on a GPU: the driver's control, each GPU, unified "
              "memory, MIG's capabilities (docs/threat-model.md, \"What a host on a GPU is "
              "granted, and why\")"),
        # --- its own threads' files (not checked for existence: its own) -------------------
        Grant("its own threads' files", THREAD_NAMES, (own_threads(),),
              "the CUDA driver names the threads it starts (pthread_setname_np writes "
              "/proc/self/task/<tid>/comm); only the host's own /proc/<pid>/task"),
    )  # fmt: skip
    return Policy(grants, SYSTEM_CALLS, memory)


def install_build_policy(build: str) -> Policy:
    """What a plugin's confined build (``idrs-bench plugins install``) may reach:
    :func:`host_policy` with its build folder as its scratch folder, and nothing else of a
    host's: nothing sent, no data root, no artifact folder, no distribution's files (it
    builds from a copy in its build folder), no GPU, no memory cgroup. So it reads its
    Python and the system's files less the installed datasets (a build could copy a test
    split into its package) and writes its build folder only."""
    return host_policy(HostPaths(scratch=build))


# --- the paths ------------------------------------------------------------------------------


def python_installation() -> list[str]:
    """What this Python reads of itself: its installation and every ``sys.path`` entry."""
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable),
             os.path.realpath(sys.executable), *(p for p in sys.path if p)]  # fmt: skip
    return list(dict.fromkeys(os.path.abspath(p) for p in paths))


def harness_packages() -> list[str]:
    """The folders of ``harness`` and the built-in ``plugins`` (an editable install maps
    them)."""
    import importlib.util

    paths: list[str] = []
    for package in ("harness", "plugins"):
        spec = importlib.util.find_spec(package)
        if spec is not None:
            paths += list(spec.submodule_search_locations or ())
    return list(dict.fromkeys(os.path.abspath(p) for p in paths))


def python_paths() -> list[str]:
    """What this Python reads: its installation, every ``sys.path`` entry and the folders
    of ``harness`` and the built-in ``plugins`` (an editable install maps them)."""
    return list(dict.fromkeys([*python_installation(), *harness_packages()]))


def distribution_paths(name: str | None, prefix: str | None) -> list[str]:
    """What a distribution's code is read from: its private prefix, and the source folder
    of an editable install (``direct_url.json``, PEP 610)."""
    paths = [] if prefix is None else [prefix]
    if name is None:
        return paths
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return paths
    described = json.loads(dist.read_text("direct_url.json") or "{}")
    url = urlparse(str(described.get("url", "")))
    if url.scheme == "file" and described.get("dir_info", {}).get("editable"):
        paths.append(unquote(url.path))
    return paths


def gpu_devices(root: str = "/dev") -> list[str]:
    """NVIDIA's device files beneath ``root``, when present: ``nvidiactl`` (the driver's
    control), ``nvidia<N>`` (each GPU), ``nvidia-uvm`` (unified memory, which CUDA opens at
    ``cuInit``), ``nvidia-uvm-tools`` (its profiling events), ``nvidia-modeset`` and the
    folder ``nvidia-caps/`` (MIG's capabilities, which the driver lists and reads)."""
    return sorted(str(p) for p in Path(root).glob(f"{GPU_DEVICE_PREFIX}*"))


def own_threads() -> str:
    """This process's ``/proc/<pid>/task``: its threads' folders (``<tid>/comm``, a
    thread's name, which ``pthread_setname_np(3)`` writes, as the CUDA driver does for the
    threads it starts in ``cuInit``). Beneath it, besides ``comm``, are the other per-thread
    files of this process alone, each checked by the kernel as for any process writing its
    own (docs/threat-model.md lists them)."""
    return f"/proc/{os.getpid()}/task"


def grants_gpu(grants: Grants) -> bool:
    """Whether ``grants`` give a GPU's device files (NVIDIA's, named as :func:`gpu_devices`
    finds them): decided from the names the harness granted, since a confined host can no
    longer list ``/dev``."""
    return any(os.path.basename(path).startswith(GPU_DEVICE_PREFIX) for path in grants.devices)


def existing(paths: Iterable[str]) -> tuple[str, ...]:
    """The paths that exist, each once, in order."""
    return tuple(p for p in dict.fromkeys(paths) if os.path.exists(p))


# --- the kernel -----------------------------------------------------------------------------


def refusal(abi: int) -> str | None:
    """Why third-party plugins cannot run confined on a kernel of Landlock ``abi`` (None
    when they can): the kernel feature, and the explicit opt-out."""
    if abi >= MINIMUM_ABI:
        return None
    found = (f"Landlock ABI {abi}, which cannot refuse truncate(2)" if abi else
             "no Landlock (Linux < 5.13, or not enabled at boot: add landlock to the lsm= "
             "kernel parameter)")  # fmt: skip
    return (
        f"third-party plugins run only in a plugin host confined by the kernel, which needs "
        f"the Landlock security module at ABI >= {MINIMUM_ABI} (Linux >= "
        f"{FIRST_LINUX[MINIMUM_ABI]}; TCP rules need ABI 4, Linux >= 6.7; signal scoping ABI "
        f"6, Linux >= 6.12); this kernel ({platform.release()}) has {found}. Run on a newer "
        f"kernel, leave the plugins out (IDRS_BENCH_PLUGINS=''), or run them unconfined with "
        f"--unconfined ({UNCONFINED_ENV}=1; recorded with the run and on its board: a plugin "
        "can then reach the harness's files and processes, docs/threat-model.md)"
    )
