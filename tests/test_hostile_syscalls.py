"""What a hostile plugin tries beyond Landlock's reach, and what the seccomp filter of its
host (harness/plugin/hosting/shared/process_privileges.py, docs/threat-model.md) leaves it: acting
on another process by its pid (``prlimit64`` with a CPU limit of 1 s killed the harness),
System V IPC, POSIX message queues and keys that outlive the host, and a datagram
``socketpair`` that reached a named UNIX socket. Each in a confined process, then from a
third-party σ-provider beside a built-in row in one run."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from harness.plugin.hosting.shared import landlock, policy
from harness.plugin.hosting.shared.process_privileges import (
    SECCOMP_MACHINES,
    system_call_number,
)

needs_landlock = pytest.mark.skipif(
    policy.refusal(landlock.landlock_abi()) is not None,
    reason="this kernel has no Landlock ABI >= 3",
)
needs_seccomp = pytest.mark.skipif(
    sys.platform != "linux" or os.uname().machine not in SECCOMP_MACHINES,
    reason="the seccomp filter knows x86_64 and aarch64 on Linux",
)

PROBE = r"""
import ctypes, errno, json, multiprocessing, os, platform, resource, socket, sys, threading
from harness.plugin.hosting.in_host.confinement import confine
from harness.plugin.hosting.shared.policy import HostPaths, host_policy
from harness.plugin.hosting.shared.process_privileges import system_call_number

layers, sibling, core, folder, mark = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3], \
    sys.argv[4], sys.argv[5]
outside = {kind: os.path.join(folder, f"{kind}.sock") for kind in ("stream", "seqpacket")}
core = tuple(int(v) for v in core.split(","))
confine(host_policy(HostPaths()).landlock(), layers=layers)  # (as a host is, less its folders)
parent, me, out = os.getppid(), os.getpid(), {}
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def call(name, *args):
    result = libc.syscall(ctypes.c_long(system_call_number(name, platform.machine())), *args)
    if result == -1:
        raise OSError(ctypes.get_errno(), name)
    return result


def checked(result):
    if result == -1:
        raise OSError(ctypes.get_errno(), "")
    return result


def attempt(name, action):
    try:
        action()
        out[name] = "done"
    except OSError as exc:
        out[name] = exc.errno


limits = (ctypes.c_uint64 * 2)()
pid_word = lambda pid, high: ctypes.c_long(pid | high << 32)
# another process by its pid: each form is harmless were it let through (the same values
# set again, or read), but the sibling's CPU limit, which the test reads back
attempt("prlimit parent", lambda: resource.prlimit(parent, resource.RLIMIT_CORE, core))
attempt("prlimit init", lambda: resource.prlimit(1, resource.RLIMIT_CPU))
attempt("prlimit sibling", lambda: resource.prlimit(sibling, resource.RLIMIT_CPU, (1, 1)))
attempt("prlimit parent, high word", lambda: call(
    "prlimit64", pid_word(parent, 1), resource.RLIMIT_CORE, None, limits))
attempt("prlimit 0", lambda: resource.prlimit(0, resource.RLIMIT_NOFILE))
attempt("prlimit own pid", lambda: resource.prlimit(
    me, resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE)))
attempt("prlimit 0, high word", lambda: call(
    "prlimit64", pid_word(0, 1), resource.RLIMIT_CORE, None, limits))
attempt("setpriority parent", lambda: os.setpriority(
    os.PRIO_PROCESS, parent, os.getpriority(os.PRIO_PROCESS, parent)))
attempt("setpriority 0", lambda: os.setpriority(os.PRIO_PROCESS, 0,
                                                os.getpriority(os.PRIO_PROCESS, 0)))
attempt("getpriority parent", lambda: os.getpriority(os.PRIO_PROCESS, parent))
attempt("affinity parent", lambda: os.sched_setaffinity(parent, os.sched_getaffinity(parent)))
attempt("affinity 0", lambda: os.sched_setaffinity(0, os.sched_getaffinity(0)))
attempt("affinity own pid", lambda: os.sched_setaffinity(me, os.sched_getaffinity(me)))
thread = {}


