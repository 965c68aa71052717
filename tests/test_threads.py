"""How many threads each process computes with, and how its idle threads wait
(harness/foundation/threads.py): the rule, the user's overrides, the environment the
command line and its subprocesses get, the registry of working processes, and a run's
thread count kept in its arithmetic fingerprint (harness/engine/arithmetic.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from harness.engine.arithmetic import computing_with, fingerprint, run_threads
from harness.foundation.errors import IdrsError
from harness.foundation.protocol import CertificationProtocol
from harness.foundation.threads import (
    THREADS_ENV_VAR,
    WAIT_VARIABLES,
    WorkingProcess,
    child_environment,
    passive_wait,
    requested_threads,
    thread_count,
    working_processes,
)
from harness.store.store import ResultStore

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("cores", "working", "requested", "threads"),
    [
        (2, 1, None, 2),  # alone: every core
        (2, 2, None, 1),  # two runs on one database: a core each
        (2, 3, None, 1),  # never fewer than one
        (16, 3, None, 5),  # 16 // 3
        (16, 0, None, 16),  # no registry (not POSIX): alone
        (2, 2, 4, 4),  # asked for: as given, whatever the cores
        (1, 1, None, 1),
    ],
)
def test_the_rule_divides_the_cores_among_the_working_processes(cores, working, requested, threads):
    assert thread_count(cores, working, requested) == threads


def test_the_count_asked_for_option_first_then_ours_then_openmps():
    env = {THREADS_ENV_VAR: "3", "OMP_NUM_THREADS": "5"}
    assert requested_threads(2, env) == 2
    assert requested_threads(None, env) == 3
    assert requested_threads(None, {"OMP_NUM_THREADS": "4,2"}) == 4
    assert requested_threads(None, {THREADS_ENV_VAR: ""}) is None
    assert requested_threads(None, {}) is None
    bad = [(0, {}, "--threads"), (None, {THREADS_ENV_VAR: "two"}, THREADS_ENV_VAR),
           (None, {"OMP_NUM_THREADS": "-1"}, "OMP_NUM_THREADS")]  # fmt: skip
    for option, env, named in bad:
        with pytest.raises(IdrsError, match=f"{named}.*positive integer"):
            requested_threads(option, env)


def test_idle_threads_sleep_unless_the_user_chose_how_they_wait():
    assert passive_wait({}) == {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0"}
    for name in WAIT_VARIABLES:  # any of them is the user's choice: nothing is added
        assert passive_wait({name: "1000"}) == {}
    env = child_environment(3, {"OMP_WAIT_POLICY": "ACTIVE", "OMP_NUM_THREADS": "7", "X": "y"})
    assert env == {"OMP_WAIT_POLICY": "ACTIVE", "OMP_NUM_THREADS": "7", "X": "y",
                   THREADS_ENV_VAR: "3"}  # fmt: skip
    env = child_environment(None, {"X": "y"})
    assert env == {"X": "y", "OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0"}


def _without_wait_variables() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in WAIT_VARIABLES}


@pytest.mark.slow
@pytest.mark.parametrize("user", [None, "ACTIVE"])
def test_the_command_line_sets_the_wait_policy_before_the_openmp_runtime_starts(user):
    """GNU OpenMP shows the spin count it started with (OMP_DISPLAY_ENV=VERBOSE): 0 when
    `idrs-bench` told idle threads to sleep before torch was imported, the user's when
    the user chose a policy."""
    code = ("import sys\nfrom harness.cli.main import main\nassert 'torch' not in sys.modules\n"
            "main(['results', '--db', 'no-such.sqlite'])\nimport torch\ntorch.ones(1)\n")  # fmt: skip
    env = _without_wait_variables() | {"OMP_DISPLAY_ENV": "VERBOSE"}
    if user is not None:
        env["OMP_WAIT_POLICY"] = user
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    spins = [line for line in done.stderr.splitlines() if "GOMP_SPINCOUNT" in line]
    if not spins:
        pytest.skip("torch's OpenMP runtime is not GNU's: it does not display its spin count")
    assert ("'0'" in spins[0]) == (user is None), spins


def test_the_replay_process_gets_the_wait_policy_and_never_overrides_the_users(monkeypatch):
    from harness.running.redraw import Replayer

    if not Path("/proc/self/environ").is_file():
        pytest.skip("reading a process's environment needs /proc")
    for name in WAIT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for user, expected in ((None, "PASSIVE"), ("ACTIVE", "ACTIVE")):
        if user is not None:
            monkeypatch.setenv("OMP_WAIT_POLICY", user)
        replayer = Replayer()
        try:
            proc = Path(f"/proc/{replayer._start().pid}")
            deadline = time.monotonic() + 60
            while b"harness.running.redraw" not in proc.joinpath("cmdline").read_bytes():
                assert time.monotonic() < deadline  # (before exec, it shows our environment)
                time.sleep(0.01)
            raw = proc.joinpath("environ").read_bytes().split(b"\0")
            env = dict(item.decode().split("=", 1) for item in raw if b"=" in item)
        finally:
            replayer.close()
        assert env["OMP_WAIT_POLICY"] == expected
        assert ("KMP_BLOCKTIME" in env) == (user is None)
        assert env["IDRS_BENCH_PLUGINS"] == ""


HOLD = """
import sys, time
from pathlib import Path
from harness.foundation.threads import WorkingProcess
with WorkingProcess(Path(sys.argv[1])):
    print("registered", flush=True)
    time.sleep(120)
