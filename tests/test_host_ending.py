"""The machinery that ends a plugin host on time and leaves nothing behind, each part alone
(harness/README.md, "Plugin host"): the keeper (a subreaper that ends what the host started),
the request's deadline on the host's pipes, the host's output drained with bounded memory,
the host's folder swept after a harness was killed, the request limit's settings. Each
runs without torch in the host; tests/test_misbehaving_plugins.py runs them together."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from harness.foundation.errors import IdrsError
from harness.plugin.hosting.in_harness import exchange, limits
from harness.plugin.hosting.in_harness.host_ending import ending
from harness.plugin.hosting.in_harness.host_folder import HostFolder, sweep_abandoned
from harness.plugin.hosting.in_harness.host_output import (
    ECHO_BYTES,
    LINE_CHARS,
    TAIL_LINES,
    HostOutput,
)
from harness.plugin.hosting.shared import wire

# A process that plays the harness: it starts a "host" through the keeper's fork, which
# starts a plain child and a daemon (setsid, then fork again), then does what argv[1] says.
KEPT = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from harness.plugin.hosting.in_host import keeper

    mark, then, folder = sys.argv[1], sys.argv[2], sys.argv[3]
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the harness's child: the host's entry point, which forks the keeper
        os.close(read)
        keeper.split({"status_fd": write, "scratch": folder + "/scratch", "folder": folder})
        with open(folder + "/adj", "w") as adj:  # (the host's score)
            adj.write(open("/proc/self/oom_score_adj").read())
        subprocess.Popen(["sleep", mark])  # a plain child
        subprocess.Popen(["sh", "-c", f"setsid sh -c 'sleep {mark}' &"])  # a daemon
        time.sleep(0.5)
        if then == "exit":
            os._exit(7)
        if then == "crash":
            os.kill(os.getpid(), 11)
        time.sleep(600)  # 'term', 'orphan': the harness decides
        os._exit(0)
    os.close(write)
    status = os.fdopen(read)
    print(status.readline(), flush=True)  # the host's pid
    print(json.dumps({"own": open("/proc/self/oom_score_adj").read().strip(),
                      "keeper": open(f"/proc/{child}/oom_score_adj").read().strip()}), flush=True)
    if then == "orphan":  # the harness ends without a word (as by SIGKILL)
        os._exit(0)
    time.sleep(1.0)
    if then == "term":
        os.kill(child, 15)  # (the keeper: end the host now)
    print(status.read(), flush=True)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:  # a zombie has ended
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _mark() -> str:
    return f"{7000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}"


@pytest.mark.parametrize("then, said", [
    ("exit", "exited with status 7"),
    ("crash", "was killed by SIGSEGV (signal 11): a crash in native code"),
    ("term", "was ended by the harness"),
])  # fmt: skip
def test_the_keeper_ends_every_process_the_host_started_as_it_ends(
    tmp_path, then, said, live_processes
):
    """A host that exits, crashes or is ended by the harness: the keeper kills its plain
    child and its daemon (which left the session and forked again), removes its scratch
    folder and says how the host ended. The host's ``oom_score_adj`` is 1000, the keeper's
    its harness's."""
    mark = _mark()
    (tmp_path / "scratch").mkdir()
    (tmp_path / "scratch" / "left.txt").write_text("a plugin's file")
    out = subprocess.run([sys.executable, "-c", KEPT, mark, then, str(tmp_path)],
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    records = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    [final] = [r for r in records if "by" in r]
    [scores] = [r for r in records if "keeper" in r]
    assert (tmp_path / "adj").read_text().strip() == "1000"  # (the kernel's first choice)
    assert scores["keeper"] == scores["own"]
    assert final["by"] == ("harness" if then == "term" else "host") and final["left"] >= 2
    assert ending(final).startswith(said)
    assert "process(es) it had started were ended with it" in ending(final)
    assert live_processes(mark) == []
    assert not (tmp_path / "scratch").exists() and tmp_path.exists()  # (the harness's folder)


def test_the_keeper_ends_the_host_and_its_folder_when_the_harness_ends(tmp_path, live_processes):
    """The harness gone (here it exits at once, as after SIGKILL): the keeper sees its
    parent change, kills the host and everything it started and removes the host's folder."""
    mark = _mark()
    folder = tmp_path / "host"
    folder.mkdir()
    out = subprocess.run([sys.executable, "-c", KEPT, mark, "orphan", str(folder)],
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    host = next(json.loads(line)["host"] for line in out.stdout.splitlines() if '"host"' in line)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (live_processes(mark) or folder.exists() or _alive(host)):
        time.sleep(0.1)
    assert live_processes(mark) == [] and not folder.exists() and not _alive(host)


@pytest.mark.parametrize("record, words", [
    ({"by": "host", "exit": 3, "left": 0}, "exited with status 3"),
    ({"by": "host", "signal": 9, "oom_kills": 1, "left": 0},
     "was killed by SIGKILL (signal 9) while answering 'sigma': the kernel's out-of-memory "
     "killer ran meanwhile"),
    ({"by": "host", "signal": 9, "oom_kills": 0, "left": 2},
     "was killed by SIGKILL (signal 9) while answering 'sigma', from outside the harness"),
    ({"by": "harness", "signal": 9, "left": 1}, "was ended by the harness while answering"),
])  # fmt: skip
def test_how_a_host_ended_in_words(record, words):
    assert ending(record, "while answering 'sigma'").startswith(words)


def test_bytes_that_begin_no_frame_break_the_wire_at_once():
    """A plugin writing to the answers' descriptor is caught by the frame's magic, before any
    length it would claim is waited for."""
    read, write = os.pipe()
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.write(write, b"\x00\x00\x10\x00garbage that claims a header of 1 MiB" + bytes(40))
        with pytest.raises(wire.WireError, match="begin no message"):
            exchange.exchange(null, read, b"", time.monotonic() + 5)
    finally:
        for fd in (read, write, null):
            os.close(fd)


def test_a_request_to_a_host_that_reads_nothing_ends_at_its_deadline():
    """A request larger than a pipe's buffer (a σ batch) to a host that never reads it: the
    harness is not held in write(2); the deadline ends the wait."""
    requests_read, requests = os.pipe()
    answers, answers_write = os.pipe()
    try:
        start = time.monotonic()
        with pytest.raises(exchange.PastDeadline):
            exchange.exchange(requests, answers, b"x" * (4 << 20), time.monotonic() + 0.5)
        assert time.monotonic() - start < 60  # (held in write(2), it would never return)
        os.close(answers_write)  # the host ended: its pipes close
        answers_write = -1
        with pytest.raises(exchange.HostEnded):
            exchange.exchange(requests, answers, b"", time.monotonic() + 5)
    finally:
        for fd in (requests_read, requests, answers, answers_write):
            if fd >= 0:
                os.close(fd)


def test_ctrl_c_delivered_to_another_thread_ends_a_wait_for_a_host_at_once():
    """Ctrl-C's SIGINT delivered by the kernel to a thread other than the main one (as it may
    be to an OpenMP worker or the leases thread): Python runs the handler in the main thread
    only when it next runs, so the wait for a host's answer, in slices, raises
    KeyboardInterrupt within a slice, not at the request's deadline (the plugin timeout)."""
    import threading

    requests_read, requests = os.pipe()
    answers, answers_write = os.pipe()

    def interrupt_this_thread():
        time.sleep(0.3)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    helper = threading.Thread(target=interrupt_this_thread)
    # Ctrl-C's default handler (this process, a pytest-xdist worker, may ignore SIGINT)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        start = time.monotonic()
        helper.start()
        with pytest.raises(KeyboardInterrupt):
            exchange.exchange(requests, answers, b"request", time.monotonic() + 600)
        assert time.monotonic() - start < 60  # a tenth of the deadline: 240 slices
    finally:
        helper.join()
        signal.signal(signal.SIGINT, previous)
        for fd in (requests_read, requests, answers, answers_write):
            os.close(fd)


def test_an_answer_arrives_whole_through_the_pipe():
    read, write = os.pipe()
    frame = wire.encode({"ok": True, "sigma": list(range(50_000))})  # (more than a pipe holds)
    writer = subprocess.Popen([sys.executable, "-c", "import os, sys; os.write(1, sys.stdin.buffer.read())"],
                              stdin=subprocess.PIPE, stdout=write)  # fmt: skip
    os.close(write)
    writer.stdin.write(frame)
    writer.stdin.close()
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        got = exchange.exchange(null, read, b"", time.monotonic() + 30)
    finally:
        writer.wait()
        os.close(read)
        os.close(null)
    assert got == {"ok": True, "sigma": list(range(50_000))}


def test_a_flood_of_output_is_drained_with_bounded_memory_and_echo(capfd):
    """Megabytes without a line end, then long lines: the reader never stops the writer,
    keeps the last lines cut to their length, and echoes at most its rate, saying how much
    it left out."""
    read, write = os.pipe()
    output = HostOutput(read, echo=True, name="the test's host")
    lines = b"".join(b"line %d " % i + b"z" * 2000 + b"\n" for i in range(100))
    flood = b"y" * (8 << 20) + b"\n" + lines
    written = 0
    while written < len(flood):  # (blocks only if the reader stops reading)
        written += os.write(write, flood[written : written + (1 << 16)])
    os.close(write)
    assert output.wait(180)  # (a reader that stopped would hold the writer for good)
    assert output.read == len(flood)
    tail = output.tail(TAIL_LINES)
    assert tail.startswith("line 80 ") and tail.count("|") == TAIL_LINES - 1
    assert all(len(line.strip()) <= LINE_CHARS for line in tail.split("|"))
    err = capfd.readouterr().err
    assert len(err) < ECHO_BYTES + 1000 and "bytes of the test's host's output left out" in err
    os.close(read)


def test_the_folders_of_hosts_whose_harness_is_gone_are_swept(tmp_path):
    """A folder whose owner holds its lock stays; one whose owner ended (the lock is free)
    is removed by the next command once it is old enough; a young one stays."""
    alive = HostFolder(tmp_path)
    code = ("import sys; from harness.plugin.hosting.in_harness.host_folder import HostFolder; "
            "f = HostFolder(sys.argv[1]); (f.sent / 'x.npy').write_bytes(b'1'); print(f.path)")  # fmt: skip
    gone = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    assert os.path.isdir(gone)
    assert sweep_abandoned(tmp_path) == []  # (young)
    old = time.time() - 3600
    for folder in (alive.path, gone):
        os.utime(folder, (old, old))
    assert [str(p) for p in sweep_abandoned(tmp_path)] == [gone]
    assert not os.path.exists(gone) and alive.path.is_dir()
    alive.remove()
    assert not alive.path.exists()


def test_the_request_limit_comes_from_the_option_or_the_environment(monkeypatch):
    monkeypatch.delenv(limits.TIMEOUT_ENV, raising=False)
    assert limits.plugin_timeout() == limits.DEFAULT_TIMEOUT == 1800
    with limits.timeout_set("2.5"):
        assert limits.plugin_timeout() == 2.5 and os.environ[limits.TIMEOUT_ENV] == "2.5"
    assert limits.TIMEOUT_ENV not in os.environ
    monkeypatch.setenv(limits.TIMEOUT_ENV, "7")
    with limits.timeout_set(None):  # no option: the environment's limit stands
        assert limits.plugin_timeout() == 7
    with limits.timeout_set("3"):
        assert limits.plugin_timeout() == 3
    assert os.environ[limits.TIMEOUT_ENV] == "7"  # restored to what it was
    monkeypatch.setenv(limits.TIMEOUT_ENV, "soon")
    with pytest.raises(IdrsError, match="IDRS_BENCH_PLUGIN_TIMEOUT='soon' is not a number"):
        limits.plugin_timeout()
    for bad in ("0", "-3", "inf", "nan"):
        with pytest.raises(IdrsError, match="--plugin-timeout 3600"):
            limits.seconds(bad, "--plugin-timeout")
    said = limits.past_limit("the plugin host of idrs-x", "sigma", 3)
    assert "idrs-x did not answer the request 'sigma' within the limit of 3 s" in said
    assert "--plugin-timeout 60 (or IDRS_BENCH_PLUGIN_TIMEOUT=60)" in said


@pytest.mark.parametrize("command", [["run"], ["check"], ["leaderboard"]])
def test_every_command_that_runs_plugins_takes_a_plugin_timeout(command, capsys):
    from harness.cli.main import main

    with pytest.raises(SystemExit):
        main([*command, "--help"])
    assert "--plugin-timeout SECONDS" in capsys.readouterr().out
    assert main([*command, "--plugin-timeout", "never"]) == 2
    assert "--plugin-timeout never is not a number of seconds" in capsys.readouterr().err


def test_a_signal_number_the_platform_does_not_name_is_still_said():
    assert "signal 250" in ending({"by": "host", "signal": 250})
    assert signal.SIGKILL == 9  # (the records' numbers are the kernel's)
