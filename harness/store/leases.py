"""Several processes certifying one run: leases on its units of work, in the results database.

``idrs-bench run`` started more than once on the same benchmark and ``--db`` (two
terminals, one process per GPU with ``--device cuda:0`` and ``cuda:1``, a scheduler
that starts a job twice) shares the work instead of repeating it. Before a process
certifies a shard it takes a **lease** on it in the database's ``leases`` table
(:meth:`harness.store.lease_records.LeaseRecords.acquire_lease`, one ``BEGIN IMMEDIATE`` transaction,
so two processes never hold the same shard). A lease expires :func:`lease_seconds`
after it was last renewed; a :class:`LeaseKeeper` renews its process's leases from a
thread every third of that time while it works, and a process that dies (even by
SIGKILL) stops renewing, so another one takes its shards over once they expire, or at
once when the dead process was of the same host (:func:`owner_gone`: a resumed run does
not wait out its killed predecessor's leases).

The result does not depend on which process certified what: noise depends only on
(seed, stream, input id, sample index) (``harness/README.md``, "Noise contract"), σ is
computed on the whole shard, and each certificate is stored under its primary key
(run, method, setting, input). An order-dependent certifier (a memory) leases its
whole setting (:data:`harness.store.schema.WHOLE_SETTING`), so one process certifies its
shards in order with its state. A process that finds a lease of its own taken over
(it stalled past the expiry) stops that shard; what both stored is the same.

The checks of a finished run are one unit too (:func:`exclusive`): one process runs
them, the others wait for it, and take them over if it dies.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.foundation.errors import IdrsError
from harness.store.lease_records import LeaseAnswer
from harness.store.schema import PRESENCE
from harness.store.store import ResultStore

LEASE_ENV_VAR = "IDRS_BENCH_LEASE_SECONDS"
DEFAULT_LEASE_SECONDS = 60.0
CHECKS = ("", "checks", -1)
"""The (method, setting, shard) key of the lease on a run's soundness checks."""

Key = tuple[str, str, str, int]


def lease_seconds() -> float:
    """How long a lease lasts without renewal: ``$IDRS_BENCH_LEASE_SECONDS``, default 60."""
    text = os.environ.get(LEASE_ENV_VAR)
    if text is None:
        return DEFAULT_LEASE_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise IdrsError(f"{LEASE_ENV_VAR}={text!r} must be a positive number of seconds")
    return value


def process_name() -> str:
    """``host:pid`` of this process, as other processes are told about it."""
    return f"{socket.gethostname()}:{os.getpid()}"


class LeaseKeeper:
    """The leases of this process on one database, renewed from a thread while open.

    ``join(run)`` leases this process's presence on a run (so that the others know it
    works on it); ``acquire(run, method, setting, shard)`` returns a
    :class:`LeaseAnswer`; ``lost(key)`` says whether a held lease was taken over by
    another process; ``release`` drops one; closing drops them all. ``notice`` receives
    one line the first time each other process is met (``progress.note``).
    """

    def __init__(
        self,
        db: str | Path,
        notice: Callable[[str], None],
        seconds: float | None = None,
    ) -> None:
        self.db = Path(db)
        self.seconds = lease_seconds() if seconds is None else seconds
        self.owner = f"{process_name()}:{uuid.uuid4().hex[:8]}"
        self.notice = notice
        self.store = ResultStore(self.db, verify=False)
        self.held: set[Key] = set()
        self._lost: set[Key] = set()
        self._met: set[str] = set()
        self._joined: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat, daemon=True, name="leases")
        self._thread.start()

    def __enter__(self) -> LeaseKeeper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def join(self, run_id: str) -> list[str]:
        """Say that this process works on ``run_id``; the others that do (``host:pid``)."""
        self.acquire(run_id, "", self.owner, PRESENCE)
        self._joined.add(run_id)
        return self.others(run_id)

    def acquire(self, run_id: str, method: str, setting: str, shard: int) -> LeaseAnswer:
        answer = self.store.acquire_lease(run_id, method, setting, shard, self.owner, self.seconds,
                                          owner_gone)  # fmt: skip
        if answer.acquired:
            with self._lock:
                self.held.add((run_id, method, setting, shard))
                self._lost.discard((run_id, method, setting, shard))
        else:
            self.meet(answer.holder)
        return answer

    def release(self, run_id: str, method: str, setting: str, shard: int) -> None:
        with self._lock:
            self.held.discard((run_id, method, setting, shard))
        self.store.release_lease(run_id, method, setting, shard, self.owner)

    def lost(self, key: Key) -> bool:
        """Whether the lease ``key`` was taken over by another process since acquired."""
        with self._lock:
            return key in self._lost

    def others(self, run_id: str) -> list[str]:
        """``host:pid`` of the other processes holding unexpired leases on ``run_id``."""
        owners = {lease["owner"] for lease in self.store.live_leases(run_id)
                  if not owner_gone(lease["owner"])} - {self.owner}  # fmt: skip
        for owner in sorted(owners):
            self.meet(owner)
        return sorted({display(o) for o in owners})

    def meet(self, owner: str | None) -> None:
        """Tell the user, once per process, that ``owner`` works on the same database."""
        if owner is None or owner == self.owner or owner in self._met:
            return
        self._met.add(owner)
        self.notice(
            f"process {display(owner)} is working on this run in {self.db} too; the work is "
            "shared between the processes"
        )

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        with self._lock:
            held, self.held = set(self.held), set()
        for key in held:
            self.store.release_lease(*key, self.owner)
        for run_id in self._joined:  # processes that died without saying so
            self.store.drop_expired_leases(run_id, PRESENCE, owner_gone)
        self.store.close()

    def _heartbeat(self) -> None:
        store = ResultStore(self.db, verify=False)
        try:
            while not self._stop.wait(self.seconds / 3):
                with self._lock:
                    before = set(self.held)  # (a lease acquired meanwhile is not judged)
                try:
                    still = store.renew_leases(self.owner, self.seconds)
                except Exception:  # a busy database: renewed at the next beat
                    continue
                with self._lock:
                    self._lost |= before - still
        finally:
            store.close()


def owner_gone(owner: str) -> bool:
    """Whether the lease owner ``host:pid:suffix`` is a process of this host that has ended
    (its pid names no process). A pid reused since, or another host's owner, counts as
    alive: its lease then lasts until it expires."""
    host, _, pid = display(owner).rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists (another user's process)
        pass
    return False


def display(owner: str) -> str:
    """``host:pid`` of a lease owner (without its random suffix)."""
    return owner.rsplit(":", 1)[0]


@contextmanager
def exclusive(
    db: str | Path, run_id: str, what: str, notice: Callable[[str], None], poll: float = 1.0
) -> Iterator[bool]:
    """One process does ``what`` (the :data:`CHECKS` of ``run_id``): yields True to the
    process that holds the lease (it does the work), False to one that waited while
    another process did it. A holder that dies stops renewing; a waiter then takes over."""
    with LeaseKeeper(db, notice) as keeper:
        waited_for: str | None = None
        while True:
            answer = keeper.acquire(run_id, *CHECKS)
            if answer.acquired:
                break
            if waited_for is None:
                notice(f"waiting for process {display(answer.holder or '?')}, which runs {what}")
            waited_for = answer.holder
            time.sleep(min(poll, keeper.seconds / 4))
            if keeper.store.lease_holder(run_id, *CHECKS) is None:  # released: done, not died
                yield False
                return
        if answer.expired is not None:
            notice(f"process {display(answer.expired)} stopped during {what}; this one takes over")
        try:
            yield True
        finally:
            keeper.release(run_id, *CHECKS)
