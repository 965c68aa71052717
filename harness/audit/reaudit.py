"""Re-audit: every check of a run re-run from its recorded entropy, verdicts compared.

A stored verdict is what the audit said when it ran, in a process that had imported the
run's plugins: a plugin that patched the audit then could have stored any verdict.
:func:`reaudit` re-runs each row's audit through :func:`harness.audit.auditor.run_checks`
(the code path of ``idrs-bench check``, in whatever isolation it runs the plugins) with
what the row's checks recorded: the entropy in their evidence (so every random choice,
audited input, trial point and noise stream is the recorded audit's), the budget and the
number of memory orders; against the plugins installed here; and compares each check's
verdict, and the row's, with the recorded ones. Nothing passes by default: a row whose
audit cannot be re-run (a plugin not installed, naming its package; a check recorded
that no installed plugin registers; a record without its entropy; a budget this version
does not define) is an error for that row.

The checks run on a scratch results database holding a copy of the run
(:func:`harness.store.runcopy.copy_run`), never on the record they are compared with.
Before any row, the run's dataset is loaded and its files' SHA-256 compared with those
the run recorded, and the base model's recipe hash with the run's (a base model whose
recipe differs would otherwise be trained again before the audit refuses it). On the
run's arithmetic (:mod:`harness.engine.arithmetic`) a re-audit is the recorded audit
again; elsewhere a statistical check draws with another rounding, and a sound row's
verdict may differ by chance (at most 10⁻³ per statistical check); the replay check
holds σ within a relative tolerance on every arithmetic (:mod:`harness.audit.replay`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness.audit.audit import BUDGETS, Budget, parse_entropy
from harness.audit.auditor import run_checks
from harness.foundation.errors import IdrsError
from harness.foundation.progress import Progress
from harness.foundation.verdict import CheckResult, overall
from harness.plugin.manager import PluginManager, managed
from harness.plugin.registry import Registry
from harness.running.preparation import RunOptions
from harness.store.runcopy import copy_run
from harness.store.store import ResultStore
from harness.store.storedrun import MEMORY_CHECK, StoredRow, StoredRun, read_run


@dataclass(frozen=True)
class RowReaudit:
    """One row's re-audit: each check's ``recorded`` verdict and the row's (``verdict``),
    the re-audit's ``results``, or the ``error`` that kept the audit from being re-run."""

    run_id: str
    method: str
    setting: str
    recorded: dict[str, str]
    verdict: str
    results: dict[str, CheckResult] = field(default_factory=dict)
    error: str | None = None

    @classmethod
    def of(cls, run: StoredRun, row: StoredRow, **kwargs) -> RowReaudit:
        """The re-audit of ``row`` of ``run``, with its recorded verdicts."""
        recorded = {c.check: c.verdict for c in row.checks}
        return cls(run.run_id, row.method, row.setting, recorded, row.verdict, **kwargs)

    @property
    def label(self) -> str:
        return f"run {self.run_id[:12]} {self.method} ({self.setting})"

    @property
    def problems(self) -> list[str]:
        """Why the row's recorded verdicts are not confirmed (empty: every check re-run gave
        its recorded verdict): each differing check with both verdicts, a recorded check
        not re-run, a row verdict that a check the record lacks changes, or the error."""
        if self.error is not None:
            return [f"{self.label}: not re-audited: {self.error}"]
        out = []
        for check, verdict in sorted(self.recorded.items()):
            result = self.results.get(check)
            if result is None:
                out.append(f"{self.label}: check {check} (recorded {verdict!r}) was not re-run: "
                           "no plugin installed here registers it")  # fmt: skip
            elif result.verdict.value != verdict:
                out.append(f"{self.label}: check {check}: recorded {verdict!r}, re-audit "
                           f"{result.verdict.value!r} ({result.summary})")  # fmt: skip
        now = overall(list(self.results.values())).value
        if not out and now != self.verdict:
            out.append(f"{self.label}: row verdict: recorded {self.verdict!r}, re-audit {now!r} "
                       f"(checks the record lacks: {', '.join(self.unrecorded)})")  # fmt: skip
        return out

    @property
    def unrecorded(self) -> list[str]:
        """Checks the re-audit ran that the record lacks (registered since), with verdicts."""
        return [f"{c}: {r.verdict.value}" for c, r in sorted(self.results.items())
                if c not in self.recorded]  # fmt: skip


