"""Results in SQLite: runs, one row per certified input, finished shards, plugin state.

Every certificate is committed as soon as it exists (INSERT OR IGNORE on its primary
key), and a shard is marked finished once all its inputs are stored, so a killed run
loses at most the inputs in flight and a rerun neither duplicates nor repeats work.

Per-run state of a certifier (e.g. the memory of Alfarra et al.'s memory certifier)
lives in the ``state`` table, keyed by (run, method, setting, seq): the records a
certifier staged while producing a certificate are written in the same transaction
as that certificate (:meth:`ResultStore.add_certificate`), so the state never holds
an input whose certificate was lost, nor the reverse. See :mod:`harness.runstate`.

Rows are inserted by column name. The typed read side (a run's certificates, checks
and verdict per method and setting) is :mod:`harness.storedrun`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.certificate import Certificate
from harness.errors import IdrsError
from harness.runstate import StateRecord

DEFAULT_DB = Path("idrs-bench.sqlite")
"""The results database of every command when no ``--db`` is given."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    created TEXT NOT NULL,
    finished TEXT,
    config TEXT NOT NULL,
    versions TEXT NOT NULL,
    git_commit TEXT,
    device TEXT NOT NULL,
    seed INTEGER NOT NULL,
    model_hash TEXT,
    weights_digest TEXT,
    inputs INTEGER,
    data_files TEXT
);
CREATE TABLE IF NOT EXISTS certificates (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    method TEXT NOT NULL,
    setting TEXT NOT NULL,
    input_id INTEGER NOT NULL,
    shard INTEGER NOT NULL,
    label INTEGER NOT NULL,
    prediction INTEGER NOT NULL,
    predict INTEGER NOT NULL,
    radius REAL NOT NULL,
    p_lower REAL NOT NULL,
    sigma REAL NOT NULL,
    alpha REAL NOT NULL,
    counts_selection TEXT,
    counts_estimation TEXT,
    seconds REAL NOT NULL,
    evidence TEXT NOT NULL,
    draws TEXT,
    PRIMARY KEY (run_id, method, setting, input_id)
);
CREATE TABLE IF NOT EXISTS shards (
    run_id TEXT NOT NULL,
    method TEXT NOT NULL,
    setting TEXT NOT NULL,
    shard INTEGER NOT NULL,
    finished TEXT NOT NULL,
    PRIMARY KEY (run_id, method, setting, shard)
);
CREATE TABLE IF NOT EXISTS checks (
    run_id TEXT NOT NULL,
    method TEXT NOT NULL,
    setting TEXT NOT NULL,
    check_name TEXT NOT NULL,
    verdict TEXT NOT NULL,
    summary TEXT NOT NULL,
    evidence TEXT NOT NULL,
    flags TEXT NOT NULL,
    budget TEXT NOT NULL,
    at TEXT NOT NULL,
    PRIMARY KEY (run_id, method, setting, check_name)
);
CREATE TABLE IF NOT EXISTS state (
    run_id TEXT NOT NULL,
    method TEXT NOT NULL,
    setting TEXT NOT NULL,
    seq INTEGER NOT NULL,
    record TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (run_id, method, setting, seq)
);
CREATE TABLE IF NOT EXISTS failures (
    run_id TEXT NOT NULL,
    method TEXT NOT NULL,
    setting TEXT NOT NULL,
    error TEXT NOT NULL,
    at TEXT NOT NULL
);
"""


ATTACK_SCHEMA = """
CREATE TABLE IF NOT EXISTS attacks (
    run_id TEXT NOT NULL,
    method TEXT NOT NULL,
    setting TEXT NOT NULL,
    budget TEXT NOT NULL,
    result TEXT NOT NULL,
    at TEXT NOT NULL,
    PRIMARY KEY (run_id, method, setting)
);
"""
"""The empirical attack's result per (run, method, setting) (:mod:`harness.empirical`)."""


