"""Several `idrs-bench run` processes on one benchmark and database share its shards
(leases in the database, harness/store/leases.py), and their result equals one process's
bit for bit: two at once, then two with one SIGKILLed in the middle of a shard, whose
shard the other takes over once its lease expires."""

import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PLUGIN = '''
"""Cohen's certifier at a constant σ, sleeping $SLOW_WORK_DELAY seconds per input it
claims, so that two processes overlap and one can be killed in the middle of a shard."""

import os
import time

from harness import CertifierSpec, Constant, MethodSpec, SigmaProviderSpec, hookimpl


class Constant_:
    def __init__(self, sigma):
        self.sigma, self.regularity = sigma, Constant(sigma)

    def __call__(self, x):
        return x.new_full((len(x),), self.sigma)


class Slow:
    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def certify(self, evidence):
        time.sleep(float(os.environ.get("SLOW_WORK_DELAY", 0)) * len(evidence.input_ids))
        return self._inner.certify(evidence)


def _slow(context, params, provider):
    return Slow(context.registry.get("certifiers", "cohen").build(context, params, provider))


@hookimpl
def idrs_register_sigma_providers(register):
    register(SigmaProviderSpec("slow-constant", lambda context, p: Constant_(p["sigma"])))


@hookimpl
def idrs_register_certifiers(register):
    register(CertifierSpec("slow-cohen", _slow))


@hookimpl
def idrs_register_methods(register):
    register(MethodSpec("slow-cohen", "slow-constant", "slow-cohen", {"sigma": 0.5}))
'''

SPEC = """
name = "shared"
seed = 5
shard_size = 16  # two chunks of claims (harness.certification.certify.CLAIM_CHUNK = 8) per shard

[dataset]
name = "cone-2"
test_count = 32

[model]
architecture = "mlp"
trainer = "gaussian-augmentation"
architecture_params = { width = 16 }
trainer_params = { sigma = 0.5, epochs = 1 }

[certification]
n0 = 20
n = 500
alpha = 0.01
batch_size = 512

[[methods]]
name = "slow-cohen"
settings = [{ sigma = 0.5 }]

[[methods]]
name = "alfarra-ds-memory"
settings = [{ sigma = 0.5, steps = 8, beta = 0.05 }]
"""

CERTIFICATES = (
    "SELECT method, setting, input_id, shard, label, prediction, predict, radius, p_lower, sigma,"
    " counts_selection, counts_estimation, evidence, draws FROM certificates"
    " ORDER BY method, setting, input_id"
)
STATE = "SELECT method, setting, seq, record, data FROM state ORDER BY method, setting, seq"
LEASE_SECONDS = 2


