"""Errors in a benchmark file come before third-party plugins are imported: their names
and parameters are checked against what they registered before (harness/plugin/manifest.py),
recorded under a key of their files, so a plugin that imports torch at module level does
not slow every spec error down; `idrs-bench plugins` and runs still load every plugin."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PLUGIN = '''
"""A third-party plugin that imports torch at module level (and says when it is imported)."""
import os
import pathlib

pathlib.Path(os.environ["SLOW_PLUGIN_MARKER"]).touch()

import torch  # noqa: E402,F401  (the slow import)

from harness import MethodSpec, ParameterError, hookimpl  # noqa: E402

IDRS_BENCH_CONTRACT = 3


def _check(params):
    if not params["sigma"] > 0:
        raise ParameterError(f"cohen-slow needs sigma > 0, got {params['sigma']}")


@hookimpl
def idrs_register_methods(register):
    register(MethodSpec("cohen-slow", "constant", "cohen", {"sigma": 0.5}, check=_check))
'''

SPEC = """
[dataset]
name = "cone-2"
test_count = 2

[model]
architecture = "mlp"
trainer = "gaussian-augmentation"

[[methods]]
name = "{method}"
settings = [{settings}]
"""

# exit with the CLI's status, after saying whether torch got imported
RUN = (
    "import sys; from harness.cli.main import main; status = main(sys.argv[1:]); "
    "print('torch imported' if 'torch' in sys.modules else 'torch not imported'); "
    "sys.exit(status)"
)


@pytest.fixture
def installed(tmp_path):
    """The plugin installed as a distribution with an `idrs_bench` entry point (as pip
    lays one out), its import marker, and the environment of a process that sees it."""
    site = tmp_path / "site"
    info = site / "idrs_slow_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (site / "idrs_slow_plugin.py").write_text(PLUGIN)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: idrs-slow-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[idrs_bench]\nslow = idrs_slow_plugin\n")
    marker = tmp_path / "cache" / "plugins" / "slow" / "imported"  # (its confined host may write
    # its artifact folder, which the harness creates before it starts the host)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(site), os.environ.get("PYTHONPATH", "")]),
        "IDRS_BENCH_CACHE": str(tmp_path / "cache"),
        "SLOW_PLUGIN_MARKER": str(marker),
    }
    env.pop("IDRS_BENCH_PLUGINS", None)
    return site, marker, env


def _cli(installed, tmp_path, *argv: str) -> tuple[int, str, str]:
    _, _, env = installed
    done = subprocess.run([sys.executable, "-c", RUN, *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True)  # fmt: skip
    return done.returncode, done.stdout, done.stderr


def _spec(tmp_path, method: str, settings: str) -> str:
    path = tmp_path / f"{method}.toml"
    path.write_text(SPEC.format(method=method, settings=settings))
    return str(path)


@pytest.mark.long
@pytest.mark.slow
def test_spec_errors_do_not_import_a_recorded_plugin(installed, tmp_path):
    _, marker, _ = installed
    unknown = _spec(tmp_path, "cohne", "{ sigma = 0.5 }")
    # the first time, the plugin is imported and what it provides recorded
    status, out, err = _cli(installed, tmp_path, "run", unknown)
    assert status == 2 and "unknown method 'cohne'" in err and "cohen-slow" in err, err
    assert marker.exists()
    marker.unlink()
    # from then on: the same error, neither the plugin nor torch imported
    for spec, message in [
        (unknown, "available: alfarra-ds, alfarra-ds-memory, ancer, ancer-memory, anisotropic-fixed, "
                  "anisotropic-shifted, chen-fgss, cohen, cohen-slow,"),
        (_spec(tmp_path, "cohen-slow", "{ sigma = 0.5, k = 3 }"),
         "unknown parameter(s) ['k'] for method 'cohen-slow'; known: ['sigma']"),
        (_spec(tmp_path, "cohen", "{ sigma = -1 }"),
         "method 'cohen', setting sigma=-1: sigma must be a positive number, got -1"),
    ]:  # fmt: skip
        status, out, err = _cli(installed, tmp_path, "run", spec)
        assert status == 2 and message in err, err
        assert out.strip() == "torch not imported"
        assert not marker.exists()
    # a value only the plugin's own check judges: the plugin is imported for it
    status, out, err = _cli(installed, tmp_path, "run", _spec(tmp_path, "cohen-slow",
                                                             "{ sigma = -2 }"))  # fmt: skip
    assert status == 2, err
    assert "method 'cohen-slow', setting sigma=-2: cohen-slow needs sigma > 0, got -2" in err
    assert marker.exists()


@pytest.mark.long
@pytest.mark.slow
def test_an_edited_plugin_is_imported_again_and_plugins_lists_everything(installed, tmp_path):
    site, marker, _ = installed
    unknown = _spec(tmp_path, "cohne", "{ sigma = 0.5 }")
    _cli(installed, tmp_path, "run", unknown)
    manifest = json.loads((tmp_path / "cache" / "plugin-manifest.json").read_text())
    assert set(manifest["plugins"]) == {"slow"}  # third-party plugins only
    # an edit (editable install) changes the plugin's key: it is imported, its new name known
    source = site / "idrs_slow_plugin.py"
    time.sleep(0.01)
    source.write_text(source.read_text().replace('"cohen-slow"', '"cohen-slower"'))
    marker.unlink()
    status, out, err = _cli(installed, tmp_path, "run", unknown)
    assert status == 2 and "cohen-slower" in err and "cohen-slow," not in err, err
    assert marker.exists()
    marker.unlink()
    status, out, err = _cli(installed, tmp_path, "plugins", "--json")
    assert status == 0, err
    listed = json.loads(out.rsplit("\n", 2)[0])
    slow = next(p for p in listed["plugins"] if p["name"] == "slow")
    assert slow["provides"] == {"methods": ["cohen-slower"]} and slow["version"] == "0.1"
    assert marker.exists()  # `plugins` imports every plugin


@pytest.mark.long
@pytest.mark.slow
def test_a_restricted_or_failing_plugin_is_not_taken_from_the_manifest(installed, tmp_path):
    site, _, env = installed
    unknown = _spec(tmp_path, "cohne", "{ sigma = 0.5 }")
    _cli(installed, tmp_path, "run", unknown)
    env["IDRS_BENCH_PLUGINS"] = ""  # third-party plugins off: its names are not offered
    status, _, err = _cli(installed, tmp_path, "run", unknown)
    assert status == 2 and "cohen-slow" not in err, err
    del env["IDRS_BENCH_PLUGINS"]
    source = site / "idrs_slow_plugin.py"
    source.write_text("raise ImportError('a missing dependency')\n" + source.read_text())
    status, _out, err = _cli(installed, tmp_path, "run", unknown)
    assert status == 2 and "cohen-slow" not in err, err
    _, _, err = _cli(installed, tmp_path, "run", unknown)  # tried again, not cached
    assert "cohen-slow" not in err
    # its entry is kept without a key (never valid to check a spec against), so that a spec
    # naming one of its methods is told which plugin provides it and why it is missing
    kept = json.loads((tmp_path / "cache" / "plugin-manifest.json").read_text())["plugins"]
    assert kept["slow"]["key"] is None and "cohen-slow" in kept["slow"]["components"]["methods"]
    status, _, err = _cli(installed, tmp_path, "run", _spec(tmp_path, "cohen-slow", "{}"))
    assert status == 2 and "method 'cohen-slow' is provided by plugin 'slow'" in err, err
    assert "failed to load: ImportError: a missing dependency" in err