def _jsonable(value: Any) -> Any:
    """numpy scalars and arrays, tensors and the like as plain JSON values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _insert(verb: str, table: str, columns: Sequence[str]) -> str:
    """``INSERT ... INTO table (c1, c2, ...) VALUES (:c1, :c2, ...)``: values bound by name."""
    return (
        f"{verb} INTO {table} ({', '.join(columns)}) VALUES ({', '.join(':' + c for c in columns)})"
    )


_CERTIFICATE_INSERT = _insert(
    "INSERT OR IGNORE", "certificates",
    ("run_id", "method", "setting", "input_id", "shard", "label", "prediction", "predict",
     "radius", "p_lower", "sigma", "alpha", "counts_selection", "counts_estimation", "seconds",
     "evidence", "draws"),
)  # fmt: skip
_STATE_INSERT = _insert(
    "INSERT OR IGNORE", "state", ("run_id", "method", "setting", "seq", "record", "data")
)
_SHARD_INSERT = _insert(
    "INSERT OR IGNORE", "shards", ("run_id", "method", "setting", "shard", "finished")
)
_FAILURE_INSERT = _insert("INSERT", "failures", ("run_id", "method", "setting", "error", "at"))
_CHECK_INSERT = _insert(
    "INSERT OR REPLACE", "checks",
    ("run_id", "method", "setting", "check_name", "verdict", "summary", "evidence", "flags",
     "budget", "at"),
)  # fmt: skip


class ResultStore:
    """A SQLite results database (created on first use)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)
        self.db.executescript(ATTACK_SCHEMA)
        columns = {r[1] for r in self.db.execute("PRAGMA table_info(runs)")}
        for column, kind in (
            ("weights_digest", "TEXT"),
            ("inputs", "INTEGER"),
            ("data_files", "TEXT"),
        ):
            if column not in columns:  # a database written before these columns existed
                self.db.execute(f"ALTER TABLE runs ADD COLUMN {column} {kind}")
        columns = {r[1] for r in self.db.execute("PRAGMA table_info(certificates)")}
        if "draws" not in columns:  # written before the harness drew the evidence itself
            self.db.execute("ALTER TABLE certificates ADD COLUMN draws TEXT")

    def close(self) -> None:
        self.db.close()

    def begin_run(
        self,
        run_id: str,
        name: str,
        config: dict[str, Any],
        versions: dict[str, str],
        git_commit: str | None,
        device: str,
        seed: int,
        model_hash: str,
        weights_digest: str | None = None,
    ) -> bool:
        """Record a run unless it exists; True when it is new.

        ``model_hash`` is the base model's recipe hash (its cache key), ``weights_digest``
        the SHA-256 of its weights (:func:`harness.weights.weights_digest`).
        """
        with self.db:
            cursor = self.db.execute(
                "INSERT OR IGNORE INTO runs (run_id, name, created, config, versions, git_commit,"
                " device, seed, model_hash, weights_digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, name, _now(), json.dumps(config, sort_keys=True), json.dumps(versions),
                 git_commit, device, seed, model_hash, weights_digest),
            )  # fmt: skip
        return cursor.rowcount == 1

    def add_imported_run(
        self, run_id: str, name: str, config: dict[str, Any], versions: dict[str, str],
        method: str, setting: str, certificates: Sequence[tuple[int, Certificate]], sha256: str,
    ) -> bool:  # fmt: skip
        """Store a run imported from a published log, finished, in one transaction (all of
        it or, when anything fails, nothing); False when the run exists (nothing changed)."""
        now = _now()
        with self.db:
            cursor = self.db.execute(
                "INSERT OR IGNORE INTO runs (run_id, name, created, finished, config, versions,"
                " device, seed, model_hash, inputs) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, name, now, now, json.dumps(config, sort_keys=True), json.dumps(versions),
                 "unknown", 0, sha256, len(certificates)),
            )  # fmt: skip
            if cursor.rowcount != 1:
                return False
            key = {"run_id": run_id, "method": method, "setting": setting, "shard": 0}
            self.db.executemany(
                _CERTIFICATE_INSERT,
                [key | {"input_id": c.input_id, "label": label, "prediction": c.prediction,
                        "predict": c.predict, "radius": c.radius, "p_lower": c.p_lower,
                        "sigma": c.sigma, "alpha": c.alpha, "counts_selection": "null",
                        "counts_estimation": "null", "seconds": c.seconds,
                        "evidence": json.dumps(c.evidence, default=_jsonable), "draws": None}
                 for label, c in certificates],
            )  # fmt: skip
            self.db.execute(_SHARD_INSERT, key | {"finished": now})
        return True

    def set_run_data(self, run_id: str, inputs: int, data_files: dict[str, str]) -> None:
        """Record how many test inputs each setting certifies and the data files read
        (path -> SHA-256); a resumed run whose files differ is refused."""
        row = self.db.execute("SELECT data_files FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is not None and row[0] is not None and json.loads(row[0]) != data_files:
            raise IdrsError(
                f"run {run_id[:12]} was certified on other data files ({row[0]}); "
                f"now {json.dumps(data_files)}: pass the --data-root of the run, or a new --db"
            )
        with self.db:
            self.db.execute(
                "UPDATE runs SET inputs = ?, data_files = ? WHERE run_id = ?",
                (inputs, json.dumps(data_files, sort_keys=True), run_id),
            )

    def finish_run(self, run_id: str) -> None:
        with self.db:
            self.db.execute("UPDATE runs SET finished = ? WHERE run_id = ?", (_now(), run_id))

    def add_certificate(
        self,
        run_id: str,
        method: str,
        setting: str,
        shard: int,
        label: int,
        cert: Certificate,
        state: Sequence[StateRecord] = (),
    ) -> None:
        """Commit ``cert`` and the certifier's ``state`` records in one transaction."""
        with self.db:
            key = {"run_id": run_id, "method": method, "setting": setting}
            self.db.executemany(
                _STATE_INSERT,
                [key | {"seq": r.seq, "record": json.dumps(r.record, sort_keys=True),
                        "data": r.data} for r in state],
            )  # fmt: skip
            self.db.execute(
                _CERTIFICATE_INSERT,
                key | {
                    "input_id": cert.input_id, "shard": shard, "label": label,
                    "prediction": cert.prediction, "predict": cert.predict,
                    "radius": cert.radius, "p_lower": cert.p_lower, "sigma": cert.sigma,
                    "alpha": cert.alpha, "counts_selection": json.dumps(cert.counts_selection),
                    "counts_estimation": json.dumps(cert.counts_estimation),
                    "seconds": cert.seconds,
                    "evidence": json.dumps(cert.evidence, default=_jsonable),
                    "draws": None if cert.draws is None else json.dumps(cert.draws),
                },
            )  # fmt: skip

    def state_records(self, run_id: str, method: str, setting: str) -> list[StateRecord]:
        """The committed state records of (run, method, setting), in order of ``seq``."""
        rows = self.db.execute(
            "SELECT seq, record, data FROM state WHERE run_id = ? AND method = ? AND setting = ?"
            " ORDER BY seq",
            (run_id, method, setting),
        )
        return [StateRecord(seq, json.loads(record), bytes(data)) for seq, record, data in rows]

    def finish_shard(self, run_id: str, method: str, setting: str, shard: int) -> None:
        with self.db:
            self.db.execute(
                _SHARD_INSERT,
                {"run_id": run_id, "method": method, "setting": setting, "shard": shard,
                 "finished": _now()},
            )  # fmt: skip

    def finished_shards(self, run_id: str, method: str, setting: str) -> set[int]:
        rows = self.db.execute(
            "SELECT shard FROM shards WHERE run_id = ? AND method = ? AND setting = ?",
            (run_id, method, setting),
        )
        return {r[0] for r in rows}

    def stored_inputs(self, run_id: str, method: str, setting: str) -> set[int]:
        rows = self.db.execute(
            "SELECT input_id FROM certificates WHERE run_id = ? AND method = ? AND setting = ?",
            (run_id, method, setting),
        )
        return {r[0] for r in rows}

    def record_failure(self, run_id: str, method: str, setting: str, error: str) -> None:
        with self.db:
            self.db.execute(
                _FAILURE_INSERT,
                {"run_id": run_id, "method": method, "setting": setting, "error": error,
                 "at": _now()},
            )  # fmt: skip

    def clear_failures(self, run_id: str, method: str, setting: str) -> None:
        with self.db:
            self.db.execute(
                "DELETE FROM failures WHERE run_id = ? AND method = ? AND setting = ?",
                (run_id, method, setting),
            )

    def failures(self, run_id: str) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT * FROM failures WHERE run_id = ? ORDER BY at", (run_id,))
        return [dict(r) for r in rows]

    def add_check(self, run_id: str, method: str, setting: str, result: Any, budget: str) -> None:
        """Store a :class:`harness.soundness.verdict.CheckResult`, replacing an earlier one."""
        with self.db:
            self.db.execute(
                _CHECK_INSERT,
                {"run_id": run_id, "method": method, "setting": setting,
                 "check_name": result.check, "verdict": str(result.verdict),
                 "summary": result.summary,
                 "evidence": json.dumps(result.evidence, default=_jsonable, sort_keys=True),
                 "flags": json.dumps(result.flags), "budget": budget, "at": _now()},
            )  # fmt: skip

    def add_attack(
        self, run_id: str, method: str, setting: str, budget: str, result: dict[str, Any]
    ) -> None:
        """Store the empirical attack's ``result`` on a (method, setting), replacing an earlier one."""
        with self.db:
            self.db.execute(
                "INSERT OR REPLACE INTO attacks (run_id, method, setting, budget, result, at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, method, setting, budget,
                 json.dumps(result, default=_jsonable, sort_keys=True), _now()),
            )  # fmt: skip

    def attacks(self, run_id: str) -> list[dict[str, Any]]:
        """The stored attack results of a run (method, setting, budget, result parsed)."""
        rows = self.db.execute(
            "SELECT method, setting, budget, result FROM attacks WHERE run_id = ?"
            " ORDER BY method, setting",
            (run_id,),
        )
        return [{"method": m, "setting": s, "budget": b, "result": json.loads(r)}
                for m, s, b, r in rows]  # fmt: skip

    def run(self, run_id: str | None = None) -> dict[str, Any]:
        """The run ``run_id`` (a unique prefix is enough), or the latest run."""
        if run_id is None:
            row = self.db.execute(
                "SELECT * FROM runs ORDER BY created DESC, rowid DESC LIMIT 1"
            ).fetchone()
            if row is None:
                raise IdrsError(f"no runs in {self.path}; start one with `idrs-bench run`")
        else:
            rows = self.db.execute(
                "SELECT * FROM runs WHERE run_id LIKE ?", (run_id + "%",)
            ).fetchall()
            if len(rows) != 1:
                known = [r[0][:12] for r in self.db.execute("SELECT run_id FROM runs")]
                what = "no run" if not rows else "more than one run"
                raise IdrsError(
                    f"{what} matches {run_id!r} in {self.path}; runs: {', '.join(known) or 'none'}"
                )
            row = rows[0]
        out = dict(row)
        out["config"] = json.loads(out["config"])
        out["versions"] = json.loads(out["versions"])
        out["data_files"] = json.loads(out["data_files"]) if out.get("data_files") else None
        return out

    def certificates(self, run_id: str) -> Iterable[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT * FROM certificates WHERE run_id = ? ORDER BY method, setting, input_id",
            (run_id,),
        )
        for row in rows:
            out = dict(row)
            for key in ("counts_selection", "counts_estimation", "evidence", "draws"):
                out[key] = json.loads(out[key]) if out[key] is not None else None
            yield out
