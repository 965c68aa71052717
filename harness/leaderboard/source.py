"""The stored runs a leaderboard renders from: the results database or a run export.

:func:`resolve_runs` turns the names on a command line (run ids, exports, databases)
into :class:`~harness.storedrun.StoredRun` objects; :func:`export_runs` and
:func:`read_export` write and read a run export.

A run export (``NAME.run.json`` beside a board) holds everything the renderer needs and
nothing else: the ``runs`` row (config, versions, commit, device, seeds, model hash,
dates; the weights digest when recorded), per (method, setting) the certificate columns the metrics use (input id,
label, CERTIFY's prediction, PREDICT's answer, radius, σ, seconds; floats as their
shortest round-trip repr, so metrics computed from the export equal those computed
from the database bit for bit), the recorded failures, and the soundness-check rows
without their evidence (verdict, summary, flags, budget), except, for memory
certificates, the worst replayed input order and the ACR spread over orders (``order``)
at which the board scores them, and the empirical attack's result per row (radii
attacked, which input broke at which radius, the attack's strength). Class counts, p_A
bounds and evidence stay in the database.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.errors import IdrsError
from harness.storedrun import (
    StoredAttack,
    StoredCertificate,
    StoredCheck,
    StoredRun,
    load_runs,
)

EXPORT_FORMAT = "idrs-bench/run-export/1"
CERTIFICATE_COLUMNS = ("input_id", "label", "prediction", "predict", "radius", "sigma", "seconds")


def resolve_runs(names: list[str], db: Path) -> list[StoredRun]:
    """Runs in the given order, each named by an id or unique prefix in ``db``, by a run
    export (``*.json``: all its runs), or by a results database (its latest run)."""
    runs = []
    for name in names or [None]:
        path = None if name is None else Path(name)
        if path is not None and path.suffix == ".json":
            runs += read_export(path)
        elif path is not None and path.is_file():
            runs += load_runs(path)
        else:
            runs += load_runs(db, None if name is None else [name])
    if len({run.run_id for run in runs}) != len(runs):
        raise IdrsError("the same run is named twice")
    return runs


def export_runs(runs: list[StoredRun]) -> str:
    """The run export as deterministic JSON text (sorted keys, one run per line)."""
    items = []
    for run in runs:
        certificates = [
            {"method": row.method, "setting": row.setting,
             "columns": {k: [getattr(c, k) for c in row.certificates] for k in CERTIFICATE_COLUMNS}}
            for row in run.rows()
        ]  # fmt: skip
        item = {
            "run": run.run,
            "certificates": certificates,
            "failures": run.failures,
            "checks": [check.as_dict() for check in run.checks],
        }
        if run.attacks:
            item["attacks"] = [attack.as_dict() for attack in run.attacks]
        items.append(item)
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
                    StoredCertificate(group["method"], group["setting"],
                                      **dict(zip(CERTIFICATE_COLUMNS, values, strict=True)))
                )  # fmt: skip
        checks = [StoredCheck.from_row(check) for check in item["checks"]]
        attacks = [StoredAttack.from_row(attack) for attack in item.get("attacks", [])]
        out.append(StoredRun(item["run"], certificates, item["failures"], checks, attacks=attacks))
    return out
