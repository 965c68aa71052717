"""A confined plugin host's privileges: its capability sets emptied, its system calls filtered.

Steps 2 and 3 of a plugin host's confinement (:mod:`harness.plugin.hosting.in_host.confinement`,
docs/threat-model.md): :func:`drop_capabilities` empties the bounding, ambient, effective,
permitted and inheritable sets (a root host keeps uid 0 but no privilege), and
:func:`install_seccomp` installs a classic-BPF filter (:func:`seccomp_program`) under which
the system calls of :data:`SYSTEM_CALLS`, each named with its rule and reason, fail with
EPERM: ``socket(2)`` (but the CUDA driver's, in a host granted a GPU: :data:`CUDA_SOCKET`),
a datagram ``socketpair(2)``, ``sendto(2)`` with an address, ``io_uring_setup(2)``, the
``chown`` family and ``chmod`` calls that set the set-uid or set-gid bit; the calls that
change another process named by its pid where Landlock does not look (``prlimit64``,
``setpriority``, ``sched_setaffinity``, ...) unless the pid is 0 or the host's own; and
System V IPC, POSIX message queues and keyrings, which outlive the host. Made with
:mod:`ctypes` (``prctl``, ``capset``). The policy names :data:`SYSTEM_CALLS` as what a host
is refused (:attr:`harness.plugin.hosting.shared.policy.Policy.system_calls`).
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

_PR_CAPBSET_DROP, _PR_SET_SECCOMP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT = 24, 22, 38, 47
_PR_CAP_AMBIENT_CLEAR_ALL, _SECCOMP_MODE_FILTER = 4, 2
_CAPABILITY_VERSION_3 = 0x20080522


_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, arg: int = 0, pointer=None) -> None:
    third = ctypes.c_ulong(0) if pointer is None else pointer
    if _libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), third, ctypes.c_ulong(0),
                   ctypes.c_ulong(0)) != 0:  # fmt: skip
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def no_new_privileges() -> None:
    """``PR_SET_NO_NEW_PRIVS``: no set-uid bit nor file capability takes effect through
    ``execve`` in this thread and its children, for good (Landlock and seccomp need it)."""
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)


def drop_capabilities() -> None:
    """Empty this thread's capability sets (bounding first: it needs ``CAP_SETPCAP``)."""
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text()) if Path(
        "/proc/sys/kernel/cap_last_cap").exists() else 63  # fmt: skip
    for cap in range(last + 1):
        try:
            _prctl(_PR_CAPBSET_DROP, cap)
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # beyond this kernel's capabilities
                break
            if exc.errno != errno.EPERM:  # EPERM: not privileged, so nothing to drop
                raise
    _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable (two words each)
    if _libc.capset(header, data) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


@dataclass(frozen=True)
class Refused:
    """Always refused."""

    WORDS: ClassVar[str] = "always"


@dataclass(frozen=True)
class OwnProcess:
    """Allowed only on the host itself: each of the arguments ``pids`` is 0 (the caller,
    where the call reads 0 so; elsewhere the kernel rejects it) or the host's pid; with
    ``kind`` (argument, value), that argument must say the ``pids`` name one process (not a
    process group nor every process of a user). A pid is a ``pid_t``, a 32-bit int: the
    kernel drops the high word, and so does the comparison."""

    WORDS: ClassVar[str] = "on the host itself"
    pids: tuple[int, ...] = (0,)
    kind: tuple[int, int] | None = None


@dataclass(frozen=True)
class NoSetIdBits:
    """Allowed unless the mode (argument ``mode``) sets the set-uid or set-gid bit."""

    WORDS: ClassVar[str] = "with the set-uid or set-gid bit"
    mode: int


@dataclass(frozen=True)
class CudaSocket:
    """``socket(AF_UNIX, SOCK_SEQPACKET[|flags], ...)`` in a host granted a GPU
    (:data:`CUDA_SOCKET`); every other socket, and every socket elsewhere, refused."""

    WORDS: ClassVar[str] = "every socket but, in a host granted a GPU, `AF_UNIX` `SOCK_SEQPACKET`"


