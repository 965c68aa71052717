"""Runs the registered soundness checks on a finished run and stores their verdicts: row
after row in this process, or side by side in audit workers (:mod:`harness.audit.workers`)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from harness.audit.audit import Budget
from harness.audit.session import AuditSession, audit_row, run_attack
from harness.audit.workers import audit_side_by_side, default_workers
from harness.engine.determinism import kernels_restored
from harness.foundation.progress import Progress
from harness.foundation.threads import available_cores
from harness.foundation.verdict import CheckResult
from harness.plugin.manager import PluginManager, managed
from harness.running.preparation import RunOptions
from harness.store.store import ResultStore


def run_checks(
    db, run_id: str | None, options: RunOptions, progress: Progress,
    manager: PluginManager | None = None, method: str | None = None, budget: str | Budget = "small",
    orders: int | None = None, entropy: int | Mapping[tuple[str, str], int] | None = None,
    attack: bool = True, workers: int | None = 1,
) -> dict[tuple[str, str], list[CheckResult]]:  # fmt: skip
    """Run every registered check on every (method, setting); store and return the results.

    Each row's audit-time entropy is recorded in each of its checks' evidence
    (``entropy``, hex), from which the audit can be re-run (``entropy``: one for every
    row, or per (method, setting), auditing only those rows).

    With ``attack``, each row is then attacked (:func:`run_attack`) at the strength of its
    budget (``small`` or ``full``; a custom budget does not attack): the empirical robust
    accuracy a board shows beside the certified one.

    ``workers`` > 1 audits rows side by side in that many processes
    (:mod:`harness.audit.workers`: this one and ``workers`` − 1 started for it; None: as
    many as :func:`~harness.audit.workers.default_workers` says), when there is more than
    one row and every plugin of ``manager`` can be loaded there. Without a ``manager``, the
    one made here ends its plugin hosts on return."""
    with managed(manager) as manager:
        return _run_checks(db, run_id, options, progress, manager, method, budget, orders,
                           entropy, attack, workers)  # fmt: skip


def _run_checks(
    db, run_id, options, progress, manager: PluginManager, method, budget, orders, entropy,
    attack, workers,
) -> dict[tuple[str, str], list[CheckResult]]:  # fmt: skip
    """:func:`run_checks` with its plugin manager."""
    checks = [manager.registry.get("checks", n) for n in manager.registry.names("checks")]
    store = ResultStore(db)
    threads = torch.get_num_threads()
    try:
        with kernels_restored():  # the session computes with deterministic kernels on CUDA
            session = AuditSession(store, run_id, options, progress, manager, budget, orders)
            store.record_plugin_hosts(session.stored.run_id, manager.hosting())  # (the checks')
            rows = session.rows(method, entropy)
            if workers is None:
                workers = default_workers(available_cores(), session.threads)
            if workers > 1 and len(rows) > 1 and manager.portable:
                return audit_side_by_side(session, rows, store, checks, progress, manager, attack,
                                          workers)  # fmt: skip
            out: dict[tuple[str, str], list[CheckResult]] = {}
            attacked: dict[str, dict] = {}
            for method_name, setting, chosen in rows:
                audit = session.audit(method_name, setting, chosen)
                out[method_name, setting] = audit_row(store, audit, checks, progress)
                if attack:
                    run_attack(store, audit, progress, attacked)
            return out
    finally:
        store.close()
        torch.set_num_threads(threads)
