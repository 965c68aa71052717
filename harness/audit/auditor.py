"""Runs the registered soundness checks on a finished run and stores their verdicts: row
after row in this process, or side by side in audit workers (:mod:`harness.audit.workers`)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from harness.audit.audit import Budget
from harness.audit.session import AuditSession, audit_row, run_attack, stored_result
from harness.audit.workers import audit_side_by_side, default_workers
from harness.engine.determinism import kernels_restored
from harness.foundation.progress import Progress
from harness.foundation.threads import available_cores
from harness.foundation.verdict import CheckResult
from harness.plugin.manager import PluginManager, managed
from harness.running.preparation import RunOptions
from harness.store.store import ResultStore
from harness.store.storedrun import StoredRun


def run_checks(
    db, run_id: str | None, options: RunOptions, progress: Progress,
    manager: PluginManager | None = None, method: str | None = None, budget: str | Budget = "small",
    orders: int | None = None, entropy: int | Mapping[tuple[str, str], int] | None = None,
    attack: bool = True, workers: int | None = 1, resume: bool = False,
) -> dict[tuple[str, str], list[CheckResult]]:  # fmt: skip
    """Run every registered check on every (method, setting); store and return the results.

    With ``resume`` (a run continued after an interruption), a row whose audit is stored
    whole (:func:`audited`) is not audited again; its stored results are returned.

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
                           entropy, attack, workers, resume)  # fmt: skip


def _run_checks(
    db, run_id, options, progress, manager: PluginManager, method, budget, orders, entropy,
    attack, workers, resume,
) -> dict[tuple[str, str], list[CheckResult]]:  # fmt: skip
    """:func:`run_checks` with its plugin manager."""
    checks = [manager.registry.get("checks", n) for n in manager.registry.names("checks")]
    store = ResultStore(db)
    threads = torch.get_num_threads()
    session = None
    try:
        with kernels_restored():  # the session computes with deterministic kernels on CUDA
            session = AuditSession(store, run_id, options, progress, manager, budget, orders)
            store.record_plugin_hosts(session.stored.run_id, manager.hosting())  # (the checks')
            rows = session.rows(method, entropy)
            kept = _kept(session, rows, checks, attack, entropy) if resume else {}
            if kept:
                progress.note(f"{len(kept)} of {len(rows)} rows were audited before; auditing "
                              f"the other {len(rows) - len(kept)}")  # fmt: skip
            rows = [row for row in rows if row[:2] not in kept]
            if workers is None:
                workers = default_workers(available_cores(), session.threads)
            if workers > 1 and len(rows) > 1 and manager.portable:
                return kept | audit_side_by_side(session, rows, store, checks, progress, manager,
                                                 attack, workers)  # fmt: skip
            out: dict[tuple[str, str], list[CheckResult]] = kept
            attacked: dict[str, dict] = {}
            for method_name, setting, chosen in rows:
                audit = session.audit(method_name, setting, chosen)
                out[method_name, setting] = audit_row(store, audit, checks, progress)
                if attack:
                    run_attack(store, audit, progress, attacked)
            return out
    finally:
        if session is not None:
            session.close()
        store.close()
        torch.set_num_threads(threads)


def _kept(
    session: AuditSession, rows: list, checks: list, attack: bool, entropy
) -> dict[tuple[str, str], list[CheckResult]]:
    """The stored results of those of ``rows`` audited whole (:func:`audited`)."""
    names = [check.name for check in checks]
    stored = {(c.method, c.setting, c.check): c for c in session.stored.checks}
    done = audited(session.stored, names, session.budget.name, attack, entropy)
    return {(m, s): [stored_result(stored[m, s, name]) for name in names]
            for m, s, _ in rows if (m, s) in done}  # fmt: skip


def audited(
    stored: StoredRun, names: list[str], budget: str, attack: bool,
    entropy: int | Mapping[tuple[str, str], int] | None = None,
) -> set[tuple[str, str]]:  # fmt: skip
    """The (method, setting) rows of ``stored`` whose audit is stored whole: every check of
    ``names`` at ``budget``, all from one entropy (``entropy`` when one is given for every
    row) and, with ``attack`` at a budget that attacks, the empirical attack of the same
    audit. A row cut short is not (some checks stored, or an earlier audit's checks or
    attack partly replaced by a later one's): its audit is redone from the start, so that
    one entropy made all of it."""
    from harness.audit.empirical import STRENGTHS

    wanted = None if entropy is None or isinstance(entropy, Mapping) else f"{entropy:032x}"
    made: dict[tuple[str, str], dict[str, str | None]] = {}  # row -> check -> its entropy
    for c in stored.checks:
        if c.budget == budget and c.check in names:
            made.setdefault((c.method, c.setting), {})[c.check] = (c.evidence or {}).get("entropy")
    whole: dict[tuple[str, str], str | None] = {}  # row -> the one entropy of all its checks
    for key, entropies in made.items():
        one = set(entropies.values())
        if len(entropies) == len(set(names)) and len(one) == 1 and wanted in one | {None}:
            whole[key] = one.pop()
    if not (attack and STRENGTHS.get(budget) is not None):
        return set(whole)
    # an attack is made with its row's entropy, or with that of a row sharing its smoothed
    # classifier: one of an earlier audit (no whole row has its entropy now) is stale
    attacked = {(a.method, a.setting): a.result.get("entropy") for a in stored.attacks
                if a.budget == budget}  # fmt: skip
    current = set(whole.values())
    return {key for key in whole if key in attacked and attacked[key] in current | {None}}
