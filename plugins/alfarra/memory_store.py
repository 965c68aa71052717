"""Persistence of the certification memory (Alg. 3), so that a resumed run continues it.

The runner commits each certificate to its results database as it goes and, on
resume, certifies only the inputs without one, with a freshly built certifier. The
memory therefore lives in its own small SQLite file (``memory.sqlite`` in
:func:`default_memory_dir`), one table keyed by a content hash of everything that
determines the certificates (see :func:`memory_key`); each entry is committed
*before* its certificate is handed to the runner. An input whose certificate was
lost in a crash is certified again and finds its entry (:meth:`Memory.certify`).

Without the run id (the core does not pass it to certifiers yet) the key cannot tell
apart two runs with the same seed, base model, protocol and method parameters but a
different set of test inputs: such runs share one memory. With ``context.run_id``,
``context.method`` and ``context.setting`` present they enter the key, and each run
setting has its own memory.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.modelcache import default_cache_dir
from plugins.alfarra.memory import Memory, MemoryEntry

SCHEMA = """
CREATE TABLE IF NOT EXISTS memory (
    key TEXT NOT NULL,
    position INTEGER NOT NULL,
    input_id INTEGER NOT NULL,
    x BLOB NOT NULL,
    prediction INTEGER NOT NULL,
    radius REAL NOT NULL,
    raw_prediction INTEGER NOT NULL,
    raw_radius REAL NOT NULL,
    action TEXT NOT NULL,
    decided_by TEXT NOT NULL,
    PRIMARY KEY (key, position),
    UNIQUE (key, input_id)
);
"""


def default_memory_dir() -> Path:
    """``$IDRS_BENCH_CACHE/alfarra-memory`` (``~/.cache/idrs-bench/alfarra-memory``)."""
    return default_cache_dir().parent / "alfarra-memory"


def model_digest(model: torch.nn.Module) -> str:
    """SHA-256 of the model's state dict (names, shapes, dtypes and values)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
        digest.update((t.float() if t.dtype == torch.bfloat16 else t).numpy().tobytes())
    return digest.hexdigest()


def memory_key(context: Any, inner: str, params: dict[str, Any]) -> str:
    """Hash of (seed, device, base model, protocol, inner certifier, parameters[, run])."""
    parts = {
        "format": 1,
        "seed": context.seed,
        "device": str(context.device),
        "model": model_digest(context.model),
        "protocol": asdict(context.protocol),
        "inner": inner,
        "params": {k: params[k] for k in sorted(params)},
        "run": [getattr(context, a, None) for a in ("run_id", "method", "setting")],
    }
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class MemoryLog:
    """The entries of one memory in ``path`` under ``key``, in insertion order."""

    def __init__(self, path: str | Path, key: str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.key = key
        self.db = sqlite3.connect(self.path, timeout=30)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    def restore(self, memory: Memory) -> int:
        """Append every stored entry to an empty ``memory``; returns how many."""
        rows = self.db.execute(
            "SELECT position, input_id, x, prediction, radius, raw_prediction, raw_radius,"
            " action, decided_by FROM memory WHERE key = ? ORDER BY position",
            (self.key,),
        )
        count = 0
        for pos, input_id, x, pred, rad, raw_pred, raw_rad, action, decided in rows:
            entry = MemoryEntry(
                pos, input_id, pred, rad, raw_pred, raw_rad, action, tuple(json.loads(decided))
            )
            memory.add(entry, torch.from_numpy(np.frombuffer(x, dtype=np.float64).copy()))
            count += 1
        return count

    def append(self, entry: MemoryEntry, x: torch.Tensor) -> None:
        """Commit one new entry (its input stored as float64 bytes)."""
        blob = x.detach().to("cpu", torch.float64).contiguous().flatten().numpy().tobytes()
        with self.db:
            self.db.execute(
                "INSERT OR IGNORE INTO memory VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (self.key, entry.position, entry.input_id, blob, entry.prediction, entry.radius,
                 entry.raw_prediction, entry.raw_radius, entry.action,
                 json.dumps(list(entry.decided_by))),
            )  # fmt: skip
