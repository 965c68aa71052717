"""Files the harness keeps between runs, under one cache root, that heal when damaged.

The cache root is ``$IDRS_BENCH_CACHE`` (default ``~/.cache/idrs-bench``); base models
live in its ``models/`` directory (:mod:`harness.running.modelcache`) and what a plugin fits to
a base model in ``plugins/<plugin>/<recipe hash>/``
(:meth:`harness.plugin.components.BuildContext.artifact_dir`).

Every cached artifact is written with :func:`save_artifact`, which stores the file's
SHA-256 beside it (``<file>.sha256``). :func:`load_artifact` checks that digest before
loading (``torch.load(..., weights_only=True)``: nothing is unpickled); a file that is
truncated, altered or fails to load is named in a one-line warning, moved aside to
``<file>.corrupt-<timestamp>`` and reported as missing, so the caller rebuilds it.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness.foundation.environment import variable_set
from harness.foundation.errors import plain
from harness.foundation.progress import Progress

CACHE_ENV_VAR = "IDRS_BENCH_CACHE"


def cache_root() -> Path:
    """``$IDRS_BENCH_CACHE``, or ``~/.cache/idrs-bench`` when it is unset."""
    return Path(os.environ.get(CACHE_ENV_VAR, Path.home() / ".cache" / "idrs-bench"))


@contextmanager
def cache_root_at(folder: str | Path) -> Iterator[None]:
    """Make ``folder`` the cache root while the block runs (a board's files staged in a
    temporary cache for a re-check), then restore the previous one."""
    with variable_set(CACHE_ENV_VAR, str(folder)):
        yield


def default_cache_dir() -> Path:
    """Where base models (and the probed batch sizes) are cached: ``<cache root>/models``."""
    return cache_root() / "models"


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def save_artifact(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` (tensors) to ``path`` atomically, with its SHA-256 beside it."""
    import torch  # (here: the cache root is read before torch is imported)

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    digest = file_digest(tmp)
    tmp.replace(path)  # atomic: an interrupted save leaves no half checkpoint
    _digest_path(path).write_text(digest + "\n")


def load_artifact(path: Path, progress: Progress, what: str = "cached file") -> Any | None:
    """The state saved at ``path``, or None when it is absent or damaged (then moved aside).

    A file without a stored digest (written before digests were kept) is loaded and
    its digest recorded; a digest mismatch or a load error quarantines the file.
    """
    if not path.is_file():
        return None
    import torch

    digest_file = _digest_path(path)
    try:
        if digest_file.is_file():
            expected = digest_file.read_text().strip()
            actual = file_digest(path)
            if actual != expected:
                raise ValueError(f"SHA-256 {actual[:12]} does not match the stored {expected[:12]}")
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # any damage: warn, move aside, rebuild
        quarantine(path, exc, progress, what)
        return None
    if not digest_file.is_file():
        digest_file.write_text(file_digest(path) + "\n")
    return state


def quarantine(path: Path, reason: BaseException | str, progress: Progress, what: str) -> None:
    """Move a damaged cached file aside (``<file>.corrupt-<timestamp>``) with a one-line warning."""
    aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
    path.replace(aside)
    _digest_path(path).unlink(missing_ok=True)
    text = (plain(str(reason)).splitlines() or [type(reason).__name__])[0]
    progress.warn(f"{what} {path} is damaged ({text}); moved to {aside.name}, rebuilding")
