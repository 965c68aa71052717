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
(:mod:`harness.plugin.hosting.in_host.keeper`): a plugin that ignores ``SIGTERM`` or keeps a thread
running cannot hold the run.

**The memory limit** (``--plugin-memory MiB`` on the same commands; :data:`MEMORY_ENV`)
bounds the memory a plugin host and every process it starts use together, page cache and
shared memory included (:mod:`harness.plugin.hosting.shared.memory_cgroup`): past it the kernel's
out-of-memory killer kills the host, never the harness, and the request fails naming the
killer, the memory used and the limit, and how to raise it (:func:`out_of_memory`). Unset,
a host may use :data:`MEMORY_SHARE` of the memory available when it starts (the kernel's
``MemAvailable``, less where the harness's own cgroup allows less): the rest stays for the
harness and what else the machine runs. A limit set where no memory cgroup can be made is
an error; the default then leaves the host without a limit of its own (docs/threat-model.md,
"Memory").

**The answer's size** (:func:`answer_limit`): the harness reads each answer within a
:class:`~harness.plugin.hosting.shared.wire.Limit` derived from its request, before it allocates
anything for it: a frame whose head claims a longer header (JSON) or payload (the arrays'
bytes) ends the host with everything it started, and the request fails naming the
distribution, the request and the limit (:func:`past_size`). An answer that carries no
data (a handle, a declaration, an acknowledgement, an error and its traceback) has
:data:`CONTROL_BYTES` of each; σ of a batch 8 bytes per input element (a diagonal scale;
twice that with their gradients), and so has a centre; the claims on ``k`` inputs
:data:`~harness.foundation.storable.EVIDENCE_BYTES` of evidence and as much of staged state per
claim, and a float64 copy of each input; a re-derivation five float64 arrays of its rows;
a trainer's answer the state it was sent, at 8 bytes per element; a dataset or a
σ-provider's declaration (its weights, a σ-smoothing's estimator), which nothing in the
request bounds, half the memory the harness can still take (:func:`available_memory`). A
header's decoded value takes at most some 50 bytes per header byte
(:mod:`harness.plugin.hosting.shared.wire`), so the answer to a σ batch or a chunk of claims costs
the harness at most megabytes, whatever the plugin sends.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from harness.foundation.environment import variable_set
from harness.foundation.errors import IdrsError
from harness.foundation.storable import EVIDENCE_BYTES
from harness.plugin.hosting.shared.host_protocol import (
    BallSigmas,
    Centre,
    Certify,
    HostRequest,
    OrderReplays,
    Recompute,
    Request,
    Sigma,
    Train,
)

if TYPE_CHECKING:  # (the wire imports numpy: the command line's start does not need it)
    from harness.plugin.hosting.shared.wire import Limit

