"""The keeper of a plugin host: the process that ends whatever the host's plugins started.

``python -m harness.plugin.hosting.in_host.host`` forks before anything else (:func:`split`); the
parent stays behind as the keeper, the child becomes the plugin host. The keeper

- is the **child subreaper** of everything beneath it (``PR_SET_CHILD_SUBREAPER``, Linux
  ≥ 3.4): a process whose parent ends is re-parented to it, so a plugin's process that
  called ``setsid(2)`` and forked again (a daemon) is still its descendant; it reaps them;
- imports nothing more and is not confined; the host's Landlock domain scopes signals
  (ABI 6), so a plugin cannot signal it (nor the harness);
- waits for one of four things: the host ends (an exit, a signal, the kernel's
  out-of-memory killer), the harness asks it to end the host (``SIGTERM``: a request ran
  past its limit, a host that will not exit), the harness ends (its parent changes: even
  after ``SIGKILL``), or a process beneath it has lowered its ``oom_score_adj`` or left the
  host's memory cgroup (below);
- then kills every process left beneath it with ``SIGKILL``, round after round (each
  round's orphans are re-parented to it) until it has no child left, removes the host's
  scratch folder (the whole host folder when the harness has ended) and its memory cgroup
  (:mod:`harness.plugin.hosting.shared.memory_cgroup`, of which it says the limit, the peak and
  the out-of-memory killer's kills), writes one line to the harness saying how the host
  ended (:mod:`harness.plugin.hosting.shared.keeper_record`; in words:
  :func:`harness.plugin.hosting.in_harness.host_ending.ending`), and exits.

The host leaves the harness's session (no terminal's ``SIGINT`` or ``SIGHUP`` reach it: the
harness decides), and its ``oom_score_adj`` is raised to 1000, by itself and by the keeper,
which needs no privilege and which its children inherit, so that under memory pressure the
kernel kills a plugin host before the harness (the keeper keeps the harness's score and
holds almost no memory). Lowering it again needs ``CAP_SYS_RESOURCE`` below the process's
``oom_score_adj_min``, which a write made with that capability sets (Linux's
``__set_oom_adj``): where the host runs as root with it, the host's own write pins the
minimum at 1000 before it drops its capabilities. Elsewhere (a user, or root without it,
as in a container) the minimum stays the harness's and a confined host could lower its
score through its own threads' ``/proc`` files, which the CUDA driver needs to write: the
keeper looks at the score of every process beneath it as it waits, and a host one of whose
processes lowered it is ended (:func:`breach`), its request failing to say so. So is one
whose process left the host's memory cgroup: a confined host cannot write beneath
``/sys``, but on cgroup v2 ``clone3(2)`` with ``CLONE_INTO_CGROUP`` starts a child in
another cgroup given a descriptor of its folder (an ``O_PATH`` one, which Landlock does not
check), and the kernel checks only the folder's file modes.

Why a keeper, not a cgroup or a PID namespace (harness/README.md, "Plugin host"): a
cgroup of one's own needs a delegated cgroup v2 subtree (systemd's, or root), and a PID
namespace needs ``CAP_SYS_ADMIN`` or an unprivileged user namespace, which distributions
restrict (Ubuntu 24.04's AppArmor). A subreaper needs no privilege and works on every
Linux the harness supports. Its one gap: a descendant that a plugin hands to a process
outside the host (a system service started over a socket) is not beneath it; the host's
seccomp filter refuses sockets (all but the CUDA driver's ``AF_UNIX`` ``SOCK_SEQPACKET``
one in a host granted a GPU, docs/threat-model.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import sys
import time
from typing import Any

from harness.plugin.hosting.shared.keeper_record import KILL_SECONDS, OOM_SCORE_ADJ, report
from harness.plugin.hosting.shared.memory_cgroup import MemoryCgroup, Unavailable, join

_PR_SET_CHILD_SUBREAPER = 36
WATCH_SECONDS = 0.25
"""How often the keeper looks at its parent (the harness) while it waits."""
_WAITED = (signal.SIGCHLD, signal.SIGTERM)


def split(start: dict[str, Any]) -> int:
    """Fork this process as the module docstring says. In the child, the plugin host,
    return the keeper's pid (the host's parent); the keeper never returns. ``start``: the
    host's start message (``status_fd``: the pipe to the harness; ``scratch``,
    ``folder``, ``memory``: what the keeper removes)."""
    status = start.get("status_fd")
    if sys.platform != "linux" or status is None:  # (no keeper: e.g. a diagnostic host)
        return os.getppid()
    signal.pthread_sigmask(signal.SIG_BLOCK, _WAITED)  # before fork: none is missed
    _prctl_subreaper()
    parent = os.getppid()
    child = os.fork()
    if child == 0:
        os.close(int(status))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _WAITED)
        os.setsid()  # (no terminal's signals: the harness decides)
        with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as adj:
            adj.write(str(OOM_SCORE_ADJ))
        return os.getppid()
    cgroup = MemoryCgroup.from_message(start.get("memory"))
    keep(child, parent, int(status), start.get("scratch"), start.get("folder"), cgroup)
    os._exit(0)  # (keep exits; never reached)


def _prctl_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(code)}")


def keep(host: int, parent: int, status: int, scratch: str | None, folder: str | None,
         cgroup: MemoryCgroup | None = None) -> None:  # fmt: skip
    """The keeper's life (see the module docstring); exits the process."""
    for name in ("SIGINT", "SIGHUP", "SIGQUIT"):  # (the harness's, not the keeper's)
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)  # the harness's pipes are the host's: its answers' end is seen at once
    os.dup2(null, 1)
    _write(status, {"host": host})
    oom_before = oom_kills()
    watched = _raise_score(host)  # (as the host does: whichever comes first)
    inside = False
    if cgroup is not None:  # (as the host does before it confines itself)
        with contextlib.suppress(Unavailable):
            join(cgroup, host)
            inside = True
    by, ended, broke = "host", None, None
    while ended is None:
        ended = _reap(host)
        if ended is not None:
            break
        if os.getppid() != parent:
            by = "harness ended"
            break
        if cgroup is not None and not inside:  # (from when the host has joined it)
            with contextlib.suppress(OSError):
                inside = cgroup.holding(host) is None
        broke = breach(cgroup if inside else None, watched)
        if broke is not None:
            by = "keeper"
            break
        got = signal.sigtimedwait(_WAITED, WATCH_SECONDS)
        if got is not None and got.si_signo == signal.SIGTERM:
            by = "harness"
            break
    if ended is None:
        _kill(host)  # (a host already dying keeps the status it dies with)
    left, host_status = end_all(host)
    ended = ended if ended is not None else host_status
    if scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    if by == "harness ended" and folder:
        shutil.rmtree(folder, ignore_errors=True)
    record: dict[str, Any] = {"by": by, "left": left, "oom_kills": oom_kills() - oom_before}
    if cgroup is not None:
        record["memory"] = {"limit": cgroup.limit, "peak": cgroup.peak(),
                            "oom_kills": cgroup.oom_kills()}  # fmt: skip
        cgroup.remove()
    if broke is not None:
        record["breach"] = broke
    if ended is not None:
        record |= report(ended)
    _write(status, record)
    os._exit(0)


