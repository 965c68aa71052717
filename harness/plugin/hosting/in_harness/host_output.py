"""A plugin host's output (its plugins' prints and logs), read without ever blocking the host.

A host's stdout and stderr are one pipe (:mod:`harness.plugin.hosting.in_host.host` points a
plugin's stdout at it; the answers travel on a descriptor of their own), whose buffer the
kernel keeps small (64 KiB on Linux): a host writing to a full pipe stops. So a thread
reads it from the moment the host starts until it ends (:class:`HostOutput`), in chunks,
whatever the host writes (lines, a progress bar's carriage returns, bytes without any line
end), and

- echoes it to this process's stderr, at most :data:`ECHO_BYTES` per :data:`ECHO_SECONDS`
  (a flood is left out, and a line says how much);
- keeps the last :data:`TAIL_LINES` lines, each cut at :data:`LINE_CHARS` characters, for
  the host's error messages (:meth:`HostOutput.tail`): memory stays bounded.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections import deque

CHUNK = 1 << 16
TAIL_LINES = 20
LINE_CHARS = 500
ECHO_BYTES = 1 << 16
ECHO_SECONDS = 10.0


class HostOutput:
    """Reads the pipe ``fd`` on a daemon thread until its end (see the module docstring);
    ``echo``: False to keep the output from this process's stderr (only its tail is kept)."""

    def __init__(self, fd: int, echo: bool = True, name: str = "plugin host") -> None:
        self._fd, self._echo, self.name = fd, echo, name
        self._lines: deque[str] = deque(maxlen=TAIL_LINES)
        self._partial = ""
        self._lock = threading.Lock()
        self.read = 0
        """Bytes read so far."""
        self.left_out = 0
        """Bytes not echoed (over the echo's rate)."""
        self._window, self._echoed = time.monotonic(), 0
        self.ended = threading.Event()
        self._thread = threading.Thread(target=self._drain, daemon=True, name="host-output")
        self._thread.start()

    def _drain(self) -> None:
        try:
            while True:
                try:
                    chunk = os.read(self._fd, CHUNK)
                except InterruptedError:
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                self.read += len(chunk)
                self._keep(chunk.decode(errors="replace"))
                if self._echo:
                    self._echo_chunk(chunk)
        finally:  # (the pipe is its owner's to close)
            self._say_left_out()
            self.ended.set()

    def _keep(self, text: str) -> None:
        with self._lock:
            parts = (self._partial + text).replace("\r", "\n").split("\n")
            self._partial = parts.pop()[-LINE_CHARS:]
            self._lines.extend(p[:LINE_CHARS] for p in parts if p.strip())

    def _echo_chunk(self, chunk: bytes) -> None:
        now = time.monotonic()
        if now - self._window >= ECHO_SECONDS:
            self._say_left_out()
            self._window, self._echoed = now, 0
        room = max(0, ECHO_BYTES - self._echoed)
        shown = chunk[:room]
        self._echoed += len(shown)
        self.left_out += len(chunk) - len(shown)
        _write(shown)

    def _say_left_out(self) -> None:
        if self.left_out and self._echo:
            _write(f"\n[{self.left_out:,} bytes of {self.name}'s output left out: more than "
                   f"{ECHO_BYTES >> 10} KiB in {ECHO_SECONDS:g} s]\n".encode())  # fmt: skip
            self.left_out = 0

    def tail(self, lines: int = 5) -> str:
        """The last ``lines`` lines read (the line not ended yet included), joined by ``|``."""
        with self._lock:
            kept = [*self._lines, *([self._partial] if self._partial.strip() else [])]
        return " | ".join(line.strip() for line in kept[-lines:]) or "no output"

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for the pipe's end (every writer gone); whether it came."""
        return self.ended.wait(seconds)


def _write(data: bytes) -> None:
    if not data:
        return
    with contextlib.suppress(OSError, ValueError, AttributeError):  # a closed stderr
        stream = sys.stderr
        stream.flush()
        buffer = getattr(stream, "buffer", None)
        if buffer is not None:
            buffer.write(data)
            buffer.flush()
        else:
            stream.write(data.decode(errors="replace"))
