"""The plugin manager: registration, providers, duplicates, broken plugins, listing."""

import importlib.metadata
import json
import types

import pytest

from harness import hookimpl
from harness.cli.main import main
from harness.foundation.errors import DuplicateNameError, UnknownNameError
from harness.plugin.components import MethodSpec
from harness.plugin.entry_points import is_builtin
from harness.plugin.loader import PluginLoader
from harness.plugin.manager import PluginManager


def _method_plugin(name: str):
    module = types.ModuleType(f"plugin_{name.replace('-', '_')}")

    @hookimpl
    def idrs_register_methods(register):
        register(
            MethodSpec(name, sigma_provider="constant", certifier="cohen", defaults={"sigma": 0.5})
        )

    module.idrs_register_methods = idrs_register_methods
    module.IDRS_BENCH_CONTRACT = 3
    return module


def test_builtins_are_registered_with_their_provider(manager):
    registry = manager.registry
    assert "cohen" in registry.names("methods")
    assert registry.provider("methods", "cohen") == "cohen"
    assert registry.provider("datasets", "fashion-mnist") == "datasets"
    assert set(registry.names("models")) >= {"mlp", "cnn", "linear-N", "ball-N"}
    assert registry.provider("models", "ball-N") == "analytic"
    assert registry.provider("checks", "coverage") == "soundness"
    assert manager.failures == []


def test_family_names_resolve(manager):
    assert manager.registry.get("datasets", "cone-60").name == "cone-N"
    assert manager.registry.family_args("datasets", "cone-60") == {"dim": 60}


def test_temporary_plugin_registered_and_unregistered(manager):
    manager.register(_method_plugin("my-method"), name="mine", version="1.2")
    assert manager.registry.provider("methods", "my-method") == "mine"
    assert {"name": "mine", "version": "1.2", "hooks": ["idrs_register_methods"],
            "distribution": None, "provides": {"methods": ["my-method"]}, "runs_in": "here"} in manager.describe()  # fmt: skip
    manager.unregister("mine")
    with pytest.raises(
        UnknownNameError, match="unknown method 'my-method'; available: alfarra-ds, "
    ):
        manager.registry.get("methods", "my-method")


def test_duplicate_name_is_rejected_naming_both_providers(manager):
    manager.register(_method_plugin("cohen"), name="impostor")
    registry = manager.registry
    # the first provider keeps the name; the duplicate is reported, naming both
    assert registry.provider("methods", "cohen") == "cohen"
    [failure] = manager.failures
    assert failure.plugin == "impostor"
    assert "'cohen'" in failure.error and "'impostor'" in failure.error
    assert "DuplicateNameError" in failure.error
    with pytest.raises(DuplicateNameError, match="by plugin 'a' and by plugin 'b'"):
        from harness.plugin.registry import Registry

        r = Registry()
        spec = MethodSpec("x", "constant", "cohen")
        r.add("methods", spec, "a")
        r.add("methods", spec, "b")


class _FakeEntryPoint:
    def __init__(self, name, target):
        self.name, self._target, self.dist = name, target, None
        self.value = f"fake.{name}"

    def load(self):
        if isinstance(self._target, Exception):
            raise self._target
        return self._target


def _fake_entry_points(monkeypatch, eps, builtins=True):
    """Entry points of the group: the installed built-ins (unless not ``builtins``) + ``eps``.

    Fake ones exist in this process only, so the tests that use them load them as a plugin
    host loads plugins, in its own process (``PluginLoader()``); how a host's
    failures reach the harness is tested in tests/test_plugin_host.py."""
    installed = list(importlib.metadata.entry_points(group="idrs_bench")) if builtins else []
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda group: [*installed, *eps] if group == "idrs_bench" else [],
    )


def test_broken_entry_point_is_reported_and_the_rest_works(monkeypatch, capsys):
    _fake_entry_points(
        monkeypatch,
        [_FakeEntryPoint("broken", ImportError("no module named 'nonexistent'")),
         _FakeEntryPoint("good", _method_plugin("good-method"))],
    )  # fmt: skip
    manager = PluginLoader()
    assert [(f.plugin, f.error) for f in manager.failures] == [
        ("broken", "ImportError: no module named 'nonexistent'")
    ]
    assert "good-method" in manager.registry.names("methods")
    assert "cohen" in manager.registry.names("methods")


def test_environment_variable_restricts_external_plugins(monkeypatch):
    _fake_entry_points(
        monkeypatch,
        [
            _FakeEntryPoint("one", _method_plugin("one")),
            _FakeEntryPoint("two", _method_plugin("two")),
        ],
    )
    monkeypatch.setenv("IDRS_BENCH_PLUGINS", "two")
    assert "one" not in PluginLoader().registry.names("methods")
    assert "two" in PluginLoader().registry.names("methods")
    monkeypatch.setenv("IDRS_BENCH_PLUGINS", "")
    assert "one" not in PluginLoader().registry.names("methods")
    assert "cohen" in PluginLoader().registry.names("methods")  # built-ins always
    monkeypatch.delenv("IDRS_BENCH_PLUGINS")
    assert "two" not in PluginManager(third_party=False).registry.names("methods")


def test_builtins_are_the_entry_points_of_this_distribution():
    eps = list(importlib.metadata.entry_points(group="idrs_bench"))
    assert {ep.name for ep in eps if is_builtin(ep)} == set(PluginManager().plugin_names())
    assert {ep.value for ep in eps if is_builtin(ep)} >= {"plugins.cohen", "harness.audit"}
    assert not is_builtin(_FakeEntryPoint("x", None))


