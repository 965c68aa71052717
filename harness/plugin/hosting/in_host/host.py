"""The plugin host: ``python -m harness.plugin.hosting.in_host.host START``, where plugins run.

The harness never imports a third-party plugin where it draws samples, runs checks or
decides verdicts (harness/README.md, "Plugin host"). Each third-party distribution gets a
host of its own (:class:`harness.plugin.hosting.in_harness.host_process.PluginHost` starts
it), so that one plugin cannot reach another's code, and the host answers the harness's
requests (:mod:`harness.plugin.hosting.shared.host_protocol`, answered by
:mod:`harness.plugin.hosting.in_host.host_requests`). ``START`` is a JSON object:
``distribution``, the one whose plugins this host loads (besides the built-ins; null: the
built-ins only); ``plugins``, the plugins of it the harness accepted (the only ones loaded;
absent: all of them); ``prefix``, the folder it is installed in when ``idrs-bench plugins
install`` put it there (:mod:`harness.plugin.private_install`); ``grants``, what the
confined host may reach besides its Python, of what only the harness knows
(:class:`harness.plugin.hosting.shared.policy.HostPaths`, granted as
:func:`~harness.plugin.hosting.shared.policy.host_policy` says), or null when the user ran
it unconfined; ``layers``, the confinement's layers (absent: all of them; fewer only for
the diagnostic :mod:`harness.plugin.hosting.in_harness.confinement_probe`);
``status_fd``, ``scratch`` and ``folder``, for its keeper; ``memory``, the memory cgroup
it joins before it confines itself (:mod:`harness.plugin.hosting.shared.memory_cgroup`).

First the process forks (:func:`harness.plugin.hosting.in_host.keeper.split`): the parent
stays as the host's keeper, which ends every process the plugins start when the host ends, when the
harness asks, or when the harness ends. Then, before it imports numpy, torch or any plugin,
and before it starts a thread, the host confines itself
(:func:`harness.plugin.hosting.in_host.confinement.confine`): a plugin's code, from its import on,
reads only its Python, its own files and what the harness sends, writes only its scratch
directory and artifact folders, opens no socket and cannot signal or ptrace the harness or
the keeper (docs/threat-model.md).

Protocol: one request per message on stdin, one answer per message on a copy of the
original stdout (a plugin's prints, to fd 1 or 2, go to stderr);
``{"ok": false, "error": ...}`` when a request fails (every request, when the host could
not confine itself or load its plugins). The process exits when its stdin closes (at once:
a plugin's threads do not hold it), or when its keeper has ended while a plugin's code
blocks: it never outlives the harness.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

from harness.foundation.errors import IdrsError
from harness.foundation.parent_watch import exit_with_parent
from harness.plugin.hosting.in_host.confinement import confine
from harness.plugin.hosting.in_host.keeper import split
from harness.plugin.hosting.shared import memory_cgroup
from harness.plugin.hosting.shared.policy import LAYERS, HostPaths, host_policy


def answer_error(exc: BaseException) -> dict[str, Any]:
    """The answer to a request that failed with ``exc``."""
    kind = type(exc).__name__ if isinstance(exc, IdrsError) else "error"
    message = str(exc) if isinstance(exc, IdrsError) else f"{type(exc).__name__}: {exc}"
    return {"ok": False, "error": message, "error_type": kind,
            "traceback": traceback.format_exc(limit=-4)}  # fmt: skip


def confined(start: dict[str, Any], cgroup: memory_cgroup.MemoryCgroup | None) -> int:
    """Confine this process as ``start`` says, to its policy
    (:func:`~harness.plugin.hosting.shared.policy.host_policy`: its Python, the system's
    files and its distribution's granted less the installed datasets, what the harness
    grants it, ``cgroup`` its memory); the Landlock ABI it is confined with (0: unconfined,
    as the user asked)."""
    if start.get("grants") is None:
        return 0
    policy = host_policy(HostPaths.from_message(start["grants"]), start.get("distribution"),
                         start.get("prefix"), cgroup)  # fmt: skip
    return confine(policy.landlock(), layers=start.get("layers", LAYERS)).abi


def main(argv: list[str] | None = None) -> None:
    """Confine, load the plugins, then serve requests until stdin closes or the harness's
    process ends (see the module docstring)."""
    argv = sys.argv[1:] if argv is None else argv
    start = json.loads(argv[0]) if argv else {}
    parent = split(start)  # the keeper stays behind in the parent; this is the host
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a plugin's print goes to stderr
    sys.stdout = sys.stderr
    error = None
    try:
        cgroup = memory_cgroup.MemoryCgroup.from_message(start.get("memory"))
        if cgroup is not None:  # (confined, it could not: Landlock refuses writes to /sys)
            memory_cgroup.join(cgroup)
        abi = confined(start, cgroup)  # first: before any thread, numpy, torch or plugin
    except Exception as exc:
        error = answer_error(exc)
    exit_with_parent(parent)
    from harness.plugin.hosting.shared import wire

    host = None
    if error is None:
        if start.get("prefix"):
            sys.path.insert(0, start["prefix"])  # (not a site folder: no .pth file runs)
        try:
            from harness.plugin.hosting.in_host.host_requests import Host

            host = Host(start.get("distribution"), abi, start.get("plugins"))
        except Exception as exc:  # every request is then answered with why the host is broken
            error = answer_error(exc)
    requests = sys.stdin.buffer
    while True:
        try:
            request = wire.read_message(requests)
        except EOFError:  # the harness's end of it: no plugin thread holds the process
            sys.stderr.flush()
            os._exit(0)
        if host is None:
            wire.write_message(channel, error)
            continue
        try:
            answer = {"ok": True, **host.serve(request)}
        except Exception as exc:
            answer = answer_error(exc)
        try:
            wire.write_message(channel, answer)
        except wire.WireError as exc:  # e.g. a σ-provider that returned a list of objects
            wire.write_message(channel, answer_error(IdrsError(
                f"the plugin's answer to {request.get('op')!r} cannot be sent to the harness: {exc}")))  # fmt: skip


if __name__ == "__main__":
    main()
