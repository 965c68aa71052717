"""A checkpoint that cannot be read is one complete line, without terminal codes, that
says what the file holds and how to make a readable one: a model pickled with
``torch.save(model)`` (alone or inside a dict), numpy arrays, a TorchScript file read as
a state dict and the reverse, a file cut short, and bytes that are no checkpoint."""

from __future__ import annotations

import pickle
import pickletools

import numpy as np
import pytest
import torch

from harness.cli.main import main
from harness.running.checkpoint_diagnosis import pickled_globals

SPEC = """
[dataset]
name = "cone-2"
test_count = 2

[model]
architecture = "mlp"
architecture_params = {{ width = 8 }}
checkpoint = "{checkpoint}"
format = "{format}"

[certification]
n0 = 10
n = 20
alpha = 0.01

[[methods]]
name = "cohen"
settings = [{{ sigma = 0.5 }}]
"""


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
    )


def _error(tmp_path, capsys, checkpoint, fmt: str) -> str:
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(checkpoint=checkpoint, format=fmt))
    argv = ["run", str(spec), "--db", str(tmp_path / "r.sqlite"), "--no-check", "--quiet"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert "\x1b" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {checkpoint} "), err
    return lines[0]


def test_a_pickled_model_names_the_two_ways_to_save_it(tmp_path, capsys):
    path = tmp_path / "model.pt"
    torch.save(_mlp(), path)
    line = _error(tmp_path, capsys, path, "state_dict")
    assert "pickled Python object (torch.nn.modules.container.Sequential)" in line
    assert 'torch.save(model.state_dict(), "model-state.pt")' in line
    assert 'format = "state_dict"' in line and 'format = "torchscript"' in line
    assert "torch.jit.save(torch.jit.script(model)" in line
    # the advice works: the re-saved state dict certifies
    torch.save(_mlp().state_dict(), tmp_path / "model-state.pt")
    spec = tmp_path / "ok.toml"
    spec.write_text(SPEC.format(checkpoint=tmp_path / "model-state.pt", format="state_dict"))
    assert main(["run", str(spec), "--db", str(tmp_path / "ok.sqlite"), "--no-check",
                 "--quiet"]) == 0  # fmt: skip


def test_a_model_pickled_inside_a_dict(tmp_path, capsys):
    path = tmp_path / "checkpoint.pth"
    torch.save({"epoch": 3, "model": _mlp()}, path)
    line = _error(tmp_path, capsys, path, "state_dict")
    assert "torch.nn.modules.container.Sequential" in line and "state_dict()" in line


def test_numpy_arrays(tmp_path, capsys):
    path = tmp_path / "arrays.pt"
    torch.save({k: v.numpy() for k, v in _mlp().state_dict().items()}, path)
    line = _error(tmp_path, capsys, path, "state_dict")
    assert "numpy arrays" in line and "torch.as_tensor(v)" in line


def test_torchscript_read_as_a_state_dict_and_the_reverse(tmp_path, capsys):
    scripted = tmp_path / "model.ts"
    torch.jit.save(torch.jit.script(_mlp()), scripted)
    line = _error(tmp_path, capsys, scripted, "state_dict")
    assert 'is a TorchScript file (torch.jit.save); set [model] format = "torchscript"' in line
    saved = tmp_path / "state.pt"
    torch.save(_mlp().state_dict(), saved)
    line = _error(tmp_path, capsys, saved, "torchscript")
    assert "was written by torch.save, not torch.jit.save" in line


@pytest.mark.parametrize("fmt", ["state_dict", "torchscript"])
def test_a_file_cut_short_or_not_a_checkpoint(tmp_path, capsys, fmt):
    whole = tmp_path / "whole.pt"
    torch.save(_mlp().state_dict(), whole)
    cut = tmp_path / "cut.pt"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    line = _error(tmp_path, capsys, cut, fmt)
    assert "cannot be read as a PyTorch checkpoint" in line and "damaged or incomplete" in line
    noise = tmp_path / "noise.pt"
    noise.write_bytes(np.random.default_rng(0).bytes(1000))
    line = _error(tmp_path, capsys, noise, fmt)
    assert "cannot be read as a PyTorch checkpoint" in line


def test_the_pickle_is_read_without_running_it(tmp_path):
    """The classes a file names are listed from its opcodes: an object whose unpickling
    would run code is never constructed."""
    ran = tmp_path / "ran"

    class Trap:
        def __reduce__(self):
            return (open, (str(ran), "w"))

    path = tmp_path / "trap.pt"
    torch.save({"w": torch.zeros(2), "trap": Trap()}, path)
    found = pickled_globals(path)
    assert _pickled_name(open) in found, found
    assert not ran.exists()


def _pickled_name(obj) -> str:
    """``module.name`` under which pickle (at torch.save's protocol) refers to ``obj``:
    ``io.open`` on Python 3.11, ``_io.open`` on 3.12, whatever the version calls it."""
    protocol = torch.serialization.DEFAULT_PROTOCOL
    data = pickle.dumps(obj, protocol=protocol)
    strings = []
    for op, arg, _ in pickletools.genops(data):
        if op.name == "GLOBAL":
            return str(arg).replace(" ", ".", 1)
        if isinstance(arg, str):
            strings.append(arg)
        if op.name == "STACK_GLOBAL":
            return f"{strings[-2]}.{strings[-1]}"
    raise AssertionError(f"no global in {data!r}")
