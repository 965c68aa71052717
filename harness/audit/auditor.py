"""Runs the registered soundness checks on a finished run and stores their verdicts."""

from __future__ import annotations

import traceback
from collections.abc import Iterator, Mapping
from dataclasses import replace

import torch

from harness.audit.audit import BUDGETS, Audit, Budget, fresh_entropy
from harness.certification.method import build_method
from harness.engine.arithmetic import run_threads
from harness.engine.determinism import enable_deterministic_kernels, kernels_restored
from harness.engine.sampling import resolve_device
from harness.foundation.errors import IdrsError
from harness.foundation.identity import setting_key
from harness.foundation.progress import Progress
from harness.foundation.verdict import CheckResult, Verdict
from harness.mathematics.accuracy import benchmark_radii
from harness.plugin.manager import PluginManager
from harness.running.benchmark import benchmark_from_dict
from harness.running.preparation import RunOptions, prepare
from harness.running.redraw import ReplaySource
from harness.store.store import ResultStore
from harness.store.storedrun import StoredRun, read_run


def audits(
    store: ResultStore,
    run_id: str | None,
    options: RunOptions,
    progress: Progress,
    manager: PluginManager,
    method: str | None = None,
    budget: str | Budget = "small",
    orders: int | None = None,
    entropy: int | Mapping[tuple[str, str], int] | None = None,
) -> Iterator[Audit]:
    """One :class:`Audit` per (method, setting) of the run that has certificates, each with
    fresh audit-time entropy (``entropy``, when given, re-runs an audit from its record;
    a mapping (method, setting) -> entropy re-runs those rows' audits, and only those).
    torch computes with the run's thread count from then on (:func:`~harness.engine.
    arithmetic.run_threads`), on CUDA with deterministic kernels (:mod:`harness.engine.
    determinism`; :func:`run_checks` restores both as they were)."""
    if isinstance(budget, str) and budget not in BUDGETS:
        raise IdrsError(f"unknown budget {budget!r}; choose one of {sorted(BUDGETS)}")
    if orders is not None and orders < 1:
        raise IdrsError(f"--orders must be >= 1, got {orders}")
    limits = BUDGETS[budget] if isinstance(budget, str) else budget
    limits = limits if orders is None else replace(limits, orders=orders)
    stored = read_run(store, run_id)
    run = stored.run
    if stored.imported:
        raise IdrsError(
            f"run {run['run_id'][:12]} is an imported log: its radii are claims with no "
            "evidence (no class counts), so there is nothing to audit"
        )
    spec = benchmark_from_dict(run["config"])
    methods = [m.name for m in spec.methods]
    if method is not None and method not in methods:
        raise IdrsError(
            f"run {run['run_id'][:12]} has no method {method!r}; it has {', '.join(methods)}"
        )
    threads = run_threads(run.get("arithmetic"), options.threads)
    if threads is not None:  # σ recomputed by the replay check rounds as when certified
        torch.set_num_threads(threads)
    device = options.device or run["device"]
    enable_deterministic_kernels(resolve_device(device))
    prepared = prepare(spec, RunOptions(**{**vars(options), "device": device}), progress, manager)
    if prepared.recipe_hash != run["recipe_hash"]:
        raise IdrsError("the base model recipe changed since the run; rerun the benchmark")
    if run.get("weights_digest") and prepared.weights_digest != run["weights_digest"]:
        raise IdrsError(
            f"the base model's weights (sha256 {prepared.weights_digest[:12]}) are not the "
            f"run's ({run['weights_digest'][:12]}); audit with the run's weights "
            "([model] checkpoint) or rerun the benchmark"
        )
    rows = {(row.method, row.setting): row for row in stored.rows()}
    radii = tuple(benchmark_radii(run["config"]))
    source = replay_source(store, stored, spec, prepared.recipe_hash, options)
    for config in spec.methods:
        if method is not None and config.name != method:
            continue
        method_spec = prepared.registry.get("methods", config.name)
        for setting in config.settings:
            key = setting_key(setting)
            row = rows.get((config.name, key))
            recorded = entropy.get((config.name, key)) if isinstance(entropy, Mapping) else entropy
            if row is None or (isinstance(entropy, Mapping) and recorded is None):
                continue
            certs = [c.as_dict() for c in row.certificates]
            params = {**method_spec.defaults, **setting}
            context = replace(prepared.context, method=config.name, setting=key)
            provider, certifier = build_method(prepared.registry, config.name, params, context)
            inputs = prepared.dataset.test_x[torch.tensor([c.input_id for c in row.certificates])]
            yield Audit(run["run_id"], method_spec, key, params, context, provider, certifier, certs,
                        inputs, limits, prepared.registry, radii,
                        fresh_entropy() if recorded is None else recorded, source)  # fmt: skip


