"""A base model per training σ and seed: the benchmark keys, its runs, its board."""

import json
import sqlite3

import pytest

from harness.cli.main import main
from harness.foundation.errors import SpecError
from harness.reports.leaderboard.board import build_board
from harness.reports.leaderboard.markdown import render_markdown
from harness.reports.leaderboard.seeds import ABOVE, BELOW, NOT_SEPARATED, seed_groups
from harness.running.benchmark import BENCHMARKS_DIR, load_benchmark
from harness.running.model_variants import model_variants
from harness.store.storedrun import load_runs

FIELD = BENCHMARKS_DIR / "fashion-mnist.toml"


def _every_run(db):
    with sqlite3.connect(db) as con:
        ids = [row[0] for row in con.execute("SELECT run_id FROM runs ORDER BY created, run_id")]
    return load_runs(db, ids)


def test_a_benchmark_without_the_keys_is_its_own_only_run():
    spec = load_benchmark(BENCHMARKS_DIR / "cone-2.toml")
    assert model_variants(spec) == [spec] and "model_axes" not in spec.to_dict()


def test_per_sigma_and_seeds_give_a_model_per_training_sigma_and_seed():
    spec = load_benchmark(FIELD, ["model.per_sigma=true", "model.seeds=[0, 1]",
                                  'model.training_sigma={"0.5" = 0.25}'])  # fmt: skip
    variants = model_variants(spec)
    models = [(v.model.trainer_params["sigma"], v.model.seed) for v in variants]
    # σ_b = 0.5 is trained at 0.25 as the table says, so two training σ, each on two seeds
    assert models == [(0.12, 0), (0.12, 1), (0.25, 0), (0.25, 1)]
    settings = {(m, v.model.trainer_params["sigma"]): [s.get("sigma") for s in ms.settings]
                for v in variants for m, ms in ((m.name, m) for m in v.methods)}  # fmt: skip
    assert settings["cohen", 0.12] == [0.12] and settings["cohen", 0.25] == [0.25, 0.5]
    # a setting without a σ_b certifies the model of trainer_params.sigma (0.25)
    assert settings["lipschitz-sigma-net", 0.25] == [None]
    assert ("lipschitz-sigma-net", 0.12) not in settings
    # each variant is a plain one-model spec: its own run id, no axes recorded
    assert all("model_axes" not in v.to_dict() for v in variants)
    assert all(v.model.trainer_params["epochs"] == 20 for v in variants)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.per_sigma=1"], "per_sigma must be true or false"),
        (["model.seeds=[0, 0]"], "distinct integers"),
        (["model.seeds=[]"], "distinct integers"),
        (['model.training_sigma={"0.3" = 0.25}', "model.per_sigma=true"], "no setting has sigma"),
        (
            ['model.training_sigma={"0.5" = 0.25}', "model.per_sigma=false"],
            "applies with model.per_sigma",
        ),
        (['model.training_sigma={"0.5" = -1}', "model.per_sigma=true"], "number >= 0"),
        (["model.per_sigma=true", "model.trainer_params={epochs = 1}"], "trainer_params.sigma"),
    ],
)
def test_bad_model_axes_are_named(overrides, message):
    with pytest.raises(SpecError, match=message):
        load_benchmark(FIELD, overrides)


def test_a_checkpoint_is_one_model(tmp_path):
    with pytest.raises(SpecError, match="a checkpoint is one model"):
        load_benchmark(FIELD, ["model.checkpoint='w.pt'", "model.seeds=[0, 1]"])


