"""The plugin host's confinement: what third-party code may reach, enforced by the kernel.

A plugin host (:mod:`harness.plugin.hosting.host`) confines itself before it imports anything but
the standard library and ``harness``'s light modules, and before it starts a thread (the
kernel confines the calling thread, and its later threads and children inherit it; a
thread started earlier would stay outside), in three steps (docs/threat-model.md):

1. **Landlock** (Linux security module; docs.kernel.org/userspace-api/landlock.html): the
   filesystem reads and executes only beneath :attr:`Grants.read` (the Python installation
   and every ``sys.path`` entry, the harness's packages, system libraries, the files the
   harness sends), writes only beneath :attr:`Grants.write` (a scratch directory the
   harness creates and deletes, the plugin's own artifact directories), the device
   files of :attr:`Grants.devices` and its own threads' files (:attr:`Grants.threads`:
   the CUDA driver names its threads); no TCP bind or connect (ABI 4); signals and
   abstract UNIX sockets scoped to the host's own domain (ABI 6); a Landlock-confined
   process cannot ptrace, nor read or write the memory of (``/proc/<pid>/mem``), a process
   outside its domain, the harness included. Rights a running kernel's ABI lacks are left
   out of the ruleset (:func:`ruleset`); below :data:`MINIMUM_ABI` (no ``truncate(2)``
   rule) the harness refuses to start a third-party plugin confined (:func:`refusal`).
2. **No capabilities** (:mod:`harness.plugin.hosting.process_privileges`, as step 3): the
   bounding, ambient, effective, permitted and inheritable sets emptied (a root host keeps
   uid 0 but not ``CAP_DAC_READ_SEARCH``'s ``open_by_handle_at(2)``, which bypasses path
   rules, nor any other privilege), after ``PR_SET_NO_NEW_PRIVS`` (no set-uid or file
   capabilities through ``execve``).
3. **seccomp**: ``socket(2)`` and ``io_uring_setup(2)`` fail with EPERM (Landlock has no
   rule for UDP nor for connecting to a named UNIX socket, e.g. a system bus through which
   root starts services, or a Ray node's; io_uring can open sockets without the system
   call), and so do ``chown``-family calls and ``chmod``-family calls that set the set-uid or
   set-gid bit (Landlock does not govern a file's metadata). ``socketpair(2)`` stays for
   connected pairs only (``AF_UNIX`` stream and seqpacket: multiprocessing's pipes), and
   ``sendto(2)`` without an address; in a host granted a GPU's device files, the CUDA
   driver's ``socket(AF_UNIX, SOCK_SEQPACKET)``, without which ``cuInit`` fails
   (:data:`~harness.plugin.hosting.process_privileges.CUDA_SOCKET`). The calls that change
   another process named by its pid, which Landlock's scoping does not cover
   (``prlimit64``, ``setpriority``, ``sched_setaffinity``, ...), fail unless the pid is 0 or
   the host's own, and System V IPC, POSIX message queues and keyrings, which outlive the
   host, fail whole (:data:`~harness.plugin.hosting.process_privileges.SYSTEM_CALLS`).
   libgomp's thread binding (``OMP_PROC_BIND``, ...) is taken out of the environment first:
   it binds a new thread by its id, which the filter refuses
   (:data:`~harness.plugin.hosting.process_privileges.THREAD_BINDING`).

The steps are the layers of :data:`LAYERS` (step 1 two of them); a host takes all of
them, and only the diagnostic ``python -m harness.plugin.hosting.confinement_probe`` starts hosts
with one alone, to say which layer a device driver's initialization needs something from.

The system calls are made with :mod:`ctypes` (``landlock_create_ruleset`` 444,
``landlock_add_rule`` 445, ``landlock_restrict_self`` 446, the same on every
architecture): no dependency, and the ABI is small, versioned and stable. The Python
bindings on PyPI are thin wrappers of the same calls, young (the ``landlock`` package was
at 1.0.0.dev5 in 2025) and not packaged by distributions.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness.foundation.environment import variable_set
from harness.foundation.errors import IdrsError
from harness.plugin.hosting.process_privileges import (
    SECCOMP_MACHINES,
    drop_capabilities,
    install_seccomp,
    no_new_privileges,
    unbind_threads,
)

MINIMUM_ABI = 3
"""The lowest Landlock ABI a third-party plugin host is confined with: ABI 3 (Linux 6.2)
governs ``truncate(2)``, without which a host could empty any file it can name (the run
database's path is on the harness's command line)."""
UNCONFINED_ENV = "IDRS_BENCH_UNCONFINED"
"""``1``: third-party plugins run in plugin hosts that are not confined (``--unconfined``);
every run made so records it."""
_LINUX = {1: "5.13", 2: "5.19", 3: "6.2", 4: "6.7", 5: "6.10", 6: "6.12", 7: "6.15"}
"""The first Linux of each Landlock ABI (filesystem rules; cross-directory rename and link;
truncate; TCP bind and connect; ioctl on device files; signal and abstract-socket scoping;
audit logging)."""

# --- Landlock's constants (include/uapi/linux/landlock.h) ---------------------------------

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REMOVE_DIR, FS_REMOVE_FILE, FS_MAKE_CHAR, FS_MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
FS_MAKE_REG, FS_MAKE_SOCK, FS_MAKE_FIFO, FS_MAKE_BLOCK = 1 << 8, 1 << 9, 1 << 10, 1 << 11
FS_MAKE_SYM, FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 12, 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
"""The filesystem rights an ABI governs (ABI 4 adds none; later ABIs none so far)."""
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
"""The rights a rule on a file (not a directory) may grant."""
READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
DEVICE = FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV | FS_READ_DIR
"""On a device file: open it for reading and writing, and its ``ioctl(2)`` commands (how a
driver is spoken to; ABI 5); on a folder of device files (``/dev/nvidia-caps/``): list it,
and the same on every device file beneath."""
THREAD_NAMES = FS_WRITE_FILE | FS_TRUNCATE
"""Beneath the host's own ``/proc/<pid>/task``: write a file there (reading is the
``/proc`` rule's). ``pthread_setname_np(3)`` on another thread opens
``/proc/self/task/<tid>/comm`` for reading and writing, and ``open(..., "w")`` truncates
too (a procfs file has no length to cut); nothing can be made, removed or linked in
procfs, so no other right applies there."""
LAYERS = ("landlock-fs", "landlock-net", "capabilities", "seccomp")
"""The confinement's layers: Landlock's filesystem rules (step 1's files, devices and
threads, with its ptrace restriction); Landlock's TCP rules and its scoping of signals and
abstract UNIX sockets (step 1's rest); the emptied capability sets (step 2); the seccomp
filter (step 3)."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = (("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64))  # fmt: skip


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _syscall(number: int, *args) -> int:
    result = _libc.syscall(ctypes.c_long(number), *args)
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


