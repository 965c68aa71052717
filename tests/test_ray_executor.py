"""The Ray executor on a local Ray cluster (2 CPUs) started here: the same certificates
as the local executor row for row for every built-in method, a worker SIGKILLed during
a shard, and the driver SIGKILLed and resumed."""

import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

from harness.foundation.errors import IdrsError
from harness.foundation.progress import Progress
from harness.running.benchmark import parse_benchmark
from harness.running.local_executor import LocalExecutor
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark

ray = pytest.importorskip("ray", reason='the Ray executor tests need pip install "idrs-bench[ray]"')

from harness.running.ray_executor import RayExecutor  # noqa: E402
from harness.running.ray_worker import import_ray  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

EVERY_METHOD = """
name = "ray-every-method"
seed = 3
shard_size = 3

[dataset]
name = "ball-2"
test_count = 8

[model]
architecture = "ball-N"
trainer = "none"

[certification]
n0 = 32
n = 400
alpha = 0.01
batch_size = 1024

[[methods]]
name = "cohen"
settings = [{ sigma = 0.25 }, { sigma = 0.5 }]

[[methods]]
name = "sukenik"    # the second setting fails when built (k > training points): recorded
settings = [{}, { k = 100000000 }]

[[methods]]
name = "chen-fgss"

[[methods]]
name = "alfarra-ds"
settings = [{ sigma = 0.25, steps = 8, beta = 0.05 }]

[[methods]]
name = "alfarra-ds-memory"
settings = [{ sigma = 0.25, steps = 8, beta = 0.05 }]

[[methods]]
name = "lipschitz-sigma-net"
settings = [{ width = 16, train_examples = 64, train_steps = 20 }]

[[methods]]
name = "dual-rs"
settings = [{ levels = [0.25, 0.5], estimator_sigma = 0.25, train_examples = 64, label_samples = 8, epochs = 2, estimator_params = { width = 8 } }]
"""

SLOW = """
name = "ray-kill"
seed = 4
shard_size = 4

[dataset]
name = "ball-2"
test_count = 12

[model]
architecture = "ball-N"
trainer = "none"

[certification]
n0 = 32
n = 60000
alpha = 0.01
batch_size = 1024

[[methods]]
name = "cohen"
settings = [{ sigma = 0.25 }]

[[methods]]
name = "alfarra-ds-memory"
settings = [{ sigma = 0.25, steps = 8, beta = 0.05 }]
"""

CERTIFICATES = (
    "SELECT method, setting, input_id, shard, label, prediction, predict, radius, p_lower, sigma,"
    " alpha, counts_selection, counts_estimation, evidence FROM certificates"
    " ORDER BY method, setting, input_id"
)
STATE = "SELECT method, setting, seq, record, data FROM state ORDER BY method, setting, seq"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A local Ray cluster for this module, shut down after it (no cluster is left)."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    temp = tmp_path_factory.mktemp("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, _temp_dir=str(temp),
             log_to_driver=False)  # fmt: skip
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def _query(db: Path, sql: str) -> list[tuple]:
    try:
        with sqlite3.connect(db, timeout=5) as con:
            return con.execute(sql).fetchall()
    except sqlite3.OperationalError:
        return []


def _run(text: str, db: Path, executor, progress: Progress | None = None) -> str:
    options = RunOptions(db=db, cache_dir=db.parent / "cache")
    return run_benchmark(parse_spec_text(text), options, progress or Progress(enabled=False),
                         executor=executor)  # fmt: skip


def parse_spec_text(text: str):
    import tomllib

    return parse_benchmark(tomllib.loads(text))


@pytest.fixture(scope="module")
def slow_reference(tmp_path_factory):
    """The SLOW benchmark certified by the local executor."""
    db = tmp_path_factory.mktemp("reference") / "local.sqlite"
    run_id = _run(SLOW, db, LocalExecutor())
    return run_id, _query(db, CERTIFICATES), _query(db, STATE)


