"""How long the harness waits for a plugin host: each request's time limit, an ending's grace.

**The request limit** (``--plugin-timeout SECONDS`` on ``run``, ``check`` and
``leaderboard``; :data:`TIMEOUT_ENV`; :data:`DEFAULT_TIMEOUT` else) bounds every request to a
plugin host, from the moment it is sent to its whole answer: a host that has not answered by
then is ended with everything it started, and the request fails naming the distribution, the
request and the limit, and how to raise it (:func:`past_limit`); in a run that fails its
row, the other rows go on, and ``idrs-bench run`` again retries it.

The default, 30 minutes, is a bound on a legitimate request with room to spare: the
costliest request of a run is σ of one shard (32 inputs by default), which a per-input σ
search computes with Monte Carlo on the base model (Chen et al.'s grid, Alfarra et al.'s
gradient ascent): some 10⁵–10⁶ forward passes, minutes of an ImageNet ResNet-50 on a GPU
(about 10 minutes at 1,000 images/s). A plugin stuck in a loop costs at most that much per
row. A plugin that trains a base model or fits a network for longer than that in one
request needs a larger limit, which the run records (``runs.plugin_hosts``). The first
request to a new host has :data:`START_SECONDS` more: the host imports torch and its
plugins first (seconds when the machine is idle, far more when it is loaded).

**The grace period** (:data:`GRACE_SECONDS`): a host asked to end (its requests' pipe
closed) that has not ended by then is killed, with everything it started
(:mod:`harness.plugin.hosting.keeper`): a plugin that ignores ``SIGTERM`` or keeps a thread
running cannot hold the run.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager

from harness.foundation.environment import variable_set
from harness.foundation.errors import IdrsError

TIMEOUT_ENV = "IDRS_BENCH_PLUGIN_TIMEOUT"
DEFAULT_TIMEOUT = 1800.0
"""Seconds a plugin host has to answer one request (the module docstring says why)."""
START_SECONDS = 120.0
"""Seconds a new host has to start (imports) besides its first request's limit."""
GRACE_SECONDS = 5.0
"""Seconds a host asked to end has before it is killed."""
OPTION = "--plugin-timeout"


def plugin_timeout() -> float:
    """The request limit in seconds: :data:`TIMEOUT_ENV` (``--plugin-timeout`` sets it for
    its command), else :data:`DEFAULT_TIMEOUT`. A value that is not a positive number of
    seconds is an error naming where it was given."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    return seconds(text, f"{TIMEOUT_ENV}={text!r}")


def seconds(text: str, where: str) -> float:
    """``text`` as a positive, finite number of seconds (``where``: what an error names)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise IdrsError(f"{where} is not a number of seconds; give a positive number, e.g. "
                        f"{OPTION} 3600 (one hour per request to a plugin host)")  # fmt: skip
    return value


def add_plugin_timeout_option(parser) -> None:
    """``--plugin-timeout SECONDS`` on an ``argparse`` parser (its command sets
    :data:`TIMEOUT_ENV` with :func:`timeout_set`)."""
    parser.add_argument(
        OPTION, metavar="SECONDS", default=None,
        help=f"seconds a plugin host has to answer one request before it is ended and its row "
        f"fails (default ${TIMEOUT_ENV}, else {DEFAULT_TIMEOUT:g}); recorded with the run",
    )  # fmt: skip


@contextmanager
def timeout_set(value: str | None) -> Iterator[None]:
    """With ``value`` (``--plugin-timeout``), :data:`TIMEOUT_ENV` is set while the block runs
    (its subprocesses inherit it: audit workers), then restored."""
    limit = None if value is None else f"{seconds(value, f'{OPTION} {value}'):g}"
    with variable_set(TIMEOUT_ENV, limit):
        yield


def past_limit(host: str, op: str, limit: float) -> str:
    """What a request that ran past ``limit`` seconds fails with (``host``: the host as errors
    name it)."""
    raised = max(2 * limit, 60.0)
    return (f"{host} did not answer the request {op!r} within the limit of {limit:g} s; it was "
            f"ended with every process it had started. If the plugin needs longer, raise the "
            f"limit: {OPTION} {raised:g} (or {TIMEOUT_ENV}={raised:g}), then `idrs-bench run` "
            "again retries the row")  # fmt: skip
