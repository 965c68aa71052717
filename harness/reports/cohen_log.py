"""Cohen et al.'s (2019) certification log, the format published per-input results use.

``certify.py`` of Cohen et al. (also SmoothAdv's) writes a header line
``idx	label	predict	radius	correct	time`` and one tab-separated line per input::

    20	7	7	0.0734	1	0:00:13.771528

``predict`` −1 means abstain (radius 0), ``radius`` is printed with 3 significant
digits (Python's ``{:.3}``), ``correct`` is 1 when predict = label, and ``time`` is the
wall-clock time of the input as ``str(datetime.timedelta)`` (H:MM:SS.ffffff); the
CIFAR-10 logs Cohen et al. published give it in seconds (``15.4``), which is read too
(:func:`harness.reports.published_logs.parse_time`). Such a log holds claims only: no class
counts, so no certificate can be checked. This module writes the format and reads it;
:mod:`harness.reports.published_logs` reads it and the other published formats.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from harness.foundation.errors import IdrsError
from harness.reports.published_logs import COHEN, parse_text_log, parse_time
from harness.store.storedrun import StoredCertificate, load_runs

HEADER = COHEN.columns
__all__ = ["HEADER", "LogLine", "format_line", "format_log", "parse_log", "parse_time",
           "read_log", "run_log_lines", "write_run_log"]  # fmt: skip


@dataclass(frozen=True)
class LogLine:
    """One input of a certification log."""

    idx: int
    label: int
    predict: int  # −1: abstain
    radius: float
    seconds: float


def format_time(seconds: float) -> str:
    """``str(timedelta)``, as Cohen et al.'s log prints it (e.g. ``0:00:13.771528``)."""
    return str(timedelta(seconds=seconds))


def format_line(line: LogLine) -> str:
    correct = int(line.predict == line.label)
    return (
        f"{line.idx}\t{line.label}\t{line.predict}\t{line.radius:.3}\t{correct}\t"
        f"{format_time(line.seconds)}"
    )


def format_log(lines: list[LogLine]) -> str:
    return "\t".join(HEADER) + "\n" + "".join(format_line(line) + "\n" for line in lines)


def parse_log(text: str, source: str = "log") -> list[LogLine]:
    """The lines of a log; a malformed line is one error naming its line number."""
    return [
        LogLine(x.idx, x.label, x.predict, x.radius, x.seconds)  # type: ignore[arg-type]
        for x in parse_text_log(text, COHEN, source)
    ]


def read_log(path: str | Path) -> list[LogLine]:
    path = Path(path)
    if not path.is_file():
        raise IdrsError(f"log file {str(path)!r} not found")
    return parse_log(path.read_text(), str(path))


def run_log_lines(certificates: Sequence[StoredCertificate]) -> list[LogLine]:
    """Log lines of stored certificates (CERTIFY's prediction and radius)."""
    return [
        LogLine(int(c.input_id), int(c.label), int(c.prediction), float(c.radius),
                float(c.seconds))
        for c in sorted(certificates, key=lambda c: c.input_id)
    ]  # fmt: skip


def write_run_log(db: Path, run_id: str | None, method: str | None, setting: str | None) -> str:
    """The log of one (method, setting) of a stored run (both may be omitted if unique)."""
    if not Path(db).is_file():
        raise IdrsError(f"results database {str(db)!r} not found; pass --db")
    (run,) = load_runs(db, [run_id] if run_id is not None else None)
    rows = sorted(run.rows(), key=lambda r: (r.method, r.setting))
    chosen = [
        r
        for r in rows
        if (method is None or r.method == method) and (setting is None or r.setting == setting)
    ]
    if len(chosen) != 1:
        available = ", ".join(f"--method {r.method} --setting {r.setting}" for r in rows) or "none"
        raise IdrsError(
            f"run {run.run_id[:12]}: a Cohen log holds one method and setting; "
            f"{'none' if not chosen else len(chosen)} match; choose one of: {available}"
        )
    return format_log(run_log_lines(chosen[0].certificates))
