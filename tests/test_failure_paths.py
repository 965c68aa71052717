"""First-run and failure paths: errors before torch, --data-root, healing caches,
progress without a terminal, SIGTERM, incomplete runs, memoized σ(x)."""

import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console

from harness.cli.main import main
from harness.foundation.artifacts import load_artifact, save_artifact
from harness.foundation.progress import Progress

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def spec_file(tmp_path, small_benchmark):
    """``spec_file(dataset="cone-4", count=8, epochs=1, n=200, sigma=0.5) -> Path``: the
    benchmark file ``tmp_path / "spec.toml"``, Cohen's method at ``sigma`` on ``count``
    inputs of ``dataset``."""

    def write(dataset="cone-4", count=8, epochs=1, n=200, sigma=0.5) -> Path:
        path = tmp_path / "spec.toml"
        path.write_text(small_benchmark({"cohen": [{"sigma": sigma}]}, name="tiny", seed=1,
                                        shard_size=4, dataset=dataset, test_count=count,
                                        epochs=epochs, n=n, batch_size=256))  # fmt: skip
        return path

    return write


def _imports_torch(argv: list[str], cwd: Path) -> tuple[bool, str]:
    """Run the CLI's main(argv) in a fresh interpreter; was torch, numpy or scipy imported?"""
    code = textwrap.dedent(f"""
        import sys
        from harness.cli.main import main
        try:
            main({argv!r})
        except SystemExit:
            pass
        heavy = [m for m in ("torch", "numpy", "scipy") if m in sys.modules]
        print(f"HEAVY-IMPORTS {{heavy}}")
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             [str(ROOT), os.environ.get("PYTHONPATH", "")])})  # fmt: skip
    return "HEAVY-IMPORTS []" not in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--help"], "usage"),
        (["plugins"], "idrs-bench plugins"),
        (["run", "{dir}/absent.toml"], "not found"),
        (["run", "{spec}", "--db", "{dir}/r.sqlite"], "sigma must be a positive number"),
        (["run", "{method}", "--db", "{dir}/r.sqlite"], "unknown method 'nope'; available:"),
        (["run", "{keys}", "--db", "{dir}/r.sqlite"], "unknown parameter(s) ['k0']"),
        (["run", "{alpha}", "--db", "{dir}/r.sqlite"], "alpha must lie in (0, 1)"),
        (["run", "{n0}", "--db", "{dir}/r.sqlite"], "n0 (50) must not exceed n (20)"),
        (["run", "{steps}", "--db", "{dir}/r.sqlite"], "steps (K) must be an integer >= 0"),
        (["run", "{good}", "--data-root", "{dir}/no/such"], "--data-root"),
    ],
)
def test_help_plugins_and_spec_errors_do_not_import_torch(tmp_path, spec_file, argv, message):
    bad = spec_file(sigma=0.0)
    variants = {"spec": bad}
    for name, text in (
        ("method", bad.read_text().replace('name = "cohen"', 'name = "nope"')),
        ("keys", bad.read_text().replace("{ sigma = 0.0 }", "{ sigma = 0.5, k0 = 1 }")),
        ("alpha", bad.read_text().replace("sigma = 0.0", "sigma = 0.5").replace("0.01", "1.5")),
        ("n0", bad.read_text().replace("sigma = 0.0", "sigma = 0.5").replace("n = 200", "n = 20")
         .replace("n0 = 20", "n0 = 50")),
        ("good", bad.read_text().replace("sigma = 0.0", "sigma = 0.5")),
        ("steps", bad.read_text().replace('"cohen"', '"alfarra-ds"')
         .replace("sigma = 0.0", "sigma = 0.5, steps = -1")),
    ):  # fmt: skip
        path = tmp_path / f"{name}.toml"
        path.write_text(text)
        variants[name] = path
    argv = [a.format(dir=tmp_path, **variants) for a in argv]
    imported, output = _imports_torch(argv, tmp_path)
    assert message in output
    assert not imported, output


def test_data_root_that_does_not_exist_or_lacks_the_files(tmp_path, spec_file, capsys):
    spec = spec_file(dataset="fashion-mnist")
    db = str(tmp_path / "r.sqlite")
    assert main(["run", str(spec), "--db", db, "--data-root", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert "nope" in err and "is not a folder" in err and len(err.splitlines()) == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    # an explicit root is never replaced by /usr/share/datasets
    assert main(["run", str(spec), "--db", db, "--data-root", str(empty), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert str(empty) in err and "t10k-images-idx3-ubyte" in err and "/usr/share" not in err
    # a generated dataset reads no files: --data-root would be ignored, so it is refused
    cone = spec_file()
    assert main(["run", str(cone), "--db", db, "--data-root", str(empty), "--quiet"]) == 2
    assert "reads no files" in capsys.readouterr().err


def test_data_files_are_recorded_with_their_digests(tmp_path, spec_file, capsys):
    import hashlib

    from plugins.datasets.fashion_mnist import DEBIAN_LOCATION, FILES

    if not DEBIAN_LOCATION.is_dir():
        pytest.skip("Fashion-MNIST is not installed")
    root = tmp_path / "fm"
    root.mkdir()
    for stem in FILES.values():
        source = next(DEBIAN_LOCATION.glob(stem + "*"))
        (root / source.name).symlink_to(source)
    spec = spec_file(dataset="fashion-mnist", count=2, epochs=0, n=20)
    db = tmp_path / "r.sqlite"
    args = ["run", str(spec), "--db", str(db), "--data-root", str(root), "--quiet", "--no-check"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(["results", "--db", str(db), "--json"]) == 0
    files = json.loads(capsys.readouterr().out)["data_files"]
    assert len(files) == 4
    for path, digest in files.items():
        assert Path(path).parent == root.resolve() or Path(path).resolve().parent == DEBIAN_LOCATION
        assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == digest


def _warnings(progress_output: io.StringIO) -> list[str]:
    return [line for line in progress_output.getvalue().splitlines() if "warning" in line]


def test_a_damaged_cache_file_is_named_moved_aside_and_rebuilt(tmp_path):
    out = io.StringIO()
    progress = Progress(enabled=False, console=Console(file=out, width=300))
    path = tmp_path / "a.pt"
    state = {"w": torch.arange(1000.0)}
    save_artifact(path, state)
    assert torch.equal(load_artifact(path, progress)["w"], state["w"])
    # truncated: the digest no longer matches
    path.write_bytes(path.read_bytes()[:100])
    assert load_artifact(path, progress, "cached base model") is None
    assert not path.exists()
    aside = list(tmp_path.glob("a.pt.corrupt-*"))
    assert len(aside) == 1
    (line,) = _warnings(out)
    assert str(path) in line and aside[0].name in line and "SHA-256" in line
    # no digest beside it (an older cache) and not loadable: also moved aside
    path.write_bytes(b"not a zip archive")
    assert load_artifact(path, progress) is None and not path.exists()


def test_a_truncated_cached_model_is_retrained_by_the_cli(tmp_path, spec_file, monkeypatch, capsys):
    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path / "cache"))
    spec = spec_file()
    db = tmp_path / "r.sqlite"
    args = ["run", str(spec), "--db", str(db), "--quiet", "--no-check"]
    assert main(args) == 0
    (model,) = (tmp_path / "cache" / "models").glob("*.pt")
    reference = torch.load(model, weights_only=True)
    model.write_bytes(model.read_bytes()[:-50])
    capsys.readouterr()
    assert (
        main(["run", str(spec), "--db", str(tmp_path / "r2.sqlite"), "--quiet", "--no-check"]) == 0
    )
    err = capsys.readouterr().err
    assert "cached base model" in err and str(model) in err and "corrupt-" in err
    healed = torch.load(model, weights_only=True)
    assert all(torch.equal(healed[k], reference[k]) for k in reference)  # retrained identically


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_without_a_terminal_prints_lines_with_rate_and_eta():
    out = io.StringIO()
    clock = _Clock()
    progress = Progress(console=Console(file=out, width=300), interval=30.0, clock=clock)
    with progress.task("cohen sigma=0.25", total=100, unit="inputs") as advance:
        for _ in range(10):
            clock.now += 10.0
            advance(5)
    lines = out.getvalue().splitlines()
    assert lines[0] == "cohen sigma=0.25: started, 100 inputs"
    assert lines[-1].startswith("cohen sigma=0.25: finished, 50/100 inputs")
    middle = lines[1:-1]
    assert len(middle) == 3  # every 30 s of the 100 s
    assert middle[0] == ("cohen sigma=0.25: 15/100 inputs, 0.50 inputs/s, elapsed 30 s, ETA 170 s")
    assert progress.timings == [("cohen sigma=0.25", 100.0)]


def test_progress_heartbeat_reports_while_nothing_advances():
    out = io.StringIO()
    progress = Progress(console=Console(file=out, width=300), interval=0.05)
    with progress.task("checks", total=2, unit="checks"):
        time.sleep(0.4)
    beats = [line for line in out.getvalue().splitlines() if "0/2 checks" in line]
    assert len(beats) >= 3


@pytest.mark.slow
def test_sigterm_is_reported_like_sigint_and_the_run_resumes(
    tmp_path, spec_file, stored_certificates
):
    """On the CPU, where 48 inputs at n = 60,000 take seconds (a GPU certifies them all
    between two polls of the database, before the signal)."""
    spec = spec_file(count=48, n=60000)
    db = tmp_path / "r.sqlite"
    command = [sys.executable, "-m", "harness.cli.main", "run", str(spec), "--db", str(db), "--quiet",
               "--no-check", "--device", "cpu"]  # fmt: skip
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    deadline = time.time() + 120
    while stored_certificates(db) < 4 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert err.strip() == "interrupted; `idrs-bench run` again resumes where it stopped"
    stopped = stored_certificates(db)
    assert 4 <= stopped < 48
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and stored_certificates(db) == 48


def test_incomplete_runs_are_marked_and_not_ranked(tmp_path, spec_file, capsys):
    spec = spec_file(count=8)
    db = tmp_path / "r.sqlite"
    assert main(["run", str(spec), "--db", str(db), "--quiet", "--no-check"]) == 0
    with sqlite3.connect(db) as con:  # as if killed: 5 of 8 inputs, run not finished
        con.execute("DELETE FROM certificates WHERE input_id >= 5")
        con.execute("UPDATE runs SET finished = NULL")
    capsys.readouterr()
    assert main(["results", "--db", str(db), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["complete"] is False
    assert out["settings"] == [{"method": "cohen", "setting": "sigma=0.5", "inputs": 5,
                                "expected": 8, "complete": False}]  # fmt: skip
    assert out["methods"][0]["verdict"].startswith("incomplete (5 of 8)")
    assert main(["results", "--db", str(db)]) == 0
    assert "is incomplete: cohen sigma=0.5 5 of 8 inputs" in capsys.readouterr().out
    assert main(["leaderboard", "--db", str(db)]) == 2
    assert "--allow-incomplete" in capsys.readouterr().err
    assert main(["leaderboard", "--db", str(db), "--allow-incomplete"]) == 0
    assert "incomplete (5 of 8 inputs)" in capsys.readouterr().out


def test_sigma_cache_returns_exactly_a_fresh_computation():
    from harness.foundation.sigmacache import SigmaCache

    calls = []

    def compute(x):
        calls.append(len(x))
        return x.flatten(1).sum(1).double()

    cache = SigmaCache(max_entries=4)
    x = torch.rand(5, 3)
    first = cache.get(x[:3], compute)
    again = cache.get(x, compute)
    assert calls == [3, 2] and torch.equal(again[:3], first)
    assert torch.equal(again, x.sum(1).double()) and len(cache) == 4
    repeated = torch.cat([x[4:], x[4:], torch.ones(1, 3), x[4:]])
    assert torch.equal(cache.get(repeated, compute), repeated.sum(1).double())
    assert calls == [3, 2, 1]  # x[4] is cached, the new input computed once


def test_a_run_resumed_on_other_data_files_is_refused(tmp_path):
    from harness.foundation.errors import IdrsError
    from harness.store.store import ResultStore

    store = ResultStore(tmp_path / "r.sqlite")
    store.begin_run("abc", "n", {}, {}, None, "cpu", 0, "m")
    store.set_run_data("abc", 10, {"/d/a": "11"})
    store.set_run_data("abc", 10, {"/d/a": "11"})  # the same files: resumes
    with pytest.raises(IdrsError, match="other data files"):
        store.set_run_data("abc", 10, {"/d/a": "22"})
    assert store.run("abc")["data_files"] == {"/d/a": "11"} and store.run("abc")["inputs"] == 10
    store.close()
