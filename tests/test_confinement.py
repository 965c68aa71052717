"""The plugin host's confinement (harness/plugin/hosting/shared/policy.py, what is granted;
shared/landlock.py and in_host/confinement.py, how; docs/threat-model.md): the policy held to
the threat model's tables, the
Landlock ruleset of each ABI, each layer on this kernel, and the refusal on a kernel
without Landlock, with ``--unconfined`` as the recorded way out."""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import socket
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from harness.foundation.errors import IdrsError
from harness.plugin.hosting.in_harness import confinement_options
from harness.plugin.hosting.in_host import driver_probe
from harness.plugin.hosting.shared import landlock, policy, process_privileges
from harness.plugin.hosting.shared.landlock import Grants, ruleset
from harness.plugin.hosting.shared.policy import refusal

CONFINABLE = refusal(landlock.landlock_abi()) is None
needs_landlock = pytest.mark.skipif(not CONFINABLE, reason="this kernel has no Landlock ABI >= 3")

# include/uapi/linux/landlock.h: the access rights, bit by bit, and what each ABI added
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 0x1, 0x2, 0x4, 0x8
TRUNCATE, IOCTL_DEV = 0x4000, 0x8000
GRANTS = Grants(read=("/lib", "/etc/passwd"), write=("/scratch",), devices=("/dev/null",))


def _is_dir(path: str) -> bool:
    return path in ("/lib", "/scratch")


@pytest.mark.parametrize("abi, fs, net, scoped", [
    (1, 0x1FFF, 0, 0),  # EXECUTE ... MAKE_SYM
    (2, 0x3FFF, 0, 0),  # + REFER
    (3, 0x7FFF, 0, 0),  # + TRUNCATE
    (4, 0x7FFF, 0x3, 0),  # + NET_BIND_TCP, NET_CONNECT_TCP
    (5, 0xFFFF, 0x3, 0),  # + IOCTL_DEV
    (6, 0xFFFF, 0x3, 0x3),  # + SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL
    (7, 0xFFFF, 0x3, 0x3),  # (audit logging: no new right)
])  # fmt: skip
def test_the_ruleset_governs_what_each_abi_knows_and_grants_within_it(abi, fs, net, scoped):
    rules = ruleset(GRANTS, abi, _is_dir)
    assert (rules.handled_fs, rules.handled_net, rules.scoped) == (fs, net, scoped)
    granted = dict(rules.rules)
    assert granted["/lib"] == EXECUTE | READ_FILE | READ_DIR
    assert granted["/etc/passwd"] == EXECUTE | READ_FILE  # a file: no directory right
    assert granted["/scratch"] == fs  # everything the ABI governs, beneath the scratch folder
    device = READ_FILE | WRITE_FILE | (TRUNCATE if abi >= 3 else 0) | (IOCTL_DEV if abi >= 5 else 0)
    assert granted["/dev/null"] == device
    assert all(allowed & ~fs == 0 for allowed in granted.values())  # none beyond the ABI


def test_the_host_writes_only_its_own_threads_files_beneath_proc_and_keeps_them_pinned():
    """``/proc`` is read only; beneath the host's own ``/proc/<pid>/task`` it may also write
    a file (a thread's name; the CUDA driver names its threads), no other right, and that
    folder is pinned (procfs makes it anew on each lookup otherwise)."""
    own = "/proc/4242/task"
    grants = Grants(read=("/proc",), threads=(own,))
    for abi in (3, 5, 7):
        rules = ruleset(grants, abi, lambda p: True)
        granted = dict(rules.rules)
        assert granted == {"/proc": EXECUTE | READ_FILE | READ_DIR, own: WRITE_FILE | TRUNCATE}
        assert rules.pinned == (own,)
    assert policy.own_threads() == f"/proc/{os.getpid()}/task"


NVIDIA = ("/dev/nvidia-caps", "/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
          "/dev/nvidia0", "/dev/nvidiactl")  # fmt: skip


@pytest.mark.parametrize("abi", [3, 4, 5, 7])
def test_nvidia_device_files_open_for_reading_writing_and_ioctl_and_their_folder_lists(abi):
    """Each NVIDIA device file: read, write (and truncate, which ``O_TRUNC`` asks for) and,
    from ABI 5, which governs it, ``ioctl``; ``nvidia-caps/``, a folder, is listed too and
    grants the same on the files beneath. Nothing else: no execute, make, remove or rename."""
    rules = ruleset(Grants(devices=NVIDIA), abi, lambda p: p.endswith("-caps"))
    device = READ_FILE | WRITE_FILE | TRUNCATE | (IOCTL_DEV if abi >= 5 else 0)
    assert dict(rules.rules) == {p: device | (READ_DIR if p.endswith("-caps") else 0)
                                 for p in NVIDIA}  # fmt: skip
    assert rules.pinned == ()


