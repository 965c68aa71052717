"""Fixture: third-party plugins installed the way pip installs them, for one test.

``install_plugin(name, source, distribution=...)`` writes the plugin's module and a
``<distribution>-<version>.dist-info`` folder (``METADATA``, and ``entry_points.txt`` with
the ``idrs_bench`` entry point, the published formats of the Python packaging
specifications: core metadata and the entry points file;
:func:`harness.audit.detection_power.install_plugin_module`) into a folder put on
``sys.path`` and ``PYTHONPATH``, so that ``importlib.metadata`` finds it here and in the
plugin host. Nothing is installed into the environment.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

from harness.audit.detection_power import install_plugin_module


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
        install_plugin_module(site, name, entry_point or name, dist, source, version)
        importlib.invalidate_caches()
        return site

    yield install
    for module in [m for m in sys.modules if m.startswith(("idrs_test_", "idrs_half"))]:
        del sys.modules[module]
