"""A plugin's name is the folder its plugin host may write (docs/plugins.md, "Plugin names").

A third-party entry point named ``/``, ``..``, ``.hidden`` or ``a/b``, one whose artifact
folder is a symbolic link, one named like a built-in (``sukenik``) and one two
distributions declare are each refused before anything of them runs, with an error naming
the distribution; ``idrs-bench plugins`` and a run report the refusal, and the run's
built-in row certifies as it did without them; a name that is not the host's own is
never granted (the grants computed are checked); a method named ``a/b`` costs its plugin;
``idrs-bench plugins install`` refuses such names before they name a folder.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from harness.foundation.artifacts import cache_root
from harness.foundation.errors import IdrsError, UnknownNameError
from harness.plugin.entry_points import (
    PluginNameError,
    artifact_folder,
    artifact_grants,
    name_problem,
)
from harness.plugin.hosting.in_harness.host_process import PluginHost
from harness.plugin.manager import PluginManager

PLUGIN = '''
"""A plugin that, once imported, writes where its name leads (it is never imported)."""
import os

from harness import MethodSpec, hookimpl

IDRS_BENCH_CONTRACT = 4
MARK = os.path.join(os.environ["IDRS_BENCH_CACHE"], "plugins", "sukenik", "{module}-imported")
with open(MARK, "w") as out:
    out.write("rewritten")


@hookimpl
def idrs_register_methods(register):
    register(MethodSpec("{module}-method", "constant", "cohen", {{"sigma": 0.25}}))
'''

BAD_METHOD = """
from harness import MethodSpec, hookimpl

IDRS_BENCH_CONTRACT = 4


@hookimpl
def idrs_register_methods(register):
    register(MethodSpec("a/b", "constant", "cohen", {"sigma": 0.25}))
    register(MethodSpec("fine", "constant", "cohen", {"sigma": 0.25}))
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache root of the test's own (a symbolic link may be made in its plugins/)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("IDRS_BENCH_CACHE", str(root))
    (root / "plugins" / "sukenik").mkdir(parents=True)
    return root


def _install(install_plugin, module: str, entry_point: str, distribution: str) -> None:
    install_plugin(module, PLUGIN.format(module=module), distribution=distribution,
                   entry_point=entry_point)  # fmt: skip


def _refusal(manager: PluginManager, distribution: str):
    [failure] = [f for f in manager.failures if f.distribution == distribution]
    return failure


@pytest.mark.parametrize("name", ["/", "..", ".hidden", "a/b", "."])
def test_an_entry_point_that_is_not_a_plain_name_is_refused_naming_its_distribution(
    name, install_plugin, cache
):
    _install(install_plugin, "idrs_test_named", name, "idrs-test-named")
    with PluginManager() as manager:
        failure = _refusal(manager, "idrs-test-named")
        assert failure.plugin == name and failure.stage == "name"
        assert failure.error.startswith("PluginNameError: the entry point ")
        assert (f"of the distribution 'idrs-test-named' is refused: {name!r} is not a plain "
                "name") in failure.error  # fmt: skip
        assert "docs/plugins.md, 'Plugin names'" in failure.error
        assert failure.why().startswith("was refused: PluginNameError")
        assert "idrs_test_named-method" not in manager.registry.names("methods")
        assert manager._hosts == {}  # (no host: nothing of it runs)
    assert not (cache / "plugins" / "sukenik" / "idrs_test_named-imported").exists()


