"""A stored run read back typed: per (method, setting) its certificates, checks and verdict.

:mod:`harness.store.store` writes a run; this module is the one place that reads it back.
:class:`StoredRun` holds the ``runs`` row, the certificates (:class:`StoredCertificate`),
the soundness-check rows (:class:`StoredCheck`) and the failures of one run, from a
results database (:func:`read_run`, :func:`load_runs`) or from a run export
(:mod:`harness.reports.leaderboard.source`). :meth:`StoredRun.rows` groups them by (method,
setting) into :class:`StoredRow` objects, each with its verdict, so that ``results``,
``compare``, the leaderboard and the soundness runner group and judge in one way.

A row's verdict combines its checks as :func:`harness.foundation.verdict.overall` does:
``violated`` or ``unjustified`` if a check says so; else ``not-verified`` if a check
raised (``error``) or none applied; else ``order-dependent`` for memory certificates
(never sound, Súkeník et al. 2022, App. C.2); else ``sound``. A verdict string the
harness does not know counts as ``violated`` (the safe side). A row without any check
row is ``not checked``; a row of a run imported from a published log is ``imported``
(claims without evidence, never checked).

The empirical attack's result on a row (:mod:`harness.audit.empirical`), when one ran, is its
:class:`StoredAttack`: the radii attacked, the inputs, which broke at which radius.

Completeness (:meth:`StoredRun.settings`): a setting of the run's spec is complete when
the run finished and stored as many certificates as the run recorded test inputs (when
it recorded none, e.g. in an export, a finished run counts as complete).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from harness.foundation.errors import IdrsError
from harness.foundation.identity import setting_key
from harness.foundation.verdict import CheckResult, Verdict, overall
from harness.mathematics.accuracy import RADII, summary
from harness.store.store import ResultStore

NOT_CHECKED = "not checked"
IMPORTED = "imported"  # radii from a published log: claims with no evidence to check
SOUND = "sound"
ORDER_DEPENDENT = "order-dependent"
NOT_APPLICABLE = "not-applicable"
MEMORY_CHECK = "memory-order"
"""The check whose evidence holds the worst replayed order of memory certificates."""

RUN_FIELDS = (
    "run_id", "name", "created", "finished", "config", "versions", "git_commit", "device", "seed",
    "recipe_hash")  # fmt: skip
"""The fields of the ``runs`` row a :class:`StoredRun` keeps (plus ``weights_digest`` and
``class_names``, the dataset's class names, ``arithmetic``, :mod:`harness.engine.arithmetic`,
``components``, :meth:`~harness.store.store.ResultStore.record_components`,
``plugin_hosts``, :meth:`~harness.store.store.ResultStore.record_plugin_hosts`, and
``test_split``, :data:`harness.foundation.data.WITHHELD`, where recorded)."""


@dataclass(frozen=True)
class StoredCertificate:
    """One row of the ``certificates`` table.

    ``prediction`` is CERTIFY's class (-1: abstained) with certified ℓ2 ``radius``,
    ``predict`` PREDICT's class, ``label`` the true class; ``draws`` are the harness's
    own draws per smoothing (:meth:`harness.engine.draws.Draws.record`). A run export keeps
    the columns the metrics use and the evidence (``p_lower``, ``alpha``, ``evidence``,
    ``draws``, ``region``); ``shard`` and the legacy class-count columns (the counts are in
    ``draws``) are None for its certificates, and so is the evidence of a format-1 export.
    """

    method: str
    setting: str
    input_id: int
    label: int
    prediction: int
    predict: int
    radius: float
    sigma: float
    seconds: float
    shard: int | None = None
    p_lower: float | None = None
    alpha: float | None = None
    counts_selection: list[int] | None = None
    counts_estimation: list[int] | None = None
    evidence: dict[str, Any] | None = None
    draws: dict[str, Any] | None = None
    load: float | None = None  # the machine's load per processor behind ``seconds``
    region: dict[str, Any] | None = None  # beside the ℓ2 ball: harness.foundation.certificate

    @property
    def correct(self) -> bool:
        """CERTIFY's class is the label (its radius then counts as certified)."""
        return self.prediction == self.label

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> StoredCertificate:
        """From a row of the ``certificates`` table (JSON columns parsed or text) or an export."""
        values = {f.name: row.get(f.name) for f in fields(cls)}
        for key in ("counts_selection", "counts_estimation", "evidence", "draws", "region"):
            if isinstance(values[key], str):
                values[key] = json.loads(values[key])
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        """The certificate as a deep-copied dict (what audits and plugin hooks read): pickled
        and back, 4× faster than ``asdict`` on a sequential certificate's looks."""
        try:
            return pickle.loads(pickle.dumps(self.__dict__, pickle.HIGHEST_PROTOCOL))
        except (pickle.PicklingError, TypeError, AttributeError):  # not plain data
            return asdict(self)


