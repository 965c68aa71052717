"""How a plugin host ended, in words: what a failed request says, from its keeper's record.

The keeper (:mod:`harness.plugin.hosting.in_host.keeper`) writes one record when the host
has ended (:mod:`harness.plugin.hosting.shared.keeper_record`); :func:`ending` says it as a
request's error does: who ended it, the signal or exit status and its likely cause (a crash
in native code, the out-of-memory killer and the host's memory limit, a process that left
the host's memory cgroup or lowered its ``oom_score_adj``), and the processes ended with it.
"""

from __future__ import annotations

import signal
from typing import Any

from harness.plugin.hosting.in_harness.limits import out_of_memory
from harness.plugin.hosting.shared.keeper_record import OOM_SCORE_ADJ


def ending(record: dict[str, Any], doing: str = "") -> str:
    """How a host ended, in words, from its keeper's record
    (:func:`harness.plugin.hosting.in_host.keeper.keep`); ``doing``: what it was doing then
    (e.g. ``while answering the request 'sigma'``)."""
    by, left = record.get("by"), int(record.get("left") or 0)
    memory = record.get("memory") or {}
    cause = ""
    if by == "keeper":
        broke = record.get("breach") or {}
        did = (f"lowered its oom_score_adj from {OOM_SCORE_ADJ} to {broke.get('oom_score_adj')}"
               if "oom_score_adj" in broke else
               f"left the host's memory cgroup for {broke.get('cgroup')}")  # fmt: skip
        head = "was ended by its keeper"
        cause = (f": its process {broke.get('pid')} {did}, which a plugin may not (out of "
                 'memory, a plugin host dies, never the harness: docs/threat-model.md, "Memory")')  # fmt: skip
    elif by == "host" and memory.get("oom_kills") and record.get("signal") == signal.SIGKILL:
        head = f"was killed by the out-of-memory killer at {_mib(memory.get('peak') or memory['limit'])}"
        cause = f"; {_limit(memory['limit'])}"
    elif by != "host" and record.get("signal") in (None, signal.SIGKILL):
        head = "was ended by the harness"
    elif "signal" in record:
        number = int(record["signal"])
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        head = f"was killed by {name} (signal {number})"
        if number == signal.SIGKILL and record.get("oom_kills"):  # (by the kernel)
            cause = (": the kernel's out-of-memory killer ran meanwhile, so the plugin most "
                     "likely needed more memory than the machine had")  # fmt: skip
        elif number == signal.SIGKILL:
            cause = ", from outside the harness (another process, or the out-of-memory killer)"
        elif number in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE,
                        signal.SIGABRT):  # fmt: skip
            cause = ": a crash in native code (a C extension or a driver)"
    elif "exit" in record:
        head = f"exited with status {record['exit']}"
        cause = " (a plugin ended the process)" if record["exit"] == 0 else ""
    else:
        head = "ended"
    words = head + (f" {doing}" if doing else "") + cause
    if memory.get("oom_kills") and "out-of-memory" not in head:
        words += (f"; the out-of-memory killer killed {memory['oom_kills']} of its processes "
                  f"at {_mib(memory.get('peak') or memory['limit'])}; "
                  f"{_limit(memory['limit'])}")  # fmt: skip
    if left:
        words += f"; the {left} process(es) it had started were ended with it"
    return words


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.0f} MiB"


def _limit(limit: int) -> str:
    """The memory limit of a host, and how to raise it."""
    return (
        f"limit {_mib(limit)} for the host and every process it started together; "
        f"{out_of_memory(limit)}"
    )
