"""Rows of a run audited side by side, in this process and in audit workers.

The checks of one row mostly make small calls (a σ search at a few points, one trial of
S1 at a time), which leave the cores of a machine half idle; the rows of a run are
independent. :func:`audit_side_by_side` therefore audits rows in this process and in
``workers`` − 1 worker processes (``python -m harness.audit.workers``) at once, each
taking the next row when it is done with one, the costliest rows (by their
certification time) first. A worker prepares the run as :class:`~harness.audit.session.
AuditSession` does here (the run's thread count, so that σ recomputed by the replay
check rounds as when certified), loads the same plugins (the entry points of this
environment: :attr:`~harness.plugin.manager.PluginManager.portable`), audits each row it
is sent with the entropy this process drew for it, stores the checks and the attack
itself (SQLite serializes the writes) and reports each check as it finishes, and every
warning. Rows whose σ-provider and parameters are the same (whose attack is shared:
:func:`harness.audit.empirical.classifier_key`) go to one process together. A worker
that fails leaves its rows to this process.

Protocol: the first line on stdin is the job (database, run, options, budget, orders,
attack), then one line per row ``{"rows": [[method, setting, entropy], ...]}``; on stdout
one JSON line per event: ``{"check": name}``, ``{"attacked": true}`` after a row's attack,
``{"warning": text}``, ``{"done": true}`` after a group of rows. The process ends when stdin
closes, or when its parent ends.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness.audit.audit import Budget, fresh_entropy
from harness.audit.session import AuditSession, audit_row, run_attack, stored_result
from harness.foundation.errors import IdrsError
from harness.foundation.identity import setting_key
from harness.foundation.progress import Progress
from harness.foundation.threads import child_environment, stop_child
from harness.foundation.verdict import CheckResult
from harness.store.storedrun import read_run

WORKERS_ENV_VAR = "IDRS_BENCH_AUDIT_WORKERS"
"""Processes that audit a run's rows side by side (default: :func:`default_workers`)."""

Row = tuple[str, str, int]


