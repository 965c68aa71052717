"""Cohen et al.'s (2019) certification log, the format published per-input results use.

``certify.py`` of Cohen et al. (also the MACER and SmoothAdv code) writes a header line
``idx	label	predict	radius	correct	time`` and one tab-separated line per input::

    20	7	7	0.0734	1	0:00:13.771528

``predict`` −1 means abstain (radius 0), ``radius`` is printed with 3 significant
digits (Python's ``{:.3}``), ``correct`` is 1 when predict = label, and ``time`` is the
wall-clock time of the input as ``str(datetime.timedelta)`` (H:MM:SS.ffffff).
Such a log holds claims only: no class counts, so no certificate can be checked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from harness.errors import IdrsError
from harness.storedrun import StoredCertificate, load_runs

HEADER = ("idx", "label", "predict", "radius", "correct", "time")
_TIME = re.compile(
    r"^(?:(?P<days>-?\d+) days?, )?(?P<h>\d+):(?P<m>\d\d):(?P<s>\d\d(?:\.\d{1,6})?)$"
)


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


def parse_time(text: str) -> float:
    match = _TIME.match(text)
    if match is None:
        raise ValueError(f"time {text!r} is not H:MM:SS[.ffffff]")
    days = int(match["days"] or 0)
    return days * 86400 + int(match["h"]) * 3600 + int(match["m"]) * 60 + float(match["s"])


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
    rows = text.splitlines()
    if not rows or tuple(c.strip() for c in rows[0].split("\t")) != HEADER:
        raise IdrsError(
            f"{source}:1: expected the header {chr(9).join(HEADER)!r} (tab-separated), "
            f"got {rows[0][:80] if rows else ''!r}"
        )
    out, seen = [], set()
    for number, row in enumerate(rows[1:], start=2):
        if not row.strip():
            continue
        fields = row.rstrip("\r").split("\t")
        try:
            if len(fields) != len(HEADER):
                raise ValueError(f"{len(fields)} tab-separated fields, expected {len(HEADER)}")
            idx, label, predict, correct = (int(fields[k]) for k in (0, 1, 2, 4))
            radius = float(fields[3])
            seconds = parse_time(fields[5].strip())
            if idx < 0 or label < 0 or predict < -1:
                raise ValueError("idx and label must be >= 0 and predict >= -1")
            if not math.isfinite(radius) or radius < 0 or (predict == -1 and radius != 0):
                raise ValueError(f"radius {fields[3]!r} must be >= 0, and 0 when abstaining")
            if correct != int(predict == label):
                raise ValueError(f"correct is {correct} but predict {predict}, label {label}")
            if idx in seen:
                raise ValueError(f"idx {idx} appears twice")
        except ValueError as exc:
            raise IdrsError(f"{source}:{number}: malformed line ({exc}): {row[:80]!r}") from None
        seen.add(idx)
        out.append(LogLine(idx, label, predict, radius, seconds))
    if not out:
        raise IdrsError(f"{source}: the log has a header but no inputs")
    return out


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