def test_a_plugin_name_declared_twice_fails_naming_both(monkeypatch):
    impostor = _FakeEntryPoint("cohen", _method_plugin("impostor"))
    installed = list(importlib.metadata.entry_points(group="idrs_bench"))
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [impostor, *installed])
    manager = PluginLoader()
    [failure] = manager.failures
    assert failure.plugin == "cohen" and "DuplicateNameError" in failure.error
    assert "'plugins.cohen'" in failure.error and "'fake.cohen'" in failure.error
    assert "impostor" not in manager.registry.names("methods")


def test_without_the_builtin_entry_points_the_failure_says_how_to_install(monkeypatch):
    _fake_entry_points(monkeypatch, [], builtins=False)
    manager = PluginManager()
    [failure] = manager.failures
    assert failure.plugin == "idrs-bench" and "README.md's first command" in failure.error
    assert "python3 -m venv .venv && .venv/bin/python -m pip install -e ." in failure.error
    assert manager.registry.names("methods") == []


def test_a_plugin_whose_register_hook_raises_does_not_break_the_others(manager):
    module = types.ModuleType("raising")

    @hookimpl
    def idrs_register_methods(register):
        raise RuntimeError("boom")

    module.idrs_register_methods = idrs_register_methods
    manager.register(module, name="raising")
    assert "cohen" in manager.registry.names("methods")
    assert manager.failures[0].plugin == "raising" and "boom" in manager.failures[0].error


def test_plugins_command_lists_plugins_as_json(capsys):
    assert main(["plugins", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    by_name = {p["name"]: p for p in out["plugins"]}
    assert by_name["cohen"]["provides"]["methods"] == ["cohen"]
    assert "idrs_register_certifiers" in by_name["cohen"]["hooks"]
    assert by_name["cohen"]["version"]


def test_plugins_command_renders_a_table(capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "cohen" in out and "fashion-mnist" in out


def _half_registering_plugin(second):
    """Registers a dataset, a method, then ``second()`` (which raises or registers)."""
    from harness.plugin.components import DatasetSpec

    module = types.ModuleType("plugin_half")

    @hookimpl
    def idrs_register_datasets(register):
        register(DatasetSpec("half-ds", lambda **_: None))

    @hookimpl
    def idrs_register_methods(register):
        register(MethodSpec("half-one", "constant", "cohen", {"sigma": 0.5}))
        second(register)

    module.idrs_register_datasets = idrs_register_datasets
    module.idrs_register_methods = idrs_register_methods
    module.IDRS_BENCH_CONTRACT = 3
    return module


def _raise(register):
    raise RuntimeError("broken half-way")


def _duplicate(register):
    register(MethodSpec("cohen", "constant", "cohen", {"sigma": 0.5}))  # a built-in's name


@pytest.mark.parametrize(("second", "error"), [(_raise, "broken half-way"),
                                                 (_duplicate, "provided twice")])  # fmt: skip
def test_a_failed_registration_is_rolled_back_whole(manager, second, error):
    manager.register(_half_registering_plugin(second), name="half")
    registry = manager.registry
    assert "half-one" not in registry.names("methods")
    assert "half-ds" not in registry.names("datasets")
    assert registry.provided_by("half") == {}
    assert registry.provider("methods", "cohen") == "cohen"  # the built-in keeps its name
    [failure] = [f for f in manager.failures if f.plugin == "half"]
    assert failure.stage == "register" and error in failure.error
    assert "cohen" in registry.names("methods") and manager.registry is registry
    # a spec naming its method is told which plugin provides it and why it is missing
    with pytest.raises(UnknownNameError) as missing:
        registry.get("methods", "half-one")
    assert str(missing.value).startswith(
        "method 'half-one' is provided by plugin 'half', which failed to register its "
        f"components: {failure.error}"
    )


def test_registration_goes_through_pluggys_hook_caller(manager):
    """A hook wrapper and pluggy's call monitoring see every plugin's register hooks."""
    seen, wrapped = [], []

    def before(hook_name, impls, kwargs):
        seen.append((hook_name, tuple(i.plugin_name for i in impls if not i.wrapper)))

    manager.pm.add_hookcall_monitoring(before, lambda *args: None)
    wrapper = types.ModuleType("plugin_wrapper")

    @hookimpl(wrapper=True)
    def idrs_register_methods(register):
        wrapped.append("around")  # called around each plugin's registration of methods
        return (yield)

    wrapper.idrs_register_methods = idrs_register_methods
    manager.register(_method_plugin("traced"), name="traced")
    manager.register(wrapper, name="wrapper")
    registry = manager.registry
    assert ("idrs_register_methods", ("traced",)) in seen
    assert ("idrs_register_methods", ("cohen",)) in seen
    assert ("idrs_register_checks", ("soundness",)) in seen
    methods_plugins = [p for hook, p in seen if hook == "idrs_register_methods"]
    assert len(wrapped) == len(methods_plugins) >= 2
    assert registry.methods.get("traced").certifier == "cohen"  # the typed table of its kind
    assert registry.methods.provider("traced") == "traced"


def test_the_registry_has_one_typed_table_per_kind(manager):
    from harness.plugin.components import CheckSpec, DatasetSpec
    from harness.plugin.registry import COMPONENT_KINDS

    registry = manager.registry
    for kind, spec_type in COMPONENT_KINDS.items():
        table = registry.table(kind)
        assert table is getattr(registry, kind) and table.spec_type is spec_type
        assert all(isinstance(table.get(n), spec_type) for n in table.names())
    assert isinstance(registry.datasets.get("cone-60"), DatasetSpec)
    assert isinstance(registry.checks.get("coverage"), CheckSpec)
    with pytest.raises(KeyError, match="unknown component kind 'method'"):
        registry.table("method")