def in_a_thread():  # (glibc's pthread_setaffinity_np names a thread by its id)
    mask = os.sched_getaffinity(0)
    for name, target in (("affinity thread 0", 0), ("affinity thread id", threading.get_native_id())):
        try:
            os.sched_setaffinity(target, mask)
            thread[name] = "done"
        except OSError as exc:
            thread[name] = exc.errno


worker = threading.Thread(target=in_a_thread)
worker.start()
worker.join()
out.update(thread)
attempt("scheduler parent", lambda: os.sched_setscheduler(
    parent, os.sched_getscheduler(parent), os.sched_param(0)))
attempt("sched_setparam parent", lambda: os.sched_setparam(parent, os.sched_param(0)))
attempt("scheduler 0", lambda: os.sched_setscheduler(0, os.sched_getscheduler(0),
                                                     os.sched_param(0)))
attempt("kcmp parent", lambda: call("kcmp", parent, parent, 1, 0, 0))  # KCMP_VM
attempt("kcmp own pid", lambda: call("kcmp", me, me, 1, 0, 0))
attempt("pidfd_open parent", lambda: os.close(os.pidfd_open(parent)))
attempt("pidfd_open own pid", lambda: os.close(os.pidfd_open(me)))
# what outlives the host (each removed at once were it let through)
key = int(mark)
attempt("shmget", lambda: libc.shmctl(checked(libc.shmget(key, 4096, 0o1600)), 0, None))
attempt("msgget", lambda: libc.msgctl(checked(libc.msgget(key, 0o1600)), 0, None))
attempt("semget", lambda: libc.semctl(checked(libc.semget(key, 1, 0o1600)), 0, 0))
attempt("shmctl", lambda: checked(libc.shmctl(0, 3, None)))  # IPC_INFO
attempt("add_key", lambda: call("add_key", b"user", f"idrs-test-{mark}".encode(), b"x",
                                ctypes.c_size_t(1), ctypes.c_int(-2)))  # (its own keyring)
attempt("keyctl", lambda: call("keyctl", 0, ctypes.c_int(-4), 0))  # the user's keyring's id
attempt("mq_open", lambda: call("mq_open", f"idrs-test-{mark}".encode(),
                                os.O_CREAT | os.O_RDWR, 0o600, None))
# sockets: only pairs connected to each other, and no address
for kind in ("SOCK_DGRAM", "SOCK_RAW", "SOCK_STREAM", "SOCK_SEQPACKET"):
    attempt(f"socketpair {kind}", lambda: [s.close() for s in socket.socketpair(
        socket.AF_UNIX, getattr(socket, kind) | socket.SOCK_CLOEXEC)])


def pipe():
    a, b = multiprocessing.Pipe()
    a.send({"x": 1})
    assert b.recv() == {"x": 1}


