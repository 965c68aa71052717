"""A damaged results database is named in a one-line error that says what is wrong and
what to do, by every command that opens it, and nothing is written to it: a file that
is not a database (random bytes where the header is), a real results database with a
page in its middle overwritten, and one cut short."""

import hashlib
import random
import shutil
import sqlite3
from pathlib import Path

import pytest

from harness.cli.main import main


@pytest.fixture(scope="module")
def real_db(tmp_path_factory, small_benchmark) -> tuple[Path, Path]:
    """A results database written by `idrs-bench run` (WAL mode, as every run leaves
    it), and its benchmark file."""
    root = tmp_path_factory.mktemp("damage")
    spec = root / "damage.toml"
    spec.write_text(small_benchmark({"cohen": [{"sigma": 0.25}, {"sigma": 0.5}]}, name="damage",
                                    shard_size=16, test_count=64, width=8, epochs=0,
                                    trainer_sigma=None, n0=10, n=100, batch_size=128))  # fmt: skip
    db = root / "real.sqlite"
    assert main(["run", str(spec), "--db", str(db), "--no-check", "--quiet"]) == 0
    return db, spec


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _commands(db: Path, spec: Path) -> list[list[str]]:
    """Every command that opens a results database, pointed at ``db``."""
    return [
        ["run", str(spec), "--db", str(db), "--no-check", "--quiet"],
        ["results", "--db", str(db)],
        ["results", "--db", str(db), "--json"],
        ["check", "--db", str(db), "--quiet"],
        ["leaderboard", "--db", str(db)],
        ["leaderboard", str(db)],
        ["compare", str(db), str(db)],
        ["compare", "latest", "latest", "--db", str(db)],
    ]


def _assert_refused(db: Path, spec: Path, capsys, what: str) -> None:
    before = _digest(db)
    siblings = sorted(p.name for p in db.parent.iterdir())
    for argv in _commands(db, spec):
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        line = err.strip()
        assert "\n" not in line and "Traceback" not in line, (argv, err)
        assert line.startswith(f"error: results database '{db}' is damaged ({what}"), (argv, line)
        assert ".recover" in line and "backup" in line and "another --db" in line, line
        assert "\x1b" not in err + out
    assert _digest(db) == before  # nothing was written to it
    assert sorted(p.name for p in db.parent.iterdir()) == siblings  # nor beside it


def test_random_bytes_where_the_header_is(tmp_path, real_db, capsys):
    db = tmp_path / "g.sqlite"
    db.write_bytes(random.Random(0).randbytes(4096))  # head -c 4096 /dev/urandom > g.sqlite
    _assert_refused(db, real_db[1], capsys, "it is not a SQLite database")


def test_a_page_in_the_middle_of_a_real_database_overwritten(tmp_path, real_db, capsys):
    db = tmp_path / "mid.sqlite"
    _checkpointed_copy(real_db[0], db)
    with sqlite3.connect(db) as con:
        page_size = con.execute("PRAGMA page_size").fetchone()[0]
        pages = con.execute("PRAGMA page_count").fetchone()[0]
    con.close()
    assert pages >= 8  # a middle page, away from the header and the schema
    with db.open("r+b") as f:
        f.seek(page_size * (pages // 2))
        f.write(random.Random(1).randbytes(page_size))
    _assert_refused(db, real_db[1], capsys, "")


def test_a_real_database_cut_short(tmp_path, real_db, capsys):
    db = tmp_path / "cut.sqlite"
    _checkpointed_copy(real_db[0], db)
    db.write_bytes(db.read_bytes()[: db.stat().st_size // 2])
    _assert_refused(db, real_db[1], capsys, "")


def test_a_text_file_passed_as_the_database(tmp_path, real_db, capsys):
    db = tmp_path / "spec.toml"
    db.write_text(real_db[1].read_text())
    _assert_refused(db, real_db[1], capsys, "it is not a SQLite database")


def test_a_healthy_database_still_opens(real_db, capsys):
    db, _ = real_db
    assert main(["results", "--db", str(db)]) == 0
    assert "cohen" in capsys.readouterr().out


def _checkpointed_copy(source: Path, target: Path) -> None:
    """``source`` with its write-ahead log folded in, copied to ``target`` (one file)."""
    with sqlite3.connect(source) as con:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    shutil.copy(source, target)
