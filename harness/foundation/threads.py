"""How many threads a process of the harness computes with, and how its idle threads wait.

**Cores and processes.** A process computes with :func:`thread_count` threads: the count
asked for (``--threads``, else ``$IDRS_BENCH_THREADS``, else ``$OMP_NUM_THREADS``:
:func:`requested_threads`), or else its share of the machine, ``max(1, cores //
working)``: ``cores`` the processors it may run on (:func:`available_cores`, which sees
``taskset`` and cpusets) and ``working`` the harness processes of this machine
that compute at the same time, itself included (:class:`WorkingProcess`, a registry of
lock files under the cache root). A helper a process starts and waits for (the replay
process, a plugin host) is not counted: the two alternate, each computing while the
other waits on their pipe, so each may use every core.

**One count per run.** The bits of a CPU run's counts depend on the thread count (a BLAS
splits its sums by threads; measured: the built-in 784-200-10 MLP's logits at 8 threads
and the ``cnn``'s at 2 differ from 1 thread's), so the count is part of a run's
arithmetic fingerprint (:mod:`harness.engine.arithmetic`), and a process that joins or
resumes a run computes with the count recorded when it began
(:func:`harness.engine.arithmetic.run_threads`): every process certifying one run rounds
alike, its replays stay bit for bit, and processes sharing a run share the cores in time.

**Idle threads sleep.** An OpenMP runtime keeps the idle threads of a process spinning
after each parallel region (GNU: about 300,000 spins, a few ms; Intel's: 200 ms), taking
the cores of every other process that computes meanwhile (and of the process's own
threads when the machine is loaded). :func:`set_passive_wait` asks the runtime to let them sleep
(``OMP_WAIT_POLICY=PASSIVE``, ``KMP_BLOCKTIME=0``), which only takes effect before the
runtime starts, i.e. before torch is imported: the command line sets it first thing, and
every subprocess the harness starts gets it in its environment (:func:`child_environment`).
A user who set any of :data:`WAIT_VARIABLES` chose the policy: none is changed then.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from harness.foundation.artifacts import cache_root
from harness.foundation.errors import IdrsError

THREADS_ENV_VAR = "IDRS_BENCH_THREADS"
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
"""The variables by which a user chooses how idle OpenMP threads wait (GNU, Intel)."""
PASSIVE_WAIT = {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0"}
"""Idle threads sleep at once: OpenMP's standard variable, and Intel's runtime's own."""


def thread_count(cores: int, working: int, requested: int | None = None) -> int:
    """The threads of a process: ``requested`` when given, else ``max(1, cores // working)``
    (its share of ``cores`` among the ``working`` processes, itself included)."""
    if requested is not None:
        return int(requested)
    return max(1, int(cores) // max(1, int(working)))


def available_cores() -> int:
    """The processors this process may run on (its affinity mask, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def load_per_core() -> float | None:
    """The machine's 1-minute load average per processor this process may run on (1.0:
    as many runnable threads as those processors; a run alone on them reads about 1.0),
    None where the system keeps none. Recorded beside each certificate's seconds: wall
    time is comparable only between rows measured under similar loads."""
    try:
        return os.getloadavg()[0] / available_cores()
    except (AttributeError, OSError):  # no load average (not Unix)
        return None


def requested_threads(
    option: int | None = None, environ: Mapping[str, str] | None = None
) -> int | None:
    """The thread count a user asked for: ``--threads`` (``option``), else
    ``$IDRS_BENCH_THREADS``, else ``$OMP_NUM_THREADS`` (its first level); None when none
    was. A count that is not a positive integer is an error naming where it was given."""
    environ = os.environ if environ is None else environ
    candidates = [("--threads", None if option is None else str(option))]
    candidates += [(f"${name}", environ.get(name)) for name in (THREADS_ENV_VAR, "OMP_NUM_THREADS")]
    for where, text in candidates:
        if text is None or text.strip() == "":
            continue
        first = text.split(",")[0].strip()  # OMP_NUM_THREADS may list nested levels: 4,2
        if not first.isdigit() or int(first) < 1:
            raise IdrsError(
                f"{where} is {text!r}, not a number of threads; give a positive integer, "
                f"e.g. {where.lstrip('$')}{' ' if where == '--threads' else '='}2"
            )
        return int(first)
    return None


def passive_wait(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to ``environ`` so that idle OpenMP threads sleep: none when
    the user set any of :data:`WAIT_VARIABLES` (the user chose how threads wait)."""
    if any(name in environ for name in WAIT_VARIABLES):
        return {}
    return dict(PASSIVE_WAIT)


def set_passive_wait(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Add :func:`passive_wait` to this process's environment (``os.environ``); it takes
    effect if the OpenMP runtime has not started yet (torch not imported). Returns what
    was added."""
    environ = os.environ if environ is None else environ
    added = passive_wait(environ)
    environ.update(added)
    return added


def child_environment(
    threads: int | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of a subprocess of the harness: ``environ`` (default this
    process's) with idle threads sleeping (:func:`passive_wait`) and, when ``threads`` is
    given, ``$IDRS_BENCH_THREADS`` set to it, so that a helper computes with its parent's
    count. Nothing the user set is changed, except ``$IDRS_BENCH_THREADS``, which the
    parent already honoured (:func:`requested_threads`)."""
    env = dict(os.environ if environ is None else environ)
    env.update(passive_wait(env))
    if threads is not None:
        env[THREADS_ENV_VAR] = str(int(threads))
    return env


def stop_child(process: subprocess.Popen, timeout: float = 30.0) -> None:
    """End a helper process the harness started with :func:`child_environment` (a plugin
    host, a replay process): close its stdin, the end of its requests, wait ``timeout``
    seconds for it to finish, else kill it."""
    if process.poll() is None:
        try:
            process.stdin.close()
            process.wait(timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()


class WorkingProcess:
    """This process, registered as working on this machine while the context is open.

    The registry is a folder of lock files, ``<cache root>/processes/<host>/<pid>``,
    each locked (``flock``) by its process while it works; :func:`working_processes`
    counts the locked ones, so a process that died (even by SIGKILL) is not counted, and
    removes its file. Without ``fcntl`` (not POSIX) the registry is empty and every
    process counts itself alone.
    """

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = (cache_root() / "processes" if folder is None else folder) / _host()
        self._fd: int | None = None

    def __enter__(self) -> WorkingProcess:
        try:
            self._fd = self._lock()
        except (ImportError, OSError):  # no fcntl, or a cache root it cannot write to
            self._fd = None  # (not registered: it still works, unseen by the others)
        return self

    def _lock(self) -> int | None:
        import fcntl

        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / str(os.getpid())
        for _ in range(10):  # a count may remove the file of a dead process with our pid
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    return fd
            except FileNotFoundError:
                pass
            os.close(fd)
        return None

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            (self.folder / str(os.getpid())).unlink(missing_ok=True)
            os.close(self._fd)  # (closing releases the lock)
            self._fd = None


def working_processes(folder: Path | None = None) -> int:
    """The processes of this host whose lock files in ``folder`` (default ``<cache
    root>/processes``) are held; files of processes that died are removed."""
    try:
        import fcntl
    except ImportError:
        return 0
    host = (cache_root() / "processes" if folder is None else folder) / _host()
    try:
        paths = list(host.iterdir())
    except OSError:  # none registered yet, or unreadable
        return 0
    alive = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:  # removed meanwhile
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            alive += 1
        else:
            path.unlink(missing_ok=True)  # its process died without removing it
        finally:
            os.close(fd)
    return alive


def _host() -> str:
    return socket.gethostname().replace(os.sep, "_") or "localhost"