def test_nvidia_device_files_are_found_by_name(tmp_path):
    for name in (*(p.split("/")[-1] for p in NVIDIA), "null", "nvme0n1", "dri"):
        (tmp_path / name).mkdir() if name in ("nvidia-caps", "dri") else (tmp_path / name).touch()
    assert policy.gpu_devices(str(tmp_path)) == sorted(str(tmp_path / p.split("/")[-1])
                                                            for p in NVIDIA)  # fmt: skip


@pytest.mark.parametrize("layers, fs, net, scoped", [
    (("landlock-fs",), 0xFFFF, 0, 0),
    (("landlock-net",), 0, 0x3, 0x3),
    (("seccomp", "capabilities"), 0, 0, 0),
    (policy.LAYERS, 0xFFFF, 0x3, 0x3),
])  # fmt: skip
def test_each_landlock_layer_governs_its_own_rights(layers, fs, net, scoped):
    rules = ruleset(GRANTS, 7, _is_dir, layers)
    assert (rules.handled_fs, rules.handled_net, rules.scoped) == (fs, net, scoped)
    assert bool(rules.rules) == bool(fs)


def test_a_ruleset_needs_landlock():
    with pytest.raises(ValueError):
        ruleset(GRANTS, 0)


def test_no_landlock_system_call_reads_as_abi_0(monkeypatch):
    def enosys(*_):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(landlock, "_syscall", enosys)
    assert landlock.landlock_abi() == 0


@pytest.mark.parametrize("abi", [0, 1, 2])
def test_a_kernel_that_cannot_confine_is_refused_naming_the_feature_and_the_opt_out(abi):
    message = refusal(abi)
    assert "Landlock" in message and "ABI >= 3 (Linux >= 6.2" in message
    assert "--unconfined" in message and "IDRS_BENCH_PLUGINS=''" in message
    assert ("no Landlock" if abi == 0 else f"Landlock ABI {abi}") in message
    assert refusal(3) is None and refusal(7) is None


