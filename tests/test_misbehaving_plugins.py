"""A plugin that misbehaves costs its own row, never the run (harness/README.md, "Plugin
host"): plugins written to hang, crash, exit, start processes that leave their session,
flood their output, write files, break the wire and hold their host past its end, each
beside a built-in row in one run; the harness itself stopped by Ctrl-C, SIGTERM and
SIGKILL while a plugin hangs; and hosts that live no longer than the call that needs them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from harness.plugin.hosting.in_harness.host_process import running_hosts

HANG = 180
"""Seconds after which a wait for a process to end is a hang (a limit, never the figure
tested: the processes end in seconds on an idle machine)."""

MISBEHAVING = '''
import ctypes, os, signal, subprocess, threading, time

from harness import Constant, MethodSpec, SigmaProviderSpec, hookimpl

IDRS_BENCH_CONTRACT = 3
MARK = "{mark}"  # the seconds its processes sleep: how the test finds them


def _daemon():
    """A plain child, and one that leaves its session and forks again (a daemon)."""
    subprocess.Popen(["sleep", MARK])
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            os.execvp("sleep", ["sleep", MARK])
        os._exit(0)
    os.waitpid(pid, 0)


def _flood():
    for _ in range(50_000):
        print("flood " * 40)  # 12 MB to stdout
    os.write(2, b"z" * 4_000_000)  # and 4 MB to stderr without a line end


def _files():
    for folder in (os.environ["TMPDIR"], os.environ["HOME"], os.environ["XDG_CACHE_HOME"]):
        with open(os.path.join(folder, "left-behind.bin"), "wb") as out:
            out.write(os.urandom(1 << 20))


def _wire():
    """Garbage on the descriptor the answers travel on (found as a plugin could)."""
    ours = {{os.readlink(f"/proc/self/fd/{{fd}}") for fd in (0, 2)}}
    for entry in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{{entry}}")
            with open(f"/proc/self/fdinfo/{{entry}}") as info:
                flags = int(info.read().split("flags:")[1].split()[0], 8)
        except (OSError, IndexError, ValueError):
            continue
        if link.startswith("pipe:") and link not in ours and flags & os.O_ACCMODE == os.O_WRONLY:
            os.write(int(entry), b"not a frame, from a plugin\\n" * 10)


def _stuck():
    """Its host will not exit: SIGTERM ignored, and a thread (not a daemon) that soon
    holds the interpreter in native code for an hour."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def hold():
        time.sleep(0.3)
        ctypes.PyDLL(None).sleep(3600)

    threading.Thread(target=hold, daemon=False).start()


ACTS = {{"daemon": _daemon, "flood": _flood, "files": _files, "wire": _wire, "stuck": _stuck,
        "hang": lambda: time.sleep(3600), "exit": lambda: os._exit(7),
        "crash": lambda: os.kill(os.getpid(), signal.SIGSEGV)}}

