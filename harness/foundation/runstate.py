"""Per-run state of a certifier, kept in the run's results database.

A certifier whose answers depend on what it certified before in the same run (the
memory of Alfarra et al. 2022, Alg. 3) finds in :attr:`harness.plugin.components.BuildContext.state`
the :class:`RunState` of its (run, method, setting): :meth:`RunState.records` are the
records committed so far (restore from them when built), and :meth:`RunState.stage`
queues new ones while a certificate is being produced. The runner writes the queued
records in the same transaction as that certificate (with the rest of its shard,
:meth:`harness.store.store.ResultStore.add_shard`), so state and certificates are
always consistent, and a run's database carries its state (no file elsewhere).
Outside a run (e.g. a soundness check replaying inputs) ``context.state`` is None
and the certifier keeps its state in memory only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StateRecord:
    """One record: its position ``seq`` (0, 1, ... per setting), JSON ``record``, raw ``data``."""

    seq: int
    record: dict[str, Any]
    data: bytes = b""


@dataclass
class RunState:
    """The state records of one (run, method, setting): committed ones and staged ones."""

    committed: list[StateRecord] = field(default_factory=list)
    staged: list[StateRecord] = field(default_factory=list)

    def records(self) -> list[StateRecord]:
        """Committed records, then staged ones, in order of ``seq``."""
        return [*self.committed, *self.staged]

    def stage(self, record: dict[str, Any], data: bytes = b"") -> StateRecord:
        """Queue a record (it gets the next ``seq``); committed with the next certificate."""
        item = StateRecord(len(self.committed) + len(self.staged), record, data)
        self.staged.append(item)
        return item

    def take(self) -> list[StateRecord]:
        """The staged records, now counted as committed (the caller writes them)."""
        out, self.staged = self.staged, []
        self.committed.extend(out)
        return out