attempt("multiprocessing.Pipe", pipe)
stream, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
attempt("sendto an address", lambda: stream.sendto(b"x", outside["stream"]))
attempt("send", lambda: stream.send(b"x"))  # (glibc: sendto without an address)
attempt("sendmsg an address, stream", lambda: stream.sendmsg([b"x"], [], 0, outside["stream"]))
attempt("connect a stream pair elsewhere", lambda: stream.connect(outside["stream"]))
packets, other = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
packets.sendmsg([b"to the peer"], [], 0, outside["seqpacket"])  # (the kernel drops it)
out["sendmsg an address, seqpacket, reached"] = other.recv(64).decode()
attempt("connect a seqpacket pair elsewhere", lambda: packets.connect(outside["seqpacket"]))
print(json.dumps(out))
"""

EXPECTED = {
    "prlimit parent": errno.EPERM, "prlimit init": errno.EPERM, "prlimit sibling": errno.EPERM,
    "prlimit parent, high word": errno.EPERM, "prlimit 0": "done", "prlimit own pid": "done",
    "prlimit 0, high word": "done",
    "setpriority parent": errno.EPERM, "setpriority 0": "done",
    "getpriority parent": "done",  # (a read: /proc/<pid>/stat shows it too)
    "affinity parent": errno.EPERM, "affinity 0": "done", "affinity own pid": "done",
    "affinity thread 0": "done", "affinity thread id": errno.EPERM,  # (libgomp's binding)
    "scheduler parent": errno.EPERM, "sched_setparam parent": errno.EPERM, "scheduler 0": "done",
    "kcmp parent": errno.EPERM, "kcmp own pid": "done",
    "pidfd_open parent": errno.EPERM, "pidfd_open own pid": "done",
    "shmget": errno.EPERM, "msgget": errno.EPERM, "semget": errno.EPERM, "shmctl": errno.EPERM,
    "add_key": errno.EPERM, "keyctl": errno.EPERM, "mq_open": errno.EPERM,
    "socketpair SOCK_DGRAM": errno.EPERM, "socketpair SOCK_RAW": errno.EPERM,
    "socketpair SOCK_STREAM": "done", "socketpair SOCK_SEQPACKET": "done",
    "multiprocessing.Pipe": "done",
    "sendto an address": errno.EPERM, "send": "done",
    "sendmsg an address, stream": errno.EISCONN,  # (the kernel's answer: no retargeting)
    "connect a stream pair elsewhere": errno.EISCONN,
    "sendmsg an address, seqpacket, reached": "to the peer",
    "connect a seqpacket pair elsewhere": errno.EISCONN,
}  # fmt: skip


def _leftovers(mark: str) -> list[str]:
    """What a process made with ``mark`` that outlives it, each removed: a System V object
    of that key, a key of that description, a message queue of that name."""
    libc = ctypes.CDLL(None, use_errno=True)
    keyctl = system_call_number("keyctl", os.uname().machine)
    found = []
    for kind, remove in (("shm", libc.shmctl), ("msg", libc.msgctl), ("sem", libc.semctl)):
        rows = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
        for row in rows:
            if row.split()[0] == mark:
                found.append(f"{kind} {row.split()[1]}")
                remove(int(row.split()[1]), 0, None)  # IPC_RMID
    if Path("/proc/keys").exists():
        for line in Path("/proc/keys").read_text().splitlines():
            if f"idrs-test-{mark}" in line:
                found.append(line)
                invalidate = 21  # KEYCTL_INVALIDATE
                libc.syscall(keyctl, invalidate, int(line.split()[0], 16))
    if libc.mq_unlink(f"/idrs-test-{mark}".encode()) == 0:
        found.append("a message queue")
    return found


def _cpu_limit(pid: int) -> str:
    line = next(x for x in Path(f"/proc/{pid}/limits").read_text().splitlines()
                if x.startswith("Max cpu time"))  # fmt: skip
    return " ".join(line.split()[3:5])


@needs_seccomp
@pytest.mark.parametrize("layers", ["seccomp", ",".join(policy.LAYERS)])
def test_a_confined_process_acts_on_no_other_process_and_leaves_nothing(tmp_path, layers):
    """Through :func:`~harness.plugin.hosting.in_host.confinement.confine`: ``prlimit64``,
    ``setpriority``, ``sched_setaffinity``, ``sched_setscheduler``, ``kcmp`` and
    ``pidfd_open`` on the parent, on init and on a sibling fail with EPERM (with the pid's
    high word set too: the kernel drops it), while on itself (0, its own pid) they work;
    System V IPC, a key and a message queue are refused and none is left; a datagram pair
    and an address on ``sendto`` are refused, while a stream pair (multiprocessing's
    ``Pipe``) works and can neither be connected elsewhere nor sent to an address. The
    filter alone does it."""
    if layers != "seccomp" and policy.refusal(landlock.landlock_abi()) is not None:
        pytest.skip("no Landlock on this kernel")
    mark = str(0x1D000000 + uuid.uuid4().int % 0xFFFFFF)  # a System V key, and names
    listeners = []  # named UNIX sockets outside the process
    for kind in ("stream", "seqpacket"):
        listeners.append(socket.socket(socket.AF_UNIX, getattr(socket, f"SOCK_{kind.upper()}")))
        listeners[-1].bind(str(tmp_path / f"{kind}.sock"))
        listeners[-1].listen()
    sibling = subprocess.Popen(["sleep", "60"])
    try:
        before = _cpu_limit(sibling.pid)
        core = ",".join(str(v) for v in resource.getrlimit(resource.RLIMIT_CORE))
        done = subprocess.run([sys.executable, "-c", PROBE, layers, str(sibling.pid), core,
                               str(tmp_path), mark], capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == EXPECTED
        assert _cpu_limit(sibling.pid) == before == "unlimited unlimited"
    finally:
        sibling.kill()
        sibling.wait()
        for listener in listeners:
            listener.close()
        left = _leftovers(mark)  # (and removed, even when the test failed before)
    assert left == []


TORCH = r"""
import os, sys
from harness.plugin.hosting.in_host.confinement import confine
from harness.plugin.hosting.shared.policy import HostPaths, host_policy