def landlock_abi() -> int:
    """The running kernel's Landlock ABI version; 0 when it has none (no such system call,
    or Landlock not enabled at boot: ``lsm=`` lacks ``landlock``)."""
    if sys.platform != "linux":
        return 0
    try:
        return _syscall(_CREATE_RULESET, None, ctypes.c_size_t(0),
                        ctypes.c_uint32(_CREATE_RULESET_VERSION))  # fmt: skip
    except OSError:
        return 0


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
        f"the Landlock security module at ABI >= {MINIMUM_ABI} (Linux >= {_LINUX[MINIMUM_ABI]}; "
        f"TCP rules need ABI 4, Linux >= 6.7; signal scoping ABI 6, Linux >= 6.12); this "
        f"kernel ({platform.release()}) has {found}. Run on a newer kernel, leave the plugins "
        f"out (IDRS_BENCH_PLUGINS=''), or run them unconfined with --unconfined "
        f"({UNCONFINED_ENV}=1; recorded with the run and on its board: a plugin can then "
        "reach the harness's files and processes, docs/threat-model.md)"
    )


def unconfined_requested() -> bool:
    """Whether the user opted out of confinement (``--unconfined``, ``$IDRS_BENCH_UNCONFINED``)."""
    value = os.environ.get(UNCONFINED_ENV, "")
    if value not in ("", "0", "1"):
        raise IdrsError(f"{UNCONFINED_ENV}={value!r}; use 1 (plugins unconfined) or leave it unset")
    return value == "1"


