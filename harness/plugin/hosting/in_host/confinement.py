"""The plugin host's confinement: what third-party code may reach, enforced by the kernel.

A plugin host (:mod:`harness.plugin.hosting.in_host.host`) confines itself before it imports
anything but the standard library and ``harness``'s light modules, and before it starts a
thread (the kernel confines the calling thread, and its later threads and children inherit
it; a thread started earlier would stay outside), in three steps (docs/threat-model.md).
What it is granted is the policy's
(:func:`~harness.plugin.hosting.shared.policy.host_policy`, each path with its reason);
this module applies it:

1. **Landlock** (Linux security module; docs.kernel.org/userspace-api/landlock.html;
   :mod:`harness.plugin.hosting.shared.landlock`): the filesystem reads and executes only
   beneath :attr:`~harness.plugin.hosting.shared.landlock.Grants.read` (the Python
   installation and every ``sys.path`` entry, the harness's packages, system libraries,
   the files the harness sends), writes only beneath
   :attr:`~harness.plugin.hosting.shared.landlock.Grants.write` (a scratch directory the
   harness creates and deletes, the plugin's own artifact directories), the device
   files of :attr:`~harness.plugin.hosting.shared.landlock.Grants.devices` and its own
   threads' files (:attr:`~harness.plugin.hosting.shared.landlock.Grants.threads`: the
   CUDA driver names its threads); no TCP bind or connect (ABI 4); signals and abstract
   UNIX sockets scoped to the host's own domain (ABI 6); a Landlock-confined process cannot
   ptrace, nor read or write the memory of (``/proc/<pid>/mem``), a process outside its
   domain, the harness included. Rights a running kernel's ABI lacks are left out of the
   ruleset (:func:`~harness.plugin.hosting.shared.landlock.ruleset`); below
   :data:`~harness.plugin.hosting.shared.policy.MINIMUM_ABI` (no ``truncate(2)`` rule) the
   harness refuses to start a third-party plugin confined
   (:func:`~harness.plugin.hosting.shared.policy.refusal`).
2. **No capabilities** (:mod:`harness.plugin.hosting.shared.process_privileges`, as step
   3): the bounding, ambient, effective, permitted and inheritable sets emptied (a root
   host keeps uid 0 but not ``CAP_DAC_READ_SEARCH``'s ``open_by_handle_at(2)``, which
   bypasses path rules, nor any other privilege), after ``PR_SET_NO_NEW_PRIVS`` (no set-uid
   or file capabilities through ``execve``).
3. **seccomp**: ``socket(2)`` and ``io_uring_setup(2)`` fail with EPERM (Landlock has no
   rule for UDP nor for connecting to a named UNIX socket, e.g. a system bus through which
   root starts services, or a Ray node's; io_uring can open sockets without the system
   call), and so do ``chown``-family calls and ``chmod``-family calls that set the set-uid or
   set-gid bit (Landlock does not govern a file's metadata). ``socketpair(2)`` stays for
   connected pairs only (``AF_UNIX`` stream and seqpacket: multiprocessing's pipes), and
   ``sendto(2)`` without an address; in a host granted a GPU's device files, the CUDA
   driver's ``socket(AF_UNIX, SOCK_SEQPACKET)``, without which ``cuInit`` fails
   (:data:`~harness.plugin.hosting.shared.process_privileges.CUDA_SOCKET`). The calls that
   change another process named by its pid, which Landlock's scoping does not cover
   (``prlimit64``, ``setpriority``, ``sched_setaffinity``, ...), fail unless the pid is 0 or
   the host's own, and System V IPC, POSIX message queues and keyrings, which outlive the
   host, fail whole (:data:`~harness.plugin.hosting.shared.process_privileges.SYSTEM_CALLS`).
   libgomp's thread binding (``OMP_PROC_BIND``, ...) is taken out of the environment first:
   it binds a new thread by its id, which the filter refuses
   (:data:`~harness.plugin.hosting.shared.process_privileges.THREAD_BINDING`).

The steps are the layers of :data:`~harness.plugin.hosting.shared.policy.LAYERS` (step 1
two of them); a host takes all of them, and only the diagnostic
``python -m harness.plugin.hosting.in_harness.confinement_probe`` starts hosts with one
alone, to say which layer a device driver's initialization needs something from. A
plugin's confined build (``idrs-bench plugins install``,
:mod:`harness.plugin.private_install`) is confined here too, by all of them.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable

from harness.foundation.errors import IdrsError
from harness.plugin.hosting.shared import landlock
from harness.plugin.hosting.shared.landlock import Grants, Ruleset, restrict, ruleset
from harness.plugin.hosting.shared.policy import LAYERS, grants_gpu, refusal
from harness.plugin.hosting.shared.process_privileges import (
    SECCOMP_MACHINES,
    drop_capabilities,
    install_seccomp,
    unbind_threads,
)


def thread_count() -> int:
    """The threads of this process."""
    return len(os.listdir("/proc/self/task"))


def confine(grants: Grants, abi: int | None = None, layers: Iterable[str] = LAYERS) -> Ruleset:
    """Confine this process for good (steps 1–3 of the module docstring; ``layers``: of
    :data:`~harness.plugin.hosting.shared.policy.LAYERS`, all but for the diagnostic probe)
    to ``grants`` (a policy's:
    :meth:`~harness.plugin.hosting.shared.policy.Policy.landlock`, its own threads' files
    among them, pinned) and return the Landlock ruleset applied. Refused
    (:class:`IdrsError`) while it has other threads, which would stay unconfined, and on a
    kernel below :data:`~harness.plugin.hosting.shared.policy.MINIMUM_ABI`."""
    layers = tuple(layers)
    unknown = [layer for layer in layers if layer not in LAYERS]
    if unknown:
        raise IdrsError(f"unknown confinement layer(s) {unknown}; choose from {', '.join(LAYERS)}")
    abi = landlock.landlock_abi() if abi is None else abi
    uses_landlock = any(layer.startswith("landlock") for layer in layers)
    reason = refusal(abi)
    if reason is not None and uses_landlock:
        raise IdrsError(reason)
    if thread_count() != 1:
        raise IdrsError(f"the plugin host has {thread_count()} threads before it is confined; "
                        "a thread started before confinement would stay unconfined")  # fmt: skip
    rules = ruleset(grants, abi, layers=layers) if uses_landlock else Ruleset(0, 0, 0, 0)
    machine = platform.machine()
    if machine not in SECCOMP_MACHINES and "seccomp" in layers:
        raise IdrsError(f"the plugin host's seccomp filter knows x86_64 and aarch64, not "
                        f"{machine}; run with --unconfined on this machine")  # fmt: skip
    if "capabilities" in layers:
        drop_capabilities()
    if uses_landlock:
        restrict(rules)
    if "seccomp" in layers:  # the CUDA driver's socket where a GPU's device files are granted
        unbind_threads()  # (before libgomp loads: it would bind its threads by their ids)
        install_seccomp(machine, unix_seqpacket=grants_gpu(grants))
    return rules
