"""Fixture: third-party plugins installed the way pip installs them, for one test.

``install_plugin(name, source, distribution=...)`` writes the plugin's module and a
``<distribution>-<version>.dist-info`` folder (``METADATA``, and ``entry_points.txt`` with
the ``idrs_bench`` entry point, the published formats of the Python packaging
specifications: core metadata and the entry points file;
:func:`harness.audit.detection_power.install_plugin_module`) into a folder put on
``sys.path`` and ``PYTHONPATH``, so that ``importlib.metadata`` finds it here and in the
plugin host. Nothing is installed into the environment.

``half_sigma_plugin()`` is the source of the README's example plugin (README.md, "A
plugin in thirty lines": Cohen's certifier at half the σ) at the current contract, the
plugin the tests of plugin hosts install.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

from harness.audit.detection_power import install_plugin_module
from harness.plugin.hookspecs import CONTRACT


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


HALF_SIGMA = '''
"""Cohen's certifier at half the σ: the README's example plugin ("A plugin in thirty lines")."""
import os

from harness import Constant, MethodSpec, SigmaProviderSpec, hookimpl

IDRS_BENCH_CONTRACT = {contract}
DESCRIPTION = {description}


class HalfSigma:
    def __init__(self, sigma):
        self.sigma = sigma / 2
        self.regularity = Constant(self.sigma)

    def __call__(self, x):
        import torch

        return torch.full((len(x),), self.sigma, device=x.device)


@hookimpl
def idrs_register_sigma_providers(register):
    register(SigmaProviderSpec("{provider}", lambda context, params: HalfSigma(params["sigma"]),
                               DESCRIPTION))


@hookimpl
def idrs_register_methods(register):
    register(MethodSpec("{method}", sigma_provider="{provider}", certifier="cohen",
                        defaults={{"sigma": 0.5}}))
'''


def _half_sigma_plugin(provider: str = "half", method: str = "cohen-half",
                       says_where: bool = False) -> str:  # fmt: skip
    description = 'f"imported in process {os.getpid()}"' if says_where else '""'
    return HALF_SIGMA.format(contract=CONTRACT, description=description, provider=provider,
                             method=method)  # fmt: skip


@pytest.fixture(scope="session")
def half_sigma_plugin():
    """``half_sigma_plugin(provider="half", method="cohen-half", says_where=False) -> str``:
    the README's example plugin module (its σ-provider and method named so; its σ-provider's
    description ``imported in process <pid>`` when ``says_where``) at the current contract,
    :data:`harness.plugin.hookspecs.CONTRACT`, to ``install_plugin``."""
    return _half_sigma_plugin


ACTING_TAIL = '''

class Acting:
    """Constant σ = 0.25, after doing ``ACTS[act]`` (the plugin's misdeed) at every call."""

    def __init__(self, act):
        self.act, self.regularity = act, Constant(0.25)

    def __call__(self, x):
        import torch

        ACTS[self.act]()
        return torch.full((len(x),), 0.25, device=x.device)


@hookimpl
def idrs_register_sigma_providers(register):
    register(SigmaProviderSpec("{provider}", lambda context, params: Acting(params["act"])))


@hookimpl
def idrs_register_methods(register):
    for act in ACTS:
        register(MethodSpec(f"{prefix}-{{act}}", "{provider}", "cohen", {{"act": act}}))
'''


@pytest.fixture(scope="session")
def acting_plugin():
    """``acting_plugin(acts_source, provider, prefix) -> str``: a plugin module whose
    σ-provider ``provider`` does ``ACTS[act]()`` (``acts_source`` defines ``ACTS``, a dict of
    callables, and imports ``Constant``, ``MethodSpec``, ``SigmaProviderSpec`` and
    ``hookimpl``) then answers σ = 0.25, with a method ``<prefix>-<act>`` per act certified
    by Cohen's certifier: the misbehaving plugins' shape."""

    def source(acts_source: str, provider: str, prefix: str) -> str:
        return acts_source + ACTING_TAIL.format(provider=provider, prefix=prefix)

    return source