def reaudit(
    stored: StoredRun, folder: Path, options: RunOptions, progress: Progress,
    manager: PluginManager | None = None, method: str | None = None,
    budgets: Mapping[str, Budget] | None = None, workers: int | None = 1,
) -> list[RowReaudit]:  # fmt: skip
    """Re-run the recorded audit of every checked row of ``stored`` (``method``'s only, when
    given) on a copy of the run in a results database under ``folder``; the base model and
    the plugins' trained parts are read from the model cache as in a run (``options``;
    ``options.db`` is ignored). ``budgets`` names the budgets a record may name (default
    :data:`harness.audit.audit.BUDGETS`); ``workers``: processes auditing rows side by
    side (:func:`~harness.audit.auditor.run_checks`). Without a ``manager``, the one made
    here ends its plugin hosts on return."""
    if stored.imported:
        raise IdrsError(f"run {stored.run_id[:12]} is an imported log: it has no audit to re-run")
    with managed(manager) as manager:
        return _reaudit(stored, folder, options, progress, manager, method,
                        BUDGETS if budgets is None else budgets, workers)  # fmt: skip


def _reaudit(
    stored: StoredRun, folder: Path, options: RunOptions, progress: Progress,
    manager: PluginManager, method: str | None, budgets: Mapping[str, Budget],
    workers: int | None,
) -> list[RowReaudit]:  # fmt: skip
    """:func:`reaudit` with its plugin manager."""
    registry = manager.registry
    rows = [r for r in stored.rows() if r.checks and method in (None, r.method)]
    if not rows:
        return []
    components = stored.run.get("components")
    model = stored.config["model"]
    try:
        wanted = [("datasets", stored.config["dataset"]["name"]),
                  ("models", model.get("architecture")), ("trainers", model.get("trainer"))]  # fmt: skip
        absent = registry.absent([(kind, name) for kind, name in wanted if name], components)
        if absent:
            raise IdrsError(absent)
        _check_inputs(stored, registry, options)
    except Exception as exc:
        return [RowReaudit.of(stored, row, error=_describe(exc)) for row in rows]
    installed = [m for m in stored.config["methods"]
                 if not registry.absent([("methods", m["name"])], components)]  # fmt: skip
    copy = replace(stored, run=stored.run | {"config": stored.config | {"methods": installed}})
    db = Path(folder) / "reaudit.sqlite"
    store = ResultStore(db)
    try:
        copy_run(store, copy)
    finally:
        store.close()
    options = replace(options, db=db)
    planned: dict[tuple[str, int | None], dict[tuple[str, str], int]] = {}
    budget_of: dict[str, Budget] = {}
    out: dict[tuple[str, str], RowReaudit] = {}
    for row in rows:
        try:
            absent = registry.absent([("methods", row.method)], components)
            if absent:
                raise IdrsError(absent)
            entropy, budget, orders = recorded_audit(row, budgets)
        except IdrsError as exc:
            out[row.method, row.setting] = RowReaudit.of(stored, row, error=_describe(exc))
            continue
        budget_of[budget.name] = budget
        planned.setdefault((budget.name, orders), {})[row.method, row.setting] = entropy
    progress.log(f"re-auditing {sum(map(len, planned.values()))} row(s) of run "
                 f"{stored.run_id[:12]}: every check again, from its recorded entropy")  # fmt: skip
    for (name, orders), entropies in planned.items():
        try:
            results = run_checks(db, stored.run_id, options, progress, manager, None,
                                 budget_of[name], orders, entropies, attack=False,
                                 workers=workers)  # fmt: skip
        except Exception:  # one row's audit failed: re-run the rows one by one to say which
            results = {}
            for key, entropy in entropies.items():
                try:
                    results |= run_checks(db, stored.run_id, options, progress, manager, None,
                                          budget_of[name], orders, {key: entropy}, attack=False)  # fmt: skip
                except Exception as exc:  # the row is not re-audited: an error, never a pass
                    results[key] = exc
        for row in rows:
            key = (row.method, row.setting)
            if key not in entropies:
                continue
            found = results.get(key)
            if isinstance(found, list):
                out[key] = RowReaudit.of(stored, row, results={r.check: r for r in found})
            else:
                error = found or IdrsError("the run's spec has no such row")
                out[key] = RowReaudit.of(stored, row, error=_describe(error))
    return [out[row.method, row.setting] for row in rows]


