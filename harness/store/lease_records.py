"""The ``leases`` table: which process certifies which shard of a run, until when
(every statement here; the protocol that uses them is :mod:`harness.store.leases`)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.store.schema import WHOLE_SETTING


@dataclass(frozen=True)
class LeaseAnswer:
    """The outcome of :meth:`ResultStore.acquire_lease`: ``acquired``, else the ``holder``
    of a live lease in the way; ``expired`` names the owner whose lapsed lease was taken."""

    acquired: bool
    holder: str | None = None
    expired: str | None = None


class LeaseRecords:
    """The lease statements of :class:`harness.store.store.ResultStore` (its ``db``)."""

    db: sqlite3.Connection

    def acquire_lease(
        self, run_id: str, method: str, setting: str, shard: int, owner: str, seconds: float,
        gone: Callable[[str], bool] = lambda owner: False,
    ) -> LeaseAnswer:  # fmt: skip
        """Lease ``shard`` (or :data:`WHOLE_SETTING`) of (run, method, setting) to ``owner``
        for ``seconds``, unless another owner's unexpired lease covers it: a shard is
        covered by its own lease and by a whole-setting lease, a whole setting by any
        lease of it. An expired lease, or one whose owner is ``gone``, is taken over. One
        transaction (``BEGIN IMMEDIATE``), so two processes never both acquire."""
        now = time.time()
        self.db.execute("BEGIN IMMEDIATE")
        try:
            rows = self.db.execute(
                "SELECT shard, owner, expires FROM leases WHERE run_id = ? AND method = ? AND "
                "setting = ? AND (shard = ? OR shard = ? OR ? = ?)",
                (run_id, method, setting, shard, WHOLE_SETTING, shard, WHOLE_SETTING),
            ).fetchall()
            live = [r["owner"] for r in rows
                    if r["owner"] != owner and r["expires"] > now and not gone(r["owner"])]  # fmt: skip
            if live:
                return LeaseAnswer(False, holder=live[0])
            lapsed = [r["owner"] for r in rows if r["owner"] != owner and r["shard"] == shard]
            self.db.execute(
                "INSERT OR REPLACE INTO leases (run_id, method, setting, shard, owner, expires)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, method, setting, shard, owner, now + seconds),
            )
            return LeaseAnswer(True, expired=lapsed[0] if lapsed else None)
        finally:
            self.db.commit()

    def renew_leases(self, owner: str, seconds: float) -> set[tuple[str, str, str, int]]:
        """Extend every lease of ``owner`` to ``seconds`` from now; the (run, method,
        setting, shard) keys it still holds (a lease another owner took over is gone)."""
        with self.db:
            self.db.execute(
                "UPDATE leases SET expires = ? WHERE owner = ?", (time.time() + seconds, owner)
            )
        rows = self.db.execute(
            "SELECT run_id, method, setting, shard FROM leases WHERE owner = ?", (owner,)
        )
        return {tuple(r) for r in rows}

    def release_lease(
        self, run_id: str, method: str, setting: str, shard: int, owner: str | None = None
    ) -> None:
        """Drop the lease on ``shard`` (only ``owner``'s when given)."""
        sql = "DELETE FROM leases WHERE run_id = ? AND method = ? AND setting = ? AND shard = ?"
        args: tuple = (run_id, method, setting, shard)
        if owner is not None:
            sql, args = sql + " AND owner = ?", (*args, owner)
        with self.db:
            self.db.execute(sql, args)

    def drop_expired_leases(
        self, run_id: str, shard: int, gone: Callable[[str], bool] = lambda owner: False
    ) -> None:
        """Delete the leases of ``run_id`` on ``shard`` that expired or whose owner is
        ``gone`` (e.g. :data:`PRESENCE`: of processes that died)."""
        owners = self.db.execute(
            "SELECT DISTINCT owner FROM leases WHERE run_id = ? AND shard = ?", (run_id, shard)
        ).fetchall()
        dead = [row[0] for row in owners if gone(row[0])]
        with self.db:
            self.db.execute(
                "DELETE FROM leases WHERE run_id = ? AND shard = ? AND expires <= ?",
                (run_id, shard, time.time()),
            )
            self.db.executemany(
                "DELETE FROM leases WHERE run_id = ? AND shard = ? AND owner = ?",
                [(run_id, shard, owner) for owner in dead],
            )

    def lease_holder(self, run_id: str, method: str, setting: str, shard: int) -> str | None:
        """The owner of the lease on ``shard``, expired or not; None when there is none."""
        row = self.db.execute(
            "SELECT owner FROM leases WHERE run_id = ? AND method = ? AND setting = ?"
            " AND shard = ?",
            (run_id, method, setting, shard),
        ).fetchone()
        return None if row is None else row[0]

    def live_leases(self, run_id: str) -> list[dict[str, Any]]:
        """The unexpired leases of ``run_id``: method, setting, shard, owner, expires."""
        rows = self.db.execute(
            "SELECT method, setting, shard, owner, expires FROM leases"
            " WHERE run_id = ? AND expires > ? ORDER BY method, setting, shard",
            (run_id, time.time()),
        )
        return [dict(r) for r in rows]