@dataclass(frozen=True)
class StoredCheck:
    """One soundness check's stored verdict on a (method, setting) with its ``evidence``
    (a dict; None when not recorded, e.g. a format-1 run export), and, for memory
    certificates, the worst replayed input order and the ACR spread over orders
    (``order``) at which a board scores them."""

    method: str
    setting: str
    check: str
    verdict: str
    summary: str = ""
    flags: tuple[str, ...] = ()
    budget: str | None = None
    order: dict[str, Any] | None = None
    evidence: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    cost: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def applied(self) -> bool:
        return self.verdict != NOT_APPLICABLE

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> StoredCheck:
        """From a row of the ``checks`` table (``check_name``, JSON text) or an export."""
        flags = row.get("flags")
        if isinstance(flags, str):
            try:
                flags = json.loads(flags)
            except json.JSONDecodeError:
                flags = [flags]
        order = row.get("order")
        if order is None:
            order = _order_evidence(row.get("evidence"))
        evidence, cost = (_parsed(row.get(key)) for key in ("evidence", "cost"))
        return cls(
            method=row["method"],
            setting=row["setting"],
            check=str(row.get("check_name", row.get("check", "?"))),
            verdict=str(row["verdict"]),
            summary=str(row.get("summary") or ""),
            flags=tuple(str(f) for f in (flags or [])),
            budget=None if row.get("budget") is None else str(row["budget"]),
            order=order,
            evidence=evidence if isinstance(evidence, dict) else None,
            cost=cost if isinstance(cost, dict) else None,
        )

    def as_dict(self) -> dict[str, Any]:
        """The check as a run export holds it (``order`` only for memory certificates;
        ``evidence`` when it was read with it; never ``cost``, which is this machine's)."""
        out = asdict(self)
        del out["cost"]
        out["flags"] = list(self.flags)
        for key in ("order", "evidence"):
            if out[key] is None:
                del out[key]
        return out


def _parsed(value: Any) -> Any:
    """A JSON column's value parsed (None when it does not parse)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return None


def _order_evidence(evidence: Any) -> dict[str, Any] | None:
    """The memory-order check's worst replayed order and ACR spread, if the evidence has them."""
    if isinstance(evidence, str):
        try:
            evidence = json.loads(evidence)
        except json.JSONDecodeError:
            return None
    if not isinstance(evidence, dict) or "worst_order" not in evidence:
        return None
    return {"orders": evidence.get("orders"), "acr": evidence.get("acr"),
            "worst_order": evidence["worst_order"]}  # fmt: skip


@dataclass(frozen=True)
class StoredAttack:
    """The empirical attack on one (method, setting) (:func:`harness.audit.empirical.attack_row`):
    ``result`` has ``radii``, ``inputs``, ``broken`` (input id -> radius) and ``strength``;
    a run export keeps those (and ``classifier`` for memory rows), the database also the
    examples, level and time."""

    method: str
    setting: str
    budget: str
    result: dict[str, Any]

    EXPORTED = ("radii", "inputs", "broken", "strength", "classifier")

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> StoredAttack:
        result = row["result"]
        if isinstance(result, str):
            result = json.loads(result)
        return cls(row["method"], row["setting"], str(row["budget"]), result)

    def as_dict(self) -> dict[str, Any]:
        """The attack as a run export holds it."""
        kept = {k: self.result[k] for k in self.EXPORTED if k in self.result}
        return {"method": self.method, "setting": self.setting, "budget": self.budget,
                "result": kept}  # fmt: skip


@dataclass(frozen=True)
class Completeness:
    """How many inputs a (method, setting) of the spec stored, of how many, and whether
    it is complete."""

    method: str
    setting: str
    inputs: int
    expected: int | None
    complete: bool


