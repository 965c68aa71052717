"""``model_hash`` became ``recipe_hash`` (the base model's recipe hash, its cache key; the
digest of its weights is ``weights_digest``): a results database of the old schema has
its column renamed on opening, and a run export of format 1 or 2 (key ``model_hash``) is
still read, re-rendered and re-derived. Values are unchanged, so run ids are too."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from harness.reports.leaderboard.board import build_board
from harness.reports.leaderboard.render import render_texts
from harness.reports.leaderboard.source import (
    EXPORT_FORMAT,
    export_format,
    export_runs,
    read_export,
    upgrade_run_row,
)
from harness.reports.leaderboard.verify import board_source, verify_board
from harness.store.store import ResultStore
from harness.store.storedrun import load_runs

LEADERBOARDS = Path(__file__).parent.parent / "leaderboards"
RUN = "ab12" * 16
RECIPE = "cd" * 32
CONFIG = {
    "name": "old", "seed": 0, "device": "auto", "shard_size": 32,
    "dataset": {"name": "cone-2", "test_every": 1, "test_count": 2},
    "model": {"architecture": "mlp", "trainer": "gaussian-augmentation"},
    "protocol": {"n0": 10, "n": 100, "alpha": 0.001},
    "methods": [{"name": "cohen", "settings": [{"sigma": 0.5}]}],
}  # fmt: skip

# the runs table as the first release created it, and as the last release with
# ``model_hash`` did (four columns later; any missing column is added on opening)
FIRST_COLUMNS = (
    "run_id TEXT PRIMARY KEY", "name TEXT NOT NULL", "created TEXT NOT NULL",
    "finished TEXT", "config TEXT NOT NULL", "versions TEXT NOT NULL", "git_commit TEXT",
    "device TEXT NOT NULL", "seed INTEGER NOT NULL", "model_hash TEXT",
)  # fmt: skip
LAST_COLUMNS = (*FIRST_COLUMNS, "weights_digest TEXT", "inputs INTEGER", "data_files TEXT",
                "arithmetic TEXT")  # fmt: skip
OLD_RUNS = f"CREATE TABLE runs ({', '.join(LAST_COLUMNS)})"
FIRST_RUNS = f"CREATE TABLE runs ({', '.join(FIRST_COLUMNS)})"


def _old_database(path: Path, schema: str) -> Path:
    con = sqlite3.connect(path)
    with con:
        con.execute(schema)
        con.execute(
            "INSERT INTO runs (run_id, name, created, finished, config, versions, git_commit,"
            " device, seed, model_hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (RUN, "old", "2024-01-01T00:00:00+00:00", "2024-01-01T00:01:00+00:00",
             json.dumps(CONFIG), "{}", None, "cpu", 0, RECIPE),
        )  # fmt: skip
    con.close()
    return path


def _columns(path: Path) -> list[str]:
    con = sqlite3.connect(path)
    try:
        return [row[1] for row in con.execute("PRAGMA table_info(runs)")]
    finally:
        con.close()


@pytest.mark.parametrize("schema", [OLD_RUNS, FIRST_RUNS], ids=["last-release", "first-release"])
def test_an_old_database_gets_its_column_renamed_on_opening(tmp_path, schema):
    db = _old_database(tmp_path / "old.sqlite", schema)
    assert "model_hash" in _columns(db)
    store = ResultStore(db)  # checked (integrity) first, then migrated
    try:
        row = store.run(RUN[:12])
        assert row["recipe_hash"] == RECIPE and "model_hash" not in row
        # the store writes the renamed column
        assert store.begin_run("ef" * 32, "new", CONFIG, {}, None, "cpu", 0, "01" * 32)
        assert store.run("ef" * 32)["recipe_hash"] == "01" * 32
    finally:
        store.close()
    columns = _columns(db)
    assert "model_hash" not in columns and columns.count("recipe_hash") == 1
    assert {"weights_digest", "arithmetic", "class_names"} <= set(columns)
    (stored,) = load_runs(db, [RUN])  # opened again: nothing left to rename
    assert stored.run["recipe_hash"] == RECIPE and "model_hash" not in stored.run
    assert _columns(db) == columns


def test_a_new_database_has_only_the_new_column(tmp_path):
    ResultStore(tmp_path / "new.sqlite").close()
    columns = _columns(tmp_path / "new.sqlite")
    assert "recipe_hash" in columns and "model_hash" not in columns


def test_upgrade_run_row_renames_the_key_only():
    old = {"run_id": RUN, "model_hash": RECIPE, "seed": 0}
    assert upgrade_run_row(old) == {"run_id": RUN, "recipe_hash": RECIPE, "seed": 0}
    assert old["model_hash"] == RECIPE  # not modified in place
    new = {"run_id": RUN, "recipe_hash": RECIPE}
    assert upgrade_run_row(new) is new


def _downgrade(export: Path, fmt: str) -> None:
    """Rewrite ``export`` as an older release wrote it: ``model_hash``, format ``fmt``."""
    data = json.loads(export.read_text())
    data["format"] = fmt
    for item in data["runs"]:
        item["run"] = {("model_hash" if k == "recipe_hash" else k): v
                       for k, v in item["run"].items()}  # fmt: skip
    export.write_text(json.dumps(data, sort_keys=True))


def test_an_old_format_export_is_read_and_verifies(tmp_path):
    """A committed board whose run export is rewritten to format 2 (``model_hash``)
    still re-derives and re-renders to the committed (current) files."""
    for path in LEADERBOARDS.glob("hidden-cost*"):
        if path.suffix != ".pt":  # the weights only matter to --replay
            shutil.copyfile(path, tmp_path / path.name)
    board, export = tmp_path / "hidden-cost.md", tmp_path / "hidden-cost.run.json"
    current = [run.run for run in read_export(export)]
    _downgrade(export, "idrs-bench/run-export/2")
    assert '"model_hash"' in export.read_text() and '"recipe_hash"' not in export.read_text()
    runs = read_export(export)
    assert [run.run for run in runs] == current
    assert all("model_hash" not in run.run and run.run["recipe_hash"] for run in runs)
    assert board_source(board).rederivable
    assert verify_board(board, notes=[]) == []
    # re-published, it is the committed export of the current format again
    texts = render_texts(build_board(runs), "hidden-cost")
    assert texts["hidden-cost.run.json"] == (LEADERBOARDS / "hidden-cost.run.json").read_text()


def test_a_committed_export_is_current_and_re_exports_unchanged(tmp_path):
    """Re-publishing a board from its own export keeps every file name (a σ-estimator's
    shipped name is not prefixed twice) and yields the export itself."""
    export = LEADERBOARDS / "quick.run.json"
    assert export_format(export) == EXPORT_FORMAT
    text = export.read_text()
    assert export_runs(read_export(export), "quick") == text
    old = tmp_path / "quick.run.json"
    shutil.copyfile(export, old)
    _downgrade(old, "idrs-bench/run-export/1")
    runs = read_export(old)
    shutil.copyfile(LEADERBOARDS / "quick.md", tmp_path / "quick.md")
    assert not board_source(tmp_path / "quick.md").rederivable  # format 1: re-rendered only
    assert export_runs(runs, "quick") == text


def test_the_former_context_attribute_reads_the_recipe_hash_with_a_warning():
    """A plugin written against ``BuildContext.model_hash`` still reads the value, and is
    told its new name."""
    from harness.plugin.components import BuildContext

    context = BuildContext(*[None] * 7, recipe_hash="ab" * 32)
    with pytest.warns(DeprecationWarning, match="recipe_hash"):
        assert context.model_hash == "ab" * 32