@pytest.mark.slow
def test_ray_certificates_equal_local_ones_row_for_row_for_every_method(cluster, tmp_path):
    local_db, ray_db = tmp_path / "local.sqlite", tmp_path / "ray.sqlite"
    local_run = _run(EVERY_METHOD, local_db, LocalExecutor())
    executor, out = RayExecutor(workers=2), StringIO()
    progress = Progress(console=Console(file=out, width=300))
    assert _run(EVERY_METHOD, ray_db, executor, progress) == local_run  # no executor in the id
    rows = _query(local_db, CERTIFICATES)
    methods = {r[0] for r in rows}
    assert methods == {"cohen", "sukenik", "chen-fgss", "alfarra-ds", "alfarra-ds-memory",
                       "lipschitz-sigma-net", "dual-rs"}  # fmt: skip
    assert len(rows) == 8 * 8
    assert _query(ray_db, CERTIFICATES) == rows
    state = _query(local_db, STATE)
    assert len(state) == 8  # the memory certifier: one entry per input, in input order
    assert _query(ray_db, STATE) == state
    assert _query(ray_db, "SELECT COUNT(*) FROM shards") == [(8 * 3,)]
    failures = "SELECT method, setting, error FROM failures"
    assert _query(ray_db, failures) == _query(local_db, failures)
    assert [r[:2] for r in _query(ray_db, failures)] == [("sukenik", "k=100000000")]
    assert "method sukenik (k=100000000) failed: ParameterError: k = 100000000" in out.getvalue()
    assert executor.stats.certificates == 64 and executor.stats.shards == 24
    assert executor.stats.bytes_received > 0 and executor.stats.inserts_per_second > 0


def _ray_worker_pids(title: bytes) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if cmdline.startswith(title):
                pids.append(int(entry))
    return pids


def _kill_a_worker_during_a_shard(db: Path, after: int, killed: list[int]) -> None:
    """SIGKILL the first Ray worker found certifying once ``after`` certificates are
    stored (its shard is then in flight)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not killed:
        count = len(_query(db, "SELECT 1 FROM certificates"))
        pids = _ray_worker_pids(b"ray::CertifyWorker.certify")
        if count >= after and pids:
            os.kill(pids[0], signal.SIGKILL)
            killed.append(pids[0])
        time.sleep(0.01)


@pytest.mark.long
@pytest.mark.slow
def test_driver_killed_then_resumed_with_a_worker_killed_mid_shard_equals_an_uninterrupted_run(
    cluster, tmp_path, slow_reference
):
    """The driver (``idrs-bench run --executor ray --address``) is SIGKILLed after a few
    certificates; the resumed Ray run loses a worker during a shard, which is retried
    on the next free worker; the rows equal the local executor's, none twice."""
    run_id, rows, state = slow_reference
    spec, db = tmp_path / "slow.toml", tmp_path / "ray.sqlite"
    spec.write_text(SLOW)
    command = [sys.executable, "-m", "harness.cli.main", "run", str(spec), "--db", str(db),
               "--cache-dir", str(tmp_path / "cache"), "--executor", "ray",
               "--address", cluster, "--no-check", "--quiet"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "RAY_USAGE_STATS_ENABLED": "0"}  # fmt: skip
    driver = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.monotonic() + 120
    while len(_query(db, "SELECT 1 FROM certificates")) < 2 and driver.poll() is None:
        assert time.monotonic() < deadline, "the Ray driver stored no certificate"
        time.sleep(0.01)
    assert driver.poll() is None, driver.stderr.read().decode()
    driver.kill()
    driver.wait()
    stored = len(_query(db, "SELECT 1 FROM certificates"))
    assert 2 <= stored < len(rows) - 4  # killed part way

    killed: list[int] = []
    killer = threading.Thread(target=_kill_a_worker_during_a_shard, args=(db, stored + 1, killed))
    killer.start()
    out = StringIO()
    executor = RayExecutor(workers=2)
    resumed = _run(SLOW, db, executor, Progress(console=Console(file=out, width=300)))
    killer.join()
    assert resumed == run_id  # resumed on Ray (the local executor resumes it the same way)
    assert killed, "no worker was killed during a shard"
    assert executor.stats.worker_deaths >= 1
    assert "a Ray worker died in method" in out.getvalue() and "shard" in out.getvalue()
    assert _query(db, "SELECT method, setting, error FROM failures") == [], out.getvalue()
    assert _query(db, CERTIFICATES) == rows  # nothing lost, nothing twice, the same values
    assert _query(db, STATE) == state
    assert _query(db, "SELECT COUNT(*) FROM runs WHERE finished IS NOT NULL") == [(1,)]


def test_without_ray_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    # pip of the interpreter running idrs-bench, not whichever comes first on PATH
    install = f'{shlex.quote(sys.executable)} -m pip install "idrs-bench[ray]"'
    with pytest.raises(IdrsError, match=re.escape(install)):
        import_ray()


def test_ray_options_without_the_ray_executor_are_refused(capsys):
    from harness.cli.main import main

    assert main(["run", "--workers", "2"]) == 2
    assert "--executor ray" in capsys.readouterr().err
