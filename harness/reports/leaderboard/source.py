"""The stored runs a leaderboard renders from: the results database or a run export.

:func:`resolve_runs` turns the names on a command line (run ids, exports, databases)
into :class:`~harness.store.storedrun.StoredRun` objects; :func:`export_runs` and
:func:`read_export` write and read a run export.

A run export (``NAME.run.json`` beside a board, format ``idrs-bench/run-export/3``) holds
everything the renderer needs and everything a reader needs to re-check the board: the
``runs`` row (config, versions, commit, device, seeds, recipe hash, dates; the weights
digest, the arithmetic fingerprint and which plugin and package provided each component,
``components``, when recorded) and the data files the run read;
per (method, setting) every certificate's columns (input id, label, CERTIFY's
prediction, PREDICT's answer, radius, σ, seconds) and its whole evidence (p_A bound,
α, the certifier's derived evidence and the harness's draws, a diagonal scale included;
a region certified beside the ℓ2 ball in a ``region`` column, only in a group where one
certificate has one, so older exports read and write as before; floats as their shortest
round-trip repr, so numbers computed from the export equal those computed from the
database bit for bit); the recorded failures; the soundness-check rows with their
evidence; and the files a replay needs (:mod:`harness.running.runfiles`: the base model's
weights, plugins' fitted artifacts, σ-estimators), each under the name it ships with
beside the board and its SHA-256. ``idrs-bench leaderboard --verify`` re-derives the
certificates and verdicts from it (:mod:`harness.reports.leaderboard.recheck`). A format-1
export (no evidence) is still read, and only re-rendered. The empirical attack's result
per row (radii attacked, which input broke at which radius, the attack's strength) is
exported beside the checks. Format 3 is format 2 with the ``runs`` row's ``model_hash``
named ``recipe_hash`` (the base model's recipe hash, not a digest of its weights); an
export of format 1 or 2 is read with the key renamed (:func:`upgrade_run_row`).

An export is strict JSON (RFC 8259), which any reader parses: a number that is NaN or
infinite (a statistic a check could not compute) is written as ``null``, never as the
bare ``NaN`` Python's ``json`` would write. Exports written before that, which may hold
one, are still read.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from harness.foundation.errors import IdrsError
from harness.store.benchmark_runs import sibling_runs
from harness.store.schema import RENAMED_COLUMNS
from harness.store.store import ResultStore
from harness.store.storedrun import (
    StoredAttack,
    StoredCertificate,
    StoredCheck,
    StoredRun,
    load_runs,
)

EXPORT_FORMAT = "idrs-bench/run-export/3"
FORMATS = ("idrs-bench/run-export/1", "idrs-bench/run-export/2", EXPORT_FORMAT)
"""Formats :func:`read_export` reads (format 1: no evidence, files or data files; formats
1 and 2: ``model_hash`` for ``recipe_hash``)."""
EVIDENCE_FORMATS = FORMATS[1:]
"""Formats whose certificates carry their evidence (``--verify`` re-derives them)."""
CERTIFICATE_COLUMNS = ("input_id", "label", "prediction", "predict", "radius", "sigma", "seconds",
                       "load")  # fmt: skip
EVIDENCE_COLUMNS = ("p_lower", "alpha", "evidence", "draws")
"""The certificates' evidence columns, exported since format 2."""
REGION_COLUMNS = ("region",)
"""Columns a group of certificates carries only where one of them has a value (a region
certified beside the ℓ2 ball, :attr:`harness.foundation.certificate.Certificate.region`):
an export of runs without one is the same text as before they existed."""


def resolve_runs(names: list[str], db: Path) -> list[StoredRun]:
    """Runs in the given order, each named by an id or unique prefix in ``db``, by a run
    export (``*.json``: all its runs), or by a results database (its latest run, with the
    runs of the same benchmark: a base model each, :mod:`harness.running.model_variants`);
    no name: ``db`` so. A run that a later export or database holds again is that source's
    copy, in the place of the first (a published board's run audited again in a database:
    ``idrs-bench leaderboard NAME.run.json runs/x.sqlite``); a run named twice by id is an
    error."""
    runs: dict[str, StoredRun] = {}
    for name in names or [None]:
        path = None if name is None else Path(name)
        if path is not None and path.suffix == ".json":
            found = read_export(path)
        elif path is None or path.is_file():
            found = _latest_benchmark(db if path is None else path)
        else:
            found = load_runs(db, [name])
            if found[0].run_id in runs:
                raise IdrsError(f"run {found[0].run_id[:12]} is named twice")
        runs |= {run.run_id: run for run in found}
    return list(runs.values())