def test_the_host_refuses_to_confine_itself_with_threads_running():
    """A thread started before confinement would stay outside it: refused."""
    code = ("import threading, time\n"
            "from harness.plugin.hosting.in_host.confinement import confine\n"
            "from harness.plugin.hosting.shared.landlock import Grants\n"
            "threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
            "confine(Grants(), abi=7)\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1 and "threads before it is confined" in done.stderr


LAYER = r"""
import json, os, socket, sys
from harness.plugin.hosting.in_host.confinement import confine
from harness.plugin.hosting.shared.policy import HostPaths, host_policy

layers, scratch, port, outside = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3]), sys.argv[4]
confine(host_policy(HostPaths(scratch=scratch)).landlock(), layers=layers)
out = {}

def attempt(name, action):
    try:
        action()
        out[name] = "done"
    except OSError as exc:
        out[name] = exc.errno

attempt("tcp", lambda: socket.create_connection(("127.0.0.1", port), timeout=5).close())
attempt("socketpair", lambda: [s.close() for s in socket.socketpair()])
attempt("write outside", lambda: open(outside, "a").close())
attempt("write scratch", lambda: open(os.path.join(scratch, "f"), "w").close())
attempt("set-uid", lambda: os.chmod(os.path.join(scratch, "f"), 0o4755))
attempt("chmod", lambda: os.chmod(os.path.join(scratch, "f"), 0o600))
attempt("chown", lambda: os.chown(os.path.join(scratch, "f"), os.getuid(), os.getgid()))
attempt("memory", lambda: open(f"/proc/{os.getppid()}/mem", "rb").close())
attempt("signal", lambda: os.kill(os.getppid(), 0))
print(json.dumps(out))
"""


@needs_landlock
@pytest.mark.parametrize("layer, expected", [
    ("landlock-fs,landlock-net", {"tcp": errno.EACCES, "socketpair": "done",
                                  "write outside": errno.EACCES, "write scratch": "done",
                                  "set-uid": "done", "chmod": "done", "chown": "done",
                                  "memory": errno.EACCES, "signal": errno.EPERM}),
    ("landlock-fs", {"tcp": "done", "socketpair": "done", "write outside": errno.EACCES,
                     "write scratch": "done", "set-uid": "done", "chmod": "done", "chown": "done",
                     "memory": errno.EACCES, "signal": "done"}),
    ("landlock-net", {"tcp": errno.EACCES, "socketpair": "done", "write outside": "done",
                      "write scratch": "done", "set-uid": "done", "chmod": "done", "chown": "done",
                      "memory": errno.EACCES, "signal": errno.EPERM}),
    ("seccomp", {"tcp": errno.EPERM, "socketpair": "done", "write outside": "done",
                 "write scratch": "done", "set-uid": errno.EPERM, "chmod": "done",
                 "chown": errno.EPERM, "memory": "done", "signal": "done"}),
])  # fmt: skip
def test_each_layer_alone_refuses_what_it_governs(tmp_path, layer, expected):
    """Through :func:`~harness.plugin.hosting.in_host.confinement.confine` with some of its
    layers, to what the policy grants a host: Landlock refuses the TCP connect and the
    signal (its network and scope rules), the write outside the scratch folder (its filesystem rules) and the parent's memory (its ptrace restriction,
    with either); the seccomp filter alone refuses the socket and the set-uid bit (chown
    too); each lets through what the others govern."""
    abi = landlock.landlock_abi()
    if layer == "landlock-net" and abi < 4:
        pytest.skip(f"Landlock ABI {abi} has no network nor scope rules")
    if "landlock-net" in layer and abi < 6:
        expected = {**expected, "signal": "done"}
    if "landlock-net" in layer and abi < 4:
        expected = {**expected, "tcp": "done"}
    scratch, outside = tmp_path / "scratch", tmp_path / "outside"
    scratch.mkdir()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        done = subprocess.run([sys.executable, "-c", LAYER, layer, str(scratch), str(port),
                               str(outside)], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == expected
    assert outside.exists() == (expected["write outside"] == "done")


SPEC = """name = "tiny"
[dataset]
name = "ball-2"
test_count = 4
[model]
architecture = "ball-N"
trainer = "none"
[certification]
n0 = 32
n = 200
batch_size = 1024
[[methods]]
name = "cohen-half"
settings = [{ sigma = 0.5 }]
"""


def test_without_landlock_plugins_are_refused_and_an_unconfined_run_says_so(
    install_plugin, half_sigma_plugin, tmp_path, monkeypatch, capsys
):
    """On a kernel without Landlock (simulated), a run that loads a third-party plugin
    fails with one error naming the feature and the opt-out; with ``--unconfined`` it runs,
    and its record and its board's protocol header say that its plugins ran unconfined."""
    from harness.cli.main import main
    from harness.store.storedrun import load_runs

    install_plugin("idrs_test_half", half_sigma_plugin(), distribution="idrs-test-half")
    monkeypatch.setattr(landlock, "landlock_abi", lambda: 0)
    monkeypatch.delenv(policy.UNCONFINED_ENV, raising=False)
    spec, db = tmp_path / "tiny.toml", tmp_path / "runs.sqlite"
    spec.write_text(SPEC)
    argv = ["run", str(spec), "--db", str(db), "--quiet", "--no-check"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error: third-party plugins run only in a plugin host confined by the kernel" in err
    assert "no Landlock" in err and "--unconfined" in err
    assert main([*argv, "--unconfined"]) == 0
    assert policy.UNCONFINED_ENV not in os.environ  # (only for the command's duration)
    [run] = load_runs(db)
    assert run.run["plugin_hosts"] == {"third_party": ["idrs-test-half 0.1"],
                                       "confinement": "unconfined", "plugin_timeout": 1800}  # fmt: skip
    capsys.readouterr()
    assert main(["leaderboard", "--db", str(db)]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if "| plugins |" in line)
    assert "UNCONFINED (--unconfined)" in header
    assert "idrs-test-half 0.1 ran with the user's rights" in header


@pytest.mark.slow
@needs_landlock
def test_a_confined_run_records_its_plugin_hosts_and_a_resume_unconfined_is_added(
    install_plugin, half_sigma_plugin, tmp_path
):
    """The record of a run whose plugins ran confined, then of the same run's checks run
    unconfined: both kept, and the board states the weaker."""
    from harness.audit.audit import Budget
    from harness.audit.auditor import run_checks
    from harness.foundation.progress import Progress
    from harness.plugin.manager import PluginManager
    from harness.reports.leaderboard.stated_protocol import plugin_hosts_statement
    from harness.running.benchmark import load_benchmark
    from harness.running.preparation import RunOptions
    from harness.running.runner import run_benchmark

    install_plugin("idrs_test_half", half_sigma_plugin(), distribution="idrs-test-half")
    spec, db = tmp_path / "tiny.toml", tmp_path / "runs.sqlite"
    spec.write_text(SPEC)
    manager = PluginManager()
    run_id = run_benchmark(load_benchmark(spec, []), RunOptions(db=db), Progress(False), manager)
    confined = manager.hosting()
    assert confined == {"third_party": ["idrs-test-half 0.1"], "plugin_timeout": 1800,
                        "confinement": confinement_options.description(landlock.landlock_abi())}  # fmt: skip
    with confinement_options.opted_out(True):
        tiny = Budget("tiny", coverage_trials=4, coverage_n=50, pairs=1, ascent_steps=1,
                      audited_inputs=1, attack_steps=1, attack_samples=4, orders=1)  # fmt: skip
        run_checks(db, run_id, RunOptions(db=db), Progress(False), PluginManager(), budget=tiny,
                   attack=False)  # fmt: skip
    with sqlite3.connect(db) as con:
        [(recorded,)] = con.execute("SELECT plugin_hosts FROM runs").fetchall()
    unconfined = {"third_party": ["idrs-test-half 0.1"], "confinement": "unconfined",
                  "plugin_timeout": 1800}  # fmt: skip
    assert json.loads(recorded) == {"varied": [confined, unconfined]}
    assert plugin_hosts_statement(json.loads(recorded)).startswith("UNCONFINED")
    assert "confined by the kernel (Landlock ABI" in plugin_hosts_statement(confined)
    assert plugin_hosts_statement(confined).endswith("; a request to a host limited to 1800 s")


def test_an_unconfined_value_other_than_1_is_an_error(monkeypatch):
    monkeypatch.setenv(policy.UNCONFINED_ENV, "yes")
    with pytest.raises(IdrsError, match="IDRS_BENCH_UNCONFINED='yes'; use 1"):
        confinement_options.unconfined_requested()


def test_the_seccomp_filter_refuses_other_architectures_and_x32():
    """Classic BPF of the filter: the architecture is checked first (another one's calls
    are refused whole), and x32 numbers (bit 30) are refused on x86_64."""
    program = process_privileges.seccomp_program("x86_64")
    load_arch, check_arch = program[0], program[1]
    assert load_arch == (0x20, 0, 0, 4) and check_arch[3] == 0xC000003E
    deny = len(program) - 2
    assert program[deny] == (0x06, 0, 0, 0x00050000 | errno.EPERM)
    assert 2 + check_arch[2] == deny  # the mismatch jumps to the refusal
    assert (0x35, deny - 4, 0, 0x40000000) == program[3]
    for machine in process_privileges.SECCOMP_MACHINES:  # every jump lands inside, forward
        for cuda in (False, True):
            program = process_privileges.seccomp_program(machine, unix_seqpacket=cuda)
            assert all(at + 1 + max(jt, jf) < len(program) for at, (code, jt, jf, _)
                       in enumerate(program) if code & 0x07 == 0x05), (machine, cuda)  # fmt: skip
            assert (
                program[-1] == (0x06, 0, 0, 0x7FFF0000) and program[-2][3] & 0xFFFF == errno.EPERM
            )


PID = 4242
"""The host's pid in the programs the tests below evaluate."""
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}  # include/uapi/linux/audit.h
NOT_GOVERNED = {
    "read": (0, 63),
    "sched_getaffinity": (204, 123),
    "getpriority": (140, 141),
    "sched_getscheduler": (145, 120),
}  # (x86_64, aarch64): the kernel's tables
"""System calls the filter leaves alone: reads of another process's scheduling, which
``/proc/<pid>/stat`` shows anyway and glibc makes per thread by its id."""


def _decide(program, machine: str, number: int, args=(), arch: int | None = None) -> str:
    """Run the classic-BPF ``program`` on a ``struct seccomp_data`` (nr, arch, the
    instruction pointer, six 64-bit arguments; little-endian): "allow" or "deny"."""
    arguments = [*args, 0, 0, 0, 0, 0, 0][:6]
    data = struct.pack("<iIQ6Q", number, AUDIT_ARCH[machine] if arch is None else arch, 0,
                       *(a & (1 << 64) - 1 for a in arguments))  # fmt: skip
    accumulator, at = 0, 0
    while True:
        code, jt, jf, k = program[at]
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            accumulator, at = struct.unpack_from("<I", data, k)[0], at + 1
        elif code == 0x54:  # BPF_ALU | BPF_AND | BPF_K
            accumulator, at = accumulator & k, at + 1
        elif code == 0x06:  # BPF_RET | BPF_K
            answers = {0x7FFF0000: "allow", 0x00050000 | errno.EPERM: "deny",
                       0x00050000 | errno.ENOSYS: "enosys"}  # fmt: skip
            return answers[k]
        else:  # BPF_JMP | BPF_JEQ, BPF_JGE, BPF_JSET (| BPF_K)
            taken = {0x15: accumulator == k, 0x35: accumulator >= k, 0x45: accumulator & k}[code]
            at += 1 + (jt if taken else jf)


HIGH = 1 << 32
"""A pid's high word (the kernel drops it: a ``pid_t`` is an int)."""
DECISIONS = [
    ("prlimit64", (0,), "allow"), ("prlimit64", (PID,), "allow"),
    ("prlimit64", (PID | 7 * HIGH,), "allow"), ("prlimit64", (HIGH,), "allow"),
    ("prlimit64", (1,), "deny"), ("prlimit64", (PID + 1,), "deny"),
    ("prlimit64", ((PID + 1) | PID * HIGH,), "deny"), ("prlimit64", (-1,), "deny"),
    ("setpriority", (0, 0), "allow"), ("setpriority", (0, PID), "allow"),
    ("setpriority", (0, 1), "deny"), ("setpriority", (1, 0), "deny"),  # PRIO_PGRP
    ("setpriority", (2, 0), "deny"), ("setpriority", (2, PID), "deny"),  # PRIO_USER
    ("ioprio_set", (1, 0), "allow"), ("ioprio_set", (1, PID), "allow"),  # IOPRIO_WHO_PROCESS
    ("ioprio_set", (1, 1), "deny"), ("ioprio_set", (2, 0), "deny"), ("ioprio_set", (3, 0), "deny"),
    ("sched_setaffinity", (0,), "allow"), ("sched_setaffinity", (PID,), "allow"),
    ("sched_setaffinity", (PID + 1,), "deny"),
    *((name, (1,), "deny") for name in ("sched_setscheduler", "sched_setparam", "sched_setattr",
                                        "migrate_pages", "move_pages", "process_vm_readv",
                                        "process_vm_writev", "get_robust_list", "pidfd_open")),
    ("pidfd_open", (PID,), "allow"), ("sched_setscheduler", (0, 5), "allow"),
    ("perf_event_open", (0x1000, 0), "allow"), ("perf_event_open", (0x1000, PID), "allow"),
    ("perf_event_open", (0x1000, -1), "deny"), ("perf_event_open", (0x1000, 1), "deny"),
    ("kcmp", (PID, PID), "allow"), ("kcmp", (PID, 1), "deny"), ("kcmp", (1, PID), "deny"),
    ("socketpair", (1, 1 | 0x80000), "allow"), ("socketpair", (1, 5), "allow"),  # AF_UNIX
    ("socketpair", (1, 2), "deny"), ("socketpair", (1, 3), "deny"),  # SOCK_DGRAM, SOCK_RAW
    ("socketpair", (2, 1), "deny"),  # AF_INET
    ("sendto", (3, 0x1000, 1, 0, 0, 0), "allow"),
    ("sendto", (3, 0x1000, 1, 0, 0x7FFF0000, 16), "deny"),
    ("sendto", (3, 0x1000, 1, 0, HIGH, 16), "deny"),
    ("fchmod", (3, 0o4755), "deny"), ("fchmod", (3, 0o755), "allow"),
    ("fchmodat", (3, 0, 0o2755), "deny"), ("fchmodat", (3, 0, 0o755), "allow"),
    ("fchmodat2", (3, 0, 0o6000, 0), "deny"), ("fchown", (3, 0, 0), "deny"),
    ("io_uring_setup", (8, 0), "deny"), ("clone3", (0x1000, 88), "enosys"),
]  # fmt: skip


@pytest.mark.parametrize("machine", process_privileges.SECCOMP_MACHINES)
def test_the_seccomp_filter_decides_each_rule_on_both_architectures(machine):
    """The program of each architecture, run on the calls it is built for: a pid argument
    names the host (0, its pid, whatever the high word) or the call is refused; a process
    group or a user is refused; System V IPC, message queues and keys are refused whatever
    the arguments; a socket pair only connected (stream, seqpacket), ``sendto`` only
    without an address; and what no rule names passes, another architecture's calls not."""
    for cuda in (False, True):
        program = process_privileges.seccomp_program(machine, unix_seqpacket=cuda, pid=PID)
        number = functools.partial(process_privileges.system_call_number, machine=machine)
        for name, args, expected in DECISIONS:
            assert _decide(program, machine, number(name), args) == expected, (name, args)
        refused = [c.name for c in process_privileges.SYSTEM_CALLS
                   if isinstance(c.rule, process_privileges.Refused)]  # fmt: skip
        assert {"shmget", "msgget", "semget", "mq_open", "add_key", "keyctl"} <= set(refused)
        for name in refused:
            if number(name) is not None:
                assert _decide(program, machine, number(name), (0, 0, 0)) == "deny", name
        for name, numbers in NOT_GOVERNED.items():
            nr = numbers[process_privileges.SECCOMP_MACHINES.index(machine)]
            assert _decide(program, machine, nr, (1, 2, 3)) == "allow", name
        socket_ = number("socket")
        assert _decide(program, machine, socket_, (1, 5 | 0x80000)) == ("allow" if cuda else "deny")
        assert _decide(program, machine, socket_, (1, 1)) == "deny"
        assert _decide(program, machine, 0, arch=0x40000003) == "deny"  # i386
    if machine == "x86_64":
        assert _decide(program, machine, 0x40000000) == "deny"  # x32's read


HEADERS = {"x86_64": "/usr/include/x86_64-linux-gnu/asm/unistd_64.h",
           "aarch64": "/usr/include/asm-generic/unistd.h"}  # fmt: skip


@pytest.mark.parametrize("machine", process_privileges.SECCOMP_MACHINES)
def test_the_filters_system_call_numbers_are_the_kernels(machine):
    """Each number of the filter's table is the one the kernel's headers (Linux's UAPI,
    as installed here) give it, where they name the call; a call the architecture lacks
    (None) is absent from them."""
    header = Path(HEADERS[machine])
    if not header.exists():
        pytest.skip(f"{header} is not installed")
    defined = dict(re.findall(r"#define __NR_(\w+)\s+(\d+)", header.read_text()))
    compared = 0
    for call in process_privileges.SYSTEM_CALLS:
        number = getattr(call, machine)
        if number is None:
            assert call.name not in defined, call.name
        elif call.name in defined:
            assert int(defined[call.name]) == number, call.name
            compared += 1
    present = [c for c in process_privileges.SYSTEM_CALLS if getattr(c, machine) is not None]
    assert compared >= len(present) - 1  # (fchmodat2, Linux 6.6, may be newer than them)
    for name, numbers in NOT_GOVERNED.items():
        assert int(defined[name]) == numbers[process_privileges.SECCOMP_MACHINES.index(machine)]


def test_the_threat_model_names_every_system_call_the_filter_governs():
    """docs/threat-model.md lists each of the filter's system calls (its table)."""
    text = (Path(__file__).parents[1] / "docs" / "threat-model.md").read_text()
    missing = [c.name for c in process_privileges.SYSTEM_CALLS if f"`{c.name}`" not in text]
    assert missing == []


def threat_model_table(heading: str, text: str | None = None) -> list[list[str]]:
    """The rows of the first table beneath the heading ``### heading`` of
    docs/threat-model.md (``text``: the page), its header left out, each cell stripped."""
    if text is None:
        text = (Path(__file__).parents[1] / "docs" / "threat-model.md").read_text()
    lines = text.split(f"\n### {heading}\n", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows[2:]


def _plain(cell: str) -> str:
    return cell.replace("`", "")


EVERY_PATH = policy.HostPaths(sent="/sent", data_roots=("/data",), builtin_artifacts=("/b",),
                              scratch="/scratch", artifacts=("/a",), gpu=("/dev/nvidia0",))  # fmt: skip
"""A host's paths with every kind the harness grants (those that do not exist are left out
of the grants' paths, not the grants)."""


def test_the_policy_grants_what_the_threat_models_table_says_in_its_order():
    """Each grant of :func:`~harness.plugin.hosting.shared.policy.host_policy` is a row of
    docs/threat-model.md's table "What a host may reach, and why", in order, with the same
    right; and each row is a grant."""
    documented = [(_plain(row[0]), row[1]) for row in threat_model_table(
        "What a host may reach, and why")]  # fmt: skip
    granted = [(g.what, g.right) for g in policy.host_policy(EVERY_PATH).grants]
    assert documented == granted
    assert {right for _, right in granted} == {policy.READ, policy.WRITE, policy.DEVICE,
                                               policy.THREAD_NAMES}  # fmt: skip


def test_the_policy_refuses_the_system_calls_of_the_threat_models_table_by_its_rules():
    """Every system call the policy's filter governs is named in docs/threat-model.md's
    table "What the seccomp filter refuses, and why" and every one named there is governed,
    its "refused" cell saying the policy's rule (:func:`~harness.plugin.hosting.shared.
    the rule's `WORDS`; "always", exactly, for a call refused whole)."""
    named = {}
    for calls, rule, _why in threat_model_table("What the seccomp filter refuses, and why"):
        named |= {name: rule for name in re.findall(r"`(\w+)`", calls)}
    governed = policy.host_policy(EVERY_PATH).system_calls
    assert sorted(named) == sorted(c.name for c in governed)
    said = {c.name: named[c.name] for c in governed
            if c.rule.WORDS not in named[c.name]
            or (named[c.name] == "always") != isinstance(c.rule, process_privileges.Refused)}  # fmt: skip
    assert said == {}


def test_the_table_check_sees_a_grant_or_a_call_the_page_leaves_out():
    """The check of the two tests above fails on a page whose table lacks a grant or a
    call, or says another right or rule."""
    page = (Path(__file__).parents[1] / "docs" / "threat-model.md").read_text()
    altered = page.replace("| its scratch folder | write |", "| its scratch folder | read |")
    altered = altered.replace(
        "| `prlimit64` | unless on the host itself |", "| `prlimit64` | always |"
    )
    altered = altered.replace("`add_key`, `request_key`, `keyctl`", "`add_key`, `request_key`")
    rows = threat_model_table("What a host may reach, and why", altered)
    assert ["its scratch folder", "read"] in [row[:2] for row in rows]
    calls = {name: row[1] for row in threat_model_table("What the seccomp filter refuses, and why",
             altered) for name in re.findall(r"`(\w+)`", row[0])}  # fmt: skip
    assert calls["prlimit64"] == "always" and "keyctl" not in calls


def test_the_policy_of_a_host_and_of_a_plugins_build(tmp_path):
    """A host's policy grants the paths the harness names it (those that exist) with their
    rights, its own threads' folder, its Python and the system's files less
    ``/usr/share/datasets``, and the CUDA driver's socket with a GPU's device files; a
    plugin's build writes its build folder only, and has no GPU, no data root and no
    artifact folder."""
    gpu = tmp_path / "nvidia0"
    gpu.touch()
    paths = policy.HostPaths(sent=str(tmp_path), data_roots=(str(tmp_path / "gone"),),
                             scratch="/tmp", gpu=(str(gpu),))  # fmt: skip
    host = policy.host_policy(paths)
    grants = host.landlock()
    assert str(tmp_path) in grants.read and str(tmp_path / "gone") not in grants.read
    assert grants.write == ("/tmp",) and str(gpu) in grants.devices and host.cuda_socket()
    assert grants.threads == (policy.own_threads(),)
    assert not any(p.startswith("/usr/share/datasets") for p in grants.read)
    build = policy.install_build_policy("/tmp")
    assert build.landlock().write == ("/tmp",) and not build.cuda_socket()
    assert build.landlock().devices == policy.existing(policy.SYSTEM_DEVICES)
    assert build.landlock().threads == (policy.own_threads(),) and build.memory is None


SOCKETS = r"""
import json, socket, sys
from harness.plugin.hosting.in_host.confinement import confine
from harness.plugin.hosting.shared.policy import HostPaths, host_policy

# a file named as NVIDIA's device files: a GPU granted, as far as the filter's choice goes
layers, devices = sys.argv[1].split(","), tuple(sys.argv[2:])
confine(host_policy(HostPaths(gpu=devices)).landlock(), layers=layers)
out = {}
for family, kind in (("AF_UNIX", "SOCK_SEQPACKET"), ("AF_UNIX", "SOCK_STREAM"),
                     ("AF_UNIX", "SOCK_DGRAM"), ("AF_INET", "SOCK_DGRAM"), ("AF_INET", "SOCK_STREAM"),
                     ("AF_INET", "SOCK_SEQPACKET")):
    flags = socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
    try:
        socket.socket(getattr(socket, family), getattr(socket, kind) | flags).close()
        out[f"{family} {kind}"] = "done"
    except OSError as exc:
        out[f"{family} {kind}"] = exc.errno
print(json.dumps(out))
"""


@pytest.mark.parametrize("gpu", [False, True])
@pytest.mark.parametrize("layers", ["seccomp", ",".join(policy.LAYERS)])
def test_the_seccomp_filter_lets_the_cuda_drivers_socket_through_only_with_a_gpu(
    tmp_path, gpu, layers
):
    """``cuInit`` makes ``socket(AF_UNIX, SOCK_SEQPACKET)`` (refused, it fails with error
    304): a host granted a GPU's device files may make that socket (whatever its flags),
    no other; a host without a GPU none. With every layer too: the choice does not need
    to list ``/dev``, which Landlock closes first."""
    if layers != "seccomp" and landlock.landlock_abi() < policy.MINIMUM_ABI:
        pytest.skip("no Landlock on this kernel")
    device = tmp_path / "nvidia0"
    device.write_bytes(b"")
    granted = [str(device)] if gpu else []
    done = subprocess.run([sys.executable, "-c", SOCKETS, layers, *granted],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    outcomes = json.loads(done.stdout)
    assert outcomes.pop("AF_UNIX SOCK_SEQPACKET") == ("done" if gpu else errno.EPERM)
    assert policy.grants_gpu(Grants(devices=tuple(granted))) is gpu
    assert set(outcomes.values()) == {errno.EPERM}, outcomes


@needs_landlock
@pytest.mark.gpu
def test_a_confined_host_certifies_on_cuda(install_plugin, half_sigma_plugin, linear_model):
    """A third-party σ-provider certifies on the GPU from its confined host (NVIDIA's
    device files granted, CUDA's caches in the scratch folder): the same certificates as
    Cohen's certifier at half the σ in the harness's process."""
    import torch

    from harness.api import certify
    from harness.plugin.manager import PluginManager

    install_plugin("idrs_test_half", half_sigma_plugin(), distribution="idrs-test-half")
    assert PluginManager().registry.get("methods", "cohen-half").sigma_provider == "half"
    model = linear_model(torch.tensor([1.0, 0.0]), 0.0)
    x, y = torch.tensor([[0.3, 0.1], [-0.8, 0.2], [0.05, 0.0]]), torch.tensor([1, 0, 1])
    hosted = certify(model, x, y, method="cohen-half", sigma=0.5, n=2000, batch_size=512,
                     device="cuda")  # fmt: skip
    local = certify(model, x, y, method="cohen", sigma=0.25, n=2000, batch_size=512,
                    device="cuda")  # fmt: skip
    for column in ("prediction", "radius", "p_lower", "sigma", "counts_estimation"):
        assert hosted[column].tolist() == local[column].tolist(), column


@pytest.fixture(scope="module")
def confined_host():
    """A plugin host confined as a third-party plugin's is (the built-ins only)."""
    from harness.plugin.hosting.in_harness.host_process import PluginHost

    host = PluginHost(None, confined=True)
    yield host
    host.close()


def _driver_probe(host) -> dict[str, tuple[str, str]]:
    """What the CUDA driver does to the OS (and what must stay refused), tried in ``host``."""
    devices = list(policy.existing(policy.SYSTEM_DEVICES))
    answer = host.probe("cpu", devices, os.getpid(), refusals=True)
    return {name: (outcome, said) for name, outcome, said in answer["parts"]}


def _assert_driver_probe(parts: dict[str, tuple[str, str]]) -> None:
    for part in ("thread names", "memfd", "devices", "cpu", "refused"):
        assert parts[part][0] == "ok", parts
    assert parts["refused"][1] in ("ok", "ok (/proc/sysrq-trigger absent)"), parts


@needs_landlock
def test_a_confined_host_does_to_the_os_what_the_cuda_driver_does_and_no_more(confined_host):
    """In a host confined as a third-party plugin's: a thread started after confinement is
    named from another thread (``pthread_setname_np``, which writes
    ``/proc/self/task/<tid>/comm``) and by writing that file, an anonymous memory file is
    made (``memfd_create``), the granted device files open, and a computation runs; while
    ``/proc/sysrq-trigger`` and ``/proc/sys/vm/drop_caches`` (root writes both without a
    capability), the harness's thread name and its memory stay refused."""
    _assert_driver_probe(_driver_probe(confined_host))
    seen = driver_probe.refused_outcomes(os.getpid())  # (here, unconfined: all open)
    assert {k: v for k, v in seen.items() if v != "absent"} == {
        k: "opened" for k, v in seen.items() if v != "absent"}  # fmt: skip


@needs_landlock
def test_threads_are_named_after_the_kernel_dropped_its_dentries(confined_host):
    """procfs makes ``/proc/<pid>/task`` anew when it is looked up after its dentry was
    dropped (here by ``drop_caches``, as memory pressure would), and a Landlock rule names
    the folder it was made on: the host keeps its folder pinned, so threads started after
    the drop are still named."""
    _assert_driver_probe(_driver_probe(confined_host))  # (the host is running)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        control = f"/proc/{sleeper.pid}/task"
        pinned = f"/proc/{confined_host.process.host_pid}/task"
        before = os.stat(control).st_ino, os.stat(pinned).st_ino
        try:
            with open("/proc/sys/vm/drop_caches", "w") as caches:
                caches.write("2\n")  # dentries and inodes (not the page cache)
        except OSError as exc:
            pytest.skip(f"this process may not drop the kernel's caches: {exc}")
        after = os.stat(control).st_ino, os.stat(pinned).st_ino
    finally:
        sleeper.kill()
        sleeper.wait()
    if after[0] == before[0]:
        pytest.skip("drop_caches kept the dentries of another process's /proc folder")
    assert after[1] == before[1]  # pinned: the same inode, which the rule names
    _assert_driver_probe(_driver_probe(confined_host))
