"""Which runs one benchmark made: a run per base model (training σ, seed), recorded so
that ``idrs-bench leaderboard DB`` finds every run of the latest benchmark
(:mod:`harness.running.model_variants`)."""

from __future__ import annotations

from pathlib import Path

from harness.store.store import ResultStore


def record_benchmark(db: Path, run_id: str, benchmark: str) -> None:
    """Record in ``db`` that run ``run_id`` is one of the runs that the benchmark of content
    hash ``benchmark`` was expanded into."""
    store = ResultStore(db)
    try:
        with store.db:
            store.db.execute("UPDATE runs SET benchmark = ? WHERE run_id = ?", (benchmark, run_id))
    finally:
        store.close()


def sibling_runs(store: ResultStore, run_id: str) -> list[str]:
    """The runs made from the benchmark run ``run_id`` was made from, in order of creation
    (``[run_id]`` when none is recorded)."""
    rows = store.db.execute(
        "SELECT run_id FROM runs WHERE benchmark IS NOT NULL AND benchmark = "
        "(SELECT benchmark FROM runs WHERE run_id = ?) ORDER BY created, rowid", (run_id,),
    ).fetchall()  # fmt: skip
    return [row[0] for row in rows] or [run_id]
