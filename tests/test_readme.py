"""The README says what the code does: its usage lines are argparse's, every command has
one, and its plugin example registers, works, and imports torch only where it is used."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
from pathlib import Path

import torch

from harness.cli.main import _parser
from harness.plugin.manager import PluginManager

README = Path(__file__).resolve().parents[1] / "README.md"


def _usage_lines() -> dict[str, str]:
    """command -> its usage line in the README's "Using it" block (continuations joined)."""
    block = README.read_text().split("## Using it", 1)[1].split("```sh\n", 1)[1].split("```")[0]
    lines: list[str] = []
    for line in block.splitlines():
        if line.startswith("idrs-bench "):
            lines.append(line)
        elif line.strip():
            lines[-1] += " " + line.strip()
    out = {}
    for line in lines:
        command = line.split()[1]
        assert command not in out, f"two usage lines for {command}"
        out[command] = " ".join(line.split())
    return out


def _argparse_lines() -> dict[str, str]:
    """command -> argparse's usage line (without ``-h``)."""
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    out = {}
    for name, parser in sub.choices.items():
        usage = " ".join(parser.format_usage().split()).removeprefix("usage: ")
        out[name] = usage.replace(" [-h]", "")
    return out


def test_every_command_has_its_usage_line_as_argparse_has_it():
    readme, actual = _usage_lines(), _argparse_lines()
    assert sorted(readme) == sorted(actual)
    for command, line in actual.items():
        assert readme[command] == line, command


def _plugin_example() -> str:
    section = README.read_text().split("## Writing a plugin", 1)[1]
    return re.search(r"```python\n(# idrs_half_sigma\.py.*?)```", section, re.S).group(1)


def test_the_plugin_example_registers_and_imports_torch_only_where_used(tmp_path):
    source = _plugin_example()
    top_level = [
        node for node in ast.parse(source).body if isinstance(node, ast.Import | ast.ImportFrom)
    ]
    imported = {alias.name for node in top_level for alias in node.names}
    imported |= {node.module for node in top_level if isinstance(node, ast.ImportFrom)}
    assert "torch" not in imported and imported <= {"harness", "Constant", "MethodSpec",
                                                    "SigmaProviderSpec", "hookimpl"}  # fmt: skip
    path = tmp_path / "idrs_half_sigma.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("idrs_half_sigma", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    manager = PluginManager(third_party=False)
    manager.register(module, "half", "0.1")
    registry = manager.registry
    method = registry.get("methods", "cohen-half")
    assert (method.sigma_provider, method.certifier) == ("half", "cohen")
    provider = registry.get("sigma_providers", "half").build(None, {"sigma": 0.5})
    assert torch.equal(provider(torch.zeros(3, 2)), torch.full((3,), 0.25))
    assert provider.regularity.sigma == 0.25


def test_the_readme_plugin_example_is_installed_and_runs_in_the_plugin_host(install_plugin):
    install_plugin("idrs_half_sigma", _plugin_example(), "idrs-half-sigma", entry_point="half")
    manager = PluginManager()
    rows = {row["name"]: row for row in manager.describe()}
    assert rows["half"]["runs_in"] == "plugin host" and rows["half"]["version"] == "0.1"
    assert [f for f in manager.failures if f.plugin == "half"] == []
    method = manager.registry.get("methods", "cohen-half")
    assert (method.sigma_provider, method.certifier) == ("half", "cohen")
