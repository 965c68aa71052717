"""Fixture: third-party plugins installed the way pip installs them, for one test.

``install_plugin(name, source, distribution=...)`` writes the plugin's module and a
``<distribution>-<version>.dist-info`` folder (``METADATA``, and ``entry_points.txt`` with
the ``idrs_bench`` entry point, the published formats of the Python packaging
specifications: core metadata and the entry points file) into a folder put on
``sys.path`` and ``PYTHONPATH``, so that ``importlib.metadata`` finds it here and in the
plugin host. Nothing is installed into the environment.
"""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
from pathlib import Path

import pytest


@pytest.fixture
def install_plugin(tmp_path, monkeypatch):
    """``install_plugin(name, source, distribution=None, version="0.1", entry_point=None)``:
    the folder it went into. ``name`` is the module's (and by default the entry point's)."""
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    paths = [str(site), str(Path.cwd()), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))

    def install(name: str, source: str, distribution: str | None = None, version: str = "0.1",
                entry_point: str | None = None) -> Path:  # fmt: skip
        dist = distribution or f"idrs-{name.replace('_', '-')}"
        (site / f"{name}.py").write_text(textwrap.dedent(source))
        info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[idrs_bench]\n{entry_point or name} = {name}\n")
        importlib.invalidate_caches()
        return site

    yield install
    for module in [m for m in sys.modules if m.startswith(("idrs_test_", "idrs_half"))]:
        del sys.modules[module]