def _reap(host: int) -> int | None:
    """Reap every child that has ended; the host's wait status if it is one of them."""
    found = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if pid == 0:
            return found
        if pid == host:
            found = status


def end_all(host: int, seconds: float = KILL_SECONDS) -> tuple[int, int | None]:
    """Kill every process beneath this one with ``SIGKILL`` and reap it, round after round,
    until none is left (or ``seconds`` have passed); the processes ended besides ``host``,
    and the host's wait status when it was reaped here."""
    killed: set[int] = set()
    host_status = None
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for pid in children():
            _kill(pid)
            if pid != host:
                killed.add(pid)
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break  # none left
        if pid == 0:
            time.sleep(0.01)
        elif pid == host:
            host_status = status
    return len(killed), host_status


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def children(pid: int | None = None) -> list[int]:
    """The processes whose parent is ``pid`` (default this one): procfs's ``children`` list
    of its threads, else a scan of every process's ``stat``."""
    pid = os.getpid() if pid is None else pid
    found: set[int] = set()
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as listed:
                found |= {int(p) for p in listed.read().split()}
        return sorted(found)
    except OSError:  # (a kernel without CONFIG_PROC_CHILDREN)
        pass
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.add(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return sorted(found)


def _raise_score(pid: int) -> bool:
    """Raise the ``oom_score_adj`` of ``pid`` to :data:`OOM_SCORE_ADJ`; whether it is."""
    try:
        with open(f"/proc/{pid}/oom_score_adj", "w") as adj:
            adj.write(str(OOM_SCORE_ADJ))
        return _score(pid) == OOM_SCORE_ADJ
    except (OSError, ValueError):
        return False


_PF_EXITING = 0x4


def _exiting(pid: int) -> bool:
    """Whether ``pid`` is exiting or has exited (a zombie): its state and flags (``stat``)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return fields[0] in ("Z", "X") or bool(int(fields[6]) & _PF_EXITING)


def _score(pid: int) -> int:
    with open(f"/proc/{pid}/oom_score_adj") as adj:
        return int(adj.read())


def breach(cgroup: MemoryCgroup | None, scores: bool = True,
           pid: int | None = None) -> dict[str, Any] | None:  # fmt: skip
    """The first process beneath ``pid`` (default this one) that is out of the host's
    ``cgroup`` (``{"pid": ..., "cgroup": where it is}``) or, with ``scores``, whose
    ``oom_score_adj`` is below :data:`OOM_SCORE_ADJ` (``{"pid": ..., "oom_score_adj":
    ...}``); None if none is. Every process beneath the keeper was born in the cgroup, with
    a score of 1000 (:func:`split`)."""
    waiting = children(pid)
    while waiting:
        below = waiting.pop()
        with contextlib.suppress(OSError, ValueError, IndexError):  # (one that has just ended)
            if _exiting(below):  # (cgroup v1 shows "/" for a process that is exiting)
                continue
            where = None if cgroup is None else cgroup.holding(below)
            if where is not None and not _exiting(below):  # (it may have begun since)
                return {"pid": below, "cgroup": where}
            score = _score(below) if scores else OOM_SCORE_ADJ
            if score < OOM_SCORE_ADJ:
                return {"pid": below, "oom_score_adj": score}
            waiting += children(below)
    return None


def oom_kills() -> int:
    """The kernel's count of processes its out-of-memory killer has killed (``oom_kill`` in
    ``/proc/vmstat``, Linux ≥ 4.13); 0 where it is not kept."""
    try:
        with open("/proc/vmstat") as vmstat:
            for line in vmstat:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _write(fd: int, record: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # (the harness has gone: nobody reads)
        os.write(fd, json.dumps(record).encode() + b"\n")