TIMEOUT_ENV = "IDRS_BENCH_PLUGIN_TIMEOUT"
DEFAULT_TIMEOUT = 1800.0
"""Seconds a plugin host has to answer one request (the module docstring says why)."""
START_SECONDS = 120.0
"""Seconds a new host has to start (imports) besides its first request's limit."""
GRACE_SECONDS = 5.0
"""Seconds a host asked to end has before it is killed."""
OPTION = "--plugin-timeout"
CONTROL_BYTES = 64 * 1024
"""Header and payload of an answer that carries no data (and the least any answer gets: room
for an error's message and traceback)."""
CLAIM_BYTES = 1024
"""Header bytes of one claim besides its evidence (its numbers and keys)."""
ITEM_BYTES = 64
"""Header bytes of one number of a list an answer carries (an id, a σ, a replayed radius)."""
DESCRIBE_BYTES = 4 << 20
"""Header of the answer that describes a host's plugins (their components, defaults and
descriptions), of a dataset's and of a σ-provider's declaration."""
MEMORY_ENV = "IDRS_BENCH_PLUGIN_MEMORY"
MEMORY_OPTION = "--plugin-memory"
MEMORY_SHARE = 0.75
"""The share of the memory available when a host starts that it may use, unless told."""
_UNITS = {"": 1 << 20, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


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


def plugin_memory() -> int | None:
    """The memory limit of a plugin host in bytes, as :data:`MEMORY_ENV` says
    (``--plugin-memory`` sets it for its command); None when it is unset (a host then may use
    :data:`MEMORY_SHARE` of the memory available when it starts). A value that is not an
    amount of memory is an error naming where it was given."""
    text = os.environ.get(MEMORY_ENV, "").strip()
    if not text:
        return None
    return memory(text, f"{MEMORY_ENV}={text!r}")


def memory(text: str, where: str) -> int:
    """``text`` as a positive amount of memory in bytes: MiB, or a number with a unit
    ``K``, ``M``, ``G`` or ``T`` (powers of 1024; ``8G``, ``8GiB``); ``where``: what an
    error names."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    amount = float(found.group(1)) * _UNITS[found.group(2).lower()] if found else 0.0
    if not (math.isfinite(amount) and amount >= 1 << 20):
        raise IdrsError(f"{where} is not an amount of memory of 1 MiB or more; give MiB or a "
                        f"unit, e.g. {MEMORY_OPTION} 8G (8 GiB for each plugin host)")  # fmt: skip
    return int(amount)


def add_plugin_memory_option(parser) -> None:
    """``--plugin-memory MiB`` on an ``argparse`` parser (its command sets
    :data:`MEMORY_ENV` with :func:`memory_set`)."""
    parser.add_argument(
        MEMORY_OPTION, metavar="MiB", default=None,
        help=f"memory a plugin host and its processes may use together (MiB, or with a unit: "
        f"8G) before the kernel kills it and its row fails (default ${MEMORY_ENV}, else "
        f"{MEMORY_SHARE:.0%}% of the memory available when the host starts)",
    )  # fmt: skip


@contextmanager
def memory_set(value: str | None) -> Iterator[None]:
    """With ``value`` (``--plugin-memory``), :data:`MEMORY_ENV` is set while the block runs
    (its subprocesses inherit it), then restored."""
    limit = None if value is None else str(memory(value, f"{MEMORY_OPTION} {value}") >> 20)
    with variable_set(MEMORY_ENV, limit):
        yield


def host_memory(headroom: int | None) -> tuple[int | None, str]:
    """The memory limit of a host starting now, in bytes, and how it was set: the one given
    (:func:`plugin_memory`), else :data:`MEMORY_SHARE` of ``headroom`` (the memory available
    now; None: unknown, and then no limit)."""
    given = plugin_memory()
    if given is not None:
        return given, f"{MEMORY_OPTION} {given >> 20} (or {MEMORY_ENV})"
    if headroom is None:
        return None, "the kernel does not say how much memory is available"
    return int(headroom * MEMORY_SHARE), (f"{MEMORY_SHARE:.0%} of the memory available when "
                                          f"the host started; {MEMORY_OPTION} sets it")  # fmt: skip


def out_of_memory(limit: int) -> str:
    """How to give a host killed at its memory limit of ``limit`` bytes more."""
    raised = max(2 * limit, 1 << 30) >> 20
    return (f"if the plugin needs more, raise the limit: {MEMORY_OPTION} {raised} (or "
            f"{MEMORY_ENV}={raised}), then `idrs-bench run` again retries the row")  # fmt: skip


Bounds = tuple[int, int, str]
"""An answer's header and payload bytes, and what they are derived from, in words."""


def _sigma(request: Sigma) -> Bounds:
    k, gradient, elements = len(request.x), bool(request.gradient), request.x.numel()
    what = f"σ of {k} inputs: a float64 value per input element (a diagonal scale)" + (
        ", and their gradients as many" if gradient else "")  # fmt: skip
    return CONTROL_BYTES, 8 * elements * (2 if gradient else 1), what


def _centre(request: Centre) -> Bounds:
    what = f"the centre of {len(request.x)} inputs: a float64 value per input element"
    return CONTROL_BYTES, 8 * request.x.numel(), what


def _certify(request: Certify) -> Bounds:
    evidence = request.evidence
    k = len(evidence["input_ids"])
    elements = evidence["x"][0].numel() if k else 0
    return (CONTROL_BYTES + k * (CLAIM_BYTES + 2 * EVIDENCE_BYTES),
            CONTROL_BYTES + k * (2 * EVIDENCE_BYTES + 8 * elements),
            f"the claims on {k} inputs: {EVIDENCE_BYTES} bytes of evidence and as much "
            "of staged state per claim, and a float64 copy of each input")  # fmt: skip


def _ball_sigmas(request: BallSigmas) -> Bounds:
    k = len(request.rows)
    return (CONTROL_BYTES + 2 * ITEM_BYTES * k, CONTROL_BYTES,
            f"σ of {k} certified balls: an id and a number each")  # fmt: skip


def _order_replays(request: OrderReplays) -> Bounds:
    cells = (int(request.orders) + 2) * len(request.ids)
    return (CONTROL_BYTES + 2 * ITEM_BYTES * cells, CONTROL_BYTES + 16 * cells,
            f"{request.orders} replayed orders of {len(request.ids)} "
            "certificates: a class and a radius each")  # fmt: skip


def _recompute(request: Recompute) -> Bounds:
    k = len(request.rows)
    return (CONTROL_BYTES, CONTROL_BYTES + 5 * 8 * k,
            f"the re-derivation of {k} certificates: five float64 arrays")  # fmt: skip


def _train(request: Train) -> Bounds:
    state = request.model["state"]
    elements = sum(t.numel() for t in state.values())
    return (CONTROL_BYTES + sum(len(name) + ITEM_BYTES for name in state),
            CONTROL_BYTES + 8 * elements,
            f"the trained state of a model of {elements} parameters and buffers, 8 "
            "bytes each")  # fmt: skip


def _unbounded(what: str) -> Callable[[HostRequest], Bounds]:
    def bounds(_: HostRequest) -> Bounds:
        return (DESCRIBE_BYTES, max(CONTROL_BYTES, available_memory() // 2),
                f"{what}: half the memory the harness can still take")  # fmt: skip

    return bounds


def _describe(_: HostRequest) -> Bounds:
    return DESCRIBE_BYTES, CONTROL_BYTES, "the description of a host's plugins"


ANSWER_BOUNDS: dict[Request, Callable[[Any], Bounds]] = {
    Request.SIGMA: _sigma,
    Request.CENTRE: _centre,
    Request.CERTIFY: _certify,
    Request.BALL_SIGMAS: _ball_sigmas,
    Request.ORDER_REPLAYS: _order_replays,
    Request.RECOMPUTE: _recompute,
    Request.TRAIN: _train,
    Request.LOAD_DATASET: _unbounded("a dataset"),
    Request.BUILD_SIGMA_PROVIDER: _unbounded("a σ-provider's declaration"),
    Request.DESCRIBE: _describe,
}
"""The bounds of the answer to each request that carries data (the module docstring says
what each is derived from); every other request's answer carries none."""


def answer_limit(request: HostRequest) -> Limit:
    """The largest answer the harness reads to ``request`` (:data:`ANSWER_BOUNDS`; one that
    carries no data: :data:`CONTROL_BYTES` of each)."""
    from harness.plugin.hosting.shared.wire import Limit

    bounds = ANSWER_BOUNDS.get(request.op)
    if bounds is None:
        return Limit(CONTROL_BYTES, CONTROL_BYTES,
                     f"an answer to {request.op.value!r}, which carries no data")  # fmt: skip
    return Limit(*bounds(request))


def available_memory() -> int:
    """Bytes this process can still take: the memory available to its cgroups
    (:func:`~harness.plugin.hosting.shared.memory_cgroup.headroom`) and its address space's room
    (``RLIMIT_AS`` less ``VmSize``), the less of the two where known."""
    import resource

    from harness.plugin.hosting.shared.memory_cgroup import headroom

    room = [headroom()]
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    if limit != resource.RLIM_INFINITY:
        with open("/proc/self/status") as status:
            size = next((int(line.split()[1]) * 1024 for line in status
                         if line.startswith("VmSize:")), 0)  # fmt: skip
        room.append(limit - size)
    known = [r for r in room if r is not None]
    return max(0, min(known)) if known else 1 << 62


def past_size(host: str, op: str, exc: Exception) -> str:
    """What a request whose answer claimed more than its limit fails with (``host``: the
    host as errors name it; ``exc``: the wire's
    :class:`~harness.plugin.hosting.shared.wire.PastLimit`)."""
    return (f"{host} answered the request {op!r} with {exc}; it was ended with every process "
            "it had started (a plugin's answer is bounded by what it was asked: "
            'docs/threat-model.md, "Answers")')  # fmt: skip
