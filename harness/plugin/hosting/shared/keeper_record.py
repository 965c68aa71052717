"""What a plugin host's keeper tells the harness: one JSON line per record, on a pipe of its own.

The keeper (:mod:`harness.plugin.hosting.in_host.keeper`) writes ``{"host": <pid>}`` when
it has forked the host, and, when the host has ended, one record of how: ``by`` (who ended
it: ``host``, ``harness``, ``harness ended``, ``keeper``), ``left`` (the processes it
ended besides the host), ``oom_kills`` (the kernel's out-of-memory kills meanwhile),
``memory`` (its cgroup's limit, peak and kills), ``breach`` (the process that lowered its
``oom_score_adj`` or left its cgroup), and ``exit`` or ``signal`` (:func:`report`). The
harness reads them (:class:`harness.plugin.hosting.in_harness.running_host.RunningHost`)
and says them in words (:func:`harness.plugin.hosting.in_harness.host_ending.ending`).
"""

from __future__ import annotations

import os
from typing import Any

KILL_SECONDS = 10.0
"""How long the keeper waits for the processes it killed to be reaped."""
OOM_SCORE_ADJ = 1000
"""The host's ``oom_score_adj``: the kernel's first choice under memory pressure."""


def report(wait_status: int) -> dict[str, Any]:
    """A wait status as the keeper reports it: ``exit`` (the code) or ``signal`` (its number)."""
    if os.WIFSIGNALED(wait_status):
        return {"signal": os.WTERMSIG(wait_status)}
    return {"exit": os.waitstatus_to_exitcode(wait_status)}