def replay_source(
    store: ResultStore, stored: StoredRun, spec, recipe_hash: str, options: RunOptions
) -> ReplaySource:
    """The files of a stored run the replay check re-draws its samples from."""
    from harness.running.runfiles import SIGMA_MODEL, weights_file

    run = stored.run
    weights, fmt = weights_file(spec, recipe_hash, options.cache_dir)
    models = {f["name"]: {"path": f["path"], "sha256": f["sha256"], **f["meta"]}
              for f in store.files(run["run_id"]) if f["role"] == SIGMA_MODEL}  # fmt: skip
    return ReplaySource(run["config"], weights, fmt, run.get("weights_digest"),
                        run.get("arithmetic"), stored.data_files, options.data_root, models,
                        "run `idrs-bench run` on the spec again to rebuild it")  # fmt: skip


def run_checks(
    db, run_id: str | None, options: RunOptions, progress: Progress,
    manager: PluginManager | None = None, method: str | None = None, budget: str | Budget = "small",
    orders: int | None = None, entropy: int | Mapping[tuple[str, str], int] | None = None,
    attack: bool = True,
) -> dict[tuple[str, str], list[CheckResult]]:  # fmt: skip
    """Run every registered check on every (method, setting); store and return the results.

    Each row's audit-time entropy is recorded in each of its checks' evidence
    (``entropy``, hex), from which the audit can be re-run (``entropy``: one for every
    row, or per (method, setting), auditing only those rows).

    With ``attack``, each row is then attacked (:func:`run_attack`) at the strength of its
    budget (``small`` or ``full``; a custom budget does not attack): the empirical robust
    accuracy a board shows beside the certified one."""
    manager = manager or PluginManager()
    checks = [manager.registry.get("checks", n) for n in manager.registry.names("checks")]
    store = ResultStore(db)
    out: dict[tuple[str, str], list[CheckResult]] = {}
    attacked: dict[str, dict] = {}
    threads = torch.get_num_threads()
    try:
        with kernels_restored():  # audits() computes with deterministic kernels on CUDA
            for audit in audits(
                store, run_id, options, progress, manager, method, budget, orders, entropy
            ):
                out[audit.method.name, audit.setting] = _checked(audit, checks, store, progress)
                if attack:
                    run_attack(store, audit, progress, attacked)
    finally:
        store.close()
        torch.set_num_threads(threads)
    return out


def _checked(
    audit: Audit, checks: list, store: ResultStore, progress: Progress
) -> list[CheckResult]:
    """Every check on one row, each result stored as soon as it exists."""
    results = []
    with progress.task(
        f"checks {audit.method.name} {audit.setting}", len(checks), "checks"
    ) as advance:
        for check in checks:
            try:
                result = check.run(audit)
                if not isinstance(result, CheckResult) or result.verdict not in set(Verdict):
                    raise TypeError(f"returned {result!r}, not a CheckResult with a Verdict")
            except Exception as exc:  # a check that raises did not complete: `error`
                result = CheckResult(
                    check.name, Verdict.ERROR, f"check raised {type(exc).__name__}: {exc}",
                    {"traceback": traceback.format_exc(limit=-3)},
                )  # fmt: skip
                progress.warn(
                    f"check {check.name} raised on {audit.method.name} ({audit.setting}): "
                    f"{exc}; the row is not verified"
                )
            result.evidence.setdefault("entropy", f"{audit.entropy:032x}")
            store.add_check(
                audit.run_id, audit.method.name, audit.setting, result, audit.budget.name
            )
            results.append(result)
            advance(1)
    return results


def run_attack(store: ResultStore, audit: Audit, progress: Progress, attacked: dict) -> None:
    """The empirical attack on one row (:mod:`harness.audit.empirical`), stored; rows with the
    same smoothed classifier (``attacked``, by :func:`harness.audit.empirical.classifier_key`)
    share one attack. An attack that raises is reported and stores nothing (the board
    then shows no empirical accuracy for the row)."""
    from harness.audit.empirical import STRENGTHS, attack_row, classifier_key

    strength = STRENGTHS.get(audit.budget.name)
    if strength is None:
        return
    key = classifier_key(audit)
    name = f"attack {audit.method.name} {audit.setting}"
    with progress.task(name, 1, "rows") as advance:
        try:
            if key not in attacked:
                attacked[key] = attack_row(audit, strength)
            result = attacked[key]
        except Exception as exc:  # reported, never a silent number
            progress.warn(f"{name} raised {type(exc).__name__}: {exc}; no empirical accuracy")
            return
        store.add_attack(audit.run_id, audit.method.name, audit.setting, audit.budget.name, result)
        advance(1)
