"""Out of memory, the plugin host dies, never the harness (docs/threat-model.md, "Memory"):
each host runs in a memory cgroup of its own, which it cannot leave once confined, and
whose out-of-memory kills its keeper reports; a host that lowers its ``oom_score_adj`` is
refused by the kernel (root with ``CAP_SYS_RESOURCE``) or ended by its keeper (elsewhere);
the memory limit's settings; and, in one run, plugins that fill memory with a memfd never
mapped (shared memory outside every process's RSS) and with anonymous memory, beside a
built-in row. Every test fills memory only within a cgroup limit it sets; where no memory
cgroup can be made here, those tests skip, saying why."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import textwrap

import pytest

from harness.foundation.errors import IdrsError
from harness.plugin.hosting.in_harness import host_ending, limits, running_host
from harness.plugin.hosting.shared import landlock, memory_cgroup, policy

MiB = 1 << 20
CAP_SYS_RESOURCE = 24


def _pinned() -> bool:
    """Whether this process has ``CAP_SYS_RESOURCE``: a host it starts then pins its
    ``oom_score_adj_min`` at 1000 (the kernel refuses to lower the score)."""
    with open("/proc/self/status") as status:
        effective = next(line for line in status if line.startswith("CapEff:"))
    return bool(int(effective.split()[1], 16) >> CAP_SYS_RESOURCE & 1)


@pytest.fixture
def cgroup_limit():
    """``cgroup_limit(bytes)``: a memory cgroup of that limit beneath this process's,
    removed after the test; the test skips where none can be made."""
    made: list[memory_cgroup.MemoryCgroup] = []

    def make(limit: int) -> memory_cgroup.MemoryCgroup:
        try:
            made.append(memory_cgroup.make(limit))
        except memory_cgroup.Unavailable as exc:
            pytest.skip(f"no memory cgroup can be made here ({exc}); a host then has no "
                        "limit of its own (docs/threat-model.md, \"Memory\")")  # fmt: skip
        return made[-1]

    yield make
    for cgroup in made:
        cgroup.remove()


# A process that plays the harness: it forks the host's entry point, which forks the keeper
# (keeper.split) and then, as the host does, joins its memory cgroup, confines itself
# (writing only the test's folder) and does what argv[1] says, writing what it saw there.
HOST = textwrap.dedent("""
    import json, os, sys, time
    from harness.plugin.hosting.in_host import keeper
    from harness.plugin.hosting.in_host.confinement import confine
    from harness.plugin.hosting.shared import memory_cgroup
    from harness.plugin.hosting.shared.policy import HostPaths, host_policy

    then, folder, memory = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read)
        keeper.split({"status_fd": write, "folder": folder, "memory": memory})
        cgroup = memory_cgroup.MemoryCgroup.from_message(memory)
        memory_cgroup.join(cgroup)
        seen = {}
        while then == "leave":  # (unconfined: as a host on cgroup v2 could with clone3)
            with open(os.path.join(os.path.dirname(cgroup.path), "cgroup.procs"), "w") as out:
                out.write(str(os.getpid()))  # (again, until its keeper ends it)
            time.sleep(0.1)
        confine(host_policy(HostPaths(scratch=folder)).landlock())
        if then == "escape":
            parent = os.path.dirname(cgroup.path)
            for name, path, value in (
                ("leave", os.path.join(parent, "cgroup.procs"), str(os.getpid())),
                ("raise", os.path.join(cgroup.path, "memory.limit_in_bytes" if cgroup.version == 1
                                       else "memory.max"), str(1 << 40)),
                ("lower", f"/proc/self/task/{os.getpid()}/oom_score_adj", "0"),
            ):
                try:
                    with open(path, "w") as file:
                        file.write(value)
                    seen[name] = "done"
                except OSError as exc:
                    seen[name] = exc.strerror
            seen["score"] = open("/proc/self/oom_score_adj").read().strip()
            seen["cgroup"] = [line.split(":", 2)[2].strip() for line in open("/proc/self/cgroup")
                              if "memory" in line.split(":")[1].split(",")]
        with open(os.path.join(folder, "seen.json"), "w") as out:
            json.dump(seen, out)
        if then == "memfd":  # shared memory never mapped: in no process's RSS
            fd = os.memfd_create("hoard")
            for _ in range(4 * memory["limit"] >> 20):
                os.write(fd, b"m" * (1 << 20))
        if then == "anon":
            held = [bytes([i % 251]) * (1 << 20) for i in range(4 * memory["limit"] >> 20)]
        if then == "escape" and seen["lower"] == "done":
            time.sleep(60)  # (its keeper ends it)
        os._exit(0)
    os.close(write)
    print(os.fdopen(read).read(), flush=True)
