"""A plugin host's folder on disk: made for it, removed on every way it ends.

Each :class:`~harness.plugin.hosting.in_harness.host_process.PluginHost` has a folder
``idrs-plugin-host-*`` in the temporary directory: ``sent/``, what the harness writes and
the host reads (large dataset arrays), and ``scratch-<generation>/``, the ``$TMPDIR``,
``$HOME`` and caches of each host process it starts (:func:`scratch_environment`), the only
place besides its plugins' artifact folders that a confined host writes. It is removed

- when the harness closes the host (:meth:`HostFolder.remove`), or collects it;
- by the host's keeper when the host ends (its scratch folder) or the harness ends, even by
  ``SIGKILL`` (the whole folder: :mod:`harness.plugin.hosting.in_host.keeper`);
- by the next harness process that starts a host, when neither could
  (:func:`sweep_abandoned`: a machine that lost power, a keeper killed with the harness).

The harness holds a lock on ``owner.lock`` (``flock``) for the folder's life: the kernel
releases it when the process ends, however it ends, so a folder whose lock can be taken
has no owner left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path

PREFIX = "idrs-plugin-host-"
OWNER = "owner.lock"
SWEEP_AGE_SECONDS = 60.0
"""A folder younger than this is left alone by the sweep (its owner may be taking its lock)."""


class HostFolder:
    """A host's folder, locked by this process until :meth:`remove`."""

    def __init__(self, parent: str | Path | None = None) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
        self._lock: int | None = _locked(self.path / OWNER)
        self.sent = self.path / "sent"
        self.sent.mkdir()

    def scratch(self, generation: int) -> Path:
        """The scratch folder of the host process of ``generation``, made empty."""
        folder = self.path / f"scratch-{generation}"
        shutil.rmtree(folder, ignore_errors=True)
        for name, sub in scratch_environment(folder).items():
            if name != "PYTHONUSERBASE":
                Path(sub).mkdir(parents=True, exist_ok=True)
        return folder

    def remove(self) -> None:
        """Remove the folder and everything in it (symbolic links are not followed)."""
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def _locked(path: Path) -> int | None:
    """A descriptor holding an exclusive ``flock`` on ``path`` (None without ``fcntl``)."""
    try:
        import fcntl
    except ImportError:  # (not POSIX: folders are removed by their owner only)
        return None
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def sweep_abandoned(parent: str | Path | None = None, age: float = SWEEP_AGE_SECONDS) -> list[Path]:
    """Remove the host folders in ``parent`` (default the temporary directory) whose owner
    has ended (their lock can be taken) and that are older than ``age`` seconds; the folders
    removed."""
    try:
        import fcntl
    except ImportError:
        return []
    root = Path(tempfile.gettempdir() if parent is None else parent)
    removed = []
    for folder in root.glob(f"{PREFIX}*"):
        with contextlib.suppress(OSError):
            if time.time() - folder.stat().st_mtime < age:
                continue
            fd = os.open(folder / OWNER, os.O_RDWR | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (held: its owner lives)
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
            finally:
                os.close(fd)
    return removed


def scratch_environment(scratch: Path) -> dict[str, str]:
    """The variables that point a host's temporary files, home and caches (Python's, torch's,
    Triton's, Matplotlib's, the harness's) into its scratch directory, and keep the user's
    site-packages where Python found them for this process."""
    import site

    folders = {"TMPDIR": "tmp", "TEMP": "tmp", "TMP": "tmp", "HOME": "home",
               "XDG_CACHE_HOME": "cache", "XDG_CONFIG_HOME": "config", "XDG_DATA_HOME": "data",
               "TORCHINDUCTOR_CACHE_DIR": "cache/inductor", "TRITON_CACHE_DIR": "cache/triton",
               "TORCH_HOME": "cache/torch", "MPLCONFIGDIR": "config/matplotlib",
               "IDRS_BENCH_CACHE": "cache/idrs-bench"}  # fmt: skip
    out = {name: str(scratch / sub) for name, sub in folders.items()}
    return out | {"PYTHONUSERBASE": site.getuserbase()}