def hosts_confined(third_party: bool) -> bool:
    """Whether plugin hosts confine themselves: yes, unless the user asked otherwise
    (:func:`unconfined_requested`); on a kernel that cannot confine them, a host of
    third-party plugins is refused (one error naming the kernel feature and the opt-out),
    and one of built-ins only runs unconfined."""
    if unconfined_requested():
        return False
    reason = refusal(landlock_abi())
    if reason is not None and third_party:
        raise IdrsError(reason)
    return reason is None


def add_unconfined_option(parser) -> None:
    """``--unconfined`` on an ``argparse`` parser (its command sets :data:`UNCONFINED_ENV`)."""
    parser.add_argument(
        "--unconfined", action="store_true",
        help="run third-party plugins in plugin hosts the kernel does not confine (on a kernel "
        "without Landlock); recorded with the run and on its board (docs/threat-model.md)",
    )  # fmt: skip


@contextmanager
def opted_out(unconfined: bool) -> Iterator[None]:
    """With ``unconfined`` (``--unconfined``), :data:`UNCONFINED_ENV` is set while the block
    runs (its subprocesses inherit it), then restored."""
    with variable_set(UNCONFINED_ENV, "1" if unconfined else None):
        yield


def description(abi: int) -> str:
    """How a host of Landlock ``abi`` is confined, as a run records it (0: unconfined)."""
    if abi <= 0:
        return "unconfined"
    return f"Landlock ABI {abi}, no capabilities, no sockets"


# --- the ruleset ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Grants:
    """What a confined host may reach: ``read`` (read and execute beneath each path),
    ``write`` (everything beneath), ``devices`` (:data:`DEVICE` on each device file or
    folder of them), ``threads`` (:data:`THREAD_NAMES` beneath each: :func:`confine` sets
    it to the process's own ``/proc/<pid>/task``). A path that does not exist is left out."""

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    threads: tuple[str, ...] = ()

    def to_message(self) -> dict[str, list[str]]:
        return {"read": list(self.read), "write": list(self.write), "devices": list(self.devices)}

    @classmethod
    def from_message(cls, message: dict) -> Grants:
        return cls(*(tuple(str(p) for p in message.get(k, ())) for k in ("read", "write",
                                                                          "devices")))  # fmt: skip


@dataclass(frozen=True)
class Ruleset:
    """A Landlock ruleset for one ABI: the rights it governs and the rules that grant some."""

    abi: int
    handled_fs: int
    handled_net: int
    scoped: int
    rules: tuple[tuple[str, int], ...] = field(default=())
    """(path, rights) per rule, each within what its kind of file may be granted."""
    pinned: tuple[str, ...] = ()
    """The rules' paths that :func:`restrict` keeps open for the process's lifetime."""


