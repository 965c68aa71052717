"""``idrs-bench plugins install``: a plugin built confined, without network, into a private
prefix that only its confined plugin host imports (harness/plugin/private_install.py)."""

from __future__ import annotations

import importlib.util
import zipfile

import pytest

from harness.foundation.errors import IdrsError
from harness.plugin.hosting.in_harness.confinement_options import description
from harness.plugin.hosting.shared import landlock, policy
from harness.plugin.manager import PluginManager
from harness.plugin.private_install import install, prefix_root, uninstall

pytestmark = pytest.mark.skipif(
    policy.refusal(landlock.landlock_abi()) is not None,
    reason="this kernel has no Landlock ABI >= 3: a plugin cannot be built confined here",
)

MODULE = """
from harness import Constant, MethodSpec, SigmaProviderSpec, hookimpl

IDRS_BENCH_CONTRACT = 3


class Quarter:
    regularity = Constant(0.125)

    def __call__(self, x):
        import torch

        return torch.full((len(x),), 0.125, device=x.device)


@hookimpl
def idrs_register_sigma_providers(register):
    register(SigmaProviderSpec("quarter", lambda context, params: Quarter()))


@hookimpl
def idrs_register_methods(register):
    register(MethodSpec("cohen-quarter", "quarter", "cohen", {}))
"""

PYPROJECT = """[build-system]
requires = ["{backend}"]
build-backend = "setuptools.build_meta"

[project]
name = "idrs-test-quarter"
version = "0.3"
dependencies = ["idrs-bench", "numpy>=1"]

[project.entry-points.idrs_bench]
quarter = "idrs_test_quarter"

[tool.setuptools]
py-modules = ["idrs_test_quarter"]
"""

# the build backend runs this: it tries to write beside the source, then builds
SETUP = """import pathlib
from setuptools import setup

try:
    pathlib.Path({outside!r}).write_text("written when the plugin was built")
except OSError:
    pass
setup()
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _source(tmp_path, backend: str = "setuptools>=61"):
    source = tmp_path / "idrs-test-quarter"
    source.mkdir()
    (source / "pyproject.toml").write_text(PYPROJECT.format(backend=backend))
    (source / "idrs_test_quarter.py").write_text(MODULE)
    (source / "setup.py").write_text(SETUP.format(outside=str(tmp_path / "outside")))
    return source


def test_a_source_folder_is_built_confined_into_a_prefix_only_its_host_imports(tmp_path, cache):
    name, version, prefix = install(_source(tmp_path), quiet=True)
    assert (name, version) == ("idrs-test-quarter", "0.3")
    assert prefix == prefix_root() / "idrs-test-quarter" and prefix.parent.parent == cache
    assert (prefix / "idrs_test_quarter.py").read_text() == MODULE
    assert not (tmp_path / "outside").exists()  # the build could not write outside its folder
    assert importlib.util.find_spec("idrs_test_quarter") is None  # not on this process's path
    manager = PluginManager()
    rows = {row["name"]: row for row in manager.describe()}
    assert rows["quarter"]["runs_in"] == "plugin host" and rows["quarter"]["private"]
    assert rows["quarter"]["confinement"] == description(landlock.landlock_abi())
    assert manager.registry.get("methods", "cohen-quarter").sigma_provider == "quarter"
    assert uninstall("idrs_test_quarter") == prefix and not prefix.exists()
    assert "quarter" not in {row["name"] for row in PluginManager().describe()}


def test_a_backend_this_environment_lacks_is_refused_before_building(tmp_path, cache):
    with pytest.raises(IdrsError, match=r"built by idrs-no-such-backend>=1, not installed"):
        install(_source(tmp_path, backend="idrs-no-such-backend>=1"))


def _wheel(tmp_path, requires: str = "") -> str:
    """A wheel laid out by hand (the binary distribution format's files)."""
    path = tmp_path / "idrs_test_quarter-0.3-py3-none-any.whl"
    info = "idrs_test_quarter-0.3.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("idrs_test_quarter.py", MODULE)
        wheel.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: idrs-test-quarter\n"
                                           f"Version: 0.3\n{requires}")  # fmt: skip
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: hand\n"
                                        "Root-Is-Purelib: true\nTag: py3-none-any\n")  # fmt: skip
        wheel.writestr(f"{info}/entry_points.txt", "[idrs_bench]\nquarter = idrs_test_quarter\n")
        wheel.writestr(f"{info}/RECORD", "")
    return path


def test_a_wheel_is_installed_and_one_whose_requirements_are_unmet_is_refused(tmp_path, cache):
    name, _, prefix = install(_wheel(tmp_path, "Requires-Dist: numpy>=1\n"), quiet=True)
    assert name == "idrs-test-quarter" and (prefix / "idrs_test_quarter.py").is_file()
    (tmp_path / "other").mkdir()
    unmet = _wheel(tmp_path / "other", "Requires-Dist: idrs-no-such-package>=2\n"
                   "Requires-Dist: pywin32; sys_platform == 'win32'\n")  # fmt: skip
    with pytest.raises(IdrsError, match=r"requires idrs-no-such-package>=2, not installed"):
        install(unmet)
    assert (prefix / "idrs_test_quarter.py").is_file()  # the installed one stays


def test_a_private_plugin_is_checked_from_the_manifest_without_a_host(tmp_path, cache):
    """Its entry in the plugin manifest is keyed by the files its RECORD lists, so a
    benchmark file naming its method is checked without starting its host."""
    from harness.plugin.entry_points import installed_prefixes, plugin_entry_points
    from harness.plugin.manifest import plugin_key

    install(_wheel(tmp_path), quiet=True)
    [entry] = [ep for ep in plugin_entry_points(installed_prefixes().values())
               if ep.name == "quarter"]  # fmt: skip
    key = plugin_key(entry)
    assert key is not None
    PluginManager().registry  # noqa: B018 (records the manifest)
    manager = PluginManager()
    assert "cohen-quarter" in manager.checking_registry().names("methods")
    assert manager._hosts == {}  # no host started to check it
    module = next(prefix for prefix in installed_prefixes().values()) / "idrs_test_quarter.py"
    module.write_text(module.read_text() + "\n# edited\n")
    assert plugin_key(entry) != key