def default_workers(cores: int, threads: int | None) -> int:
    """Processes auditing side by side: ``$IDRS_BENCH_AUDIT_WORKERS`` when set, else two
    per ``threads`` cores (the checks keep about half of a process's threads busy), at
    least one, at most ``cores``."""
    value = os.environ.get(WORKERS_ENV_VAR, "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise IdrsError(f"${WORKERS_ENV_VAR} is {value!r}; give a positive integer")
        return int(value)
    return max(1, min(cores, 2 * cores // max(1, threads or cores)))


def audit_side_by_side(
    session, rows: Sequence[tuple[str, str, int | None]], store, checks: list,
    progress: Progress, manager, attack: bool, workers: int,
) -> dict[tuple[str, str], list[CheckResult]]:  # fmt: skip
    """Audit ``rows`` of ``session``'s run in this process and ``workers`` − 1 workers
    (module docstring); the stored results of every row, in ``rows``' order."""
    groups = _groups(session, [(m, s, fresh_entropy() if e is None else e) for m, s, e in rows])
    todo: queue.SimpleQueue[list[Row]] = queue.SimpleQueue()
    for group in groups:
        todo.put(group)
    job = _job(session, store, manager, attack)
    names = [check.name for check in checks]
    feeders = [threading.Thread(target=_feed, args=(job, todo, names, progress), daemon=True,
                                name=f"audit-worker-{k}") for k in range(1, workers)]  # fmt: skip
    for feeder in feeders:
        feeder.start()
    attacked: dict[str, dict] = {}

    def audit_here() -> None:
        while True:
            try:
                group = todo.get_nowait()
            except queue.Empty:
                return
            for method, setting, entropy in group:
                audit = session.audit(method, setting, entropy)
                audit_row(store, audit, checks, progress)
                if attack:
                    run_attack(store, audit, progress, attacked)

    audit_here()
    for feeder in feeders:
        feeder.join()
    audit_here()  # the rows of a worker that failed
    stored = {
        (c.method, c.setting, c.check): c for c in read_run(store, session.stored.run_id).checks
    }
    return {(m, s): [stored_result(stored[m, s, name]) for name in names] for m, s, _ in rows}


def _groups(session, rows: list[Row]) -> list[list[Row]]:
    """Rows of one σ-provider and parameters together (their attack is shared), the
    groups costliest first (their rows' certification seconds)."""
    registry = session.prepared.registry
    stored = {(r.method, r.setting): r for r in session.stored.rows()}
    by_key: dict[str, list[Row]] = {}
    cost: dict[str, float] = {}
    for method, setting, entropy in rows:
        spec = registry.get("methods", method)
        params = next(s for c in session.spec.methods if c.name == method
                      for s in c.settings if setting_key(s) == setting)  # fmt: skip
        key = spec.sigma_provider + json.dumps({**spec.defaults, **params}, sort_keys=True,
                                               default=str)  # fmt: skip
        by_key.setdefault(key, []).append((method, setting, entropy))
        cost[key] = cost.get(key, 0.0) + stored[method, setting].certification_seconds
    return [by_key[k] for k in sorted(by_key, key=lambda k: -cost[k])]


def _job(session, store, manager, attack: bool) -> dict[str, Any]:
    """What a worker needs to prepare the run as ``session`` did."""
    options = {k: None if v is None else str(v) if isinstance(v, Path) else v
               for k, v in vars(session.options).items()}  # fmt: skip
    return {"db": str(store.path), "run_id": session.stored.run_id, "options": options,
            "budget": asdict(session.budget), "attack": attack,
            "third_party": manager.third_party, "parent": os.getpid()}  # fmt: skip


def _feed(
    job: dict[str, Any], todo: queue.SimpleQueue, names: list[str], progress: Progress
) -> None:
    """Run one worker process: send it groups from ``todo`` until none is left, showing
    its progress and warnings here; on failure, its group goes back to ``todo``."""
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "harness.audit.workers"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=child_environment(), text=True,
        )  # fmt: skip
    except OSError as exc:
        progress.warn(f"an audit worker could not start ({exc}); its rows are audited here")
        return
    try:
        process.stdin.write(json.dumps(job) + "\n")
        process.stdin.flush()
        while True:
            try:
                group = todo.get_nowait()
            except queue.Empty:
                return
            if not _audit_group(process, group, names, progress, job["attack"]):
                todo.put(group)
                return
    finally:
        stop_child(process)


def _audit_group(process: subprocess.Popen, group: list[Row], names: list[str],
                 progress: Progress, attack: bool) -> bool:  # fmt: skip
    """Send ``group`` to ``process`` and follow it to its end (each row's checks, then its
    attack, as stages here); False if the worker failed."""
    try:
        process.stdin.write(json.dumps({"rows": [list(row) for row in group]}) + "\n")
        process.stdin.flush()
    except OSError:
        return False
    for method, setting, _ in group:
        if not _follow(
            process, progress, f"checks {method} {setting}", len(names), "checks", "check"
        ):
            return False
        if attack and not _follow(
            process, progress, f"attack {method} {setting}", 1, "rows", "attacked"
        ):
            return False
    event = _event(process, progress)
    return event is not None and event.get("done") is True


def _follow(process: subprocess.Popen, progress: Progress, stage: str, count: int, unit: str,
            key: str) -> bool:  # fmt: skip
    """Show ``stage`` while the worker reports ``count`` events ``key``; False (with a
    warning) if it ended or said something else first."""
    with progress.task(stage, count, unit) as advance:
        for _ in range(count):
            event = _event(process, progress)
            if event is None or key not in event:
                progress.warn(f"an audit worker ended during {stage}; its rows are audited here")
                return False
            advance(1)
    return True


def _event(process: subprocess.Popen, progress: Progress) -> dict[str, Any] | None:
    """The worker's next event (its warnings shown on the way), None when it ended."""
    while True:
        line = process.stdout.readline()
        if not line:
            return None
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue  # not ours (a library's print)
        if "warning" in event:
            progress.warn(str(event["warning"]))
            continue
        return event


class _Reporting(Progress):
    """A worker's progress: no bars; warnings and notes go to the parent as events."""

    def __init__(self, send: Callable[[dict[str, Any]], None]) -> None:
        super().__init__(enabled=False)
        self._send = send

    def warn(self, message: str) -> None:
        self._send({"warning": message})

    def note(self, message: str) -> None:
        self._send({"warning": f"note: {message}"})


def serve(lines, send: Callable[[dict[str, Any]], None]) -> None:
    """A worker: prepare the job of the first line, then audit each group of rows sent."""
    from harness.plugin.manager import PluginManager
    from harness.running.preparation import RunOptions
    from harness.store.store import ResultStore

    job = json.loads(next(iter(lines)))
    options = RunOptions(**{k: Path(v) if k in ("db", "cache_dir") and v is not None else v
                            for k, v in job["options"].items()})  # fmt: skip
    manager = PluginManager(third_party=job["third_party"])
    checks = [manager.registry.get("checks", n) for n in manager.registry.names("checks")]
    progress = _Reporting(send)
    store = ResultStore(Path(job["db"]))
    session = None
    try:  # (its plugin hosts end with it)
        session = AuditSession(store, job["run_id"], options, progress, manager,
                               Budget(**job["budget"]))  # fmt: skip
        attacked: dict[str, dict] = {}
        for line in lines:
            if not line.strip():
                continue
            for method, setting, entropy in json.loads(line)["rows"]:
                audit = session.audit(method, setting, int(entropy))
                audit_row(store, audit, checks, progress, lambda name: send({"check": name}))
                if job["attack"]:
                    run_attack(store, audit, progress, attacked)
                    send({"attacked": True})
            send({"done": True})
    finally:
        if session is not None:
            session.close()
        store.close()
        manager.close()


def main() -> None:
    from harness.foundation.threads import set_passive_wait

    set_passive_wait()  # before torch starts its OpenMP runtime
    out = sys.stdout
    sys.stdout = sys.stderr  # prints of plugins and libraries stay out of the protocol

    def send(event: dict[str, Any]) -> None:
        out.write(json.dumps(event) + "\n")
        out.flush()

    lines = iter(sys.stdin.readline, "")
    job_line = next(lines, "")
    if not job_line:
        return
    from harness.foundation.parent_watch import exit_with_parent

    exit_with_parent(int(json.loads(job_line)["parent"]))
    serve(_prepended(job_line, lines), send)


def _prepended(first: str, rest):
    yield first
    yield from rest


if __name__ == "__main__":
    main()