@dataclass(frozen=True)
class ConnectedPair:
    """``socketpair(AF_UNIX, SOCK_STREAM or SOCK_SEQPACKET[|flags], ...)`` only: a pair
    connected to each other, which rejects (stream) or ignores (seqpacket) an address on
    ``sendmsg`` and cannot be connected elsewhere (``EISCONN``); a datagram pair can send to
    any named UNIX socket (``sendto`` with an address) and be connected to one."""

    WORDS: ClassVar[str] = "all but `AF_UNIX` `SOCK_STREAM` and `SOCK_SEQPACKET` pairs"


@dataclass(frozen=True)
class NoAddress:
    """Allowed only with a NULL address (argument ``address``, a pointer: both words)."""

    WORDS: ClassVar[str] = "with an address"
    address: int


@dataclass(frozen=True)
class NotImplemented_:
    """Answered ``ENOSYS``, as by a kernel without the call: the C library then uses the
    older call it falls back to (glibc's ``clone3`` → ``clone``)."""

    WORDS: ClassVar[str] = "always, as not implemented (`ENOSYS`)"


# WORDS: how docs/threat-model.md's table of the filter says each rule (its "refused" column)
Rule = Refused | OwnProcess | NoSetIdBits | CudaSocket | ConnectedPair | NoAddress | NotImplemented_


@dataclass(frozen=True)
class SystemCall:
    """One system call the filter governs: its number on x86_64
    (arch/x86/entry/syscalls/syscall_64.tbl) and on aarch64
    (include/uapi/asm-generic/unistd.h; None where the architecture has no such call), its
    rule and why (docs/threat-model.md lists the same)."""

    name: str
    x86_64: int | None
    aarch64: int | None
    rule: Rule
    why: str


