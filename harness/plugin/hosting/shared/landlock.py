"""Landlock's system calls: the kernel's ABI asked, a ruleset made of grants and applied.

Step 1 of a plugin host's confinement (:mod:`harness.plugin.hosting.in_host.confinement`;
docs/threat-model.md): Landlock (Linux security module;
docs.kernel.org/userspace-api/landlock.html) lets the filesystem be read and executed only
beneath :attr:`Grants.read`, written only beneath :attr:`Grants.write`, the device files of
:attr:`Grants.devices` and the process's own threads' files (:attr:`Grants.threads`) be
opened, governs TCP bind and connect (ABI 4) and scopes signals and abstract UNIX sockets
(ABI 6). What a host is granted is the policy's
(:func:`harness.plugin.hosting.shared.policy.host_policy`); this module only speaks to the
kernel. The harness asks it the kernel's ABI (:func:`landlock_abi`), the confined process
applies its ruleset (:func:`restrict`).

The system calls are made with :mod:`ctypes` (``landlock_create_ruleset`` 444,
``landlock_add_rule`` 445, ``landlock_restrict_self`` 446, the same on every
architecture): no dependency, and the ABI is small, versioned and stable. The Python
bindings on PyPI are thin wrappers of the same calls, young (the ``landlock`` package was
at 1.0.0.dev5 in 2025) and not packaged by distributions.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from harness.foundation.errors import IdrsError
from harness.plugin.hosting.shared.process_privileges import no_new_privileges

FIRST_LINUX = {1: "5.13", 2: "5.19", 3: "6.2", 4: "6.7", 5: "6.10", 6: "6.12", 7: "6.15"}
"""The first Linux of each Landlock ABI (filesystem rules; cross-directory rename and link;
truncate; TCP bind and connect; ioctl on device files; signal and abstract-socket scoping;
audit logging)."""
LANDLOCK_LAYERS = ("landlock-fs", "landlock-net")
"""Landlock's two layers of the confinement
(:data:`~harness.plugin.hosting.shared.policy.LAYERS`): its filesystem rules (files,
devices and threads, with its ptrace restriction); its TCP rules and its scoping of
signals and abstract UNIX sockets."""

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


# --- the ruleset ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Grants:
    """What a confined host may reach: ``read`` (read and execute beneath each path),
    ``write`` (everything beneath), ``devices`` (:data:`DEVICE` on each device file or
    folder of them), ``threads`` (:data:`THREAD_NAMES` beneath each: the policy sets it to
    the process's own ``/proc/<pid>/task``,
    :func:`~harness.plugin.hosting.shared.policy.own_threads`). A path that does not exist
    is left out."""

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    threads: tuple[str, ...] = ()


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
            layers: Iterable[str] = LANDLOCK_LAYERS) -> Ruleset:  # fmt: skip
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
