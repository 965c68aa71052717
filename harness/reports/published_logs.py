"""Per-input certification results as the field published them, read into one shape.

``idrs-bench import-log`` detects the format from the file (the header line of a text
log, the signature of a MATLAB file):

- ``cohen``: Cohen et al.'s (2019) ``code/certify.py``, also SmoothAdv's (Salman et al.
  2019) ``code/certify.py``: a header ``idx	label	predict	radius	correct	time`` and one
  tab-separated line per input; ``predict`` −1 abstains (radius 0), ``radius`` has 3
  significant digits, ``time`` is ``str(timedelta)`` (``0:02:31.238689``) or, in the
  CIFAR-10 logs Cohen et al. published, seconds (``15.4``).
- ``ddrs``: Alfarra et al.'s (2022) ``certify_ds.py``: ``idx label predict radius
  correct sigma time``, with each input's σ(x).
- ``ancer``: Eiras et al.'s (2022) ``certify.py`` (ANCER): ``idx label predict radius
  radius_proxy correct min_sigma time``; ``radius`` is the ℓ2 radius of the ball that the
  smallest σ of the anisotropic Gaussian certifies (σ_min times the gap), the one read
  here; ``radius_proxy`` (ANCER's volume proxy) is kept in each certificate's evidence.
- ``macer``: MACER's ``rs/certify.py`` (Zhai et al. 2020) ``--matdir`` file: a MATLAB
  file with one array per smoothing (``hard``, ``soft``) of each input's certified
  radius, −1 where the prediction was wrong or abstained. Labels, predictions and times
  are not in it; inputs are ``start + i · skip`` of the test split (``main.py``'s
  ``--start_img``, default 500, and ``--skip``, default 1). MACER's own summary (printed
  by the same function) counts an input at radius r when it is correct and its radius
  >= r, and its ACR is the sum of the correct inputs' radii over all inputs.

The publishing repositories' analysis computes certified accuracy at r as the fraction
of inputs with ``correct`` = 1 and ``radius`` >= r (Cohen et al.'s ``analyze.py``
``ApproximateAccuracy``, kept by SmoothAdv; ANCER's README), and the ACR as the mean of
``radius · correct`` (MACER); :func:`harness.mathematics.accuracy.row_metrics` computes both that way
from the imported certificates. Whitespace around fields, CRLF line ends and blank lines
are ignored; anything else that does not fit is one error naming the file, the line
and the expected columns.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.foundation.errors import IdrsError

MAT_SIGNATURE = b"MATLAB 5.0 MAT-file"
MACER_START, MACER_SKIP = 500, 1
"""MACER's ``main.py`` defaults: the first certified test input and the stride."""

_TIMEDELTA = re.compile(
    r"^(?:(?P<days>-?\d+) days?, )?(?P<h>\d+):(?P<m>\d\d):(?P<s>\d\d(?:\.\d{1,6})?)$"
)


def parse_time(text: str) -> float:
    """Seconds of a log's time column: ``str(timedelta)`` (``0:00:13.771528``,
    ``1 day, 2:00:00``) or seconds as a number (``15.4``, ``1.23e+03``)."""
    match = _TIMEDELTA.match(text)
    if match is not None:
        days = int(match["days"] or 0)
        return days * 86400 + int(match["h"]) * 3600 + int(match["m"]) * 60 + float(match["s"])
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"time {text!r} is neither H:MM:SS[.ffffff] nor seconds")
    return seconds


@dataclass(frozen=True)
class LogFormat:
    """A published log format: its name, columns (None for a binary file) and source."""

    name: str
    columns: tuple[str, ...] | None
    source: str
    default_method: str

    def describe(self) -> str:
        what = "\t".join(self.columns) if self.columns else "a MATLAB file"
        return f"{self.name} ({self.source}): {what!r}"


COHEN = LogFormat("cohen", ("idx", "label", "predict", "radius", "correct", "time"),
                  "Cohen et al.'s and SmoothAdv's certify.py", "cohen")  # fmt: skip