'''

DISTRIBUTION = "idrs-test-misbehaving"
ACTS = ("daemon", "flood", "files", "hang", "crash", "exit", "wire", "stuck")
"""In the run's order (the host that holds itself past its end last)."""
FAILED = {
    "hang": "did not answer the request 'sigma' within the limit of 8 s",
    "crash": "was killed by SIGSEGV (signal 11) while answering the request 'sigma'",
    "exit": "exited with status 7 while answering the request 'sigma'",
    "wire": "after it wrote something other than an answer to 'sigma'",
}


def _host_folders(temporary: Path) -> list[Path]:
    return list(temporary.glob("idrs-plugin-host-*"))


@pytest.fixture
def misbehaving(install_plugin, acting_plugin, tmp_path, monkeypatch, beside_cohen):
    """The misbehaving plugin installed, its processes' mark, a temporary directory of the
    test's own (host folders go there) and the benchmark file naming every act."""
    mark = f"{8000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}"
    install_plugin("idrs_test_misbehaving", acting_plugin(MISBEHAVING.format(mark=mark), "misbehaving", "misbehave"),
                   distribution=DISTRIBUTION)  # fmt: skip
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    spec = tmp_path / "misbehaving.toml"
    spec.write_text(beside_cohen("misbehaving", [f"misbehave-{act}" for act in ACTS]))
    return mark, temporary, spec


@pytest.mark.long
@pytest.mark.slow
def test_each_misbehaving_plugin_costs_its_own_row_and_leaves_nothing(
    misbehaving, tmp_path, live_processes, capsys
):
    """One run: the built-in row certifies and ends sound; the rows whose plugin hung,
    crashed, exited or broke the wire failed, each naming the distribution and what
    happened, and the run says so (exit 3, the command that retries them); the rows whose
    plugin started a daemon, flooded its output, wrote files or would not let its host end
    certified; the run ends in time, and no process or file of the plugin remains."""
    from harness.audit.audit import Budget
    from harness.audit.auditor import run_checks
    from harness.cli.main import ROWS_FAILED, main
    from harness.foundation.progress import Progress
    from harness.running.preparation import RunOptions
    from harness.store.store import ResultStore
    from harness.store.storedrun import load_runs

    mark, temporary, spec = misbehaving
    db = tmp_path / "runs.sqlite"
    argv = ["run", str(spec), "--db", str(db), "--quiet", "--no-check", "--plugin-timeout", "8"]
    start = time.monotonic()
    assert main(argv) == ROWS_FAILED
    took = time.monotonic() - start
    out = capsys.readouterr().out
    [run] = load_runs(db)
    failures = {f["method"].removeprefix("misbehave-"): f["error"] for f in run.failures}
    assert sorted(failures) == sorted(FAILED), failures
    for act, said in FAILED.items():
        assert f"the plugin host of {DISTRIBUTION}" in failures[act] and said in failures[act]
    assert "it was ended with every process it had started" in failures["hang"]
    assert "raise the limit: --plugin-timeout 60" in failures["hang"]
    assert "4 row(s) failed" in out
    for act in FAILED:
        assert f"failed: misbehave-{act} (default), plugin idrs_test_misbehaving of " in out
    assert f"retry the failed row(s): idrs-bench run {spec} --db {db}" in " ".join(out.split())
    counts = run.counts()
    assert {m for m, _ in counts} == {"cohen", *(f"misbehave-{a}" for a in ACTS if a not in FAILED)}
    assert all(n == 4 for n in counts.values())
    # the hang's limit, a grace period and a host started again after each failure (its
    # imports: seconds on an idle machine, far more on a loaded one), far below the hang's
    # own 3,600 s: the limit ended it
    assert took < 1200, took
    assert live_processes(mark) == [] and live_processes(DISTRIBUTION) == []
    assert _host_folders(temporary) == []  # every host folder, scratch and files in it
    quiet = Progress(enabled=False)
    tiny = Budget("tiny", coverage_trials=8, coverage_n=100, pairs=1, ascent_steps=1,
                  audited_inputs=2, attack_steps=1, attack_samples=8, orders=1, replay_inputs=2)  # fmt: skip
    run_checks(db, run.run_id, RunOptions(db=db), quiet, method="cohen", budget=tiny,
               attack=False, entropy=0x45)  # fmt: skip
    [run] = load_runs(db)
    verdicts = {row.method: row.verdict for row in run.rows()}
    assert verdicts["cohen"] == "sound"
    assert all(v == "not checked" for m, v in verdicts.items() if m != "cohen")
    store = ResultStore(db)  # a row that failed after it certified some inputs
    store.record_failure(run.run_id, "misbehave-flood", "default", "IdrsError: it hung")
    assert main(["leaderboard", "--db", str(db), "--allow-incomplete"]) == 0
    store.clear_failures(run.run_id, "misbehave-flood", "default")
    store.close()
    board, failures = capsys.readouterr().out.split("### Failures")
    assert all(f"misbehave-{act} (default)" in failures for act in [*FAILED, "flood"])
    flood = [line for line in board.splitlines() if "| misbehave-flood |" in line]
    assert any("| failed (4 inputs certified before), not checked" in line for line in flood)
    assert not any("| sound |" in line for line in flood)
    assert not any(f"| misbehave-{act} |" in board for act in FAILED)  # (no certificate)
    # the plugin mended, the same command certifies the failed rows and keeps the others
    plugin = Path(os.environ["PYTHONPATH"].split(os.pathsep)[0]) / "idrs_test_misbehaving.py"
    plugin.write_text(plugin.read_text().replace("ACTS[self.act]()", "pass"))
    assert main(argv) == 0
    [run] = load_runs(db)
    assert run.failures == [] and set(run.counts().values()) == {4} and len(run.counts()) == 9


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_a_harness_stopped_while_a_plugin_hangs_leaves_nothing_behind(
    misbehaving, tmp_path, how, live_processes, beside_cohen
):
    """``idrs-bench run`` stopped while a plugin's σ hangs, its daemon running: by Ctrl-C
    (SIGINT to its process group) and SIGTERM it ends its host at once and exits 130 or
    143; by SIGKILL its hosts' keepers end them; either way no process of the plugin and no
    host folder remains."""
    mark, temporary, spec = misbehaving
    spec.write_text(beside_cohen("misbehaving", ["misbehave-daemon-hang"], cohen=False))
    plugin = Path(os.environ["PYTHONPATH"].split(os.pathsep)[0]) / "idrs_test_misbehaving.py"
    plugin.write_text(plugin.read_text().replace(
        '"hang": lambda: time.sleep(3600),',
        '"hang": lambda: time.sleep(3600), "daemon-hang": lambda: (_daemon(), time.sleep(3600)),'))  # fmt: skip
    # (PYTHONFAULTHANDLER: SIGABRT then prints every thread's stack)
    env = {**os.environ, "TMPDIR": str(temporary), "IDRS_BENCH_PLUGIN_TIMEOUT": "600",
           "PYTHONFAULTHANDLER": "1"}  # fmt: skip
    # started with Ctrl-C's default, as from a terminal: an ignored signal is inherited, and
    # this test process (a pytest-xdist worker) has been seen to ignore SIGINT
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        harness = subprocess.Popen(
            [sys.executable, "-m", "harness.cli.main", "run", str(spec), "--db",
             str(tmp_path / "runs.sqlite"), "--quiet", "--no-check"],
            env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        deadline = time.monotonic() + 240
        while len(live_processes(mark)) < 2 and time.monotonic() < deadline:  # the daemon runs
            assert harness.poll() is None, harness.communicate()
            time.sleep(0.2)
        assert len(live_processes(mark)) >= 2 and len(_host_folders(temporary)) == 1
        if how == "SIGINT":
            os.killpg(harness.pid, signal.SIGINT)  # (as Ctrl-C: the harness's group)
        else:
            os.kill(harness.pid, getattr(signal, how))
        # the waits below end on the events themselves (the harness's exit, the last
        # process gone); their limits only keep a hang from holding the suite, and are far
        # above what a loaded machine needs (a few seconds idle)
        try:
            code = harness.wait(timeout=HANG)
        except subprocess.TimeoutExpired:  # say where it waits, for the report
            harness.send_signal(signal.SIGABRT)
            _, err = harness.communicate(timeout=30)
            pytest.fail(f"the harness did not exit within {HANG} s of {how}; its threads then:\n"
                        f"{err.decode(errors='replace')[-6000:]}")  # fmt: skip
        assert code == {"SIGINT": 130, "SIGTERM": 143, "SIGKILL": -9}[how]
        deadline = time.monotonic() + HANG
        while (
            live_processes(mark) or live_processes(DISTRIBUTION) or _host_folders(temporary)
        ) and (time.monotonic() < deadline):
            time.sleep(0.1)
        assert live_processes(mark) == [] and live_processes(DISTRIBUTION) == []
        assert _host_folders(temporary) == []
    finally:
        if harness.poll() is None:
            harness.kill()
        harness.communicate()


@pytest.mark.slow
def test_hosts_end_when_the_call_that_needs_them_returns(
    install_plugin, acting_plugin, tmp_path, monkeypatch
):
    """``harness.api``'s calls and the checks end the plugin hosts they start when they
    return, also when they raise."""
    import torch

    from harness import api
    from harness.audit import auditor
    from harness.foundation.progress import Progress
    from harness.running.preparation import RunOptions

    install_plugin("idrs_test_half", acting_plugin(MISBEHAVING.format(mark="1"), "misbehaving", "misbehave"),
                   distribution=DISTRIBUTION)  # fmt: skip
    spec = {"name": "api", "seed": 0, "dataset": {"name": "ball-2", "test_count": 4},
            "model": {"architecture": "ball-N", "trainer": "none"},
            "certification": {"n0": 16, "n": 200, "batch_size": 256},
            "methods": [{"name": "misbehave-files", "settings": [{}]}]}  # fmt: skip
    db = tmp_path / "runs.sqlite"
    result = api.run(spec, db=db, check=False)
    assert result["failures"] == [] and len(result["certificates"]) == 4
    assert running_hosts() == []
    spec["methods"] = [{"name": "misbehave-exit", "settings": [{}]}]
    result = api.run(spec, db=db, check=False)
    assert [f["method"] for f in result["failures"]] == ["misbehave-exit"]
    assert running_hosts() == []
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(2, 2))
    with pytest.raises(Exception, match="exited with status 7"):
        api.certify(model, torch.zeros(3, 2), torch.zeros(3, dtype=torch.long),
                    method="misbehave-exit", n=100)  # fmt: skip
    assert running_hosts() == []

    def broken(*args, **kwargs):
        raise RuntimeError("the audit broke")

    monkeypatch.setattr(auditor, "AuditSession", broken)
    with pytest.raises(RuntimeError, match="the audit broke"):
        auditor.run_checks(db, None, RunOptions(db=db), Progress(enabled=False))
    assert running_hosts() == []
