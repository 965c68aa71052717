"""An environment variable set while a block runs, for this process and the subprocesses it
starts (audit workers, plugin hosts, the replay process), then restored."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def variable_set(name: str, value: str | None) -> Iterator[None]:
    """``$name`` is ``value`` inside the block (None: left as it is), and after it what it
    was before (unset if it was unset)."""
    before = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
