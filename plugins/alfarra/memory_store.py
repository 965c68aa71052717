"""The certification memory (Alg. 3) as per-run state in the run's results database.

Each memory entry is one :class:`harness.foundation.runstate.StateRecord` of the (run, method,
setting) it belongs to: the entry's fields as JSON and its input as float64 bytes.
The runner writes an entry in the same transaction as the certificate it produced,
so a resumed run restores exactly the entries whose certificates are stored
(:func:`restore`), and copying a run's database carries its memory.
"""

from __future__ import annotations

import numpy as np
import torch

from harness import IdrsError, RunState, StateRecord
from plugins.alfarra.memory import Memory, MemoryEntry

RECORD_FORMAT = 1


def entry_record(entry: MemoryEntry, x: torch.Tensor) -> tuple[dict, bytes]:
    """(JSON fields, input bytes) of one entry."""
    record = {
        "format": RECORD_FORMAT, "position": entry.position, "input_id": entry.input_id,
        "prediction": entry.prediction, "radius": entry.radius,
        "raw_prediction": entry.raw_prediction, "raw_radius": entry.raw_radius,
        "action": entry.action, "decided_by": list(entry.decided_by),
    }  # fmt: skip
    return record, x.detach().to("cpu", torch.float64).contiguous().flatten().numpy().tobytes()


def restore(memory: Memory, records: list[StateRecord]) -> int:
    """Append the entries of ``records`` to an empty ``memory``; returns how many."""
    for item in records:
        r = item.record
        if r.get("format") != RECORD_FORMAT or r.get("position") != item.seq:
            raise IdrsError(f"memory record {item.seq} is not a memory entry of this format: {r}")
        entry = MemoryEntry(
            r["position"], r["input_id"], r["prediction"], r["radius"], r["raw_prediction"],
            r["raw_radius"], r["action"], tuple(r["decided_by"]),
        )  # fmt: skip
        memory.add(entry, torch.from_numpy(np.frombuffer(item.data, dtype=np.float64).copy()))
    return len(records)


def stage_entry(state: RunState, entry: MemoryEntry, x: torch.Tensor) -> None:
    """Queue a new entry; the runner commits it with the certificate it produced."""
    record, data = entry_record(entry, x)
    state.stage(record, data)
