"""The shipped benchmark files, and a real (tiny) run rendered into a board and verified."""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path

import pytest

from harness.foundation.progress import Progress
from harness.reports.leaderboard.cli import add_leaderboard_parser
from harness.running.benchmark import BENCHMARKS_DIR, load_benchmark, parse_benchmark, validate
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark

SHIPPED = ["fashion-mnist", "cone-2", "cone-60", "cone-400", "hidden-cost"]
COMPANIONS = {"anisotropic": ("quick", ["model.seeds=[0, 1, 2]"]),
              "anisotropic-centred": ("quick", ["model.seeds=[0, 1, 2]"]),
              "fashion-mnist-anisotropic": ("fashion-mnist", []),
              "fashion-mnist-anisotropic-centred": ("fashion-mnist", []),
              "fashion-mnist-sequential-anisotropic": ("fashion-mnist-sequential", []),
              "fashion-mnist-sequential-anisotropic-centred": ("fashion-mnist-sequential", [])}  # fmt: skip
"""Benchmarks published on their partner's board: their runs certify the partner's base
models, whose cohen rows are their reference (leaderboards/README.md)."""


@pytest.mark.parametrize("name", SHIPPED + list(COMPANIONS))
def test_shipped_benchmark_parses_and_validates(name, manager):
    spec = load_benchmark(BENCHMARKS_DIR / f"{name}.toml")
    validate(spec, manager.registry)
    assert spec.name == name
    methods = {m.name: m.settings for m in spec.methods}
    assert ("cohen" in methods) is (name not in COMPANIONS)


@pytest.mark.parametrize("name", list(COMPANIONS))
def test_a_companion_certifies_its_partners_models_under_its_protocol(name):
    from harness.running.model_variants import model_variants

    partner_name, overrides = COMPANIONS[name]
    spec = load_benchmark(BENCHMARKS_DIR / f"{name}.toml")
    partner = load_benchmark(BENCHMARKS_DIR / f"{partner_name}.toml", overrides)
    assert (spec.dataset, spec.protocol, spec.seed) == (
        partner.dataset, partner.protocol, partner.seed)  # fmt: skip
    models = [variant.model for variant in model_variants(spec)]
    assert models and all(m in [v.model for v in model_variants(partner)] for m in models)
    rows = {(m.name, str(s)) for m in spec.methods for s in m.settings}
    assert not rows & {(m.name, str(s)) for m in partner.methods for s in m.settings}


def test_benchmark_parameters_follow_the_issue_and_the_papers():
    fmnist = load_benchmark(BENCHMARKS_DIR / "fashion-mnist.toml")
    assert (fmnist.dataset.test_every, fmnist.dataset.test_count) == (20, 500)
    assert (fmnist.protocol.n, fmnist.protocol.alpha) == (100_000, 0.001)
    assert [s["sigma"] for s in fmnist.methods[0].settings] == [0.12, 0.25, 0.5]
    hidden = load_benchmark(BENCHMARKS_DIR / "hidden-cost.toml")
    sigmas = [s["sigma"] for s in hidden.methods[0].settings]
    assert (min(sigmas), max(sigmas), hidden.dataset.name) == (0.12, 2.0, "gauss-mix")
    # Súkeník App. A.5: the constant σ of each dimension
    for n, sigma in ((2, 0.5), (60, 1.0), (400, 2.0)):
        cone = load_benchmark(BENCHMARKS_DIR / f"cone-{n}.toml")
        assert cone.dataset.name == f"cone-{n}" and cone.methods[0].settings == [{"sigma": sigma}]


def _cli(argv):
    parser = argparse.ArgumentParser()
    add_leaderboard_parser(parser.add_subparsers())
    args = parser.parse_args(["leaderboard", *argv])
    return args.handler(args)


def test_a_tiny_hidden_cost_run_renders_and_verifies(tmp_path, manager, capsys):
    raw = tomllib.loads((BENCHMARKS_DIR / "hidden-cost.toml").read_text())
    raw["dataset"]["test_count"] = 8
    raw["certification"].update(n0=20, n=200, batch_size=200)
    raw["model"]["trainer_params"].update(epochs=1)
    raw["methods"][0]["settings"] = [{"sigma": 0.25}, {"sigma": 2.0}]
    db = tmp_path / "r.sqlite"
    run_id = run_benchmark(
        parse_benchmark(raw), RunOptions(db=db), Progress(enabled=False), manager
    )
    out = tmp_path / "leaderboards" / "hidden-cost.md"
    assert _cli([run_id[:10], "--db", str(db), "--out", str(out)]) == 0
    assert _cli(["--verify", str(out)]) == 0
    assert _cli(["--verify", str(out), "--db", str(db)]) == 0
    data = json.loads((out.parent / "hidden-cost.json").read_text())
    assert {r["setting"] for r in data["rows"]} == {"sigma=0.25", "sigma=2.0"}
    assert all(r["inputs"] == 8 for r in data["rows"])
    assert data["runs"][0]["run_id"] == run_id
    text = out.read_text()
    assert "## 1. gauss-mix · mlp" in text and "not checked" in text
    capsys.readouterr()


PUBLISHED = sorted(
    p for p in (Path(__file__).parent.parent / "leaderboards").glob("*.md") if p.name != "README.md"
)


@pytest.mark.slow
@pytest.mark.published
@pytest.mark.skipif(not PUBLISHED, reason="no published board yet")
@pytest.mark.parametrize("board", PUBLISHED, ids=lambda p: p.name)
def test_published_boards_verify_and_replay(board, capsys):
    """``idrs-bench leaderboard --verify BOARD --replay 2`` on every committed board, as a
    reviewer types it (from its run export, which must be of the current format: one
    without the evidence cannot be re-checked; records made before a key was declared are
    read by what they mean), its replay on the CPU it was made on."""
    from harness.reports.leaderboard.source import EXPORT_FORMAT, export_format

    assert export_format(board.with_suffix(".run.json")) == EXPORT_FORMAT, "re-publish it"
    if not Path("/usr/share/datasets/fashion-mnist").is_dir():
        pytest.skip("the boards' replays need Fashion-MNIST: apt-get install dataset-fashion-mnist")
    code = _cli(["--verify", str(board), "--replay", "2", "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert f"{board}: verified" in out and f"{board}: replayed" in out, out[-3000:]


@pytest.mark.parametrize("export", sorted((BENCHMARKS_DIR.parents[1] / "leaderboards").glob("*.run.json")),
                         ids=lambda p: p.name)  # fmt: skip
def test_every_published_runs_spec_file_runs_the_spec_it_ran(export):
    """The spec a board ships beside each run parses to the run's own benchmark (a
    sequential run's rule named, its grid left to the radii)."""
    from harness.reports.leaderboard.reproduce import spec_toml
    from harness.reports.leaderboard.source import read_export
    from harness.running.benchmark import benchmark_from_dict

    for run in read_export(export):
        if run.imported:
            continue
        parsed = parse_benchmark(tomllib.loads(spec_toml(run.run["config"])))
        assert parsed.to_dict() == benchmark_from_dict(run.run["config"]).to_dict()
