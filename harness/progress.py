"""Progress bars (rich) for long work: training epochs and certification."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichProgress


class Progress:
    """Reports progress of named tasks; ``enabled=False`` reports nothing (tests, pipes)."""

    def __init__(self, enabled: bool = True, console: Console | None = None) -> None:
        self.enabled = enabled
        self.console = console or Console(stderr=True, soft_wrap=True)

    @contextmanager
    def task(
        self, description: str, total: float, unit: str = "it"
    ) -> Iterator[Callable[[float], None]]:
        """A bar with count, rate and ETA; yields ``advance(amount)``."""
        if not self.enabled:
            yield lambda amount=1: None
            return
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
            task_id = bar.add_task(description, total=total, rate="")

            def advance(amount: float = 1) -> None:
                bar.advance(task_id, amount)
                speed = bar.tasks[0].speed
                if speed:
                    bar.update(task_id, rate=f"{speed:,.1f} {unit}/s")

            yield advance

    def log(self, message: str) -> None:
        """Information (shown only when enabled)."""
        if self.enabled:
            self.console.print(message)

    def warn(self, message: str) -> None:
        """A problem the user must see, even when progress is disabled."""
        self.console.print(f"[yellow]warning:[/yellow] {message}")
