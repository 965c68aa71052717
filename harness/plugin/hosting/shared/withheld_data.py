"""What no confined process of the harness reads: the public datasets installed on the machine.

Debian's dataset packages (``dataset-fashion-mnist``: the built-in ``fashion-mnist``'s
default) install public datasets, test splits included, beneath ``/usr/share/datasets``,
which the system's read grant (``/usr``:
:data:`~harness.plugin.hosting.shared.policy.SYSTEM_READ`) would include. A plugin host
(:mod:`harness.plugin.hosting.in_host.host`) and a plugin's confined build
(:mod:`harness.plugin.private_install`) are granted their Python and the system's
files :func:`narrowed`: everything they were granted before but the datasets, so that a
plugin can neither read a test split there nor copy one into its package
(docs/threat-model.md, "What remains outside"). The data roots the harness grants a
third-party dataset's loader are granted as asked.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

WITHHELD_DATA = ("/usr/share/datasets",)
"""Where Debian's dataset packages install public datasets (``dataset-fashion-mnist``: the
built-in ``fashion-mnist``'s default): readable by no plugin host and no plugin's build."""


def narrowed(paths: Iterable[str], withheld: Iterable[str] = WITHHELD_DATA) -> list[str]:
    """``paths`` less the folders ``withheld``: Landlock grants everything beneath a path, so
    a path that holds a withheld folder is replaced by its entries but the one leading there
    (recursively: ``/usr`` by ``/usr/bin``, ..., ``/usr/share/<each but datasets>``). Paths
    are compared resolved (a path that leads into a withheld folder is left out, one that
    leads to a folder holding one is narrowed), and a symbolic link among the entries is
    left out: a rule on it would grant its target, wherever that is (beneath the path it
    replaces, the target is granted as an entry of its own)."""
    cut = [os.path.realpath(w) for w in withheld if os.path.isdir(w)]
    out: list[str] = []

    def add(path: str) -> None:
        real = os.path.realpath(path)
        if any(real == w or real.startswith(w.rstrip("/") + "/") for w in cut):
            return  # a withheld folder, or beneath one
        if not any(w.startswith(real.rstrip("/") + "/") for w in cut):
            out.append(path)  # holds none of them
            return
        try:
            entries = sorted(os.listdir(real))  # (a folder: it holds one)
        except OSError:
            return  # (not granted: nothing of it can be told apart)
        for entry in entries:
            if not os.path.islink(os.path.join(real, entry)):
                add(os.path.join(real, entry))

    for path in paths:
        if os.path.lexists(path):
            add(path)
    return out
