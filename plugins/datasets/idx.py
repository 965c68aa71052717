"""Reader for the IDX format of (Fashion-)MNIST (LeCun et al.), optionally gzipped."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from harness import IdrsError

_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file: magic (0, 0, dtype code, ndim), ndim big-endian sizes, data.

    A file that is damaged (a gzip stream cut short, a wrong magic number, fewer values
    than its header declares) raises an :class:`~harness.IdrsError` naming it."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            raw = handle.read()
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise _damaged(path, f"it cannot be read: {exc}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _DTYPES:
        raise _damaged(path, "it is not an IDX file: its magic number is wrong")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    itemsize = np.dtype(_DTYPES[raw[2]]).itemsize
    body = len(raw) - 4 - 4 * ndim
    if body < 0 or body != int(np.prod(shape)) * itemsize:
        values = max(body, 0) // itemsize
        raise _damaged(path, f"its header says {shape} but it holds {values} values")
    return np.frombuffer(raw, dtype=_DTYPES[raw[2]], offset=4 + 4 * ndim).reshape(shape)


def _damaged(path: Path, what: str) -> IdrsError:
    return IdrsError(
        f"{path} is damaged ({what}); replace it with the original file (reinstall "
        "dataset-fashion-mnist, or fetch the dataset again with --download), or pass "
        "--data-root DIR with good copies"
    )
