"""One request to a plugin host and its answer, against a deadline, never blocking.

The request's frame (:mod:`harness.plugin.hosting.shared.wire`) is written to the host's
stdin as the pipe takes it (non-blocking: a host that stopped reading cannot hold the harness in
``write(2)``, which a pipe of 64 KiB would for any σ batch), and the answer read from the
pipe of its answers as it arrives, into one buffer of the frame's size; both wait in
``poll(2)`` until the deadline, in slices (:data:`SLICE_MS`) so that a signal reaches the
harness at once. The answers' pipe has no writer left once the host and every
process it started have ended (its keeper kills them all), so a host's end is seen at once,
whatever killed it: :class:`HostEnded`. A deadline that passes first is
:class:`PastDeadline`; bytes that are not a frame are the wire's
:class:`~harness.plugin.hosting.shared.wire.WireError`, and a frame whose head claims more
than the request's :class:`~harness.plugin.hosting.shared.wire.Limit` its
:class:`~harness.plugin.hosting.shared.wire.PastLimit`, raised from the head alone: the
answer's buffer is allocated only once its size is known to lie within the limit.
"""

from __future__ import annotations

import os
import select
import time
from typing import Any

from harness.plugin.hosting.shared import wire

CHUNK = 1 << 20
SLICE_MS = 250
"""The longest single wait in ``poll(2)``: the kernel may deliver Ctrl-C's ``SIGINT`` (or a
``SIGTERM``) to any thread of the harness (an OpenMP worker, the leases thread), and Python
runs its handler in the main thread only when that thread next runs, so a wait that ends
only at the request's deadline would hold Ctrl-C for up to the plugin timeout."""


class HostEnded(Exception):
    """The host's pipes closed during the request (the host and what it started ended)."""


class PastDeadline(Exception):
    """The deadline passed before the whole answer came."""


def exchange(requests: int, answers: int, frame: bytes, deadline: float,
             limit: wire.Limit | None = None) -> Any:  # fmt: skip
    """Write ``frame`` to the pipe ``requests``, then read and return the one answer from the
    pipe ``answers``, by ``deadline`` (``time.monotonic()``), within ``limit`` (None: a header
    up to :data:`~harness.plugin.hosting.shared.wire.MAX_HEADER`)."""
    os.set_blocking(requests, False)
    view, sent = memoryview(frame), 0
    answer = _Answer(limit)
    poller = select.poll()
    poller.register(answers, select.POLLIN)
    poller.register(requests, select.POLLOUT)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise PastDeadline()
        for fd, _ in poller.poll(min(SLICE_MS, max(1, int(left * 1000) + 1))):
            if fd == requests:
                try:
                    sent += os.write(requests, view[sent : sent + CHUNK])
                except BlockingIOError:
                    continue
                except OSError:  # (EPIPE: nothing reads the requests any more)
                    raise HostEnded() from None
                if sent == len(view):
                    poller.unregister(requests)
            elif answer.read(answers):
                return answer.value()


class _Answer:
    """A frame read as it arrives: its head, then its header and payload into one buffer
    (allocated once the head's lengths are within ``limit``)."""

    def __init__(self, limit: wire.Limit | None = None) -> None:
        self.limit = limit
        self.head = bytearray()
        self.frame: bytearray | None = None
        self.filled = 0
        self.header_length = 0

    def read(self, fd: int) -> bool:
        """Read what ``fd`` has; whether the frame is whole."""
        if self.frame is None:
            chunk = os.read(fd, wire.HEAD.size - len(self.head))
            if not chunk:
                raise HostEnded()
            self.head += chunk
            if len(self.head) < wire.HEAD.size:
                return False
            self.header_length, payload = wire.lengths(bytes(self.head), self.limit)
            self.frame = bytearray(self.header_length + payload)
            return not self.frame
        window = memoryview(self.frame)[self.filled : self.filled + CHUNK]
        count = os.readv(fd, [window])
        if not count:
            raise HostEnded()
        self.filled += count
        return self.filled == len(self.frame)

    def value(self) -> Any:
        frame = memoryview(self.frame if self.frame is not None else bytearray())
        return wire.decode(frame[: self.header_length], frame[self.header_length :])
