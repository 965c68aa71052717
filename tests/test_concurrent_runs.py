"""Several `idrs-bench run` processes on one benchmark and database share its shards
(leases in the database, harness/leases.py), and their result equals one process's
bit for bit: two at once, then two with one SIGKILLed in the middle of a shard, whose
shard the other takes over once its lease expires."""

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PLUGIN = '''
"""Cohen's certifier at a constant σ, sleeping `delay` seconds per input it claims, so
that two processes overlap and one can be killed in the middle of a shard."""

import time

from harness import CertifierSpec, Constant, MethodSpec, SigmaProviderSpec, hookimpl


class Constant_:
    def __init__(self, sigma):
        self.sigma, self.regularity = sigma, Constant(sigma)

    def __call__(self, x):
        return x.new_full((len(x),), self.sigma)


class Slow:
    def __init__(self, inner, delay):
        self._inner, self._delay = inner, delay

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def certify(self, evidence):
        time.sleep(self._delay * len(evidence.input_ids))
        return self._inner.certify(evidence)


def _slow(context, params, provider):
    cohen = context.registry.get("certifiers", "cohen").build(context, params, provider)
    return Slow(cohen, params["delay"])


@hookimpl
def idrs_register_sigma_providers(register):
    register(SigmaProviderSpec("slow-constant", lambda context, p: Constant_(p["sigma"])))


@hookimpl
def idrs_register_certifiers(register):
    register(CertifierSpec("slow-cohen", _slow))


@hookimpl
def idrs_register_methods(register):
    register(MethodSpec("slow-cohen", "slow-constant", "slow-cohen", {"sigma": 0.5, "delay": 0.0}))
'''

SPEC = """
name = "shared"
seed = 5
shard_size = 16  # two chunks of claims (harness.certify.CLAIM_CHUNK = 8) per shard

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
settings = [{ sigma = 0.5, delay = 0.05 }]

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
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)]),
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
    return [sys.executable, "-m", "harness.cli", "run", str(spec), "--db", str(db), *extra]


def _start(setup, db: Path, log: Path, *extra: str) -> subprocess.Popen:
    spec, env, _ = setup
    return subprocess.Popen(_command(spec, db, *extra), cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=log.open("w"))  # fmt: skip


def _same_as_reference(db: Path, reference: Path) -> None:
    assert _query(db, CERTIFICATES) == _query(reference, CERTIFICATES)
    assert len(_query(reference, STATE)) == 32  # the memory's records, one per input
    assert _query(db, STATE) == _query(reference, STATE)
    assert _query(db, "SELECT * FROM leases") == []
    assert len(_query(db, "SELECT 1 FROM runs WHERE finished IS NOT NULL")) == 1


def test_two_processes_share_the_shards_and_equal_one_process(setup, tmp_path):
    db = tmp_path / "shared.sqlite"
    logs = [tmp_path / "a.err", tmp_path / "b.err"]
    procs = [_start(setup, db, log, "--no-check") for log in logs]
    for proc, log in zip(procs, logs, strict=True):
        assert proc.wait(timeout=300) == 0, log.read_text()
    _same_as_reference(db, setup[2])
    texts = [log.read_text() for log in logs]
    for text, other in zip(texts, reversed(procs), strict=True):
        assert f":{other.pid} is working on this run in {db} too" in text, text
    # each process certified part of the Cohen shards, neither all of them
    done = [int(t.split("slow-cohen delay=0.05,sigma=0.5: finished, ")[1].split("/")[0])
            for t in texts]  # fmt: skip
    assert all(0 < n < 32 for n in done), texts


HOLD = """
import sys, time
from harness.leases import exclusive
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
    a = _start(setup, db, a_log, "--no-check")
    b = _start(setup, db, b_log, "--no-check")
    deadline = time.monotonic() + 120
    shard = None
    while shard is None:  # A holds a Cohen shard of which some inputs are stored
        assert time.monotonic() < deadline and a.poll() is None, a_log.read_text()
        held = _query(db, "SELECT shard FROM leases WHERE method = 'slow-cohen' AND owner LIKE ?",
                      (f"%:{a.pid}:%",))  # fmt: skip
        for (k,) in held:
            stored = _query(db, "SELECT COUNT(*) FROM certificates WHERE method = 'slow-cohen'"
                            " AND shard = ?", (k,))[0][0]  # fmt: skip
            if 0 < stored < 16:
                shard = k
        time.sleep(0.002)
    a.kill()
    a.wait()
    assert b.wait(timeout=300) == 0, b_log.read_text()
    text = b_log.read_text()
    assert f"taking over shard {shard} from process" in text, text
    assert f":{a.pid}, whose lease expired" in text, text
    _same_as_reference(db, setup[2])
