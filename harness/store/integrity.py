"""Opening a results database checks it first: a file that is not a SQLite database, or
fails SQLite's ``PRAGMA quick_check``, is refused before anything is written to it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from harness.foundation.errors import IdrsError
from harness.store.schema import BUSY_SECONDS


class DamagedStoreError(IdrsError):
    """A results database that is not a SQLite database or fails its integrity check."""


def check_database(path: str | Path) -> None:
    """Raise :class:`DamagedStoreError` unless ``path`` is missing, empty (SQLite makes
    it a new database) or a SQLite database that passes ``PRAGMA quick_check``.

    Reads only, through a read-only SQLite connection (never a file handle of its own:
    closing one would drop the locks SQLite holds on the file for this process's other
    connections). A database is checked once per process.
    """
    path = Path(path)
    if path.is_dir():
        raise IdrsError(f"results database {str(path)!r} is a folder; pass a file with --db")
    if not path.is_file() or path.stat().st_size == 0 or path.resolve() in _CHECKED:
        return
    wal, shm = (path.with_name(path.name + suffix) for suffix in ("-wal", "-shm"))
    had_log = wal.exists() or shm.exists()
    try:
        try:
            uri = f"{path.resolve().as_uri()}?mode=ro"
            db = sqlite3.connect(uri, uri=True, timeout=BUSY_SECONDS)
            try:
                # a problem may span lines (e.g. "Page 15: ..."): one line of text each
                problems = [" ".join(row[0].split()) for row in db.execute("PRAGMA quick_check")]
            finally:
                db.close()
        except sqlite3.DatabaseError as exc:
            if "not a database" in str(exc):
                what = "it is not a SQLite database, or its header is damaged"
                raise _damaged(path, what) from None
            raise _damaged(path, f"SQLite cannot read it: {exc}") from None
        if problems != ["ok"]:
            more = f" and {len(problems) - 1} more problem(s)" if len(problems) > 1 else ""
            raise _damaged(path, f"it fails SQLite's integrity check: {problems[0]}{more}")
    except DamagedStoreError:
        # a read-only look at a WAL database leaves an empty log and its index behind
        if not had_log and wal.is_file() and wal.stat().st_size == 0:
            wal.unlink()
            shm.unlink(missing_ok=True)
        raise
    _CHECKED.add(path.resolve())


_CHECKED: set[Path] = set()
"""Databases :func:`check_database` passed in this process."""


def _damaged(path: Path, what: str) -> DamagedStoreError:
    return DamagedStoreError(
        f"results database {str(path)!r} is damaged ({what}); nothing was written to it. "
        f"Restore it from a backup, or save what is readable with "
        f'`sqlite3 {path} ".recover" | sqlite3 recovered.sqlite` and pass --db recovered.sqlite, '
        "or pass another --db to start a new database"
    )
