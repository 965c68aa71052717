"""A finished run prepared for its audits, and one row's audit: every registered check on
it, each result stored with what it cost, then the empirical attack."""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace

import torch

from harness.audit.audit import BUDGETS, Audit, Budget, fresh_entropy
from harness.audit.cost import measured
from harness.certification.method import build_method
from harness.engine.arithmetic import run_threads
from harness.engine.centre import drawn_with_centre
from harness.engine.determinism import enable_deterministic_kernels
from harness.engine.sampling import resolve_device
from harness.engine.scale import drawn_with_scale
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
from harness.store.storedrun import StoredCheck, StoredRun, read_run


class AuditSession:
    """A finished run prepared for its audits: its stored rows and spec, dataset, base model
    and build context (:func:`~harness.running.preparation.prepare`, once) and the files
    the replay check re-draws from; :meth:`audit` builds one row's :class:`Audit`.

    torch computes with the run's thread count from then on
    (:func:`~harness.engine.arithmetic.run_threads`), on CUDA with deterministic kernels
    (:mod:`harness.engine.determinism`; :func:`run_checks` restores both as they were)."""

    def __init__(
        self, store: ResultStore, run_id: str | None, options: RunOptions, progress: Progress,
        manager: PluginManager, budget: str | Budget = "small", orders: int | None = None,
    ) -> None:  # fmt: skip
        if isinstance(budget, str) and budget not in BUDGETS:
            raise IdrsError(f"unknown budget {budget!r}; choose one of {sorted(BUDGETS)}")
        if orders is not None and orders < 1:
            raise IdrsError(f"--orders must be >= 1, got {orders}")
        limits = BUDGETS[budget] if isinstance(budget, str) else budget
        self.budget = limits if orders is None else replace(limits, orders=orders)
        self.stored = read_run(store, run_id)
        run = self.stored.run
        if self.stored.imported:
            raise IdrsError(
                f"run {run['run_id'][:12]} is an imported log: its radii are claims with no "
                "evidence (no class counts), so there is nothing to audit"
            )
        self.spec = benchmark_from_dict(run["config"])
        self.threads = run_threads(run.get("arithmetic"), options.threads)
        if self.threads is not None:  # σ recomputed by the replay check rounds as when certified
            torch.set_num_threads(self.threads)
        device = options.device or run["device"]
        enable_deterministic_kernels(resolve_device(device))
        self.options = RunOptions(**{**vars(options), "device": device})
        self.prepared = prepare(self.spec, self.options, progress, manager)
        if self.prepared.recipe_hash != run["recipe_hash"]:
            raise IdrsError("the base model recipe changed since the run; rerun the benchmark")
        if run.get("weights_digest") and self.prepared.weights_digest != run["weights_digest"]:
            raise IdrsError(
                f"the base model's weights (sha256 {self.prepared.weights_digest[:12]}) are not "
                f"the run's ({run['weights_digest'][:12]}); audit with the run's weights "
                "([model] checkpoint) or rerun the benchmark"
            )
        self.source = replay_source(store, self.stored, self.spec, self.prepared.recipe_hash,
                                    options)  # fmt: skip
        self._rows = {(row.method, row.setting): row for row in self.stored.rows()}

    def rows(
        self, method: str | None = None,
        entropy: int | Mapping[tuple[str, str], int] | None = None,
    ) -> list[tuple[str, str, int | None]]:  # fmt: skip
        """(method, setting, entropy to re-run or None) of every row with certificates, in
        the spec's order: ``method``'s only, and with a mapping ``entropy`` only its rows."""
        run = self.stored.run
        methods = [m.name for m in self.spec.methods]
        if method is not None and method not in methods:
            raise IdrsError(
                f"run {run['run_id'][:12]} has no method {method!r}; it has {', '.join(methods)}"
            )
        out = []
        for config in self.spec.methods:
            if method is not None and config.name != method:
                continue
            for setting in config.settings:
                key = (config.name, setting_key(setting))
                chosen = entropy.get(key) if isinstance(entropy, Mapping) else entropy
                if key in self._rows and not (isinstance(entropy, Mapping) and chosen is None):
                    out.append((*key, chosen))
        return out

    def close(self) -> None:
        """Stop what the audits started for the run (the replay process)."""
        from harness.audit.replay import stop_replayer

        stop_replayer(self.prepared.context)

    def audit(self, method: str, setting: str, entropy: int | None = None) -> Audit:
        """The :class:`Audit` of one row (fresh audit-time entropy unless ``entropy``)."""
        run, prepared = self.stored.run, self.prepared
        method_spec = prepared.registry.get("methods", method)
        config = next(c for c in self.spec.methods if c.name == method)
        params = {**method_spec.defaults,
                  **next(s for s in config.settings if setting_key(s) == setting)}  # fmt: skip
        row = self._rows[method, setting]
        certs = [c.as_dict() for c in row.certificates]
        context = replace(prepared.context, method=method, setting=setting)
        provider, certifier = build_method(prepared.registry, method, params, context)
        inputs = prepared.dataset.test_x[torch.tensor([c.input_id for c in row.certificates])]
        return Audit(run["run_id"], method_spec, setting, params, context, provider, certifier,
                     certs, inputs, self.budget, prepared.registry,
                     tuple(benchmark_radii(run["config"])),
                     fresh_entropy() if entropy is None else entropy, self.source)  # fmt: skip


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
    """One :class:`Audit` per (method, setting) of the run that has certificates
    (:class:`AuditSession`), each with fresh audit-time entropy (``entropy``, when given,
    re-runs an audit from its record; a mapping (method, setting) -> entropy re-runs those
    rows' audits, and only those)."""
    session = AuditSession(store, run_id, options, progress, manager, budget, orders)
    for method_name, setting, chosen in session.rows(method, entropy):
        yield session.audit(method_name, setting, chosen)


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


