"""A confined plugin host's privileges: its capability sets emptied, its system calls filtered.

Steps 2 and 3 of a plugin host's confinement (:mod:`harness.plugin.hosting.confinement`,
docs/threat-model.md): :func:`drop_capabilities` empties the bounding, ambient, effective,
permitted and inheritable sets (a root host keeps uid 0 but no privilege), and
:func:`install_seccomp` installs a classic-BPF filter under which ``socket(2)`` (but the
CUDA driver's, in a host granted a GPU: :data:`CUDA_SOCKET`), ``io_uring_setup(2)``, the
``chown`` family and ``chmod`` calls that set the set-uid or set-gid bit fail with EPERM
(:func:`seccomp_program`). Made with :mod:`ctypes` (``prctl``, ``capset``).
"""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass
from pathlib import Path

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
class _Arch:
    audit: int
    socket: int
    chown: tuple[int, ...]
    chmod_mode_arg1: tuple[int, ...]  # chmod(path, mode), fchmod(fd, mode)
    chmod_mode_arg2: tuple[int, ...]  # fchmodat(dirfd, path, mode[, flags])
    x32: bool = False


_ARCHES = {
    "x86_64": _Arch(0xC000003E, 41, (92, 93, 94, 260), (90, 91), (268, 452), x32=True),
    "aarch64": _Arch(0xC00000B7, 198, (54, 55), (52,), (53, 452)),
}
SECCOMP_MACHINES = tuple(_ARCHES)
"""The architectures (``platform.machine()``) the filter knows."""
_IO_URING_SETUP = 425  # the same on every architecture
_AF_UNIX, _SOCK_SEQPACKET, _SOCK_TYPE_MASK = 1, 5, 0xF  # (the flags are higher bits)
CUDA_SOCKET = "socket(AF_UNIX, SOCK_SEQPACKET)"
"""The kind of socket the CUDA driver makes twice in ``cuInit`` (traced on an H200, driver
580, CUDA 13): one to look for an MPS server (``connect`` to ``/tmp/nvidia-mps/control``) and one bound
to an abstract address (``@cuda-uvmfd-<namespace>-<pid>``, which Landlock's scoping keeps
within the host); refused, ``cuInit`` fails with ``CUDA_ERROR_OPERATING_SYSTEM`` (304)."""
_SETUID_BITS = 0o6000


class _SockFilter(ctypes.Structure):
    _fields_ = (("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32))  # fmt: skip


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter)))


def seccomp_program(machine: str, unix_seqpacket: bool = False) -> list[tuple[int, int, int, int]]:
    """The classic-BPF filter of step 3 for ``machine`` (``platform.machine()``): a list
    of (code, jt, jf, k); another architecture's system calls are refused whole. With
    ``unix_seqpacket``, ``socket(AF_UNIX, SOCK_SEQPACKET[|flags], ...)`` is allowed, the
    socket the CUDA driver makes in ``cuInit`` (:data:`CUDA_SOCKET`)."""
    arch = _ARCHES[machine]
    load, jeq, jge, jset, ret, and_ = 0x20, 0x15, 0x35, 0x45, 0x06, 0x54
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EPERM
    program: list[tuple] = [(load, 0, 0, 4), (jeq, 0, "deny", arch.audit), (load, 0, 0, 0)]
    if arch.x32:  # x32 system calls (numbers with bit 30 set) are refused
        program.append((jge, "deny", 0, 0x40000000))
    program.append((jeq, "socket" if unix_seqpacket else "deny", 0, arch.socket))
    for number in (_IO_URING_SETUP, *arch.chown):
        program.append((jeq, "deny", 0, number))
    for number in arch.chmod_mode_arg1:
        program.append((jeq, "mode1", 0, number))
    for number in arch.chmod_mode_arg2:
        program.append((jeq, "mode2", 0, number))
    program.append((ret, 0, 0, allow))
    labels = {"mode1": len(program)}  # the low word of argument 1 (seccomp_data.args[1])
    program += [(load, 0, 0, 16 + 8), (jset, "deny", "allow", _SETUID_BITS)]
    labels["mode2"] = len(program)
    program += [(load, 0, 0, 16 + 16), (jset, "deny", "allow", _SETUID_BITS)]
    if unix_seqpacket:  # the family (argument 0), then the type without its flags (argument 1)
        labels["socket"] = len(program)
        program += [
            (load, 0, 0, 16),
            (jeq, 0, "deny", _AF_UNIX),
            (load, 0, 0, 16 + 8),
            (and_, 0, 0, _SOCK_TYPE_MASK),
            (jeq, "allow", "deny", _SOCK_SEQPACKET),
        ]
    labels["deny"] = len(program)
    program.append((ret, 0, 0, deny))
    labels["allow"] = len(program)  # (jumps go forward only)
    program.append((ret, 0, 0, allow))

    def offset(target, at: int) -> int:
        return target if isinstance(target, int) else labels[target] - at - 1

    return [(code, offset(jt, at), offset(jf, at), k)
            for at, (code, jt, jf, k) in enumerate(program)]  # fmt: skip


def install_seccomp(machine: str, unix_seqpacket: bool = False) -> None:
    """Install :func:`seccomp_program` on this thread (after ``PR_SET_NO_NEW_PRIVS``)."""
    instructions = seccomp_program(machine, unix_seqpacket)
    array = (_SockFilter * len(instructions))(*(_SockFilter(*i) for i in instructions))
    program = _SockFprog(len(instructions), array)
    no_new_privileges()
    _prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(program))
