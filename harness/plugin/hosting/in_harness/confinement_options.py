"""Whether plugin hosts are confined: the user's opt-out (``--unconfined``) and the kernel's say.

Confinement is the default (docs/threat-model.md, "What the harness guarantees"): the
harness starts every plugin host confined by the policy
(:mod:`harness.plugin.hosting.shared.policy`), unless the user opted out with
``--unconfined`` on ``run``, ``check`` and ``leaderboard`` (:data:`UNCONFINED_ENV`), which
every run made so records (:func:`description`). On a kernel that cannot confine a host a
third-party plugin is refused, naming the kernel feature and the opt-out
(:func:`~harness.plugin.hosting.shared.policy.refusal`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from harness.foundation.environment import variable_set
from harness.foundation.errors import IdrsError
from harness.plugin.hosting.shared import landlock
from harness.plugin.hosting.shared.policy import UNCONFINED_ENV, refusal


def unconfined_requested() -> bool:
    """Whether the user opted out of confinement (``--unconfined``, ``$IDRS_BENCH_UNCONFINED``)."""
    value = os.environ.get(UNCONFINED_ENV, "")
    if value not in ("", "0", "1"):
        raise IdrsError(f"{UNCONFINED_ENV}={value!r}; use 1 (plugins unconfined) or leave it unset")
    return value == "1"


def hosts_confined(third_party: bool) -> bool:
    """Whether plugin hosts confine themselves: yes, unless the user asked otherwise
    (:func:`unconfined_requested`); on a kernel that cannot confine them, a host of
    third-party plugins is refused (one error naming the kernel feature and the opt-out),
    and one of built-ins only runs unconfined."""
    if unconfined_requested():
        return False
    reason = refusal(landlock.landlock_abi())
    if reason is not None and third_party:
        raise IdrsError(reason)
    return reason is None


def add_unconfined_option(parser) -> None:
    """``--unconfined`` on an ``argparse`` parser (its command sets :data:`UNCONFINED_ENV`)."""
    parser.add_argument(
        "--unconfined", action="store_true",
        help="run third-party plugins in plugin hosts the kernel does not confine (on a kernel "
        "without Landlock); recorded with the run and on its board (docs/threat-model.md)",
    )  # fmt: skip


@contextmanager
def opted_out(unconfined: bool) -> Iterator[None]:
    """With ``unconfined`` (``--unconfined``), :data:`UNCONFINED_ENV` is set while the block
    runs (its subprocesses inherit it), then restored."""
    with variable_set(UNCONFINED_ENV, "1" if unconfined else None):
        yield


def description(abi: int) -> str:
    """How a host of Landlock ``abi`` is confined, as a run records it (0: unconfined)."""
    if abi <= 0:
        return "unconfined"
    return f"Landlock ABI {abi}, no capabilities, no sockets"