def ruleset(grants: Grants, abi: int, is_dir: Callable[[str], bool] = os.path.isdir,
            layers: Iterable[str] = LAYERS) -> Ruleset:  # fmt: skip
    """The ruleset of ``grants`` on a kernel of Landlock ``abi`` (≥ 1): every filesystem
    right the ABI knows is governed (layer ``landlock-fs``), TCP (ABI ≥ 4) with no port
    allowed and signals and abstract sockets (ABI ≥ 6) scoped (layer ``landlock-net``);
    each rule keeps the rights the ABI governs, and on a file only those a file may be
    granted. The rules of :attr:`Grants.threads` are pinned: procfs makes a process's
    folders as they are looked up, and a rule holds the folder it was made on, so the
    folder must stay (:func:`restrict`)."""
    if abi < 1:
        raise ValueError("a Landlock ruleset needs ABI >= 1")
    layers = set(layers)
    handled_fs = FS_BY_ABI[max(a for a in FS_BY_ABI if a <= abi)] if "landlock-fs" in layers else 0
    net = "landlock-net" in layers
    handled_net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 and net else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 and net else 0
    rules: dict[str, int] = {}
    for paths, rights in ((grants.read, READ), (grants.write, handled_fs),
                          (grants.devices, DEVICE), (grants.threads, THREAD_NAMES)):  # fmt: skip
        for path in paths if handled_fs else ():
            allowed = rights & handled_fs
            if not is_dir(path):
                allowed &= FILE_RIGHTS
            rules[path] = rules.get(path, 0) | allowed
    pinned = tuple(p for p in grants.threads if p in rules)
    return Ruleset(abi, handled_fs, handled_net, scoped, tuple(rules.items()), pinned)


_PINNED: dict[str, int] = {}
"""The folders of :attr:`Ruleset.pinned`, each held by an ``O_PATH`` descriptor for the
process's lifetime."""


def restrict(rules: Ruleset) -> None:
    """Apply ``rules`` to this thread (and its future threads and children), for good.

    A Landlock rule holds the inode of the folder it was made on. A procfs folder such as
    ``/proc/<pid>/task`` is made when it is looked up and dropped with its dentry (memory
    pressure, ``drop_caches``): looked up again, it is another inode, which no rule names.
    The folders of :attr:`Ruleset.pinned` keep their ``O_PATH`` descriptor open, so their
    dentry, and the inode the rule holds, stay for the process's lifetime."""
    if not (rules.handled_fs or rules.handled_net or rules.scoped):
        raise IdrsError(f"Landlock ABI {rules.abi} governs nothing of the layers asked for "
                        "(TCP rules need ABI 4, scoping ABI 6)")  # fmt: skip
    attr = _RulesetAttr(rules.handled_fs, rules.handled_net, rules.scoped)
    fd = _syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)),
                  ctypes.c_uint32(0))  # fmt: skip
    try:
        for path, allowed in rules.rules:
            try:
                parent = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                beneath = _PathBeneathAttr(allowed, parent)
                _syscall(_ADD_RULE, ctypes.c_int(fd), ctypes.c_int(_RULE_PATH_BENEATH),
                         ctypes.byref(beneath), ctypes.c_uint32(0))  # fmt: skip
            except BaseException:
                os.close(parent)
                raise
            if path in rules.pinned:
                _PINNED[path] = parent
            else:
                os.close(parent)
        no_new_privileges()
        _syscall(_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0))
    finally:
        os.close(fd)


# --- this process ----------------------------------------------------------------------------


def python_paths() -> list[str]:
    """What this Python reads: its installation, every ``sys.path`` entry and the folders
    of ``harness`` and the built-in ``plugins`` (an editable install maps them)."""
    import importlib.util

    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable),
             os.path.realpath(sys.executable), *(p for p in sys.path if p)]  # fmt: skip
    for package in ("harness", "plugins"):
        spec = importlib.util.find_spec(package)
        if spec is not None:
            paths += list(spec.submodule_search_locations or ())
    return list(dict.fromkeys(os.path.abspath(p) for p in paths))


SYSTEM_READ = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/proc", "/sys",
               "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
               "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/os-release",
               "/etc/lsb-release", "/etc/debian_version", "/etc/redhat-release",
               "/etc/mime.types")  # fmt: skip
"""System paths a host reads: libraries and programs, ``/proc`` and ``/sys`` (another
process's memory, environment and file descriptors stay out of reach: Landlock refuses
the ptrace access they need), and the few files of ``/etc`` that the C library, Python
and torch read (never the whole of it: the host may run as root)."""
SYSTEM_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