"""


def test_the_registry_counts_the_live_processes_of_this_machine(tmp_path):
    folder = tmp_path / "processes"
    assert working_processes(folder) == 0
    with WorkingProcess(folder):
        assert working_processes(folder) == 1
        other = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], cwd=ROOT,
                                 stdout=subprocess.PIPE, text=True)  # fmt: skip
        try:
            assert other.stdout.readline().strip() == "registered"
            assert working_processes(folder) == 2
        finally:
            other.kill()  # SIGKILL: it cannot unregister; its lock goes with it
            other.wait()
        assert working_processes(folder) == 1
        (host,) = folder.iterdir()
        assert [p.name for p in host.iterdir()] == [str(os.getpid())]  # its file was removed
    assert working_processes(folder) == 0
    unwritable = tmp_path / "a-file"
    unwritable.write_text("")
    with WorkingProcess(unwritable):  # a registry it cannot write: it works, unregistered
        assert working_processes(unwritable) == 0


def test_a_run_is_computed_with_the_count_it_began_with_unless_another_is_asked_for(tmp_path):
    protocol = CertificationProtocol(n0=10, n=100, alpha=0.01, batch_size=64, noise="block-v1")
    cpu = fingerprint("cpu", protocol, 64, threads=3)
    assert cpu["threads"] == 3
    assert fingerprint("cpu", protocol, 64)["threads"] == torch.get_num_threads()
    assert run_threads(None) is None and run_threads(None, 2) == 2  # a new run: ours
    assert run_threads(cpu) == 3 and run_threads(cpu, 1) == 1  # the run's, or as asked
    assert run_threads({"varied": [cpu]}) is None  # nothing left to keep
    assert run_threads(cpu | {"device_type": "cuda", "threads": None}) is None

    store = ResultStore(tmp_path / "runs.sqlite")
    store.begin_run("r", "r", {}, {}, None, "cpu", 0, "hash")

    def choose(threads):
        return lambda recorded: fingerprint("cpu", protocol, 64,
                                            threads=run_threads(recorded, threads))  # fmt: skip

    assert store.record_arithmetic("r", choose(3)) == (None, cpu)  # a new run: as asked
    assert store.record_arithmetic("r", choose(None)) == (cpu, cpu)  # joined: the run's count
    assert store.run("r")["arithmetic"] == cpu  # the same arithmetic: not varied
    other = cpu | {"threads": 1}
    assert store.record_arithmetic("r", choose(1)) == (cpu, other)  # asked for another
    assert store.run("r")["arithmetic"] == {"varied": [cpu, other]}
    store.close()


def test_computing_with_a_count_restores_the_one_before():
    before = torch.get_num_threads()
    with computing_with(before + 1):
        assert torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before
    with computing_with(None):
        assert torch.get_num_threads() == before


def test_a_bad_count_is_an_error_before_torch_is_imported(monkeypatch, tmp_path, capsys):
    from harness.cli.main import main

    monkeypatch.setenv(THREADS_ENV_VAR, "two")
    assert main(["run", "--db", str(tmp_path / "runs.sqlite"), "--no-check"]) == 2
    err = capsys.readouterr().err
    assert f"${THREADS_ENV_VAR} is 'two', not a number of threads" in err, err
    assert not (tmp_path / "runs.sqlite").exists()