def reaudit_stored(
    db: Path, run_id: str | None, options: RunOptions, progress: Progress,
    manager: PluginManager | None = None, method: str | None = None,
    budgets: Mapping[str, Budget] | None = None, workers: int | None = 1,
) -> tuple[StoredRun, list[RowReaudit]]:  # fmt: skip
    """:func:`reaudit` of run ``run_id`` (None: the latest) of the results database ``db``,
    which is only read; returns the run and the rows' re-audits."""
    store = ResultStore(db)
    try:
        stored = read_run(store, run_id)
    finally:
        store.close()
    with tempfile.TemporaryDirectory(prefix="idrs-reaudit-") as folder:
        return stored, reaudit(stored, Path(folder), options, progress, manager, method, budgets,
                               workers)  # fmt: skip


def recorded_audit(row: StoredRow, budgets: Mapping[str, Budget]) -> tuple[int, Budget, int | None]:
    """The audit a row's checks recorded: its entropy, its budget and, when the memory
    check replayed another number of orders than the budget's, that number."""
    unrecorded = sorted(c.check for c in row.checks if not (c.evidence or {}).get("entropy"))
    if unrecorded:
        raise IdrsError(f"the evidence of {', '.join(unrecorded)} records no entropy (audited "
                        "before it was recorded): its random choices cannot be made again")  # fmt: skip
    entropies = sorted({c.evidence["entropy"] for c in row.checks})
    if len(entropies) > 1:
        raise IdrsError(f"its checks were recorded by {len(entropies)} audits (entropies "
                        f"{', '.join(entropies)}); re-run each with `idrs-bench check --entropy`")  # fmt: skip
    names = sorted({str(c.budget) for c in row.checks})
    if len(names) > 1 or names[0] not in budgets:
        raise IdrsError(f"its checks were recorded at the budget {' and '.join(names)}; this "
                        f"version defines {', '.join(budgets)}")  # fmt: skip
    budget = budgets[names[0]]
    memory = next((c for c in row.checks if c.check == MEMORY_CHECK and c.applied), None)
    orders = (memory.evidence or {}).get("orders") if memory is not None else None
    return parse_entropy(entropies[0]), budget, None if orders in (None, budget.orders) else orders


def _check_inputs(stored: StoredRun, registry: Registry, options: RunOptions) -> None:
    """The run's dataset, loaded here, must be the files the run read (SHA-256), and the
    base model's recipe the run's (else the model cache would train another one)."""
    from harness.foundation.identity import content_hash
    from harness.running.benchmark import benchmark_from_dict
    from harness.running.modelcache import model_recipe
    from harness.running.preparation import load_dataset

    spec = benchmark_from_dict(stored.config)
    dataset = load_dataset(spec, registry, replace(options, db=Path(os.devnull)))
    recorded = stored.data_files
    if recorded is not None and sorted(recorded.values()) != sorted(dataset.files.values()):
        raise IdrsError(f"the data files read here (SHA-256 {sorted(dataset.files.values())}) are "
                        f"not the run's ({sorted(recorded.values())}); pass the run's --data-root")  # fmt: skip
    if spec.model.checkpoint is None:
        recipe = content_hash(model_recipe(spec.model, dataset, registry))
        if recipe != stored.run["recipe_hash"]:
            raise IdrsError(f"the base model's recipe computed here ({recipe[:12]}) is not the "
                            f"run's ({stored.run['recipe_hash'][:12]}): the installed "
                            "architecture or trainer has other defaults than the run's version")  # fmt: skip


def _describe(exc: Exception) -> str:
    text = str(exc) if isinstance(exc, IdrsError) else f"{type(exc).__name__}: {exc}"
    return (text.splitlines() or [type(exc).__name__])[0]