GPU_DEVICE_PREFIX = "nvidia"
"""How NVIDIA's device files are named (:func:`gpu_devices`, :func:`grants_gpu`)."""


def gpu_devices(root: str = "/dev") -> list[str]:
    """NVIDIA's device files beneath ``root``, when present: ``nvidiactl`` (the driver's
    control), ``nvidia<N>`` (each GPU), ``nvidia-uvm`` (unified memory, which CUDA opens at
    ``cuInit``), ``nvidia-uvm-tools`` (its profiling events), ``nvidia-modeset`` and the
    folder ``nvidia-caps/`` (MIG's capabilities, which the driver lists and reads)."""
    return sorted(str(p) for p in Path(root).glob(f"{GPU_DEVICE_PREFIX}*"))


def thread_count() -> int:
    """The threads of this process."""
    return len(os.listdir("/proc/self/task"))


def own_threads() -> str:
    """This process's ``/proc/<pid>/task``: its threads' folders (``<tid>/comm``, a
    thread's name, which ``pthread_setname_np(3)`` writes, as the CUDA driver does for the
    threads it starts in ``cuInit``). Beneath it, besides ``comm``, are the other per-thread
    files of this process alone, each checked by the kernel as for any process writing its
    own (docs/threat-model.md lists them)."""
    return f"/proc/{os.getpid()}/task"


def confine(grants: Grants, abi: int | None = None, layers: Iterable[str] = LAYERS) -> Ruleset:
    """Confine this process for good (steps 1–3 of the module docstring; ``layers``: of
    :data:`LAYERS`, all but for the diagnostic probe) and return the Landlock ruleset
    applied. Its own threads' files are granted (:func:`own_threads`, pinned). Refused
    (:class:`IdrsError`) while it has other threads, which would stay unconfined, and on a
    kernel below :data:`MINIMUM_ABI`."""
    layers = tuple(layers)
    unknown = [layer for layer in layers if layer not in LAYERS]
    if unknown:
        raise IdrsError(f"unknown confinement layer(s) {unknown}; choose from {', '.join(LAYERS)}")
    abi = landlock_abi() if abi is None else abi
    landlock = any(layer.startswith("landlock") for layer in layers)
    reason = refusal(abi)
    if reason is not None and landlock:
        raise IdrsError(reason)
    if thread_count() != 1:
        raise IdrsError(f"the plugin host has {thread_count()} threads before it is confined; "
                        "a thread started before confinement would stay unconfined")  # fmt: skip
    grants = replace(grants, threads=(own_threads(),))
    rules = ruleset(grants, abi, layers=layers) if landlock else Ruleset(0, 0, 0, 0)
    machine = platform.machine()
    if machine not in SECCOMP_MACHINES and "seccomp" in layers:
        raise IdrsError(f"the plugin host's seccomp filter knows x86_64 and aarch64, not "
                        f"{machine}; run with --unconfined on this machine")  # fmt: skip
    if "capabilities" in layers:
        drop_capabilities()
    if landlock:
        restrict(rules)
    if "seccomp" in layers:  # the CUDA driver's socket where a GPU's device files are granted
        unbind_threads()  # (before libgomp loads: it would bind its threads by their ids)
        install_seccomp(machine, unix_seqpacket=grants_gpu(grants))
    return rules


def grants_gpu(grants: Grants) -> bool:
    """Whether ``grants`` give a GPU's device files (NVIDIA's, named as :func:`gpu_devices`
    finds them): decided from the names the harness granted, since a confined host can no
    longer list ``/dev``."""
    return any(os.path.basename(path).startswith(GPU_DEVICE_PREFIX) for path in grants.devices)


def existing(paths: Iterable[str]) -> tuple[str, ...]:
    """The paths that exist, each once, in order."""
    return tuple(p for p in dict.fromkeys(paths) if os.path.exists(p))
