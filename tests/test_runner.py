"""The runner: resumable runs, a failing method, the default benchmark, results."""

import json
import signal
import sqlite3
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.foundation.identity import setting_key
from harness.foundation.progress import Progress
from harness.running.benchmark import DEFAULT_BENCHMARK, parse_benchmark
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark


def _tiny(small_benchmark, n: int, batch_size: int = 512) -> str:
    """The benchmark of these tests: Cohen's method at two σ on 48 inputs of cone-10."""
    return small_benchmark({"cohen": [{"sigma": 0.5}, {"sigma": 1.0}]}, name="tiny", seed=3,
                           shard_size=8, dataset="cone-10", test_count=48, width=32, epochs=2,
                           n0=50, n=n, alpha=0.001, batch_size=batch_size)  # fmt: skip


COMPARED = "method, setting, input_id, shard, label, prediction, predict, radius, p_lower, sigma, counts_selection, counts_estimation"


def _rows(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as con:
        return con.execute(
            f"SELECT {COMPARED} FROM certificates ORDER BY method, setting, input_id"
        ).fetchall()


@pytest.mark.long
@pytest.mark.slow
def test_interrupted_run_resumes_without_loss_or_duplicates(
    tmp_path, stored_certificates, small_benchmark
):
    spec = tmp_path / "tiny.toml"
    # long enough to be killed mid-way under load: each shard alone in its engine calls
    # (batch 400 = one shard's 8 × n0 = 50 selection samples) and stored on its own
    spec.write_text(_tiny(small_benchmark, n=150000, batch_size=400))
    command = [sys.executable, "-m", "harness.cli.main", "run", str(spec), "--quiet", "--no-check"]
    # the uninterrupted reference (it also trains and caches the shared base model)
    subprocess.run(
        [*command, "--db", str(tmp_path / "ref.sqlite")], check=True, capture_output=True
    )
    reference = _rows(tmp_path / "ref.sqlite")
    assert len(reference) == 2 * 48

    db = tmp_path / "killed.sqlite"
    proc = subprocess.Popen(
        [*command, "--db", str(db)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 120
    while stored_certificates(db) < 8 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    at_kill = stored_certificates(db)
    assert 8 <= at_kill < len(reference), "the run was not interrupted mid-way"

    subprocess.run([*command, "--db", str(db)], check=True, capture_output=True)
    resumed = _rows(db)
    assert len(resumed) == len(set((r[0], r[1], r[2]) for r in resumed)) == len(reference)
    assert resumed == reference
    # a third invocation finds nothing to do and adds nothing
    subprocess.run([*command, "--db", str(db)], check=True, capture_output=True)
    assert _rows(db) == reference
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 1


def test_a_failing_method_is_reported_and_the_rest_goes_on(
    tmp_path, manager, capsys, small_benchmark
):
    import types

    from harness import hookimpl
    from harness.mathematics.radius import COHEN
    from harness.plugin.components import CertifierSpec, MethodSpec

    plugin = types.ModuleType("failing")

    class Failing:
        smoothing, order_dependent = "hard", False
        radius_formula = COHEN

        def certify(self, evidence):
            raise RuntimeError("certifier exploded")

    @hookimpl
    def idrs_register_certifiers(register):
        register(CertifierSpec("failing", lambda context, params, sigma_provider: Failing()))

    @hookimpl
    def idrs_register_methods(register):
        register(MethodSpec("failing", "constant", "failing", {"sigma": 0.5}))

    plugin.idrs_register_certifiers = idrs_register_certifiers
    plugin.idrs_register_methods = idrs_register_methods
    manager.register(plugin, name="failing")
    raw = tomllib.loads(_tiny(small_benchmark, n=200))
    raw["methods"].insert(0, {"name": "failing"})
    db = tmp_path / "r.sqlite"
    run_id = run_benchmark(
        parse_benchmark(raw), RunOptions(db=db), Progress(enabled=False), manager
    )
    assert main(["results", run_id[:8], "--db", str(db), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [m["method"] for m in out["methods"]] == ["cohen", "cohen"]
    assert out["failures"][0]["method"] == "failing"
    assert "certifier exploded" in out["failures"][0]["error"]


@pytest.mark.long
@pytest.mark.slow
def test_default_benchmark_smoke_on_a_tiny_subset(tmp_path, capsys):
    raw = tomllib.loads(DEFAULT_BENCHMARK.read_text())
    raw["dataset"]["test_count"] = 4
    raw["certification"].update(n0=20, n=200)
    raw["model"]["trainer_params"]["epochs"] = 1
    small = {"lipschitz-sigma-net": {"train_examples": 64, "train_steps": 5},
             "dual-rs": {"train_examples": 64, "label_samples": 4, "epochs": 1}}  # fmt: skip
    for method in raw["methods"]:
        method["settings"] = [{**s, **small.get(method["name"], {})} for s in method["settings"]]
    spec = tmp_path / "quick-tiny.toml"
    import tomli_w

    spec.write_text(tomli_w.dumps(raw))
    db = tmp_path / "q.sqlite"
    # the checks are exercised in tests/test_soundness_expected.py with a tiny budget
    assert main(["run", str(spec), "--db", str(db), "--quiet", "--no-check"]) == 0
    table = capsys.readouterr().out
    assert "sigma=0.12" in table and "sigma=0.5" in table and "cert@0.5" in table
    # piped, `run` fits 100 columns (but for the lines it ends with, which name the
    # database by its path), names every method in full and ends with what to type next
    assert max(map(len, table.splitlines()[:-3])) <= 100, table
    first_words = {line.split()[0] for line in table.splitlines() if line.strip()}
    assert {
        "lipschitz-sigma-net",
        "alfarra-ds-memory",
        "chen-fgss",
        "sukenik",
        "dual-rs",
    } <= first_words
    # a base model per σ_b (0.12, 0.25, 0.5): three runs, in order of training σ
    with sqlite3.connect(db) as con:
        run_ids = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY created, rowid")]
    *_, summary, results, board = table.strip().splitlines()
    settings = sum(len(m["settings"]) for m in raw["methods"])
    assert settings == 11 and summary == f"results: {db}, 3 runs (a model each): 11 not checked"
    assert results.split() == ["next:", "idrs-bench", "results", "RUN", "--db", str(db),
                               "(each", "of", "the", "runs)", "(every", "metric", "and", "check)"]  # fmt: skip
    assert board.split() == ["idrs-bench", "leaderboard", *[r[:12] for r in run_ids], "--db",
                             str(db), "--out",
                             str(tmp_path / "boards" / f"quick-{run_ids[0][:12]}.md")]  # fmt: skip
    rows = {}
    for run_id in run_ids:
        assert main(["results", run_id, "--db", str(db), "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert not out["failures"]
        rows |= {(m["method"], m["setting"]): m for m in out["methods"]}
    expected = {(m["name"], setting_key(s)) for m in raw["methods"] for s in m["settings"]}
    assert set(rows) == expected
    from scipy.stats import norm

    for (method, setting), row in rows.items():
        assert row["inputs"] == 4
        assert 0 <= row["certified_accuracy"]["0"] <= 1
        if method == "cohen":
            assert row["mean_sigma"] == pytest.approx(float(setting.split("=")[1]))
            # with n = 200 at alpha = 0.001, p_A_lower <= 0.001^(1/200): no radius can be larger
        assert row["acr"] <= row["mean_sigma"] * norm.ppf(0.001 ** (1 / 200)) + 1e-12
