"""A plugin host's process as started: asked within a deadline, ended on time, its end told.

:class:`RunningHost` starts ``python -m harness.plugin.hosting.in_host.host`` with a pipe of
its own to the host's keeper (:mod:`harness.plugin.hosting.in_host.keeper`), which says the
host's pid when it forks and, when it exits, how the host ended. The process this object
holds is the keeper; the host is its child. Ending one (harness/README.md, "Plugin host"):

- :meth:`RunningHost.end`, a host that is idle: its requests' pipe is closed (the host
  exits), and a host that has not ended within the grace period
  (:data:`~harness.plugin.hosting.in_harness.limits.GRACE_SECONDS`) is killed;
- :meth:`RunningHost.kill`, a host that is busy or past its request's limit: ``SIGTERM``
  to the keeper, which kills the host and everything beneath it with ``SIGKILL`` and exits;
  a keeper that has not exited by then is killed, and the host with it.

Either way the keeper's record says how the host ended (:meth:`RunningHost.ending`), and
the host's output is drained meanwhile (:mod:`harness.plugin.hosting.in_harness.host_output`).

Before it starts the process, it makes the host's memory cgroup
(:mod:`harness.plugin.hosting.shared.memory_cgroup`; its limit:
:func:`~harness.plugin.hosting.in_harness.limits.host_memory`), which the host joins before it
confines itself and the keeper removes when the host has ended, saying whether the
out-of-memory killer killed in it. A limit the user set that no cgroup can enforce is an
error; the default limit, where none can be made, is left out, and said once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from harness.foundation.errors import IdrsError
from harness.plugin.hosting.in_harness.exchange import exchange
from harness.plugin.hosting.in_harness.host_ending import ending
from harness.plugin.hosting.in_harness.host_output import HostOutput
from harness.plugin.hosting.in_harness.limits import GRACE_SECONDS, host_memory, plugin_memory
from harness.plugin.hosting.shared import memory_cgroup, wire
from harness.plugin.hosting.shared.keeper_record import KILL_SECONDS

KEEPER_SECONDS = KILL_SECONDS + 5.0
"""How long a keeper told to end its host has to exit before it is killed."""
_SAID: list[str] = []


def host_memory_cgroup() -> tuple[memory_cgroup.MemoryCgroup | None, dict[str, Any]]:
    """The memory cgroup of a host starting now (None where none is made) and what its
    start message says of it (``memory``: the cgroup, its limit and how the limit was set;
    or why it has none). A limit the user set that cannot be enforced is an
    :class:`IdrsError`."""
    limit, set_by = host_memory(memory_cgroup.headroom())
    if limit is None:
        return None, {"limit": None, "why": set_by}
    try:
        cgroup = memory_cgroup.make(limit)
    except memory_cgroup.Unavailable as exc:
        if plugin_memory() is not None:
            raise IdrsError(f"the memory limit of plugin hosts ({set_by}) cannot be enforced "
                            f"here: {exc}. Run where it can, or leave the limit unset: a host "
                            "then has no limit of its own and stays the kernel's first choice "
                            'under memory pressure (docs/threat-model.md, "Memory")') from None  # fmt: skip
        if not _SAID:
            _SAID.append(str(exc))
            print(f"note: plugin hosts run without a memory limit of their own: {exc}; each "
                  "stays the kernel's first choice under memory pressure (docs/threat-model.md, "
                  '"Memory")', file=sys.stderr)  # fmt: skip
        return None, {"limit": None, "why": str(exc)}
    return cgroup, {**cgroup.to_message(), "set_by": set_by}


class RunningHost:
    """The process ``argv`` (the host's entry point; the keeper's pipe is added to its start
    message ``start``) with ``environment``; ``name``: the host as errors name it."""

    def __init__(self, argv: Sequence[str], start: Mapping[str, Any],
                 environment: Mapping[str, str], name: str, echo: bool = True) -> None:  # fmt: skip
        self.memory, memory = host_memory_cgroup()
        """The host's memory cgroup (None: it has none)."""
        read, write = os.pipe()
        try:
            self.process = subprocess.Popen(
                [*argv, json.dumps({**start, "status_fd": write, "memory": memory})],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=dict(environment), pass_fds=(write,),
            )  # fmt: skip
        except BaseException:
            os.close(read)
            if self.memory is not None:
                self.memory.remove()
            raise
        finally:
            os.close(write)
        self._status, self._said = read, b""
        self.records: list[dict[str, Any]] = []
        self.answered = 0
        """Requests this process has answered."""
        self.output = HostOutput(self.process.stderr.fileno(), echo, name)

    @property
    def pid(self) -> int:
        """The keeper's pid (the process started here)."""
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def ask(self, frame: bytes, deadline: float, limit: wire.Limit | None = None) -> Any:
        """Send a request's ``frame``; its answer by ``deadline``, within ``limit``
        (:func:`~harness.plugin.hosting.in_harness.exchange.exchange`)."""
        answer = exchange(self.process.stdin.fileno(), self.process.stdout.fileno(), frame,
                          deadline, limit)  # fmt: skip
        self.answered += 1
        return answer

    @property
    def host_pid(self) -> int | None:
        """The host's pid, once its keeper has said it."""
        self._read_status(block=False)
        return next((int(r["host"]) for r in self.records if "host" in r), None)

    def end(self, grace: float = GRACE_SECONDS) -> None:
        """End an idle host: close its requests' pipe, and kill it after ``grace`` seconds."""
        if self.alive():
            with contextlib.suppress(OSError):
                self.process.stdin.close()
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.kill()
        self._finish()

    def kill(self, ended: bool = False) -> None:
        """End the host now, and everything it started (see the module docstring);
        ``ended``: the host's pipes have closed, so its keeper is ending the rest and is
        waited for first (then says how the host ended)."""
        if ended:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=KEEPER_SECONDS)
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=KEEPER_SECONDS)
            except subprocess.TimeoutExpired:  # the keeper itself is stuck: both are killed
                host = self.host_pid
                self.process.kill()
                if host is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(host, signal.SIGKILL)
                self.process.wait()
        self._finish()

    def _finish(self) -> None:
        self._read_status(block=True)
        self.output.wait(1.0)
        for stream in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        if self.output.ended.is_set():
            with contextlib.suppress(OSError):
                self.process.stderr.close()
        if self._status >= 0:
            os.close(self._status)
            self._status = -1
        if self.memory is not None:  # (its keeper removed it, unless it was killed first)
            self.memory.remove()

    def _read_status(self, block: bool) -> None:
        """Read the keeper's records: what has come (``block``: until its pipe's end)."""
        if self._status < 0:
            return
        os.set_blocking(self._status, block)
        while True:
            try:
                chunk = os.read(self._status, 4096)
            except (BlockingIOError, InterruptedError):
                break
            if not chunk:
                break
            self._said += chunk
        *lines, self._said = self._said.split(b"\n")
        for line in lines:
            with contextlib.suppress(ValueError):
                self.records.append(json.loads(line))

    def ending(self, doing: str = "") -> str:
        """How the host ended, in words (after :meth:`end` or :meth:`kill`); ``doing``: what
        it was doing then (:func:`~harness.plugin.hosting.in_harness.host_ending.ending`)."""
        final = next((r for r in reversed(self.records) if "by" in r), None)
        if final is not None:
            return ending(final, doing)
        code = self.process.returncode
        return f"ended {doing} (its keeper exited {code} without saying how)".replace("  ", " ")
