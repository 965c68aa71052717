"""Progress of long work (training epochs, certification, checks), on a terminal or not.

On a terminal: rich progress bars with count, rate and ETA. Otherwise (CI, ``nohup``,
a log file): plain lines, one when a stage starts, one at least every ``interval``
seconds while it runs (done/total, rate, ETA), and one when it ends. Every stage's
wall time is kept in :attr:`Progress.timings` (``--timings`` prints them).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichProgress

from harness.foundation.errors import plain

LINE_INTERVAL = 30.0
"""Seconds between progress lines when the output is not a terminal."""


class Progress:
    """Reports progress of named tasks; ``enabled=False`` reports nothing (tests, pipes).

    ``clock`` (seconds, monotonic) and ``interval`` are injectable for tests.
    """

    def __init__(
        self,
        enabled: bool = True,
        console: Console | None = None,
        interval: float = LINE_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = enabled
        self.console = console or Console(stderr=True, soft_wrap=True)
        self.interval = interval
        self.clock = clock
        self.timings: list[tuple[str, float]] = []
        """(stage description, wall seconds) of every finished task, in order."""

    @contextmanager
    def task(
        self, description: str, total: float, unit: str = "it"
    ) -> Iterator[Callable[[float], None]]:
        """A stage with count, rate and ETA; yields ``advance(amount)``."""
        start = self.clock()
        try:
            if not self.enabled:
                yield lambda amount=1: None
            elif self.console.is_terminal:
                with self._bar(description, total, unit) as advance:
                    yield advance
            else:
                with self._lines(description, total, unit, start) as advance:
                    yield advance
        finally:
            self.timings.append((description, self.clock() - start))

    @contextmanager
    def _bar(self, description: str, total: float, unit: str):
        columns = (
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
        )
        with RichProgress(*columns, console=self.console, transient=False) as bar:
            task_id = bar.add_task(escape(description), total=total, rate="")

            def advance(amount: float = 1) -> None:
                bar.advance(task_id, amount)
                speed = bar.tasks[0].speed
                if speed:
                    bar.update(task_id, rate=f"{speed:,.1f} {unit}/s")

            yield advance

    @contextmanager
    def _lines(self, description: str, total: float, unit: str, start: float):
        """Plain lines; a heartbeat thread writes one even while ``advance`` is not called."""
        done = 0.0
        last = start
        lock = threading.Lock()
        stop = threading.Event()
        self._line(f"{description}: started, {total:g} {unit}")

        def status() -> str:
            elapsed = self.clock() - start
            rate = done / elapsed if elapsed > 0 else 0.0
            eta = f"{(total - done) / rate:,.0f} s" if rate > 0 else "unknown"
            return f"{done:g}/{total:g} {unit}, {rate:,.2f} {unit}/s, elapsed {elapsed:,.0f} s, ETA {eta}"

        def report_if_due() -> None:
            nonlocal last
            with lock:
                now = self.clock()
                if now - last >= self.interval:
                    last = now
                    self._line(f"{description}: {status()}")

        def advance(amount: float = 1) -> None:
            nonlocal done
            done += amount
            report_if_due()

        def heartbeat() -> None:
            while not stop.wait(self.interval / 4):
                report_if_due()

        thread = threading.Thread(target=heartbeat, daemon=True)
        thread.start()
        try:
            yield advance
        finally:
            stop.set()
            thread.join()
        self._line(f"{description}: finished, {status()}")

    def _line(self, text: str) -> None:
        self.console.print(escape(text), highlight=False)

    def log(self, message: str) -> None:
        """Information (shown only when enabled), as plain text."""
        if self.enabled:
            self.console.print(escape(plain(message)), highlight=False)

    def note(self, message: str) -> None:
        """Information the user should see even when progress is disabled (e.g. that
        another process works on the same run), as plain text."""
        self.console.print(f"note: {escape(plain(message))}", highlight=False)

    def warn(self, message: str) -> None:
        """A problem the user must see, even when progress is disabled; the message is
        plain text (brackets in it are not markup, a library's terminal codes are removed)."""
        self.console.print(f"[yellow]warning:[/yellow] {escape(plain(message))}", highlight=False)