_PRIO_PROCESS, _IOPRIO_WHO_PROCESS = 0, 1  # setpriority(2)'s and ioprio_set(2)'s "one process"
_OUTLIVES = "outlives the host and is shared with the user's other processes"
SYSTEM_CALLS: tuple[SystemCall, ...] = (
    # --- sockets: Landlock has no rule for UDP nor for a named UNIX socket
    SystemCall("socket", 41, 198, CudaSocket(),
               "UDP, netlink, a named UNIX socket (a system bus through which root starts "
               "services, a Ray node's); only the CUDA driver's in a host granted a GPU"),
    SystemCall("socketpair", 53, 199, ConnectedPair(),
               "a datagram pair sends to any named UNIX socket (sendto with an address); "
               "stream and seqpacket pairs (multiprocessing's pipes) stay"),
    SystemCall("sendto", 44, 206, NoAddress(4),
               "an address: no socket of the host may send elsewhere than to its peer"),
    SystemCall("clone3", 435, 435, NotImplemented_(),
               "CLONE_INTO_CGROUP starts a child in any cgroup whose folder the host can open "
               "(O_PATH needs no Landlock right), out of its memory cgroup; the flag is in "
               "memory a filter cannot read, and clone(2), glibc's fallback, has no such flag"),
    SystemCall("io_uring_setup", 425, 425, Refused(),
               "io_uring opens sockets and files without the system calls"),
    # --- a file's metadata, which Landlock does not govern
    SystemCall("chown", 92, None, Refused(), "a file's owner"),
    SystemCall("fchown", 93, 55, Refused(), "a file's owner"),
    SystemCall("lchown", 94, None, Refused(), "a file's owner"),
    SystemCall("fchownat", 260, 54, Refused(), "a file's owner"),
    SystemCall("chmod", 90, None, NoSetIdBits(1), "the set-uid and set-gid bits"),
    SystemCall("fchmod", 91, 52, NoSetIdBits(1), "the set-uid and set-gid bits"),
    SystemCall("fchmodat", 268, 53, NoSetIdBits(2), "the set-uid and set-gid bits"),
    SystemCall("fchmodat2", 452, 452, NoSetIdBits(2), "the set-uid and set-gid bits"),
    # --- another process named by its pid, where Landlock's scoping does not look
    SystemCall("prlimit64", 302, 261, OwnProcess(),
               "another process's resource limits: a CPU limit of 1 s kills it (SIGXCPU)"),
    SystemCall("setpriority", 141, 140, OwnProcess((1,), (0, _PRIO_PROCESS)),
               "another process's nice value, or every process of a group or of the user"),
    SystemCall("ioprio_set", 251, 30, OwnProcess((1,), (0, _IOPRIO_WHO_PROCESS)),
               "another process's I/O class (idle: it waits for every other disk access)"),
    SystemCall("sched_setaffinity", 203, 122, OwnProcess(),
               "the CPUs another process (or thread) may run on"),
    SystemCall("sched_setscheduler", 144, 119, OwnProcess(),
               "another process's scheduling policy (SCHED_IDLE starves it)"),
    SystemCall("sched_setparam", 142, 118, OwnProcess(), "another process's priority"),
    SystemCall("sched_setattr", 314, 274, OwnProcess(),
               "another process's policy, priority and utilization limits"),
    SystemCall("migrate_pages", 256, 238, OwnProcess(),
               "another process's memory, moved between NUMA nodes"),
    SystemCall("move_pages", 279, 239, OwnProcess(),
               "another process's memory, moved between NUMA nodes"),
    SystemCall("perf_event_open", 298, 241, OwnProcess((1,)),
               "another process's (pid > 0) or every process's (-1) events"),
    SystemCall("pidfd_open", 434, 434, OwnProcess(),
               "a descriptor of another process (whose uses Landlock checks too)"),
    SystemCall("process_vm_readv", 310, 270, OwnProcess(),
               "another process's memory (Landlock's ptrace restriction refuses it too)"),
    SystemCall("process_vm_writev", 311, 271, OwnProcess(),
               "another process's memory (Landlock's ptrace restriction refuses it too)"),
    SystemCall("kcmp", 312, 272, OwnProcess((0, 1)),
               "whether two processes share files or memory (Landlock refuses it too)"),
    SystemCall("get_robust_list", 274, 100, OwnProcess(),
               "another thread's futex list (Landlock's ptrace restriction refuses it too)"),
    # --- what outlives the host: Landlock governs none of it
    *(SystemCall(name, x86, arm, Refused(), f"a System V IPC object {_OUTLIVES}; another's "
                 "(listed in /proc/sysvipc) can be attached, read, written or removed")
      for name, x86, arm in (("shmget", 29, 194), ("shmat", 30, 196), ("shmctl", 31, 195),
                             ("shmdt", 67, 197), ("msgget", 68, 186), ("msgsnd", 69, 189),
                             ("msgrcv", 70, 188), ("msgctl", 71, 187), ("semget", 64, 190),
                             ("semop", 65, 193), ("semtimedop", 220, 192),
                             ("semctl", 66, 191))),
    *(SystemCall(name, x86, arm, Refused(), f"a POSIX message queue {_OUTLIVES}: mq_open "
                 "makes it even where Landlock then refuses to open it; mq_unlink removes "
                 "another's")
      for name, x86, arm in (("mq_open", 240, 180), ("mq_unlink", 241, 181),
                             ("mq_timedsend", 242, 182), ("mq_timedreceive", 243, 183),
                             ("mq_notify", 244, 184), ("mq_getsetattr", 245, 185))),
    *(SystemCall(name, x86, arm, Refused(), f"a key in the user's or session keyring "
                 f"{_OUTLIVES} (request_key may start /sbin/request-key outside the host)")
      for name, x86, arm in (("add_key", 248, 217), ("request_key", 249, 218),
                             ("keyctl", 250, 219))),
)  # fmt: skip
"""What the filter of step 3 governs, each by name; every other system call is allowed."""

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
SECCOMP_MACHINES = tuple(_AUDIT_ARCH)
"""The architectures (``platform.machine()``) the filter knows."""
_X32_BIT = 0x40000000  # x86_64's x32 system calls: numbers with bit 30 set
_AF_UNIX, _SOCK_STREAM, _SOCK_SEQPACKET, _SOCK_TYPE_MASK = 1, 1, 5, 0xF  # (flags: higher bits)
CUDA_SOCKET = "socket(AF_UNIX, SOCK_SEQPACKET)"
"""The kind of socket the CUDA driver makes twice in ``cuInit`` (traced on an H200, driver
580, CUDA 13): one to look for an MPS server (``connect`` to ``/tmp/nvidia-mps/control``) and one bound
to an abstract address (``@cuda-uvmfd-<namespace>-<pid>``, which Landlock's scoping keeps
within the host); refused, ``cuInit`` fails with ``CUDA_ERROR_OPERATING_SYSTEM`` (304)."""
_SETUID_BITS = 0o6000
THREAD_BINDING = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY")
"""GNU OpenMP's (libgomp's, torch's) thread binding. With one set, libgomp starts each
thread bound to its CPUs (``pthread_attr_setaffinity_np``): glibc's ``pthread_create``
calls ``sched_setaffinity`` with the new thread's id, which the filter refuses (it is not
the host's pid), and a refused binding fails ``pthread_create``, which libgomp ends the
process on ("Thread creation failed"). :func:`unbind_threads` removes them."""