def _latest_benchmark(db: Path) -> list[StoredRun]:
    """The latest run of ``db`` and the other runs of its benchmark, in order of creation."""
    (latest,) = load_runs(db)
    store = ResultStore(db)
    try:
        ids = sibling_runs(store, latest.run_id)
    finally:
        store.close()
    return load_runs(db, ids) if len(ids) > 1 else [latest]


def export_runs(runs: list[StoredRun], stem: str = "board") -> str:
    """The run export as deterministic JSON text (sorted keys, one run per line); ``stem``
    names the board whose folder ships the runs' files (:func:`harness.running.runfiles.shipped_name`)."""
    from harness.running.runfiles import shipped_name

    columns = CERTIFICATE_COLUMNS + EVIDENCE_COLUMNS
    items = []
    for run in runs:
        certificates = [
            {"method": row.method, "setting": row.setting,
             "columns": {k: [getattr(c, k) for c in row.certificates]
                         for k in columns + _present(row.certificates, REGION_COLUMNS)}}
            for row in run.rows()
        ]  # fmt: skip
        files = [
            {"role": f["role"], "name": f["name"], "sha256": f["sha256"], "meta": f["meta"],
             "file": shipped_name(stem, run.run_id, f, len(runs) == 1)}
            for f in run.files
        ]  # fmt: skip
        items.append(
            {
                "run": run.run,
                "data_files": run.data_files,
                "certificates": certificates,
                "failures": run.failures,
                "checks": [check.as_dict() for check in run.checks],
                "files": files,
            }
            | ({"attacks": [attack.as_dict() for attack in run.attacks]} if run.attacks else {})
        )
    lines = [json.dumps(strict(item), sort_keys=True, separators=(",", ":"), allow_nan=False)
             for item in items]  # fmt: skip
    return '{"format":"' + EXPORT_FORMAT + '","runs":[\n' + ",\n".join(lines) + "\n]}\n"


def _present(certificates, names: tuple[str, ...]) -> tuple[str, ...]:
    """Those of the columns ``names`` that some of ``certificates`` has a value in."""
    return tuple(k for k in names if any(getattr(c, k) is not None for c in certificates))


def strict(value: Any) -> Any:
    """``value`` with every NaN or infinite float as None: what strict JSON can hold."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict(v) for v in value]
    return value


def read_export(path: str | Path) -> list[StoredRun]:
    """The runs of a run export written by :func:`export_runs`."""
    return read_export_and_format(path)[1]


def read_export_and_format(path: str | Path) -> tuple[str, list[StoredRun]]:
    """The format a run export declares (one of :data:`FORMATS`) and its runs, from one
    reading of the file."""
    path = Path(path)
    if not path.is_file():
        raise IdrsError(f"run export {str(path)!r} not found")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise IdrsError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") not in FORMATS:
        raise IdrsError(f"{path} is not an idrs-bench run export ({', '.join(FORMATS)})")
    out = []
    for item in data["runs"]:
        certificates = []
        for group in item["certificates"]:
            columns = group["columns"]
            names = [k for k in CERTIFICATE_COLUMNS + EVIDENCE_COLUMNS + REGION_COLUMNS
                     if k in columns]  # fmt: skip
            for values in zip(*(columns[k] for k in names), strict=True):
                certificates.append(
                    StoredCertificate(group["method"], group["setting"],
                                      **dict(zip(names, values, strict=True)))
                )  # fmt: skip
        checks = [StoredCheck.from_row(check) for check in item["checks"]]
        files = [f | {"path": str(path.parent / f["file"])} for f in item.get("files", [])]
        attacks = [StoredAttack.from_row(attack) for attack in item.get("attacks", [])]
        out.append(StoredRun(upgrade_run_row(item["run"]), certificates, item["failures"], checks,
                             data_files=item.get("data_files"), files=files,
                             attacks=attacks))  # fmt: skip
    return data["format"], out


def upgrade_run_row(run: dict) -> dict:
    """The ``runs`` row of an export of any format as the current format names it: formats
    1 and 2 call the base model's recipe hash ``model_hash`` (a results database's column
    is renamed on opening, :data:`harness.store.schema.RENAMED_COLUMNS`). The value is
    kept, so the run's id and its files' cache paths are unchanged."""
    renamed = {old: new for table, old, new in RENAMED_COLUMNS if table == "runs"}
    if renamed.keys().isdisjoint(run):
        return run
    return {renamed.get(key, key): value for key, value in run.items()}


def export_format(path: str | Path) -> str | None:
    """The format an export declares (None if it is not one)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data.get("format") if isinstance(data, dict) else None