confine(host_policy(HostPaths()).landlock())
import torch

torch.set_num_threads(2)
a = torch.arange(256 * 256, dtype=torch.float64).reshape(256, 256) / 65536
x = torch.linspace(-3, 3, 2_000_000, dtype=torch.float64)  # parallel_for on OpenMP's team
print(float((a @ a).sum()), float(x.exp().sum()), torch.get_num_threads(),
      len(os.listdir("/proc/self/task")), "OMP_PROC_BIND" in os.environ)
"""


@needs_seccomp
@needs_landlock
def test_torch_computes_on_two_openmp_threads_in_a_confined_process():
    """A process confined as a plugin host is imports torch and multiplies matrices and
    sums on two OpenMP threads, with libgomp's thread binding asked for (which binds a new
    thread by its id, refused:
    :func:`~harness.plugin.hosting.in_host.confinement.confine` takes it out of the
    environment, else libgomp ends the process, "Thread creation failed")."""
    import torch

    env = {**os.environ, "OMP_PROC_BIND": "true", "OMP_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-c", TORCH], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    product, total, threads, tasks, bound = done.stdout.split()
    a = torch.arange(256 * 256, dtype=torch.float64).reshape(256, 256) / 65536
    x = torch.linspace(-3, 3, 2_000_000, dtype=torch.float64)
    assert float(product) == pytest.approx(float((a @ a).sum()), rel=1e-12)
    assert float(total) == pytest.approx(float(x.exp().sum()), rel=1e-9)
    assert (int(threads), bound) == (2, "False") and int(tasks) >= 2  # OpenMP's team started


HOSTILE = '''
import ctypes, errno, os, platform, resource

from harness import Constant, MethodSpec, SigmaProviderSpec, hookimpl
from harness.plugin.hosting.shared.process_privileges import system_call_number

IDRS_BENCH_CONTRACT = 3
MARK = "{mark}"


def _parent(pid):
    with open(f"/proc/{{pid}}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def _attacks():
    """Each done for real: a CPU limit of 1 s on its keeper and on the harness, nice 19,
    one CPU; the limits of init and of the harness's parent read; a System V segment, queue
    and semaphore set, a key in the user's keyring, a message queue."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    number = lambda name: ctypes.c_long(system_call_number(name, platform.machine()))
    keeper = os.getppid()
    harness = _parent(keeper)
    outcomes = {{}}

    def attempt(name, action):
        try:
            if action() == -1:
                raise OSError(ctypes.get_errno(), name)
            outcomes[name] = "done"
        except OSError as exc:
            outcomes[name] = exc.errno

    for who, pid in (("keeper", keeper), ("harness", harness)):
        attempt(f"prlimit {{who}}", lambda: resource.prlimit(pid, resource.RLIMIT_CPU, (1, 1)))
        attempt(f"renice {{who}}", lambda: os.setpriority(os.PRIO_PROCESS, pid, 19))
        attempt(f"pin {{who}}", lambda: os.sched_setaffinity(pid, {{min(os.sched_getaffinity(0))}}))
    for who, pid in (("init", 1), ("the harness's parent", _parent(harness))):
        attempt(f"prlimit {{who}}", lambda: resource.prlimit(pid, resource.RLIMIT_CPU))
    key = int(MARK)
    attempt("shmget", lambda: libc.shmget(key, 1 << 20, 0o1600))
    attempt("msgget", lambda: libc.msgget(key, 0o1600))
    attempt("semget", lambda: libc.semget(key, 1, 0o1600))
    attempt("add_key", lambda: libc.syscall(number("add_key"), b"user",
                                            f"idrs-test-{{MARK}}".encode(), b"x",
                                            ctypes.c_size_t(1), ctypes.c_int(-4)))
    attempt("mq_open", lambda: libc.syscall(number("mq_open"), f"idrs-test-{{MARK}}".encode(),
                                            os.O_CREAT | os.O_RDWR, 0o600, None))
    return outcomes