@pytest.mark.parametrize("target", ["elsewhere", "sukenik"])
def test_an_entry_point_whose_artifact_folder_is_a_symbolic_link_is_refused(
    target, install_plugin, cache, tmp_path
):
    """A link out of the cache, and a link to a built-in's folder beneath it: neither is
    granted (checked after resolution), at discovery and where the grants are made."""
    (tmp_path / "elsewhere").mkdir()
    destination = tmp_path / "elsewhere" if target == "elsewhere" else cache / "plugins" / "sukenik"
    (cache / "plugins" / "linked").symlink_to(destination, target_is_directory=True)
    _install(install_plugin, "idrs_test_linked", "linked", "idrs-test-linked")
    with PluginManager() as manager:
        failure = _refusal(manager, "idrs-test-linked")
        assert failure.plugin == "linked" and failure.stage == "name"
        assert "of the distribution 'idrs-test-linked' is refused" in failure.error
        assert "is a symbolic link" in failure.error and "remove the link" in failure.error
        assert manager._hosts == {}
    with pytest.raises(PluginNameError, match="is a symbolic link"):
        artifact_grants(cache.resolve(), ["linked"], ["sukenik"])
    host = PluginHost("idrs-test-linked", ["linked"], confined=True, builtins=["sukenik"])
    try:
        with pytest.raises(PluginNameError, match="is a symbolic link"):
            host.start()
        assert not host.running
    finally:
        host.close()
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_built_in_name_is_refused_and_never_granted_the_built_ins_folder(
    install_plugin, cache, capsys
):
    from harness.cli.main import main

    _install(install_plugin, "idrs_test_clash", "sukenik", "idrs-test-clash")
    with PluginManager() as manager:
        failure = _refusal(manager, "idrs-test-clash")
        assert failure.plugin == "sukenik" and failure.stage == "name"
        assert failure.error.startswith("DuplicateNameError: the entry point 'sukenik' = "
                                        "'idrs_test_clash' of the distribution 'idrs-test-clash' "
                                        "is refused: 'sukenik' is the built-in plugin "
                                        "'plugins.sukenik' of idrs-bench")  # fmt: skip
        assert manager.registry.provider("methods", "sukenik") == "sukenik"  # the built-in's
        with pytest.raises(UnknownNameError, match=re.escape(
                "plugin 'sukenik' (package idrs-test-clash 0.1) was refused: DuplicateNameError")):  # fmt: skip
            manager.registry.get("methods", "idrs_test_clash-method")
        assert manager._hosts == {}
    # where the grants are made: a host of a plugin named like a built-in is never started,
    # and the grants of a host of its own name write its folder only
    builtins = manager.builtin_plugins()
    with pytest.raises(PluginNameError, match="'sukenik' are built-in plugins'"):
        artifact_grants(cache.resolve(), ["sukenik"], builtins)
    host = PluginHost("idrs-test-clash", ["sukenik"], confined=True, builtins=builtins)
    try:
        with pytest.raises(PluginNameError):
            host.start()
        assert not host.running
    finally:
        host.close()
    own, shared = artifact_grants(cache.resolve(), ["idrs_test_own"], builtins)
    plugins = cache.resolve() / "plugins"
    assert own == [plugins / "idrs_test_own"]
    assert plugins / "sukenik" in shared and plugins / "sukenik" not in own
    for name in ("/", "..", ".hidden", "a/b"):
        with pytest.raises(PluginNameError, match="is not a plain name"):
            artifact_grants(cache.resolve(), [name], builtins)
    # `idrs-bench plugins` reports it, as a table and as JSON
    assert main(["plugins"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "not loaded plugin 'sukenik' (package idrs-test-clash 0.1) was refused: " in out
    assert "of the distribution 'idrs-test-clash' is refused" in out
    assert main(["plugins", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    [refused] = [f for f in listed["failures"] if f["distribution"] == "idrs-test-clash"]
    assert refused["plugin"] == "sukenik" and refused["stage"] == "name"
    assert not (cache / "plugins" / "sukenik" / "idrs_test_clash-imported").exists()


def test_a_name_two_distributions_declare_is_refused_for_both(install_plugin, cache):
    _install(install_plugin, "idrs_test_first", "shared-name", "idrs-test-first")
    _install(install_plugin, "idrs_test_second", "shared-name", "idrs-test-second")
    with PluginManager() as manager:
        for distribution in ("idrs-test-first", "idrs-test-second"):
            failure = _refusal(manager, distribution)
            assert failure.error.startswith("DuplicateNameError: ")
            assert ("'shared-name' is declared by the distributions 'idrs-test-first' and "
                    "'idrs-test-second'") in failure.error  # fmt: skip
        assert manager._hosts == {}


def test_a_run_beside_refused_plugins_certifies_its_built_in_row_as_before(
    install_plugin, cache, tmp_path, capsys, beside_cohen
):
    """The run warns of each refused distribution (and of a plugin whose method is named
    ``a/b``) and goes on: its built-in row's certificates are those of a run without them."""
    from harness.cli.main import main

    spec = tmp_path / "names.toml"
    spec.write_text(beside_cohen("names"))

    def certificates(db: Path) -> list[tuple]:
        with sqlite3.connect(db) as con:
            return con.execute("SELECT input_id, prediction, radius FROM certificates "
                               "WHERE method = 'cohen' ORDER BY input_id").fetchall()  # fmt: skip

    before = tmp_path / "before.sqlite"
    assert main(["run", str(spec), "--db", str(before), "--quiet", "--no-check"]) == 0
    capsys.readouterr()
    _install(install_plugin, "idrs_test_clash", "sukenik", "idrs-test-clash")
    _install(install_plugin, "idrs_test_slash", "/", "idrs-test-slash")
    install_plugin("idrs_test_badmethod", BAD_METHOD, distribution="idrs-test-badmethod")
    after = tmp_path / "after.sqlite"
    assert main(["run", str(spec), "--db", str(after), "--quiet", "--no-check"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert ("warning: plugin 'sukenik' (package idrs-test-clash 0.1) was refused: "
            "DuplicateNameError") in err  # fmt: skip
    assert "warning: plugin '/' (package idrs-test-slash 0.1) was refused: PluginNameError" in err
    assert ("warning: plugin 'idrs_test_badmethod' (package idrs-test-badmethod 0.1) was "
            "refused: PluginNameError: the plugin 'idrs_test_badmethod' of the distribution "
            "'idrs-test-badmethod' is refused: its method 'a/b' is not a plain name") in err  # fmt: skip
    assert len(certificates(before)) == 4 and certificates(after) == certificates(before)
    assert list((cache / "plugins" / "sukenik").glob("*-imported")) == []  # never imported
    with PluginManager() as manager:  # the refused plugin's methods are not served, not even "fine"
        methods = manager.registry.names("methods")
        assert "a/b" not in methods and "fine" not in methods
        with pytest.raises(UnknownNameError, match=re.escape(
                "method 'a/b' is provided by plugin 'idrs_test_badmethod' (package "
                "idrs-test-badmethod 0.1), which was refused")):  # fmt: skip
            manager.registry.get("methods", "a/b")


def test_the_naming_rule():
    for name in ("cohen", "dual-rs", "my_plugin.v2", "A9", "x" * 100):
        assert name_problem(name) is None
    for name in ("", "/", ".", "..", ".hidden", "a/b", "a\\b", "ü", "a b", "x" * 101, None, 3):
        assert name_problem(name) is not None, name
    with pytest.raises(PluginNameError):
        artifact_folder(cache_root() / "plugins", "../escape", create=True)


def test_plugins_install_refuses_a_bad_entry_point_or_distribution_name(tmp_path):
    from harness.plugin.private_install import _checked

    def dist(folder: Path, name: str, entry_point: str) -> Path:
        info = folder / "evil-0.1.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[idrs_bench]\n{entry_point} = evil\n")
        return folder

    with pytest.raises(PluginNameError, match="declares the entry point '/', refused"):
        _checked(dist(tmp_path / "a", "idrs-evil", "/"))
    for i, name in enumerate(("/etc", "../../evil", ".evil")):
        with pytest.raises(IdrsError, match="is not a valid distribution name"):
            _checked(dist(tmp_path / f"b{i}", name, "evil"))