DDRS = LogFormat("ddrs", ("idx", "label", "predict", "radius", "correct", "sigma", "time"),
                 "Alfarra et al.'s certify_ds.py", "alfarra-ds")  # fmt: skip
ANCER = LogFormat(
    "ancer", ("idx", "label", "predict", "radius", "radius_proxy", "correct", "min_sigma", "time"),
    "ANCER's certify.py", "ancer",
)  # fmt: skip
MACER = LogFormat("macer", None, "MACER's rs/certify.py --matdir", "cohen")
FORMATS = (COHEN, DDRS, ANCER, MACER)
TEXT_FORMATS = {f.columns: f for f in FORMATS if f.columns}


@dataclass(frozen=True)
class ImportedLine:
    """One input of a published log. ``label`` and ``predict`` are None where the format
    does not record them (MACER: only whether the prediction was correct)."""

    idx: int
    label: int | None
    predict: int | None  # −1: abstained
    correct: bool
    radius: float
    sigma: float | None  # the input's σ(x) if the log records it
    seconds: float | None
    line: int  # line number in the file (1-based; MACER: the array position + 1)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ImportedLog:
    """A parsed log: its format and lines (and, for MACER, which array)."""

    format: LogFormat
    lines: list[ImportedLine]
    key: str | None = None


def detect_format(path: Path) -> LogFormat:
    """The format of ``path`` from its first bytes (a MATLAB signature or a header line)."""
    if not path.is_file():
        raise IdrsError(f"log file {str(path)!r} not found")
    with open(path, "rb") as handle:
        head = handle.read(4096)
    if head.startswith(MAT_SIGNATURE):
        return MACER
    first = head.split(b"\n", 1)[0].decode("utf-8", "replace")
    header = tuple(c.strip() for c in first.strip().split("\t"))
    if header in TEXT_FORMATS:
        return TEXT_FORMATS[header]
    if first.startswith("===certify(") or first.startswith("Radius: "):
        raise IdrsError(
            f"{path}:1: this is MACER's printed certify summary (counts per radius, no "
            "per-input results); import the .mat file main.py writes with --matdir"
        )
    if header == ("idx", "label", "predict", "correct", "time"):
        raise IdrsError(
            f"{path}:1: this is a predict.py log (no radius): there is nothing certified to import"
        )
    expected = "; ".join(f.describe() for f in FORMATS)
    raise IdrsError(
        f"{path}:1: unknown log format, header {first.strip()[:80]!r}; expected one of: "
        f"{expected} (tab-separated)"
    )


def read_published_log(
    path: str | Path, key: str | None = None, start: int = MACER_START, skip: int = MACER_SKIP
) -> ImportedLog:
    """The lines of the log at ``path`` in whichever published format it is.

    ``key`` picks the array of a MACER file that holds both (``hard`` or ``soft``);
    ``start`` and ``skip`` give its inputs' test ids.
    """
    path = Path(path)
    fmt = detect_format(path)
    if fmt is MACER:
        return _read_macer(path, key, start, skip)
    if key is not None:
        raise IdrsError(f"--key applies to MACER's .mat files; {path} is a {fmt.name} log")
    text = path.read_text(encoding="utf-8", errors="replace")
    return ImportedLog(fmt, parse_text_log(text, fmt, str(path)))


def _int(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} {text!r} is not an integer") from None


