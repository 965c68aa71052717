"""A plugin host's memory cgroup: the memory its processes may use together, and who pays.

Each plugin host runs in a memory cgroup of its own (docs/threat-model.md, "Memory"),
made by the harness beneath its own cgroup before the host starts (:func:`make`) and
joined by the host before it confines itself (:func:`join`; once confined, Landlock keeps
it from writing beneath ``/sys``, so it cannot leave it nor raise its limit). The kernel
charges to the cgroup every page its processes make: anonymous memory, ``memfd_create(2)``
and other shared memory, the page cache of the files they write. Past the limit the
kernel reclaims what it can, then its out-of-memory killer kills one of the cgroup's
processes (cgroup v2: all of them, ``memory.oom.group``), never one outside it: the
harness, and the host's keeper, which reads the cgroup's count of such kills
(:meth:`MemoryCgroup.oom_kills`) when the host has ended and removes the cgroup.

Where the memory controller is (``/proc/self/cgroup``, ``/proc/self/mountinfo``):

- **cgroup v1** (a ``memory`` hierarchy, as on this project's CI machines): a child cgroup
  with ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes``, memory and swap
  together, where swap is accounted); making one needs write access to the harness's
  cgroup folder, which is root's;
- **cgroup v2**: a cgroup with ``memory.max``, ``memory.swap.max`` 0 and
  ``memory.oom.group`` 1, beneath the harness's cgroup where that one passes the memory
  controller to its children (``cgroup.subtree_control``: the root cgroup; the kernel
  refuses to enable it on another cgroup that holds processes), else beside it (beneath the
  cgroup above, which holds none); either needs write access there: root's, or a subtree
  delegated to the user (systemd's ``Delegate=yes``, as a user manager's ``app.slice``).
  A confined host cannot write the cgroup's files, but ``clone3(2)``'s
  ``CLONE_INTO_CGROUP`` can start a child elsewhere: the keeper ends a host whose process
  it finds outside (:func:`harness.plugin.hosting.in_host.keeper.breach`).

Where no cgroup can be made (:class:`Unavailable` says why), a host has no memory limit of
its own; it stays the kernel's first choice under memory pressure (its ``oom_score_adj``,
:mod:`harness.plugin.hosting.in_host.keeper`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import uuid
from dataclasses import dataclass

from harness.foundation.errors import IdrsError

PREFIX = "idrs-plugin-host-"
"""How the cgroups made here are named: ``PREFIX<harness pid>-<random>``."""
_UNLIMITED = 1 << 62
"""Above this, a cgroup v1 limit means none (the kernel shows ``PAGE_COUNTER_MAX`` pages)."""
_SWEPT: list[bool] = []


class Unavailable(IdrsError):
    """No memory cgroup can be made for a plugin host here; the message says why."""


@dataclass(frozen=True)
class MemoryCgroup:
    """A memory cgroup at ``path`` (a folder of the cgroup filesystem), of cgroup
    ``version`` 1 or 2, limited to ``limit`` bytes."""

    path: str
    version: int
    limit: int

    def to_message(self) -> dict[str, object]:
        return {"cgroup": self.path, "version": self.version, "limit": self.limit}

    @classmethod
    def from_message(cls, message: dict | None) -> MemoryCgroup | None:
        """The cgroup a host's start message names (None: it names none)."""
        if not message or not message.get("cgroup"):
            return None
        return cls(str(message["cgroup"]), int(message["version"]), int(message["limit"]))

    def _read(self, name: str) -> str:
        with open(os.path.join(self.path, name)) as file:
            return file.read()

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w") as file:
            file.write(value)

    def oom_kills(self) -> int:
        """The processes of this cgroup that the out-of-memory killer has killed (v1:
        ``memory.oom_control``, v2: ``memory.events``, Linux ≥ 4.13); 0 once it is gone."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        with contextlib.suppress(OSError, ValueError):
            for line in self._read(name).splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def peak(self) -> int | None:
        """The most memory the cgroup's processes have used together, in bytes (v2's
        ``memory.peak`` needs Linux ≥ 5.19); None where the kernel does not say."""
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        try:
            return int(self._read(name).strip())
        except (OSError, ValueError):
            return None

    def holding(self, pid: int) -> str | None:
        """None when the process ``pid`` is in this cgroup; else the cgroup it is in (its
        path in ``/proc/<pid>/cgroup``). ``OSError`` once it has ended."""
        with open(f"/proc/{pid}/cgroup") as file:
            for line in file:
                hierarchy_id, controllers, path = line.rstrip("\n").split(":", 2)
                if (
                    "memory" in controllers.split(",")
                    if self.version == 1
                    else (hierarchy_id == "0" and controllers == "")
                ):
                    if path != "/" and self.path.endswith(path):
                        return None
                    return path
        return "(none)"

    def processes(self) -> list[int]:
        """The processes in the cgroup now."""
        try:
            return [int(p) for p in self._read("cgroup.procs").split()]
        except OSError:
            return []

    def remove(self) -> None:
        """Remove the cgroup once no process is left in it (else leave it: the kernel
        refuses, and the next harness's :func:`sweep_abandoned` removes it)."""
        with contextlib.suppress(OSError):
            os.rmdir(self.path)


def join(cgroup: MemoryCgroup, pid: int = 0) -> None:
    """Move the process ``pid`` (0: this one) into ``cgroup``; its later children are born
    there."""
    try:
        cgroup._write("cgroup.procs", str(pid or os.getpid()))
    except OSError as exc:
        raise Unavailable(f"cannot enter the memory cgroup {cgroup.path}: {exc.strerror}") from None


def hierarchy() -> tuple[int, str]:
    """The memory controller of this process: its cgroup version and the folder of this
    process's cgroup (:class:`Unavailable` when there is none: no cgroup filesystem
    mounted, or no memory controller in it)."""
    try:
        with open("/proc/self/cgroup") as file:
            memberships = [line.rstrip("\n").split(":", 2) for line in file if line.strip()]
        with open("/proc/self/mountinfo") as file:
            mounts = [line.split() for line in file]
    except OSError as exc:
        raise Unavailable(f"cannot read this process's cgroups: {exc}") from None
    for _, controllers, path in memberships:  # v1: a hierarchy of its own for memory
        if "memory" in controllers.split(","):
            for mount in mounts:
                tail = mount[mount.index("-") + 1 :]
                if tail[0] == "cgroup" and "memory" in tail[2].split(","):
                    return 1, _beneath(mount[4], mount[3], path)
    for hierarchy_id, controllers, path in memberships:  # v2: the unified hierarchy
        if hierarchy_id == "0" and controllers == "":
            for mount in mounts:
                if mount[mount.index("-") + 1] == "cgroup2":
                    folder = _beneath(mount[4], mount[3], path)
                    try:
                        with open(os.path.join(folder, "cgroup.controllers")) as file:
                            if "memory" in file.read().split():
                                return 2, folder
                    except OSError:
                        pass
    raise Unavailable("this process is in no cgroup with the memory controller (no cgroup "
                      "filesystem mounted, or the memory controller not enabled)")  # fmt: skip


def _beneath(mount_point: str, mount_root: str, path: str) -> str:
    """The folder of the cgroup ``path`` in a cgroup filesystem mounted at ``mount_point``
    from its folder ``mount_root``."""
    relative = os.path.relpath(path, mount_root) if mount_root != "/" else path.lstrip("/")
    return os.path.normpath(os.path.join(mount_point, "" if relative == "." else relative))


def make(limit: int) -> MemoryCgroup:
    """A new memory cgroup beneath this process's (cgroup v2: beside it, where this one
    cannot pass the memory controller on: :func:`_parent_v2`), limited to ``limit`` bytes
    (its swap besides none); :class:`Unavailable` when none can be made here, saying why."""
    version, parent = hierarchy()
    beside = ""
    if version == 2:
        parent, beside = _parent_v2(parent)
    if not _SWEPT:
        _SWEPT.append(True)
        sweep_abandoned(parent)
    path = os.path.join(parent, f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        os.mkdir(path)
    except OSError as exc:
        raise Unavailable(f"cannot make a memory cgroup beneath {parent} (cgroup v{version}): "
                          f"{exc.strerror}{_why(exc, version)}{beside}") from None  # fmt: skip
    cgroup = MemoryCgroup(path, version, limit)
    try:
        if version == 1:
            cgroup._write("memory.limit_in_bytes", str(limit))
            cgroup._write("memory.oom_control", "0")  # (the killer on: a child inherits it)
            with contextlib.suppress(OSError):  # (only where swap is accounted)
                cgroup._write("memory.memsw.limit_in_bytes", str(limit))
        else:
            cgroup._write("memory.max", str(limit))
            cgroup._write("memory.oom.group", "1")  # (Linux ≥ 4.19)
            with contextlib.suppress(OSError):  # (only where swap is accounted)
                cgroup._write("memory.swap.max", "0")
    except OSError as exc:
        cgroup.remove()
        raise Unavailable(f"cannot limit the memory cgroup {path}: {exc.strerror}") from None
    return cgroup


def _parent_v2(own: str) -> tuple[str, str]:
    """Where a host's cgroup v2 goes: beneath this process's cgroup ``own`` where it passes
    the memory controller to its children (the root cgroup, or one enabled now); else beside
    it, beneath the cgroup above, which passes the controller to ``own`` (:func:`hierarchy`
    found it there) and holds no process of its own (the kernel's rule), e.g. the
    ``app.slice`` of a systemd user manager, which is its user's. Beside it, also why not
    beneath it (for the error if that fails too)."""
    try:
        _pass_memory_controller(own)
        return own, ""
    except Unavailable as exc:
        above = os.path.dirname(own)
        if os.path.exists(os.path.join(above, "cgroup.subtree_control")):
            return above, f"; and not beneath its own cgroup: {exc}"
        raise


def _pass_memory_controller(parent: str) -> None:
    """Enable the memory controller for ``parent``'s children (cgroup v2)."""
    try:
        with open(os.path.join(parent, "cgroup.subtree_control")) as file:
            if "memory" in file.read().split():
                return
        with open(os.path.join(parent, "cgroup.subtree_control"), "w") as file:
            file.write("+memory")
    except OSError as exc:
        busy = (" (the kernel enables it only on a cgroup that holds no process; run the "
                "harness in a delegated cgroup of its own, e.g. a systemd unit with "
                "Delegate=yes whose processes are in a child cgroup)")  # fmt: skip
        raise Unavailable(f"cannot enable the memory controller for the children of {parent} "
                          f"(cgroup v2): {exc.strerror}"
                          f"{busy if exc.errno == errno.EBUSY else _why(exc, 2)}") from None  # fmt: skip


def _why(exc: OSError, version: int) -> str:
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (" (the harness's cgroup is not its user's: run as root, or, with cgroup v2, "
                "in a cgroup delegated to the user)" if version == 2 else
                " (with cgroup v1 only root makes cgroups)")  # fmt: skip
    if exc.errno == errno.EROFS:
        return " (the cgroup filesystem is mounted read-only, as in a default container)"
    return ""


def headroom() -> int | None:
    """The memory this process's processes may still take, in bytes: the kernel's estimate
    of the memory available (``MemAvailable``), less where this process's cgroups limit it
    to less; None where the kernel does not say."""
    available = None
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as file:
        for line in file:
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    try:
        version, folder = hierarchy()
    except Unavailable:
        return available
    for limit, usage in _limits(version, folder):
        if limit < _UNLIMITED:
            left = max(limit - usage, 0)
            available = left if available is None else min(available, left)
    return available


def _limits(version: int, folder: str) -> list[tuple[int, int]]:
    """(limit, usage) in bytes of this process's memory cgroup and those above it that
    limit it (v1: the hierarchical limit; v2: each ``memory.max`` up to the root)."""

    def number(path: str) -> int:
        with open(path) as file:
            text = file.read().strip()
        return _UNLIMITED if text == "max" else int(text)

    found = []
    with contextlib.suppress(OSError, ValueError):
        if version == 1:
            with open(os.path.join(folder, "memory.stat")) as file:
                stat = dict(line.split() for line in file if line.strip())
            found.append((int(stat["hierarchical_memory_limit"]),
                          number(os.path.join(folder, "memory.usage_in_bytes"))))  # fmt: skip
            return found
        while os.path.exists(os.path.join(folder, "memory.max")):
            found.append((number(os.path.join(folder, "memory.max")),
                          number(os.path.join(folder, "memory.current"))))  # fmt: skip
            folder = os.path.dirname(folder)
    return found


def sweep_abandoned(parent: str) -> list[str]:
    """Remove the cgroups of :data:`PREFIX` beneath ``parent`` whose harness has ended and
    in which no process is left (a keeper killed before it removed its host's); those
    removed."""
    removed = []
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            found = re.fullmatch(re.escape(PREFIX) + r"(\d+)-[0-9a-f]+", name)
            if found is None or _alive(int(found.group(1))):
                continue
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(parent, name))
                removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