class Hostile:
    def __init__(self):
        self.regularity = Constant(0.25)

    def __call__(self, x):
        import torch

        outcomes = _attacks()
        if any(outcome != errno.EPERM for outcome in outcomes.values()):
            raise RuntimeError(f"not refused: {{outcomes}}")
        return torch.full((len(x),), 0.25, device=x.device)


@hookimpl
def idrs_register_sigma_providers(register):
    register(SigmaProviderSpec("hostile", lambda context, params: Hostile()))


@hookimpl
def idrs_register_methods(register):
    register(MethodSpec("hostile", "hostile", "cohen", {{}}))
'''


@needs_seccomp
@needs_landlock
def test_a_plugin_that_acts_on_the_harness_and_leaves_ipc_objects_gets_eperm_each_time(
    install_plugin, tmp_path, beside_cohen
):
    """A σ-provider that puts a CPU limit of 1 s on its keeper and on the harness, renices
    and pins them, reads the limits of init and of the harness's parent, and makes a System
    V segment, queue and semaphore set, a key and a message queue, gets EPERM each time
    (else its row fails, saying what went through): beside it, the built-in ``cohen`` row
    certifies exactly as in a run without the plugin, the harness (a process of its own)
    and the keeper live on, the run exits 0, and nothing is left."""
    from harness.cli.main import main
    from harness.store.storedrun import load_runs

    mark = str(0x1E000000 + uuid.uuid4().int % 0xFFFFFF)
    install_plugin("idrs_test_hostile", HOSTILE.format(mark=mark),
                   distribution="idrs-test-hostile")  # fmt: skip
    alone, beside = tmp_path / "cohen.toml", tmp_path / "hostile.toml"
    alone.write_text(beside_cohen("hostile"))
    beside.write_text(beside_cohen("hostile", ["hostile"]))
    harness = subprocess.run(
        [sys.executable, "-m", "harness.cli.main", "run", str(beside), "--db",
         str(tmp_path / "beside.sqlite"), "--quiet", "--no-check"],
        capture_output=True, text=True, env={**os.environ, "IDRS_BENCH_PLUGIN_TIMEOUT": "300"},
    )  # fmt: skip
    left = _leftovers(mark)  # (and removed)
    assert harness.returncode == 0, (harness.returncode, harness.stdout[-4000:],
                                     harness.stderr[-4000:])  # fmt: skip
    [run] = load_runs(tmp_path / "beside.sqlite")
    assert run.failures == [] and run.counts() == {("cohen", "sigma=0.25"): 4,
                                                   ("hostile", "default"): 4}  # fmt: skip
    assert main(["run", str(alone), "--db", str(tmp_path / "alone.sqlite"), "--quiet",
                 "--no-check"]) == 0  # fmt: skip
    [reference] = load_runs(tmp_path / "alone.sqlite")

    def certified(stored) -> list[tuple]:
        return [(c.input_id, c.prediction, c.radius, c.p_lower, c.counts_estimation)
                for c in stored.certificates if c.method == "cohen"]  # fmt: skip

    assert certified(run) == certified(reference) and len(certified(run)) == 4
    assert left == []
