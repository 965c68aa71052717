"""Why a checkpoint cannot be read, found without unpickling it, and what to do.

``torch.load(..., weights_only=True)`` refuses any pickled object that is not a tensor
or a plain container, and ``torch.jit.load`` anything that is not TorchScript; their
messages are long, version-dependent and carry terminal codes. :func:`diagnose` reads
the file's structure instead: a file written by ``torch.save`` is a zip archive whose
``data.pkl`` names, as GLOBAL opcodes, every class it would instantiate
(:func:`pickled_globals` lists them with :mod:`pickletools`, which executes nothing);
a TorchScript archive also holds ``constants.pkl`` and ``code/``. From that it names
the problem (a pickled model, numpy arrays, another object, a TorchScript file read as
a state dict, a damaged file) and the fix.
"""

from __future__ import annotations

import pickletools
import re
import zipfile
from pathlib import Path

from harness.foundation.errors import plain

SAFE_GLOBALS = {
    "collections OrderedDict",
    "torch._utils _rebuild_tensor_v2",
    "torch._utils _rebuild_parameter",
    "torch._utils _rebuild_parameter_with_state",
    "__builtin__ set",
    "builtins set",
    "torch device",
    "torch Size",
}
"""Globals of a plain state dict (tensor rebuilders, storages are matched by name)."""

_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "SHORT_BINSTRING", "BINSTRING",
               "STRING", "BINUNICODE8"}  # fmt: skip


def archive_kind(path: Path) -> str | None:
    """``"torchscript"`` or ``"torch.save"`` for a PyTorch zip archive, else None."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return None
    if any(n.endswith("/constants.pkl") or "/code/" in n for n in names):
        return "torchscript"
    return "torch.save" if any(n.endswith("/data.pkl") for n in names) else None


def pickled_globals(path: Path) -> list[str] | None:
    """``module.name`` of every global that ``path``'s ``data.pkl`` refers to, in order
    of first use (None when it is not a ``torch.save`` zip archive). Nothing is run."""
    try:
        with zipfile.ZipFile(path) as archive:
            name = next((n for n in archive.namelist() if n.endswith("/data.pkl")), None)
            if name is None:
                return None
            data = archive.read(name)
    except (zipfile.BadZipFile, OSError):
        return None
    found: list[str] = []
    strings: list[str] = []  # recent string arguments (STACK_GLOBAL takes the last two)
    memo: dict[int, str] = {}
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name in _STRING_OPS:
                strings.append(str(arg))
            elif op.name == "MEMOIZE" and strings:
                memo[len(memo)] = strings[-1]
            elif op.name in ("BINPUT", "LONG_BINPUT", "PUT") and strings:
                memo[int(arg)] = strings[-1]
            elif op.name in ("BINGET", "LONG_BINGET", "GET") and int(arg) in memo:
                strings.append(memo[int(arg)])
            elif op.name == "GLOBAL":
                found.append(str(arg).replace(" ", ".", 1))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.append(f"{strings[-2]}.{strings[-1]}")
    except Exception:  # a damaged pickle: what was read so far
        pass
    return list(dict.fromkeys(found))


def _safe(name: str) -> bool:
    module, _, attr = name.rpartition(".")
    return f"{module} {attr}" in SAFE_GLOBALS or (module == "torch" and attr.endswith("Storage"))


def diagnose(path: Path, fmt: str, error: BaseException) -> str:
    """One line: why ``path`` (read as ``fmt``) failed with ``error``, and the fix."""
    kind = archive_kind(path)
    if kind == "torchscript" and fmt != "torchscript":
        return (
            f'{path} is a TorchScript file (torch.jit.save); set [model] format = "torchscript" '
            "(the architecture then comes with the file)"
        )
    if fmt == "torchscript" and kind == "torch.save":
        return (
            f"{path} was written by torch.save, not torch.jit.save; export the model with "
            f'torch.jit.save(torch.jit.script(model), "{path.stem}.ts"), or set format = '
            '"state_dict" if the file holds a state dict'
        )
    unsafe = [g for g in pickled_globals(path) or [] if not _safe(g)]
    if any(g.startswith("numpy.") for g in unsafe):
        return (
            f"{path} holds numpy arrays, which torch.load(weights_only=True) does not read; "
            "re-save them as tensors: torch.save({k: torch.as_tensor(v) for k, v in "
            f'state.items()}}, "{path.stem}-tensors.pt")'
        )
    if unsafe:
        return (
            f"{path} holds a pickled Python object ({unsafe[0]}), e.g. a model saved with "
            "torch.save(model); it is not loaded, because unpickling it could run any code. "
            f'Re-save the weights with torch.save(model.state_dict(), "{path.stem}-state.pt") '
            'and set [model] format = "state_dict" with the matching architecture, or export '
            f'TorchScript with torch.jit.save(torch.jit.script(model), "{path.stem}.ts") and '
            'set format = "torchscript"'
        )
    text = plain(str(error)).strip()
    reason = re.split(r"(?<=\.)\s", text)[0].rstrip(".") if text else "no message"
    return (
        f"{path} cannot be read as a PyTorch checkpoint ({type(error).__name__}: {reason}); "
        "the file may be damaged or incomplete (compare its size or SHA-256 with the "
        "original), or not be a torch.save or torch.jit.save file"
    )