def _query(db: Path, sql: str, args: tuple = ()) -> list[tuple]:
    try:
        with sqlite3.connect(db, timeout=5) as con:
            return con.execute(sql, args).fetchall()
    except sqlite3.OperationalError:
        return []


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The spec, the environment of a process (the plugin installed as a distribution
    with an entry point, a short lease) and a reference database certified by one
    process alone."""
    root = tmp_path_factory.mktemp("concurrent")
    site = root / "site"
    (site / "slow_work-0.1.dist-info").mkdir(parents=True)
    (site / "slow_work.py").write_text(PLUGIN)
    (site / "slow_work-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: slow-work\nVersion: 0.1\n"
    )
    (site / "slow_work-0.1.dist-info" / "entry_points.txt").write_text(
        "[idrs_bench]\nslow-work = slow_work\n"
    )
    spec = root / "shared.toml"
    spec.write_text(SPEC)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(site), os.environ.get("PYTHONPATH", "")]),
        "IDRS_BENCH_CACHE": str(root / "cache"),
        "IDRS_BENCH_LEASE_SECONDS": str(LEASE_SECONDS),
    }
    env.pop("IDRS_BENCH_PLUGINS", None)
    reference = root / "reference.sqlite"
    done = subprocess.run(_command(spec, reference, "--no-check"), cwd=ROOT, env=env,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(_query(reference, CERTIFICATES)) == 64
    return spec, env, reference


def _command(spec: Path, db: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "harness.cli.main", "run", str(spec), "--db", str(db), *extra]


def _start(setup, db: Path, log: Path, delay: float, *extra: str) -> subprocess.Popen:
    """`idrs-bench run` in the background, its plugin sleeping ``delay`` s per input."""
    spec, env, _ = setup
    return subprocess.Popen(_command(spec, db, *extra), cwd=ROOT,
                            env={**env, "SLOW_WORK_DELAY": str(delay)},
                            stdout=subprocess.DEVNULL, stderr=log.open("w"))  # fmt: skip


def _wait_for(condition, proc: subprocess.Popen, log: Path, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
        time.sleep(0.01)


def _leases_of(db: Path, proc: subprocess.Popen) -> list[tuple]:
    return _query(db, "SELECT method, shard FROM leases WHERE owner LIKE ?", (f"%:{proc.pid}:%",))


def _certified(text: str) -> int:
    """Inputs a process certified, from its progress lines (`...: finished, 16/32 inputs`)."""
    return sum(int(m) for m in re.findall(r": finished, (\d+)/\d+ inputs", text))


def _same_as_reference(db: Path, reference: Path) -> None:
    assert _query(db, CERTIFICATES) == _query(reference, CERTIFICATES)
    assert len(_query(reference, STATE)) == 32  # the memory's records, one per input
    assert _query(db, STATE) == _query(reference, STATE)
    assert _query(db, "SELECT * FROM leases") == []
    assert len(_query(db, "SELECT 1 FROM runs WHERE finished IS NOT NULL")) == 1


def test_two_processes_share_the_shards_and_equal_one_process(setup, tmp_path):
    db = tmp_path / "shared.sqlite"
    logs = [tmp_path / "a.err", tmp_path / "b.err"]
    first = _start(setup, db, logs[0], 0.25, "--no-check")
    _wait_for(lambda: _leases_of(db, first), first, logs[0])  # it works: start the second
    second = _start(setup, db, logs[1], 0.25, "--no-check")
    procs = [first, second]
    for proc, log in zip(procs, logs, strict=True):
        assert proc.wait(timeout=300) == 0, log.read_text()
    _same_as_reference(db, setup[2])
    texts = [log.read_text() for log in logs]
    for text, other in zip(texts, reversed(procs), strict=True):
        assert f":{other.pid} is working on this run in {db} too" in text, text
    # each process certified part of the inputs, and no input was certified twice
    done = [_certified(text) for text in texts]
    assert all(n > 0 for n in done) and sum(done) == 2 * 32, (done, texts)


HOLD = """
import sys, time
from harness.store.leases import exclusive
with exclusive(sys.argv[1], "run", "the work", lambda line: print(line, flush=True)) as ours:
    print("ours" if ours else "done by another", flush=True)
    if ours:
        time.sleep(float(sys.argv[2]))
"""


def test_one_process_runs_the_checks_the_others_wait_or_take_over(setup, tmp_path):
    """`exclusive`, which `run` puts around the checks: a second process waits while the
    first works and does not repeat the work; if the first dies, it takes over."""
    _, env, _ = setup
    db = tmp_path / "checks.sqlite"

    def start(seconds: float) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", HOLD, str(db), str(seconds)], cwd=ROOT,
                                env=env, stdout=subprocess.PIPE, text=True)  # fmt: skip

    first = start(3)
    assert first.stdout.readline().strip() == "ours"
    second = start(0)
    out, _ = second.communicate(timeout=60)
    assert "waiting for process" in out and "which runs the work" in out, out
    assert out.strip().endswith("done by another"), out
    assert first.wait(timeout=60) == 0

    first = start(60)
    assert first.stdout.readline().strip() == "ours"
    first.kill()  # dies holding the lease: the next process takes over once it expires
    first.wait()
    out, _ = start(0).communicate(timeout=60)
    assert f"process {os.uname().nodename}:{first.pid} stopped during the work" in out, out
    assert out.strip().endswith("ours"), out


def test_a_process_killed_mid_shard_leaves_its_shard_to_the_other(setup, tmp_path):
    db = tmp_path / "shared.sqlite"
    a_log, b_log = tmp_path / "a.err", tmp_path / "b.err"
    a = _start(setup, db, a_log, 1.0, "--no-check")  # a claim a second: stopped mid-shard

    def a_mid_shard() -> int | None:
        """A Cohen shard A holds, of which some inputs are stored but not all."""
        for method, shard in _leases_of(db, a):
            stored = _query(db, "SELECT COUNT(*) FROM certificates WHERE method = ? AND shard = ?",
                            (method, shard))[0][0]  # fmt: skip
            if method == "slow-cohen" and 0 < stored < 16:
                return shard
        return None

    _wait_for(lambda: a_mid_shard() is not None, a, a_log)
    b = _start(setup, db, b_log, 0.0, "--no-check")
    _wait_for(lambda: f":{a.pid} is working on this run" in b_log.read_text(), b, b_log)
    shard = a_mid_shard()
    assert shard is not None, a_log.read_text()
    a.kill()  # SIGKILL: its lease is left to expire
    a.wait()
    assert b.wait(timeout=300) == 0, b_log.read_text()
    text = b_log.read_text()
    assert f"taking over shard {shard} from process" in text, text
    assert f":{a.pid}, whose lease expired" in text, text
    _same_as_reference(db, setup[2])
