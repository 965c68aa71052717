"""Results in SQLite: runs, one row per certified input, finished shards, plugin state.

A shard's certificates are committed together, with the mark that the shard is
finished, once all its inputs are certified (:meth:`ResultStore.add_shard`; INSERT OR
IGNORE on each certificate's primary key), so a killed run loses at most the shards in
flight and a rerun neither duplicates nor repeats work.

Per-run state of a certifier (e.g. the memory of Alfarra et al.'s memory certifier)
lives in the ``state`` table, keyed by (run, method, setting, seq): the records a
certifier staged while producing a certificate are written in the same transaction
as that certificate (:meth:`ResultStore.add_shard`), so the state never holds
an input whose certificate was lost, nor the reverse. See :mod:`harness.foundation.runstate`.

Several processes may certify one run in one database at once (``idrs-bench run``
started twice): the ``leases`` table says which process works on which shard, until
when (:mod:`harness.store.leases`).

Opening a database checks it first (:func:`check_database`): a file that is not a
SQLite database, or fails SQLite's ``PRAGMA quick_check``, is refused with a
:class:`~harness.store.integrity.DamagedStoreError` before anything is written to it.

The ``files`` table names what a replay of a run needs besides the database (the base
model's weights, plugins' fitted artifacts, the σ-estimator of a σ-smoothing), with
their SHA-256; ``runs.arithmetic`` is the fingerprint of the arithmetic it certified
with (:mod:`harness.engine.arithmetic`), ``runs.components`` which plugin, package and
version provided each component the run names (:meth:`ResultStore.record_components`),
``runs.plugin_hosts`` how its third-party plugins were confined
(:meth:`ResultStore.record_plugin_hosts`), ``runs.test_split`` ``withheld`` (NULL: a run
begun before it was recorded).

A database written by an earlier release gets the columns added since, and its
renamed columns their new names, on opening (``runs.model_hash`` became ``recipe_hash``:
:data:`~harness.store.schema.RENAMED_COLUMNS`).

Rows are inserted by column name. The typed read side (a run's certificates, checks
and verdict per method and setting) is :mod:`harness.store.storedrun`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.foundation.certificate import Certificate
from harness.foundation.errors import IdrsError
from harness.foundation.runstate import StateRecord
from harness.foundation.storable import jsonable, stored_evidence
from harness.store.integrity import check_database
from harness.store.lease_records import LeaseRecords
from harness.store.schema import (
    ADDED_COLUMNS,
    ATTACK_SCHEMA,
    BUSY_SECONDS,
    CERTIFICATE_INSERT,
    CHECK_INSERT,
    FAILURE_INSERT,
    FILE_INSERT,
    RENAMED_COLUMNS,
    SCHEMA,
    SHARD_INSERT,
    STATE_INSERT,
)

DEFAULT_DB = Path("idrs-bench.sqlite")
"""The results database of every command when no ``--db`` is given."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class ResultStore(LeaseRecords):
    """A SQLite results database (created on first use; checked with
    :func:`check_database` first unless ``verify`` is False)."""

    def __init__(self, path: str | Path, verify: bool = True) -> None:
        self.path = Path(path)
        if verify:
            check_database(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, timeout=BUSY_SECONDS)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)
        self.db.executescript(ATTACK_SCHEMA)
        for table, old, new in RENAMED_COLUMNS:  # a database written before the rename
            self._rename_column(table, old, new)
        for table, column, kind in ADDED_COLUMNS:  # a database written before they existed
            self._add_column(table, column, kind)

    def _add_column(self, table: str, column: str, kind: str) -> None:
        if column in self._columns(table):
            return
        try:
            self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        except sqlite3.OperationalError as exc:  # another process added it meanwhile
            if "duplicate column" not in str(exc):
                raise

    def _columns(self, table: str) -> set[str]:
        return {r[1] for r in self.db.execute(f"PRAGMA table_info({table})")}

    def _rename_column(self, table: str, old: str, new: str) -> None:
        """Rename ``table.old`` to ``new`` (SQLite >= 3.25), where the table still has it."""
        columns = self._columns(table)
        if old not in columns or new in columns:
            return
        try:
            self.db.execute(f"ALTER TABLE {table} RENAME COLUMN {old} TO {new}")
        except sqlite3.OperationalError as exc:  # another process renamed it meanwhile?
            if old in self._columns(table) or new not in self._columns(table):
                raise IdrsError(
                    f"results database {str(self.path)!r} has the column {table}.{old}, which "
                    f"this version calls {new}, and SQLite {sqlite3.sqlite_version} could not "
                    f"rename it ({exc}); SQLite 3.25 or later renames it"
                ) from None

    def close(self) -> None:
        self.db.close()

    def begin_run(
        self, run_id: str, name: str, config: dict[str, Any], versions: dict[str, str],
        git_commit: str | None, device: str, seed: int, recipe_hash: str,
        weights_digest: str | None = None, test_split: str | None = None,
    ) -> bool:  # fmt: skip
        """Record a run unless it exists; True when it is new.

        ``recipe_hash`` is the base model's recipe hash (its cache key), ``weights_digest``
        the SHA-256 of its weights (:func:`harness.running.weights.weights_digest`),
        ``test_split`` :data:`harness.foundation.data.WITHHELD` (an existing run keeps its own).
        """
        with self.db:
            cursor = self.db.execute(
                "INSERT OR IGNORE INTO runs (run_id, name, created, config, versions, git_commit,"
                " device, seed, recipe_hash, weights_digest, test_split)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, name, _now(), json.dumps(config, sort_keys=True), json.dumps(versions),
                 git_commit, device, seed, recipe_hash, weights_digest, test_split),
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
                " device, seed, recipe_hash, inputs) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, name, now, now, json.dumps(config, sort_keys=True), json.dumps(versions),
                 "unknown", 0, sha256, len(certificates)),
            )  # fmt: skip
            if cursor.rowcount != 1:
                return False
            key = {"run_id": run_id, "method": method, "setting": setting, "shard": 0}
            self.db.executemany(
                CERTIFICATE_INSERT,
                [key | {"input_id": c.input_id, "label": label, "prediction": c.prediction,
                        "predict": c.predict, "radius": c.radius, "p_lower": c.p_lower,
                        "sigma": c.sigma, "alpha": c.alpha, "counts_selection": "null",
                        "counts_estimation": "null", "seconds": c.seconds,
                        "evidence": json.dumps(c.evidence, default=jsonable), "draws": None,
                        "load": c.load, "region": None}
                 for label, c in certificates],
            )  # fmt: skip
            self.db.execute(SHARD_INSERT, key | {"finished": now})
        return True

    def set_run_data(
        self,
        run_id: str,
        inputs: int,
        data_files: dict[str, str],
        class_names: Sequence[str] = (),
    ) -> None:
        """Record how many test inputs each setting certifies, the data files read
        (path -> SHA-256) and the dataset's class names; a resumed run whose files
        differ is refused."""
        row = self.db.execute("SELECT data_files FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is not None and row[0] is not None and json.loads(row[0]) != data_files:
            raise IdrsError(
                f"run {run_id[:12]} was certified on other data files ({row[0]}); "
                f"now {json.dumps(data_files)}: pass the --data-root of the run, or a new --db"
            )
        with self.db:
            self.db.execute(
                "UPDATE runs SET inputs = ?, data_files = ?, class_names = ? WHERE run_id = ?",
                (inputs, json.dumps(data_files, sort_keys=True),
                 json.dumps(list(class_names)) if class_names else None, run_id),
            )  # fmt: skip

    def record_arithmetic(
        self, run_id: str, choose: Callable[[dict[str, Any] | None], dict[str, Any]]
    ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """Record the arithmetic this process certifies the run with (:mod:`harness.engine.
        arithmetic`): ``choose(recorded)``, given what the run recorded so far (None: a new
        run); another arithmetic than the recorded one marks the run as varied
        (:func:`~harness.engine.arithmetic.combined`). One transaction (``BEGIN
        IMMEDIATE``), so processes that begin a run at once see each other's record.
        Returns what the run had recorded and this process's fingerprint."""
        from harness.engine.arithmetic import combined

        self.db.execute("BEGIN IMMEDIATE")
        try:
            row = self.db.execute(
                "SELECT arithmetic FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            recorded = json.loads(row[0]) if row is not None and row[0] else None
            here = choose(recorded)
            self.db.execute(
                "UPDATE runs SET arithmetic = ? WHERE run_id = ?",
                (json.dumps(combined(recorded, here), sort_keys=True), run_id),
            )
        except BaseException:
            self.db.rollback()
            raise
        self.db.commit()
        return recorded, here

    def record_plugin_hosts(self, run_id: str, hosting: dict[str, Any]) -> None:
        """Record how this process ran the third-party plugins for the run (their packages
        and confinement, :meth:`~harness.plugin.manager.PluginManager.hosting`); a process
        that ran them otherwise is added (``{"varied": [...]}``, as for the arithmetic)."""
        from harness.engine.arithmetic import combined

        self.db.execute("BEGIN IMMEDIATE")
        row = self.db.execute(
            "SELECT plugin_hosts FROM runs WHERE run_id = ?", (run_id,)
        ).fetchone()
        recorded = json.loads(row[0]) if row is not None and row[0] else None
        if hosting not in (recorded or {}).get("varied", ()):
            self.db.execute("UPDATE runs SET plugin_hosts = ? WHERE run_id = ?",
                            (json.dumps(combined(recorded, hosting), sort_keys=True), run_id))  # fmt: skip
        self.db.commit()

    def record_components(self, run_id: str, components: dict[str, Any]) -> None:
        """Record which plugin, installed package (distribution) and version provided each
        component of the run (kind -> name -> provenance), unless the run has a record (a
        resumed run keeps what began it)."""
        with self.db:
            self.db.execute(
                "UPDATE runs SET components = ? WHERE run_id = ? AND components IS NULL",
                (json.dumps(components, sort_keys=True), run_id),
            )

    def add_file(
        self, run_id: str, role: str, name: str, path: str, sha256: str, meta: dict[str, Any]
    ) -> None:
        """Record a file a replay of the run needs (``role``: ``weights``, ``plugin-artifact``,
        ``sigma-model``), with its SHA-256; recorded again, it replaces the earlier entry."""
        with self.db:
            self.db.execute(
                FILE_INSERT,
                {"run_id": run_id, "role": role, "name": name, "path": path, "sha256": sha256,
                 "meta": json.dumps(meta, sort_keys=True)},
            )  # fmt: skip

    def files(self, run_id: str) -> list[dict[str, Any]]:
        """The recorded files of a run (role, name, path, sha256, meta), by role and name."""
        rows = self.db.execute(
            "SELECT role, name, path, sha256, meta FROM files WHERE run_id = ? ORDER BY role, name",
            (run_id,),
        )
        return [dict(r) | {"meta": json.loads(r["meta"])} for r in rows]

    def finish_run(self, run_id: str) -> None:
        with self.db:
            self.db.execute("UPDATE runs SET finished = ? WHERE run_id = ?", (_now(), run_id))

    def add_certificate(
        self, run_id: str, method: str, setting: str, shard: int, label: int, cert: Certificate,
        state: Sequence[StateRecord] = (),
    ) -> None:  # fmt: skip
        """Commit ``cert`` and the certifier's ``state`` records in one transaction."""
        self.add_shard(run_id, method, setting, shard, [(label, cert, state)], finished=False)

    def add_shard(
        self, run_id: str, method: str, setting: str, shard: int,
        stored: Sequence[tuple[int, Certificate, Sequence[StateRecord]]], finished: bool = True,
    ) -> None:  # fmt: skip
        """Commit certificates of ``shard``, each ``(label, certificate, state records)`` in
        order, and (``finished``) the mark that the shard is finished, in one transaction: a
        shard is stored whole or not at all."""
        key = {"run_id": run_id, "method": method, "setting": setting}
        evidence = [stored_evidence(cert, label, state) for label, cert, state in stored]
        with self.db:
            for (label, cert, state), text in zip(stored, evidence, strict=True):
                self.db.executemany(
                    STATE_INSERT,
                    [key | {"seq": r.seq, "record": json.dumps(r.record, sort_keys=True),
                            "data": r.data} for r in state],
                )  # fmt: skip
                self.db.execute(
                    CERTIFICATE_INSERT,
                    key | {
                        "input_id": cert.input_id, "shard": shard, "label": label,
                        "prediction": cert.prediction, "predict": cert.predict,
                        "radius": cert.radius, "p_lower": cert.p_lower, "sigma": cert.sigma,
                        "alpha": cert.alpha, "counts_selection": json.dumps(cert.counts_selection),
                        "counts_estimation": json.dumps(cert.counts_estimation),
                        "seconds": cert.seconds, "load": cert.load, "evidence": text,
                        "draws": None if cert.draws is None else json.dumps(cert.draws),
                        "region": None if cert.region is None else json.dumps(cert.region),
                    },
                )  # fmt: skip
            if finished:
                self.db.execute(SHARD_INSERT, key | {"shard": shard, "finished": _now()})

    def state_records(self, run_id: str, method: str, setting: str) -> list[StateRecord]:
        """The committed state records of (run, method, setting), in order of ``seq``."""
        rows = self.db.execute(
            "SELECT seq, record, data FROM state WHERE run_id = ? AND method = ? AND setting = ?"
            " ORDER BY seq",
            (run_id, method, setting),
        )
        return [StateRecord(seq, json.loads(record), bytes(data)) for seq, record, data in rows]

    def finished_shards(self, run_id: str, method: str, setting: str) -> set[int]:
        rows = self.db.execute(
            "SELECT shard FROM shards WHERE run_id = ? AND method = ? AND setting = ?",
            (run_id, method, setting),
        )
        return {r[0] for r in rows}

    def stored_inputs(
        self, run_id: str, method: str, setting: str, shard: int | None = None
    ) -> set[int]:
        """Input ids with a stored certificate (of one ``shard`` when given)."""
        sql = "SELECT input_id FROM certificates WHERE run_id = ? AND method = ? AND setting = ?"
        args: tuple = (run_id, method, setting)
        if shard is not None:
            sql, args = sql + " AND shard = ?", (*args, shard)
        return {r[0] for r in self.db.execute(sql, args)}

    def record_failure(self, run_id: str, method: str, setting: str, error: str) -> None:
        with self.db:
            self.db.execute(
                FAILURE_INSERT,
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
        """Store a :class:`harness.foundation.verdict.CheckResult`, replacing an earlier one,
        with what it cost (its ``cost``, :mod:`harness.audit.cost`)."""
        cost = getattr(result, "cost", None)
        with self.db:
            self.db.execute(
                CHECK_INSERT,
                {"run_id": run_id, "method": method, "setting": setting,
                 "check_name": result.check, "verdict": str(result.verdict),
                 "summary": result.summary,
                 "evidence": json.dumps(result.evidence, default=jsonable, sort_keys=True),
                 "flags": json.dumps(result.flags), "budget": budget, "at": _now(),
                 "cost": None if cost is None else json.dumps(cost)},
            )  # fmt: skip

    def checks(self, run_id: str) -> list[dict[str, Any]]:
        """The stored check results of ``run_id``, one dict per (method, setting, check)."""
        rows = self.db.execute("SELECT * FROM checks WHERE run_id = ?", (run_id,))
        return [dict(r) for r in rows]

    def add_attack(
        self, run_id: str, method: str, setting: str, budget: str, result: dict[str, Any]
    ) -> None:
        """Store the empirical attack's ``result`` on a (method, setting), replacing an earlier one."""
        with self.db:
            self.db.execute(
                "INSERT OR REPLACE INTO attacks (run_id, method, setting, budget, result, at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, method, setting, budget,
                 json.dumps(result, default=jsonable, sort_keys=True), _now()),
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
        out["arithmetic"] = json.loads(out["arithmetic"]) if out.get("arithmetic") else None
        for key in ("components", "plugin_hosts"):
            out[key] = json.loads(out[key]) if out.get(key) else None
        return out

    def certificates(self, run_id: str) -> Iterable[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT * FROM certificates WHERE run_id = ? ORDER BY method, setting, input_id",
            (run_id,),
        )
        for row in rows:
            out = dict(row)
            for key in ("counts_selection", "counts_estimation", "evidence", "draws", "region"):
                out[key] = json.loads(out[key]) if out[key] is not None else None
            yield out