def incomplete_note(settings: Iterable[Completeness]) -> str | None:
    """``"incomplete: cohen sigma=0.5 12 of 48 inputs; ..."``, or None when all are complete."""
    parts = [
        f"{s.method} {s.setting} {s.inputs} of {s.expected or '?'} inputs"
        for s in settings
        if not s.complete
    ]
    return "incomplete: " + "; ".join(parts) if parts else None


def combined_verdict(checks: Sequence[StoredCheck]) -> str:
    """The verdict of one (method, setting) from its stored checks (see the module doc)."""
    if not checks:
        return NOT_CHECKED
    known = {v.value: v for v in Verdict}
    results = [CheckResult(c.check, known.get(c.verdict, Verdict.VIOLATED), "") for c in checks]
    return overall(results).value


@dataclass(frozen=True)
class StoredRow:
    """One (method, setting) of a run: its certificates (by input id), checks and verdict.

    ``status`` is None for a (method, setting) that is not in the run's spec.
    """

    run_id: str
    method: str
    setting: str
    certificates: tuple[StoredCertificate, ...]
    checks: tuple[StoredCheck, ...]
    verdict: str
    status: Completeness | None
    attack: StoredAttack | None = None

    @property
    def inputs(self) -> int:
        return len(self.certificates)

    @property
    def complete(self) -> bool:
        return self.status is not None and self.status.complete

    @property
    def certification_seconds(self) -> float:
        """Seconds its certificates took (σ, the harness's draws and the claims)."""
        return sum(c.seconds for c in self.certificates)

    def audit_costs(self) -> list[tuple[str, dict[str, Any]]]:
        """(check, cost record) of each check and of the attack that recorded its cost
        (:mod:`harness.audit.cost`), in stored order, the attack last."""
        out = [(c.check, c.cost) for c in self.checks if c.cost is not None]
        cost = None if self.attack is None else self.attack.result.get("cost")
        return out + ([("attack", cost)] if isinstance(cost, dict) else [])

    @property
    def audit_seconds(self) -> float | None:
        """Wall seconds of its checks and attack (None when none recorded its cost)."""
        costs = self.audit_costs()
        return sum(float(c.get("seconds", 0.0)) for _, c in costs) if costs else None

    @property
    def applied(self) -> list[str]:
        """Names of the checks that applied to the row (all but ``not-applicable``), sorted."""
        return sorted(c.check for c in self.checks if c.applied)

    @property
    def flags(self) -> list[str]:
        """Every flag any check raised on the row, sorted."""
        return sorted({f for c in self.checks for f in c.flags})

    @property
    def order(self) -> dict[str, Any] | None:
        """For an ``order-dependent`` row, the memory-order check's worst replayed order
        and the ACR spread over orders; else None."""
        if self.verdict != ORDER_DEPENDENT:
            return None
        return next((c.order for c in self.checks if c.check == MEMORY_CHECK and c.order), None)