""")


def _host(then: str, folder, cgroup: memory_cgroup.MemoryCgroup) -> tuple[dict, dict]:
    """Run :data:`HOST`; the keeper's final record and what the host saw."""
    out = subprocess.run([sys.executable, "-c", HOST, then, str(folder),
                          json.dumps(cgroup.to_message())],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    [final] = [json.loads(line) for line in out.stdout.splitlines() if '"by"' in line]
    return final, json.loads((folder / "seen.json").read_text())


needs_landlock = pytest.mark.skipif(
    policy.refusal(landlock.landlock_abi()) is not None,
    reason="the kernel cannot confine a plugin host (Landlock ABI < 3)",
)


@pytest.mark.parametrize("then", ["memfd", "anon"])
def test_a_host_that_fills_its_cgroup_is_killed_there_and_its_keeper_says_so(
    tmp_path, cgroup_limit, then
):
    """A host that fills memory past its cgroup's limit of 64 MiB, with a memfd it never
    maps or with anonymous memory (either would take 256 MiB): the kernel's out-of-memory
    killer kills it (its keeper, outside the cgroup, lives), the keeper reports the kill,
    the limit and the peak and removes the cgroup, and the host's ending names the killer,
    the memory and the limit, and how to raise it."""
    cgroup = cgroup_limit(64 * MiB)
    final, _ = _host(then, tmp_path, cgroup)
    assert final["by"] == "host" and final["signal"] == 9, final
    assert final["memory"]["oom_kills"] >= 1 and final["memory"]["limit"] == 64 * MiB
    assert 48 * MiB <= final["memory"]["peak"] <= 64 * MiB
    assert not os.path.exists(cgroup.path)  # (the keeper removed it)
    said = host_ending.ending(final, "while answering the request 'sigma'")
    assert said.startswith("was killed by the out-of-memory killer at ")
    assert " MiB while answering the request 'sigma'; limit 64 MiB for the host and" in said
    assert "raise the limit: --plugin-memory 1024 (or IDRS_BENCH_PLUGIN_MEMORY=1024)" in said


@needs_landlock
def test_a_confined_host_cannot_leave_its_cgroup_nor_keep_a_lower_oom_score(tmp_path, cgroup_limit):
    """Once confined, a host cannot move itself out of its memory cgroup nor raise its limit
    (Landlock: nothing beneath ``/sys`` is written). It can write its own threads'
    ``oom_score_adj`` (the CUDA driver's grant beneath ``/proc/<pid>/task``): lowering it is
    refused by the kernel where the host started as root with ``CAP_SYS_RESOURCE`` (the
    score stays 1000), and elsewhere its keeper ends it, saying so."""
    cgroup = cgroup_limit(64 * MiB)
    final, seen = _host("escape", tmp_path, cgroup)
    assert seen["leave"] == seen["raise"] == "Permission denied", seen
    assert seen["cgroup"][0].endswith("/" + os.path.basename(cgroup.path))
    if _pinned():
        assert seen["lower"] == "Permission denied" and seen["score"] == "1000"
        assert final["by"] == "host" and final["exit"] == 0
    else:  # (root without CAP_SYS_RESOURCE, as in a container, or a user)
        assert seen["lower"] == "done" and seen["score"] == "0"
        assert final["by"] == "keeper" and final["breach"]["oom_score_adj"] == 0, final
        said = host_ending.ending(final)
        assert said.startswith("was ended by its keeper: its process ")
        assert "lowered its oom_score_adj from 1000 to 0, which a plugin may not" in said


def test_a_host_process_that_leaves_its_cgroup_is_ended_by_its_keeper(tmp_path, cgroup_limit):
    """A host process found outside its memory cgroup (here the host itself, unconfined; a
    confined one on cgroup v2 could start a child elsewhere with ``clone3``'s
    ``CLONE_INTO_CGROUP``): its keeper ends the host, saying so."""
    cgroup = cgroup_limit(64 * MiB)
    out = subprocess.run([sys.executable, "-c", HOST, "leave", str(tmp_path),
                          json.dumps(cgroup.to_message())],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    [final] = [json.loads(line) for line in out.stdout.splitlines() if '"by"' in line]
    assert final["by"] == "keeper" and final["signal"] == 9, final
    assert os.path.dirname(cgroup.path).endswith(final["breach"]["cgroup"])
    assert "left the host's memory cgroup for " in host_ending.ending(final)


def test_a_process_that_begins_to_exit_while_its_keeper_looks_is_no_breach(monkeypatch):
    """cgroup v1 shows an exiting process in the root cgroup ("/"): one that begins to exit
    between the keeper's look at its state and at its cgroup (a loaded machine) is no
    breach; one found outside, still running, is."""
    from harness.plugin.hosting.in_host import keeper

    class Cgroup:
        def holding(self, pid: int) -> str:
            return "/"

    states = iter([False, True])  # running when first looked at, exiting after the read
    monkeypatch.setattr(keeper, "children", lambda pid=None: [] if pid == 7 else [7])
    monkeypatch.setattr(keeper, "_exiting", lambda pid: next(states))
    assert keeper.breach(Cgroup(), scores=False) is None
    monkeypatch.setattr(keeper, "_exiting", lambda pid: False)
    assert keeper.breach(Cgroup(), scores=False) == {"pid": 7, "cgroup": "/"}


def test_the_memory_limit_comes_from_the_option_or_the_environment(monkeypatch):
    monkeypatch.delenv(limits.MEMORY_ENV, raising=False)
    assert limits.plugin_memory() is None
    assert limits.host_memory(8 << 30) == (6 << 30, "75% of the memory available when the "
                                                    "host started; --plugin-memory sets it")  # fmt: skip
    assert limits.host_memory(None)[0] is None
    with limits.memory_set("2G"):
        assert os.environ[limits.MEMORY_ENV] == "2048" and limits.plugin_memory() == 2 << 30
        assert limits.host_memory(8 << 30) == (2 << 30, "--plugin-memory 2048 (or "
                                                        "IDRS_BENCH_PLUGIN_MEMORY)")  # fmt: skip
    assert limits.MEMORY_ENV not in os.environ
    for text, size in (("512", 512 * MiB), ("1.5GiB", 1536 * MiB), ("768M", 768 * MiB),
                       ("1t", 1 << 40), ("2048K", 2 * MiB)):  # fmt: skip
        assert limits.memory(text, "--plugin-memory") == size
    for bad in ("0", "0.5", "-3", "lots", "1e9", "12 parsecs"):
        with pytest.raises(IdrsError, match="not an amount of memory of 1 MiB or more"):
            limits.memory(bad, "--plugin-memory")
    monkeypatch.setenv(limits.MEMORY_ENV, "much")
    with pytest.raises(IdrsError, match="IDRS_BENCH_PLUGIN_MEMORY='much' is not an amount"):
        limits.plugin_memory()


@pytest.mark.parametrize("command", [["run"], ["check"], ["leaderboard"]])
def test_every_command_that_runs_plugins_takes_a_memory_limit(command, capsys):
    from harness.cli.main import main

    with pytest.raises(SystemExit):
        main([*command, "--help"])
    assert "--plugin-memory MiB" in capsys.readouterr().out
    assert main([*command, "--plugin-memory", "plenty"]) == 2
    assert "--plugin-memory plenty is not an amount of memory" in capsys.readouterr().err


def test_where_no_cgroup_can_be_made_a_set_limit_is_an_error_and_the_default_is_left_out(
    monkeypatch, capsys
):
    """Without a memory cgroup (a user on cgroup v1, an undelegated cgroup v2): a limit the
    user set is refused, naming why; the default leaves the host without a limit of its
    own, said once, and the host's start message says why."""

    def unavailable(limit):
        raise memory_cgroup.Unavailable("cannot make a memory cgroup beneath /x: Permission "
                                        "denied (with cgroup v1 only root makes cgroups)")  # fmt: skip

    monkeypatch.setattr(memory_cgroup, "make", unavailable)
    monkeypatch.setattr(running_host, "_SAID", [])
    monkeypatch.setenv(limits.MEMORY_ENV, "1024")
    with pytest.raises(IdrsError, match=r"plugin hosts \(--plugin-memory 1024 .*\) cannot be "
                                        r"enforced here: cannot make a memory cgroup"):  # fmt: skip
        running_host.host_memory_cgroup()
    monkeypatch.delenv(limits.MEMORY_ENV)
    for _ in range(2):
        cgroup, message = running_host.host_memory_cgroup()
        assert cgroup is None and message["limit"] is None
        assert "only root makes cgroups" in message["why"]
    assert capsys.readouterr().err.count("plugin hosts run without a memory limit") == 1


def test_the_cgroups_of_a_harness_that_is_gone_are_swept(cgroup_limit):
    """A harness killed with its keepers leaves empty cgroups: the next one removes those
    whose harness has ended, not the live ones (its own, another harness's)."""
    mine = cgroup_limit(64 * MiB)
    parent = os.path.dirname(mine.path)
    dead = _ended_pid()
    gone = os.path.join(parent, f"{memory_cgroup.PREFIX}{dead}-0a1b2c3d")
    os.mkdir(gone)
    assert memory_cgroup.sweep_abandoned(parent) == [os.path.basename(gone)]
    assert not os.path.exists(gone) and os.path.isdir(mine.path)


@pytest.mark.parametrize("passes", [True, False])
def test_on_cgroup_v2_a_host_cgroup_goes_beneath_the_harness_s_or_beside_it(
    tmp_path, monkeypatch, passes
):
    """cgroup v2 (a folder tree standing for one; the kernel's files are plain files here):
    beneath the harness's cgroup where it passes the memory controller to its children,
    else beside it, beneath the cgroup above; limited to the limit, no swap, killed as a
    group."""
    slice_ = tmp_path / "app.slice"
    own = slice_ / "run.scope"
    own.mkdir(parents=True)
    for folder in (slice_, own):
        (folder / "cgroup.controllers").write_text("cpu memory pids\n")
        (folder / "cgroup.subtree_control").write_text("")
    monkeypatch.setattr(memory_cgroup, "hierarchy", lambda: (2, str(own)))
    monkeypatch.setattr(memory_cgroup, "_SWEPT", [True])
    if not passes:  # (the kernel refuses: the harness's cgroup holds processes)

        def busy(parent):
            raise memory_cgroup.Unavailable(f"cannot enable it for {parent}: busy")

        monkeypatch.setattr(memory_cgroup, "_pass_memory_controller", busy)
    cgroup = memory_cgroup.make(256 * MiB)
    assert os.path.dirname(cgroup.path) == str(own if passes else slice_)
    assert cgroup.version == 2 and cgroup.limit == 256 * MiB
    assert {name: (tmp_path / cgroup.path / name).read_text() for name in
            ("memory.max", "memory.oom.group", "memory.swap.max")} == {
        "memory.max": str(256 * MiB), "memory.oom.group": "1", "memory.swap.max": "0"}  # fmt: skip
    if passes:
        assert (own / "cgroup.subtree_control").read_text() == "+memory"


def _ended_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


HOARDING = '''
import os

from harness import Constant, MethodSpec, SigmaProviderSpec, hookimpl

IDRS_BENCH_CONTRACT = 3
CAP_MIB = 2048  # never more than this, should the limit not hold


def _memfd():
    """Shared memory that is never mapped: in no process's RSS, which the out-of-memory
    killer's score counts."""
    fd = os.memfd_create("hoard")
    for _ in range(CAP_MIB):
        os.write(fd, b"m" * (1 << 20))


def _anon():
    held = [bytes([i % 251]) * (1 << 20) for i in range(CAP_MIB)]
    return len(held)


def _lower():
    with open(f"/proc/self/task/{{os.getpid()}}/oom_score_adj", "w") as adj:
        adj.write("0")
    import time

    time.sleep(120)  # (its keeper ends it)


ACTS = {{"memfd": _memfd, "anon": _anon, "lower": _lower}}

'''
DISTRIBUTION = "idrs-test-hoarding"
LIMIT_MIB = 768
"""The test's memory limit per host: a host importing torch takes some 300 MiB."""


def test_a_plugin_that_fills_memory_fails_its_row_and_the_harness_survives(
    install_plugin, acting_plugin, tmp_path, monkeypatch, cgroup_limit, capsys, beside_cohen
):
    """One run under a memory limit of 768 MiB per host: the rows whose plugin filled a memfd
    it never mapped and anonymous memory (up to 2 GiB) failed, naming the out-of-memory
    killer, the memory and the limit; the row whose plugin lowered its host's
    ``oom_score_adj`` failed saying so (or, where the kernel refuses, with the plugin's
    error); the built-in row certified, and the harness lived to say so."""
    from harness.cli.main import ROWS_FAILED, main
    from harness.store.storedrun import load_runs

    cgroup_limit(MiB).remove()  # (skips where no memory cgroup can be made)
    install_plugin("idrs_test_hoarding", acting_plugin(HOARDING.format(), "hoarding", "hoard"),
                   distribution=DISTRIBUTION)  # fmt: skip
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    spec = tmp_path / "hoarding.toml"
    spec.write_text(
        beside_cohen("hoarding", [f"hoard-{act}" for act in ("memfd", "anon", "lower")])
    )
    db = tmp_path / "runs.sqlite"
    argv = ["run", str(spec), "--db", str(db), "--quiet", "--no-check", "--plugin-memory",
            str(LIMIT_MIB), "--plugin-timeout", "60"]  # fmt: skip
    assert main(argv) == ROWS_FAILED
    [run] = load_runs(db)
    failures = {f["method"].removeprefix("hoard-"): f["error"] for f in run.failures}
    assert sorted(failures) == ["anon", "lower", "memfd"], failures
    for act in ("memfd", "anon"):
        said = failures[act]
        assert f"the plugin host of {DISTRIBUTION}" in said, said
        assert "was killed by the out-of-memory killer at " in said, said
        assert " MiB while answering the request 'sigma'" in said
        assert f"; limit {LIMIT_MIB} MiB for the host and every process it started" in said
        assert f"--plugin-memory {2 * LIMIT_MIB}" in said
    if _pinned() and policy.refusal(landlock.landlock_abi()) is None:  # (confined)
        assert "PermissionError" in failures["lower"], failures["lower"]
    else:
        assert "lowered its oom_score_adj from 1000 to 0" in failures["lower"], failures["lower"]
    counts = run.counts()
    assert {m for m, _ in counts} == {"cohen"} and set(counts.values()) == {4}
    assert "3 row(s) failed" in capsys.readouterr().out
    alone = tmp_path / "alone.sqlite"  # the built-in row certifies exactly as without them
    spec.write_text(beside_cohen("hoarding"))
    assert main(["run", str(spec), "--db", str(alone), "--quiet", "--no-check"]) == 0

    def cohen(path) -> list[tuple]:
        with sqlite3.connect(path) as con:
            return con.execute("SELECT input_id, prediction, radius, p_lower FROM certificates "
                               "WHERE method = 'cohen' ORDER BY input_id").fetchall()  # fmt: skip

    assert len(cohen(db)) == 4 and cohen(db) == cohen(alone)
    assert list(temporary.glob("idrs-plugin-host-*")) == []
