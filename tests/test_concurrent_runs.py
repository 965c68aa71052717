"""Several `idrs-bench run` processes on one benchmark and database share its shards
(leases in the database, harness/store/leases.py), and their result equals one process's
bit for bit: two at once (computing with the run's one thread count, so its replays stay
bit for bit), then two with one SIGKILLed in the middle of a shard, whose shard the other
takes over once its lease expires."""

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from harness.audit.detection_power import install_plugin_module

ROOT = Path(__file__).resolve().parents[1]

PLUGIN = '''
"""Cohen's certifier at a constant σ, sleeping $SLOW_WORK_DELAY seconds per input it
claims, so that two processes overlap and one can be killed in the middle of a shard.
With $SLOW_WORK_GATE set, every chunk of claims after the first $SLOW_WORK_GATE_AFTER
(default 0) waits until that file exists."""

import os
import time

from harness import CertifierSpec, Constant, MethodSpec, SigmaProviderSpec, hookimpl

IDRS_BENCH_CONTRACT = 3


class Constant_:
    def __init__(self, sigma):
        self.sigma, self.regularity = sigma, Constant(sigma)

    def __call__(self, x):
        return x.new_full((len(x),), self.sigma)


class Slow:
    def __init__(self, inner):
        self._inner, self._chunks = inner, 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def certify(self, evidence):
        gate = os.environ.get("SLOW_WORK_GATE")
        if self._chunks >= int(os.environ.get("SLOW_WORK_GATE_AFTER", 0)):
            while gate and not os.path.exists(gate):
                time.sleep(0.05)
        self._chunks += 1
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

METHODS = {"slow-cohen": [{"sigma": 0.5}],
           "alfarra-ds-memory": [{"sigma": 0.5, "steps": 8, "beta": 0.05}]}  # fmt: skip
BENCHMARK = {
    "name": "shared",
    "seed": 5,
    # the thread rule is the CPU's (a CUDA run records no thread count)
    "device": "cpu",
    # two chunks of claims (harness.certification.certify.CLAIM_CHUNK = 8) per shard
    "shard_size": 16,
    "test_count": 32,
    "n0": 20,
    "n": 500,
    # under a shard's 16 × n0 = 320 selection rows: one shard per engine call
    # (harness.running.work.shards_per_call), so processes share a setting's shards
    "batch_size": 256,
}
"""The run's values (``small_benchmark``'s: on cone-2, an MLP trained one epoch)."""

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
def setup(tmp_path_factory, small_benchmark):
    """The spec, the environment of a process (the plugin installed as a distribution
    with an entry point, a short lease) and a reference database certified by one
    process alone."""
    root = tmp_path_factory.mktemp("concurrent")
    site = root / "site"
    site.mkdir()
    install_plugin_module(site, "slow_work", "slow-work", "slow-work", PLUGIN)
    spec = root / "shared.toml"
    spec.write_text(small_benchmark(METHODS, **BENCHMARK))
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


def _start(setup, db: Path, log: Path, delay: float, *extra: str, gate: Path | None = None,
           after: int = 0) -> subprocess.Popen:  # fmt: skip
    """`idrs-bench run` in the background, its plugin sleeping ``delay`` s per input (its
    chunks of claims after the first ``after`` waiting until ``gate`` exists)."""
    spec, env, _ = setup
    env = {**env, "SLOW_WORK_DELAY": str(delay)}
    if gate is not None:
        env |= {"SLOW_WORK_GATE": str(gate), "SLOW_WORK_GATE_AFTER": str(after)}
    return subprocess.Popen(_command(spec, db, *extra), cwd=ROOT, env=env,
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


@pytest.mark.long
@pytest.mark.slow
def test_two_processes_share_the_shards_and_equal_one_process(setup, tmp_path, monkeypatch):
    """The first process computes with 3 threads (asked for), the second with its share of
    the cores, which it gives up for the run's 3 (harness/foundation/threads.py): the run's
    arithmetic is one, so the replay check re-draws its counts bit for bit."""
    db, gate = tmp_path / "shared.sqlite", tmp_path / "gate"
    logs = [tmp_path / "a.err", tmp_path / "b.err"]
    first = _start(setup, db, logs[0], 0.25, "--no-check", "--threads", "3", gate=gate)
    _wait_for(lambda: _leases_of(db, first), first, logs[0])  # it works: start the second
    second = _start(setup, db, logs[1], 0.25, "--no-check", gate=gate)
    _wait_for(lambda: ("slow-cohen", 1) in _leases_of(db, second), second, logs[1])
    gate.touch()  # each holds a shard of slow-cohen: both certify from now on
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
    # the second counted the first among the processes working, then kept the run's count
    assert "2 idrs-bench processes work on this machine" in texts[1], texts[1]
    assert "certifies with 3 threads, as it began" in texts[1], texts[1]
    (arithmetic,) = _query(db, "SELECT arithmetic FROM runs")
    assert json.loads(arithmetic[0])["threads"] == 3  # one arithmetic: not varied
    replay = _replayed(setup, db, monkeypatch)
    assert replay.verdict == "sound" and replay.evidence["mode"] == "exact", replay.summary
    assert replay.evidence["differences"] == [] and replay.evidence["arithmetic"]["threads"] == 3
    # asked for another count, a process makes the run varied (and says so)
    log = tmp_path / "c.err"
    with sqlite3.connect(db) as con:  # a shard left to certify
        con.execute("DELETE FROM shards WHERE method = 'slow-cohen' AND shard = 1")
        con.execute("DELETE FROM certificates WHERE method = 'slow-cohen' AND shard = 1")
    assert _start(setup, db, log, 0.0, "--no-check", "--threads", "1").wait(timeout=300) == 0
    assert "began with 3 threads, this process certifies with 1 (asked for)" in log.read_text()
    (arithmetic,) = _query(db, "SELECT arithmetic FROM runs")
    assert [f["threads"] for f in json.loads(arithmetic[0])["varied"]] == [3, 1]


def _replayed(setup, db: Path, monkeypatch):
    """The replay check of the slow-cohen row, in this process (the plugin imported from
    its file), on the run's model cache; this process's thread count is restored after."""
    import importlib.util

    from harness.audit.audit import BUDGETS
    from harness.audit.replay import check_replay
    from harness.audit.session import audits
    from harness.foundation.progress import Progress
    from harness.plugin.manager import PluginManager
    from harness.running.preparation import RunOptions
    from harness.store.store import ResultStore

    spec, env, _ = setup
    site = spec.parent / "site"  # where the setup installed the plugin
    module_spec = importlib.util.spec_from_file_location("slow_work", site / "slow_work.py")
    plugin = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(plugin)
    manager = PluginManager(third_party=False)
    manager.register(plugin, name="slow-work")
    monkeypatch.setenv("IDRS_BENCH_CACHE", env["IDRS_BENCH_CACHE"])
    budget = replace(BUDGETS["small"], replay_inputs=8)
    threads = torch.get_num_threads()
    store = ResultStore(db)
    try:  # a fixed audit: its verdict is the same every time
        audit = next(iter(audits(store, None, RunOptions(db=db), Progress(enabled=False), manager,
                                 method="slow-cohen", budget=budget, entropy=0x47)))  # fmt: skip
        assert torch.get_num_threads() == 3  # the audit computes with the run's count
        return check_replay(audit)
    finally:
        store.close()
        torch.set_num_threads(threads)


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


@pytest.mark.slow
def test_a_process_killed_mid_shard_leaves_its_shard_to_the_other(setup, tmp_path):
    db = tmp_path / "shared.sqlite"
    a_log, b_log = tmp_path / "a.err", tmp_path / "b.err"
    # A claims its first chunk (8 of a shard's 16), then waits for a gate that never opens:
    # it is killed in the middle of that shard
    a = _start(setup, db, a_log, 0.25, "--no-check", gate=tmp_path / "never", after=1)

    def a_mid_shard() -> int | None:
        """The Cohen shard A holds, which it never finishes: none of its inputs is stored
        (a shard is stored whole, once all its inputs are certified)."""
        for method, shard in _leases_of(db, a):
            if method == "slow-cohen":
                stored = _query(db, "SELECT COUNT(*) FROM certificates WHERE method = ? "
                                "AND shard = ?", (method, shard))[0][0]  # fmt: skip
                assert stored == 0, stored
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


def test_a_lease_of_an_ended_process_of_this_host_is_taken_over_at_once(tmp_path):
    """A resumed run does not wait out the leases of the run it replaces, killed on this
    host; a live process's lease, or another host's, still holds until it expires."""
    from harness.store.leases import LeaseKeeper, owner_gone, process_name
    from harness.store.store import ResultStore

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    host = process_name().rpartition(":")[0]
    owners = {"ended": f"{host}:{ended.pid}:aa", "alive": f"{host}:{os.getpid()}:bb",
              "elsewhere": "another-host:1:cc"}  # fmt: skip
    assert [owner_gone(o) for o in owners.values()] == [True, False, False]
    db = tmp_path / "leases.sqlite"
    store = ResultStore(db)
    for shard, owner in enumerate(owners.values()):
        assert store.acquire_lease("run", "m", "s", shard, owner, 3600).acquired
    store.close()
    with LeaseKeeper(db, notice=lambda line: None) as keeper:
        taken = [keeper.acquire("run", "m", "s", shard) for shard in range(3)]
    assert [a.acquired for a in taken] == [True, False, False]
    assert taken[0].expired == owners["ended"]