def audit_row(
    store: ResultStore, audit: Audit, checks: list, progress: Progress,
    done: Callable[[str], None] | None = None,
) -> list[CheckResult]:  # fmt: skip
    """Every check on one row, each stored with its cost as it finishes (``done(check)``
    is told); the results."""
    results = []
    for check in checks:  # work a check waits for, started while the others run
        if check.prepare is not None:
            with contextlib.suppress(Exception):  # the check reports what fails
                check.prepare(audit)
    name = f"checks {audit.method.name} {audit.setting}"
    with progress.task(name, len(checks), "checks") as advance:
        for check in checks:
            with measured(audit.queries) as cost:
                result = _checked_run(check, audit, progress)
            result.evidence.setdefault("entropy", f"{audit.entropy:032x}")
            result.cost = cost().record()
            store.add_check(audit.run_id, audit.method.name, audit.setting, result,
                            audit.budget.name)  # fmt: skip
            results.append(result)
            advance(1)
            if done is not None:
                done(check.name)
    return results


def stored_result(stored: StoredCheck) -> CheckResult:
    """A stored check as the :class:`CheckResult` that made it."""
    return CheckResult(stored.check, Verdict(stored.verdict), stored.summary,
                       dict(stored.evidence or {}), list(stored.flags))  # fmt: skip


NOISE_FEATURES = (
    ("diagonal", drawn_with_scale, "diagonal scale", "a diagonal noise scale",
     "drawn at one σ per input dimension", "A diagonal scale"),
    ("centred", drawn_with_centre, "noise centre", "a noise centre",
     "drawn around x + μ(x)", "A noise centre"),
)  # fmt: skip
"""What a check declares it audits (its attribute), how a row shows it was drawn so, and
how a refusal names it: a diagonal scale (:mod:`harness.engine.scale`: an ℓ2 ball at the
smallest axis judged at one σ, or an ellipsoid not judged at all, would pass unexamined)
and a noise centre (:mod:`harness.engine.centre`: a smoothed classifier judged at x whose
noise is drawn at x + μ(x))."""


def unsupported(audit: Audit, check) -> tuple[str, str] | None:
    """(the feature, why) ``check`` cannot audit ``audit``'s row, or None: its
    certificates were drawn with a feature of :data:`NOISE_FEATURES` the check does not
    declare it audits."""
    for attribute, drawn, feature, named, how, section in NOISE_FEATURES:
        if not getattr(check, attribute, False) and drawn(audit.certificates):
            return feature, (f"check {check.name!r} does not support {named} (the row's "
                             f"certificates were {how}); the row is not verified by it "
                             f'(docs/soundness.md, "{section}")')  # fmt: skip
    return None


def _checked_run(check, audit: Audit, progress: Progress) -> CheckResult:
    """``check`` on ``audit``; a check that raises, or answers anything but a
    :class:`CheckResult` with a :class:`Verdict`, did not complete: ``error``; so is a
    check on a row it does not support (:func:`unsupported`)."""
    refused = unsupported(audit, check)
    if refused is not None:
        feature, why = refused
        return CheckResult(check.name, Verdict.ERROR, why, {"unsupported": feature})
    try:
        result = check.run(audit)
        if not isinstance(result, CheckResult) or result.verdict not in set(Verdict):
            raise TypeError(f"returned {result!r}, not a CheckResult with a Verdict")
        return result
    except Exception as exc:
        progress.warn(f"check {check.name} raised on {audit.method.name} ({audit.setting}): "
                      f"{exc}; the row is not verified")  # fmt: skip
        return CheckResult(check.name, Verdict.ERROR, f"check raised {type(exc).__name__}: {exc}",
                           {"traceback": traceback.format_exc(limit=-3)})  # fmt: skip


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
    with progress.task(name, 1, "rows") as advance, measured(audit.queries) as cost:
        try:
            if key not in attacked:
                attacked[key] = attack_row(audit, strength)
            result = attacked[key]
        except Exception as exc:  # reported, never a silent number
            progress.warn(f"{name} raised {type(exc).__name__}: {exc}; no empirical accuracy")
            return
        result = {**result, "cost": cost().record()}  # a shared attack costs this row nothing
        store.add_attack(audit.run_id, audit.method.name, audit.setting, audit.budget.name, result)
        advance(1)
