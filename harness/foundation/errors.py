"""User-facing errors: one clear line that names the problem and the fix."""

from __future__ import annotations

import re
import shlex
import sys

_TERMINAL_CODES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def plain(text: str) -> str:
    """``text`` without terminal escape codes (a library's bold or colour)."""
    return _TERMINAL_CODES.sub("", text)


def pip_command(arguments: str) -> str:
    """``pip ARGUMENTS`` as an error message tells the user to type it: run by the
    interpreter running idrs-bench (``sys.executable -m pip``), so that it changes the
    environment idrs-bench runs in, a virtual environment activated or not (README.md,
    "Two commands"), never whichever ``pip`` comes first on PATH."""
    return f"{shlex.quote(sys.executable)} -m pip {arguments}"


class IdrsError(Exception):
    """An error the CLI prints as one line (no traceback) and exits non-zero."""


class UnknownNameError(IdrsError, KeyError):
    """A method, dataset, architecture, ... that no loaded plugin provides; the message
    names the available ones, or the installed plugin that provides it and why it was not
    loaded (:mod:`harness.plugin.registry`)."""

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return str(self.args[0])


class DuplicateNameError(IdrsError):
    """Two plugins registered a component of the same kind under the same name."""


class ParameterError(IdrsError, ValueError):
    """An invalid parameter value (sigma <= 0, alpha outside (0, 1), n0 > n, ...)."""


class DatasetMissingError(IdrsError, FileNotFoundError):
    """A dataset's files are not found where they were looked for."""


class ModelOutputError(IdrsError, FloatingPointError):
    """The base model produced NaN or infinite outputs."""


class SpecError(IdrsError):
    """A benchmark specification (TOML) is malformed or inconsistent."""


class ContractError(IdrsError):
    """A plugin broke the contract it declared (e.g. a certifier that returns its own
    counts instead of claims on the harness's draws); the message names the plugin."""