def _float(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{name} {text!r} is not finite")
    return value


def _sigma(text: str, name: str) -> float:
    value = _float(text, name)
    if value <= 0:
        raise ValueError(f"{name} {text!r} must be > 0")
    return value


_EXTRA: dict[str, Callable[[str, str], Any]] = {
    "sigma": _sigma, "min_sigma": _sigma, "radius_proxy": _float,
}  # fmt: skip


def parse_text_log(text: str, fmt: LogFormat, source: str = "log") -> list[ImportedLine]:
    """The lines of a tab-separated log in format ``fmt``; one error naming the first bad line."""
    columns = fmt.columns or ()
    rows = text.splitlines()
    header = tuple(c.strip() for c in rows[0].strip().split("\t")) if rows else ()
    if header != columns:
        raise IdrsError(
            f"{source}:1: expected the header {chr(9).join(columns)!r} ({fmt.source}, "
            f"tab-separated), got {rows[0][:80] if rows else ''!r}"
        )
    out: list[ImportedLine] = []
    seen: set[int] = set()
    for number, row in enumerate(rows[1:], start=2):
        if not row.strip():
            continue
        fields = [f.strip() for f in row.strip().split("\t")]
        try:
            if len(fields) != len(columns):
                raise ValueError(
                    f"{len(fields)} tab-separated columns, expected {len(columns)}: "
                    + ", ".join(columns)
                )
            value = dict(zip(columns, fields, strict=True))
            idx, label = _int(value["idx"], "idx"), _int(value["label"], "label")
            predict, correct = _int(value["predict"], "predict"), _int(value["correct"], "correct")
            radius = _float(value["radius"], "radius")
            seconds = parse_time(value["time"])
            if idx < 0 or label < 0 or predict < -1:
                raise ValueError("idx and label must be >= 0 and predict >= -1")
            if radius < 0 or (predict == -1 and radius != 0):
                raise ValueError(f"radius {value['radius']!r} must be >= 0, and 0 when abstaining")
            if correct not in (0, 1) or correct != int(predict == label):
                raise ValueError(f"correct is {correct} but predict {predict}, label {label}")
            if idx in seen:
                raise ValueError(f"idx {idx} appears twice")
            extra = {k: _EXTRA[k](value[k], k) for k in columns if k in _EXTRA}
        except ValueError as exc:
            raise IdrsError(
                f"{source}:{number}: malformed line ({exc}); expected {fmt.source}'s columns "
                f"{', '.join(columns)}: {row[:80]!r}"
            ) from None
        seen.add(idx)
        sigma = extra.pop("sigma", extra.pop("min_sigma", None))
        out.append(ImportedLine(idx, label, predict, bool(correct), radius, sigma, seconds,
                                number, extra))  # fmt: skip
    if not out:
        raise IdrsError(f"{source}: the log has a header but no inputs")
    return out


def _read_macer(path: Path, key: str | None, start: int, skip: int) -> ImportedLog:
    import numpy as np
    from scipy.io import loadmat

    if start < 0 or skip < 1:
        raise IdrsError(f"--start must be >= 0 and --skip >= 1, got {start} and {skip}")
    try:
        content = loadmat(path)
    except Exception as exc:  # a damaged or foreign MATLAB file
        raise IdrsError(f"{path}: not a readable MATLAB file ({exc})".splitlines()[0]) from None
    arrays = sorted(k for k in content if not k.startswith("__"))
    known = [k for k in arrays if k in ("hard", "soft")]
    if key is None:
        if len(known) != 1:
            raise IdrsError(
                f"{path}: a MACER file with arrays {arrays}; pass --key hard or --key soft "
                "(which smoothing to import)"
                if len(known) > 1
                else f"{path}: no 'hard' or 'soft' array (it has {arrays}); not a MACER --matdir file"
            )
        key = known[0]
    if key not in known:
        raise IdrsError(f"{path}: no array {key!r}; it has {arrays} (MACER writes 'hard', 'soft')")
    radii = np.asarray(content[key], dtype=float).reshape(-1)
    lines = []
    for i, radius in enumerate(radii.tolist()):
        if not math.isfinite(radius) or (radius < 0 and radius != -1):
            raise IdrsError(
                f"{path}: {key}[{i}] = {radius!r}; MACER stores a radius >= 0, or -1 for a wrong "
                "prediction"
            )
        correct = radius >= 0
        lines.append(ImportedLine(start + i * skip, None, None, correct, max(radius, 0.0), None,
                                  None, i + 1))  # fmt: skip
    if not lines:
        raise IdrsError(f"{path}: the array {key!r} is empty")
    return ImportedLog(MACER, lines, key)
