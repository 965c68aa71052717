"""The results database's tables, and its insert statements (rows inserted by column name).

Tables: ``runs``, ``certificates`` (one row per certified input), ``shards`` (finished
shards), ``state`` (a certifier's per-run state), ``files`` (what a replay needs besides
the database), ``leases`` (which process works on which shard), ``failures``, ``checks``
and ``attacks``. A database written before a column existed gets it on opening
(:data:`ADDED_COLUMNS`), and a column since renamed gets its new name (:data:`RENAMED_COLUMNS`).
"""

from __future__ import annotations

from collections.abc import Sequence

BUSY_SECONDS = 60.0
"""How long a write waits for another process's transaction on the same database."""

WHOLE_SETTING = -1
"""The shard number of a lease on every shard of a setting (an order-dependent certifier)."""
PRESENCE = -2
"""The shard number of a process's presence on a run (method "", setting: the process)."""

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
    recipe_hash TEXT,
    weights_digest TEXT,
    inputs INTEGER,
    data_files TEXT,
    arithmetic TEXT
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
    load REAL,
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
    cost TEXT,
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
CREATE TABLE IF NOT EXISTS leases (
    run_id TEXT NOT NULL,
    method TEXT NOT NULL,
    setting TEXT NOT NULL,
    shard INTEGER NOT NULL,
    owner TEXT NOT NULL,
    expires REAL NOT NULL,
    PRIMARY KEY (run_id, method, setting, shard)
);
CREATE TABLE IF NOT EXISTS files (
    run_id TEXT NOT NULL,
    role TEXT NOT NULL,
    name TEXT NOT NULL,
    path TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    meta TEXT NOT NULL,
    PRIMARY KEY (run_id, role, name)
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
"""The empirical attack's result per (run, method, setting) (:mod:`harness.audit.empirical`)."""

ADDED_COLUMNS = (
    ("runs", "weights_digest", "TEXT"),
    ("runs", "inputs", "INTEGER"),
    ("runs", "data_files", "TEXT"),
    ("runs", "class_names", "TEXT"),
    ("runs", "arithmetic", "TEXT"),
    ("runs", "components", "TEXT"),  # which plugin and package provides each component
    ("runs", "plugin_hosts", "TEXT"),  # how third-party plugins were confined
    ("runs", "test_split", "TEXT"),  # "withheld": no plugin had the test split (data.WITHHELD)
    ("runs", "benchmark", "TEXT"),  # the benchmark a run was expanded from (model_variants)
    ("certificates", "draws", "TEXT"),  # before the harness drew the evidence itself
    ("certificates", "load", "REAL"),  # the machine's load per core behind ``seconds``
    ("certificates", "region", "TEXT"),  # a region certified beside the ℓ2 ball (JSON)
    ("checks", "cost", "TEXT"),  # what each check cost (harness.audit.cost)
)
"""Columns added after the first release: (table, column, type)."""

RENAMED_COLUMNS = (
    # the base model's recipe hash (its cache key), never a digest of its weights
    # (that is ``weights_digest``); values unchanged, so run ids and cache paths are too
    ("runs", "model_hash", "recipe_hash"),
)
"""Columns renamed after the first release: (table, old name, new name)."""


def _insert(verb: str, table: str, columns: Sequence[str]) -> str:
    """``INSERT ... INTO table (c1, c2, ...) VALUES (:c1, :c2, ...)``: values bound by name."""
    return (
        f"{verb} INTO {table} ({', '.join(columns)}) VALUES ({', '.join(':' + c for c in columns)})"
    )


CERTIFICATE_INSERT = _insert(
    "INSERT OR IGNORE", "certificates",
    ("run_id", "method", "setting", "input_id", "shard", "label", "prediction", "predict",
     "radius", "p_lower", "sigma", "alpha", "counts_selection", "counts_estimation", "seconds",
     "evidence", "draws", "load", "region"),
)  # fmt: skip
STATE_INSERT = _insert(
    "INSERT OR IGNORE", "state", ("run_id", "method", "setting", "seq", "record", "data")
)
SHARD_INSERT = _insert(
    "INSERT OR IGNORE", "shards", ("run_id", "method", "setting", "shard", "finished")
)
FILE_INSERT = _insert(
    "INSERT OR REPLACE", "files", ("run_id", "role", "name", "path", "sha256", "meta")
)
FAILURE_INSERT = _insert("INSERT", "failures", ("run_id", "method", "setting", "error", "at"))
CHECK_INSERT = _insert(
    "INSERT OR REPLACE", "checks",
    ("run_id", "method", "setting", "check_name", "verdict", "summary", "evidence", "flags",
     "budget", "at", "cost"),
)  # fmt: skip
