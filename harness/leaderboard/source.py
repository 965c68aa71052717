"""The stored runs a leaderboard renders from: the results database or a run export.

A run export (``NAME.run.json`` beside a board) holds everything the renderer needs and
nothing else: the ``runs`` row (config, versions, commit, device, seeds, model hash,
dates; the weights digest when recorded), per (method, setting) the certificate columns the metrics use (input id,
label, CERTIFY's prediction, PREDICT's answer, radius, σ, seconds; floats as their
shortest round-trip repr, so metrics computed from the export equal those computed
from the database bit for bit), the recorded failures, and the soundness-check rows
without their evidence (verdict, summary, flags, budget), except, for memory
certificates, the worst replayed input order and the ACR spread over orders (``order``)
at which the board scores them. Class counts, p_A bounds and evidence stay in the
database.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import IdrsError

EXPORT_FORMAT = "idrs-bench/run-export/1"
CERTIFICATE_COLUMNS = ("input_id", "label", "prediction", "predict", "radius", "sigma", "seconds")
RUN_FIELDS = (
    "run_id", "name", "created", "finished", "config", "versions", "git_commit", "device",
    "seed", "model_hash",
)  # fmt: skip
CHECK_FIELDS = ("check", "verdict", "summary", "flags", "budget")


@dataclass
class StoredRun:
    """One run: its ``runs`` row, certificates (dicts with :data:`CERTIFICATE_COLUMNS`
    plus method and setting, ordered by method, setting, input id), failures and checks."""

    run: dict[str, Any]
    certificates: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    expected_inputs: int | None = None
    """Test inputs per setting, as recorded by the run (None: not recorded, e.g. an export)."""

    @property
    def run_id(self) -> str:
        return self.run["run_id"]

    def settings(self) -> list[dict[str, Any]]:
        """Every (method, setting) of the config with inputs stored/expected and ``complete``."""
        from harness.results import completeness

        counts: dict[tuple[str, str], int] = {}
        for c in self.certificates:
            counts[c["method"], c["setting"]] = counts.get((c["method"], c["setting"]), 0) + 1
        return completeness(
            self.run["config"], counts, self.expected_inputs, self.run["finished"] is not None
        )


def load_runs(db: str | Path, run_ids: list[str] | None = None) -> list[StoredRun]:
    """The runs ``run_ids`` (unique prefixes are enough; none: the latest) from ``db``."""
    from harness.store import ResultStore

    db = Path(db)
    if not db.is_file():
        raise IdrsError(f"results database {str(db)!r} not found; run a benchmark or pass --db")
    store = ResultStore(db)
    try:
        out = []
        for run_id in run_ids or [None]:
            run = store.run(run_id)
            full_id = run["run_id"]
            certificates = [
                {"method": c["method"], "setting": c["setting"]}
                | {k: c[k] for k in CERTIFICATE_COLUMNS}
                for c in store.certificates(full_id)
            ]
            failures = [
                {k: f[k] for k in ("method", "setting", "error", "at")}
                for f in store.failures(full_id)
            ]
            out.append(
                StoredRun(
                    run={k: run[k] for k in RUN_FIELDS} | _weights(run),
                    certificates=certificates,
                    failures=sorted(failures, key=lambda f: (f["at"], f["method"], f["setting"])),
                    checks=_checks(store.db, full_id),
                    expected_inputs=run["inputs"],
                )
            )
    finally:
        store.close()
    if len({r.run_id for r in out}) != len(out):
        raise IdrsError("the same run is named twice")
    return out


def _weights(run: dict[str, Any]) -> dict[str, Any]:
    """The weights digest when the run recorded one (older runs and exports have none)."""
    return {"weights_digest": run["weights_digest"]} if run.get("weights_digest") else {}


def _checks(db: sqlite3.Connection, run_id: str) -> list[dict[str, Any]]:
    """Rows of the soundness ``checks`` table for ``run_id`` (none if there is no table)."""
    exists = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'checks'"
    ).fetchone()
    if not exists:
        return []
    out = []
    for row in db.execute("SELECT * FROM checks WHERE run_id = ?", (run_id,)):
        item = dict(row)
        flags = item.get("flags")
        if isinstance(flags, str):
            try:
                flags = json.loads(flags)
            except json.JSONDecodeError:
                flags = [flags]
        check = {
            "method": item["method"],
            "setting": item["setting"],
            "check": str(item.get("check_name", item.get("check", "?"))),
            "verdict": str(item["verdict"]),
            "summary": str(item.get("summary") or ""),
            "flags": [str(f) for f in (flags or [])],
            "budget": None if item.get("budget") is None else str(item["budget"]),
        }
        order = _order_evidence(item.get("evidence"))
        if order is not None:
            check["order"] = order
        out.append(check)
    return sorted(out, key=lambda c: (c["method"], c["setting"], c["check"]))


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


def export_runs(runs: list[StoredRun]) -> str:
    """The run export as deterministic JSON text (sorted keys, one run per line)."""
    items = []
    for run in runs:
        groups: dict[tuple[str, str], dict[str, list]] = {}
        for cert in run.certificates:
            columns = groups.setdefault(
                (cert["method"], cert["setting"]), {k: [] for k in CERTIFICATE_COLUMNS}
            )
            for key in CERTIFICATE_COLUMNS:
                columns[key].append(cert[key])
        items.append(
            {
                "run": run.run,
                "certificates": [
                    {"method": m, "setting": s, "columns": cols} for (m, s), cols in groups.items()
                ],
                "failures": run.failures,
                "checks": run.checks,
            }
        )
    lines = [json.dumps(item, sort_keys=True, separators=(",", ":")) for item in items]
    return '{"format":"' + EXPORT_FORMAT + '","runs":[\n' + ",\n".join(lines) + "\n]}\n"


def read_export(path: str | Path) -> list[StoredRun]:
    """The runs of a run export written by :func:`export_runs`."""
    path = Path(path)
    if not path.is_file():
        raise IdrsError(f"run export {str(path)!r} not found")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise IdrsError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise IdrsError(f"{path} is not an idrs-bench run export ({EXPORT_FORMAT})")
    out = []
    for item in data["runs"]:
        certificates = []
        for group in item["certificates"]:
            columns = group["columns"]
            for values in zip(*(columns[k] for k in CERTIFICATE_COLUMNS), strict=True):
                certificates.append(
                    {"method": group["method"], "setting": group["setting"]}
                    | dict(zip(CERTIFICATE_COLUMNS, values, strict=True))
                )
        out.append(StoredRun(item["run"], certificates, item["failures"], item["checks"]))
    return out