@dataclass
class StoredRun:
    """One run: its ``runs`` row, certificates (ordered by method, setting, input id),
    failures (ordered by time, method, setting) and checks."""

    run: dict[str, Any]
    """The ``runs`` row: :data:`RUN_FIELDS`, plus ``weights_digest``, ``class_names``,
    ``arithmetic``, ``components``, ``plugin_hosts`` and ``test_split`` when recorded."""
    certificates: list[StoredCertificate] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    """Dicts with method, setting, error (the traceback) and at (the time)."""
    checks: list[StoredCheck] = field(default_factory=list)
    expected_inputs: int | None = None
    """Test inputs per setting, as recorded by the run (None: not recorded, e.g. an export)."""
    data_files: dict[str, str] | None = None
    """The data files the run read (path -> SHA-256), when recorded."""
    files: list[dict[str, Any]] = field(default_factory=list)
    """The files a replay of the run needs (:mod:`harness.running.runfiles`): role, name, path,
    sha256, meta."""
    attacks: list[StoredAttack] = field(default_factory=list)
    """The empirical attack's result per (method, setting), where one ran."""

    @property
    def run_id(self) -> str:
        return self.run["run_id"]

    @property
    def config(self) -> dict[str, Any]:
        """The benchmark spec as stored (:meth:`harness.running.benchmark.Benchmark.to_dict`)."""
        return self.run["config"]

    @property
    def imported(self) -> bool:
        """A run imported from a published log (``idrs-bench import-log``)."""
        return bool(self.config.get("imported"))

    @property
    def unknown_metrics(self) -> tuple[str, ...]:
        """Metrics an imported log cannot give (MACER's has no labels or times)."""
        return tuple(self.config.get("imported", {}).get("unknown_metrics", ()))

    @property
    def finished(self) -> bool:
        return self.run["finished"] is not None

    def counts(self) -> dict[tuple[str, str], int]:
        """Number of stored certificates per (method, setting)."""
        out: dict[tuple[str, str], int] = {}
        for c in self.certificates:
            out[c.method, c.setting] = out.get((c.method, c.setting), 0) + 1
        return out

    def settings(self) -> list[Completeness]:
        """Every (method, setting) of the spec, with inputs stored and expected, complete?"""
        counts = self.counts()
        out = []
        for method in self.config["methods"]:
            for setting in method.get("settings") or [{}]:
                key = setting_key(setting)
                n = counts.get((method["name"], key), 0)
                done = self.finished and (self.expected_inputs is None or n >= self.expected_inputs)
                out.append(Completeness(method["name"], key, n, self.expected_inputs, done))
        return out

    def rows(self) -> list[StoredRow]:
        """One :class:`StoredRow` per (method, setting) with certificates, in stored order."""
        groups: dict[tuple[str, str], list[StoredCertificate]] = {}
        for cert in self.certificates:
            groups.setdefault((cert.method, cert.setting), []).append(cert)
        checks: dict[tuple[str, str], list[StoredCheck]] = {}
        for check in self.checks:
            checks.setdefault((check.method, check.setting), []).append(check)
        status = {(s.method, s.setting): s for s in self.settings()}
        attacks = {(a.method, a.setting): a for a in self.attacks}
        out = []
        for key, certs in groups.items():
            mine = tuple(checks.get(key, ()))
            verdict = IMPORTED if self.imported else combined_verdict(mine)
            out.append(StoredRow(self.run_id, *key, tuple(certs), mine, verdict, status.get(key),
                                 attacks.get(key)))  # fmt: skip
        return out

    def summaries(self, radii: Sequence[float] | None = None) -> list[dict[str, Any]]:
        """:func:`harness.mathematics.accuracy.summary` of every row; ``radii`` default to the spec's
        (``radii`` of its config, else :data:`harness.mathematics.accuracy.RADII`)."""
        if radii is None:
            radii = self.config.get("radii", RADII)
        return [
            summary(r.method, r.setting, r.certificates, radii, self.unknown_metrics)
            for r in self.rows()
        ]


def read_run(store: ResultStore, run_id: str | None = None) -> StoredRun:
    """The run ``run_id`` (a unique prefix is enough; None: the latest) of an open store."""
    run = store.run(run_id)
    full_id = run["run_id"]
    certificates = [StoredCertificate.from_row(row) for row in store.certificates(full_id)]
    failures = [
        {k: f[k] for k in ("method", "setting", "error", "at")} for f in store.failures(full_id)
    ]
    checks = [StoredCheck.from_row(row) for row in store.checks(full_id)]
    attacks = [StoredAttack.from_row(row) for row in store.attacks(full_id)]
    extra = {"weights_digest": run["weights_digest"]} if run.get("weights_digest") else {}
    if run.get("class_names"):
        extra["class_names"] = json.loads(run["class_names"])
    for key in ("arithmetic", "components", "plugin_hosts", "test_split"):
        if run.get(key):
            extra[key] = run[key]
    return StoredRun(
        run={k: run[k] for k in RUN_FIELDS} | extra,
        certificates=certificates,
        failures=sorted(failures, key=lambda f: (f["at"], f["method"], f["setting"])),
        checks=sorted(checks, key=lambda c: (c.method, c.setting, c.check)),
        expected_inputs=run["inputs"],
        data_files=run["data_files"],
        files=store.files(full_id),
        attacks=attacks,
    )


def load_runs(db: str | Path, run_ids: list[str] | None = None) -> list[StoredRun]:
    """The runs ``run_ids`` (unique prefixes are enough; none: the latest) from ``db``."""
    db = Path(db)
    if not db.is_file():
        raise IdrsError(f"results database {str(db)!r} not found; run a benchmark or pass --db")
    store = ResultStore(db)
    try:
        out = [read_run(store, run_id) for run_id in run_ids or [None]]
    finally:
        store.close()
    if len({r.run_id for r in out}) != len(out):
        raise IdrsError("the same run is named twice")
    return out