def system_call_number(name: str, machine: str) -> int | None:
    """The number of the system call ``name`` (of :data:`SYSTEM_CALLS`) on ``machine``."""
    [call] = [c for c in SYSTEM_CALLS if c.name == name]
    return getattr(call, machine)


def unbind_threads(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Remove :data:`THREAD_BINDING` from ``environ`` (default ``os.environ``, and so the
    C library's, which libgomp reads once when it loads: before torch is imported); the
    names removed."""
    environ = os.environ if environ is None else environ
    return [name for name in THREAD_BINDING if environ.pop(name, None) is not None]


class _SockFilter(ctypes.Structure):
    _fields_ = (("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32))  # fmt: skip


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter)))


# classic BPF (include/uapi/linux/filter.h, bpf_common.h) on struct seccomp_data: the number
# at offset 0, the architecture at 4, the six arguments (8 bytes each) from 16
_LOAD, _JEQ, _JGE, _JSET, _RET, _AND = 0x20, 0x15, 0x35, 0x45, 0x06, 0x54
_ALLOW, _DENY = 0x7FFF0000, 0x00050000 | errno.EPERM  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO
_ENOSYS = 0x00050000 | errno.ENOSYS
_JUMP_MAX = 255  # a conditional jump's offsets are 8-bit


def _low(argument: int) -> int:
    """Where an argument's low word is (both architectures are little-endian)."""
    return 16 + 8 * argument


def _block(rule: Rule, pid: int, unix_seqpacket: bool) -> list[tuple] | None:
    """The instructions that decide ``rule`` (jumping to "allow" or "deny", or returning);
    None when it is refused whole."""
    if isinstance(rule, OwnProcess):
        code: list[tuple] = []
        if rule.kind is not None:
            code += [(_LOAD, 0, 0, _low(rule.kind[0])), (_JEQ, 0, "deny", rule.kind[1])]
        for argument in rule.pids:  # 0, else the host's pid, else refused
            code += [(_LOAD, 0, 0, _low(argument)), (_JEQ, 1, 0, 0), (_JEQ, 0, "deny", pid)]
        return [*code, (_RET, 0, 0, _ALLOW)]
    if isinstance(rule, NoSetIdBits):
        return [(_LOAD, 0, 0, _low(rule.mode)), (_JSET, "deny", "allow", _SETUID_BITS)]
    if isinstance(rule, CudaSocket) and unix_seqpacket:  # the family, then the type
        return [(_LOAD, 0, 0, _low(0)), (_JEQ, 0, "deny", _AF_UNIX), (_LOAD, 0, 0, _low(1)),
                (_AND, 0, 0, _SOCK_TYPE_MASK), (_JEQ, "allow", "deny", _SOCK_SEQPACKET)]  # fmt: skip
    if isinstance(rule, ConnectedPair):
        return [(_LOAD, 0, 0, _low(0)), (_JEQ, 0, "deny", _AF_UNIX), (_LOAD, 0, 0, _low(1)),
                (_AND, 0, 0, _SOCK_TYPE_MASK), (_JEQ, "allow", 0, _SOCK_STREAM),
                (_JEQ, "allow", "deny", _SOCK_SEQPACKET)]  # fmt: skip
    if isinstance(rule, NotImplemented_):
        return [(_RET, 0, 0, _ENOSYS)]
    if isinstance(rule, NoAddress):  # a pointer: NULL in both words
        return [(_LOAD, 0, 0, _low(rule.address)), (_JEQ, 0, "deny", 0),
                (_LOAD, 0, 0, _low(rule.address) + 4), (_JEQ, "allow", "deny", 0)]  # fmt: skip
    return None


def seccomp_program(machine: str, unix_seqpacket: bool = False,
                    pid: int | None = None) -> list[tuple[int, int, int, int]]:  # fmt: skip
    """The classic-BPF filter of step 3 for ``machine`` (``platform.machine()``) in the
    process ``pid`` (default this one): a list of (code, jt, jf, k). Another architecture's
    system calls (and x32's) are refused whole; each of :data:`SYSTEM_CALLS` is sent to its
    rule's instructions (one block per rule), which end in "allow" or "deny" (EPERM);
    every other call is allowed. With ``unix_seqpacket``, the CUDA driver's socket is
    allowed (:data:`CUDA_SOCKET`)."""
    pid = os.getpid() if pid is None else pid
    program: list[tuple] = [(_LOAD, 0, 0, 4), (_JEQ, 0, "deny", _AUDIT_ARCH[machine]),
                            (_LOAD, 0, 0, 0)]  # fmt: skip
    if machine == "x86_64":
        program.append((_JGE, "deny", 0, _X32_BIT))
    blocks: dict[Rule, list[tuple]] = {}
    for call in SYSTEM_CALLS:
        number = getattr(call, machine)
        if number is None:
            continue
        block = _block(call.rule, pid, unix_seqpacket)
        if block is not None:
            blocks.setdefault(call.rule, block)
        program.append((_JEQ, "deny" if block is None else call.rule, 0, number))
    program.append((_RET, 0, 0, _ALLOW))
    labels: dict[object, int] = {}
    for rule, block in blocks.items():
        labels[rule] = len(program)
        program += block
    labels["deny"] = len(program)
    program.append((_RET, 0, 0, _DENY))
    labels["allow"] = len(program)  # (jumps go forward only)
    program.append((_RET, 0, 0, _ALLOW))

    def offset(target, at: int) -> int:
        jump = target if isinstance(target, int) else labels[target] - at - 1
        if not 0 <= jump <= _JUMP_MAX:  # (then dispatch through a table, or `ja`'s 32 bits)
            raise ValueError(f"the seccomp filter's jump at {at} spans {jump} instructions")
        return jump

    return [(code, offset(jt, at), offset(jf, at), k)
            for at, (code, jt, jf, k) in enumerate(program)]  # fmt: skip


def install_seccomp(machine: str, unix_seqpacket: bool = False) -> None:
    """Install :func:`seccomp_program` of this process on this thread (after
    ``PR_SET_NO_NEW_PRIVS``); its later threads and children inherit it, the children with
    this process's pid as "the host's" (each may name itself by 0)."""
    instructions = seccomp_program(machine, unix_seqpacket)
    array = (_SockFilter * len(instructions))(*(_SockFilter(*i) for i in instructions))
    program = _SockFprog(len(instructions), array)
    no_new_privileges()
    _prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(program))