@pytest.mark.long
def test_a_run_per_model_and_one_board_for_them(tmp_path, capsys, small_benchmark):
    text = small_benchmark({"cohen": [{"sigma": 0.25}, {"sigma": 0.5}]}, dataset="cone-2",
                           test_count=12, n=300, trainer_sigma=0.25)  # fmt: skip
    spec = tmp_path / "tiny.toml"
    spec.write_text(text.replace("[model]\n", "[model]\nper_sigma = true\nseeds = [1, 2]\n"))
    db = tmp_path / "r.sqlite"
    assert main(["run", str(spec), "--db", str(db), "--quiet"]) == 0
    out = capsys.readouterr().out
    runs = _every_run(db)
    assert len(runs) == 4 and "4 runs (a model each)" in out
    models = {(r.config["model"]["trainer_params"]["sigma"], r.config["model"]["seed"]):
              r.run["recipe_hash"] for r in runs}  # fmt: skip
    assert sorted(models) == [(0.25, 1), (0.25, 2), (0.5, 1), (0.5, 2)]
    assert len(set(models.values())) == 4  # four base models, each trained on its own
    for run in runs:  # each run certifies only the σ_b of its model
        (method,) = run.config["methods"]
        assert method["settings"] == [{"sigma": run.config["model"]["trainer_params"]["sigma"]}]
    # the board: one table, every row beside its model; a row is paired only within it
    (table,) = build_board(runs).tables
    assert len(table.models) == 4 and len(table.rows) == 4
    for row in table.rows:
        for reference in table.references[row.model].values():
            assert reference is None or reference.model == row.model
    markdown = render_markdown(build_board(runs), "tiny")
    assert "4 base models" in markdown and "| # | model | method | setting |" in markdown
    assert "σ 0.25 · seed 1" in markdown and "### Over training seeds" in markdown
    groups = seed_groups(table)
    assert sorted((g.setting, g.seeds) for g in groups) == [("sigma=0.25", [1, 2]),
                                                            ("sigma=0.5", [1, 2])]  # fmt: skip
    # the mean over seeds is the mean of the rows' own numbers (each its model's)
    for g in groups:
        values = [row.metrics["certified_accuracy@0"] for row in g.rows]
        assert f"{sum(values) / 2:.3f} [" in markdown
    # the `run` output names the board command with every run
    board = next(line for line in out.splitlines() if " leaderboard " in line and "--out" in line)
    assert all(r.run_id[:12] in board for r in runs)


def test_the_reading_across_seeds_is_an_intersection_union_test(tmp_path, monkeypatch):
    class Diff:
        def __init__(self, low, high):
            self.low, self.high, self.difference = low, high, (low + high) / 2

    class FakeRow:
        def __init__(self, *d):
            self.differences = {0.5: Diff(*d)}

    from harness.reports.leaderboard.seeds import SeedGroup

    group = SeedGroup("m", "s", 0.25, [FakeRow(0.01, 0.2), FakeRow(0.02, 0.3)], [0, 1])
    assert group.reading(0.5) == ABOVE
    group.rows.append(FakeRow(-0.01, 0.2))  # one seed's interval holds 0: not on every seed
    assert group.reading(0.5) == NOT_SEPARATED
    group.rows = [FakeRow(-0.3, -0.1), FakeRow(-0.2, -0.01)]
    assert group.reading(0.5) == BELOW
    group.rows[0].differences[0.5] = None
    assert group.reading(0.5) is None


def test_the_board_json_holds_the_seed_groups(tmp_path, capsys, small_benchmark):
    text = small_benchmark({"cohen": [{"sigma": 0.5}]}, test_count=6, n=200)
    spec = tmp_path / "tiny.toml"
    spec.write_text(text.replace("[model]\n", "[model]\nseeds = [3, 4]\n"))
    db = tmp_path / "r.sqlite"
    assert main(["run", str(spec), "--db", str(db), "--quiet", "--no-check"]) == 0
    runs = _every_run(db)
    out = tmp_path / "b.md"
    assert main(["leaderboard", *[r.run_id for r in runs], "--db", str(db), "--out", str(out),
                 "--no-plots"]) == 0  # fmt: skip
    (table,) = json.loads(out.with_suffix(".json").read_text())["tables"]
    (group,) = table["seeds"]
    assert group["seeds"] == [3, 4] and len(group["runs"]) == 2
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    values = sorted(r["clean_accuracy"] for r in rows)
    assert group["metrics"]["clean_accuracy"]["range"] == [values[0], values[-1]]
    assert group["metrics"]["clean_accuracy"]["mean"] == pytest.approx(sum(values) / 2)


def test_leaderboard_of_a_database_takes_every_run_of_its_latest_benchmark(
    tmp_path, capsys, small_benchmark
):
    text = small_benchmark({"cohen": [{"sigma": 0.5}]}, test_count=4, n=100)
    first, seeds = tmp_path / "one.toml", tmp_path / "seeds.toml"
    first.write_text(text)
    seeds.write_text(text.replace("[model]\n", "[model]\nseeds = [5, 6]\n"))
    db = tmp_path / "r.sqlite"
    for spec in (first, seeds):
        assert main(["run", str(spec), "--db", str(db), "--quiet", "--no-check"]) == 0
    out = tmp_path / "b.md"
    assert main(["leaderboard", str(db), "--out", str(out), "--no-plots"]) == 0
    runs = json.loads(out.with_suffix(".json").read_text())["runs"]
    # the two seeds' runs, not the earlier benchmark's
    assert len(runs) == 2 and all(isinstance(r, dict) for r in runs)
    exported = json.loads(out.with_suffix(".run.json").read_text())["runs"]
    assert sorted(r["run"]["config"]["model"]["seed"] for r in exported) == [5, 6]
    assert main(["leaderboard", "--db", str(db)]) == 0
    assert "2 base models" in capsys.readouterr().out
