"""The sequential rules by name: which rule a protocol or a stored record names, and
whether a protocol's n_max lets it certify at all.

``grid-place-v1`` (:mod:`harness.mathematics.gridplace`) is the default of a new
sequential run; ``mixture-cs-v2`` (:mod:`harness.mathematics.sequential`) the rule of
earlier runs, which keep verifying under it (their records name it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from harness.mathematics.gridplace import HALF, GridPlaceRule
from harness.mathematics.gridplace import RULE_NAME as GRID_PLACE
from harness.mathematics.sequential import RULE_NAME, SequentialRule, best_bound


def rule_from_record(record: Mapping[str, Any]) -> SequentialRule | GridPlaceRule:
    """The rule a certificate's draws record: :class:`~harness.mathematics.sequential.SequentialRule`
    (``mixture-cs-v2``, earlier runs) or :class:`GridPlaceRule`
    (``grid-place-v1``); a ValueError naming the known rules otherwise."""
    name = record.get("name") if isinstance(record, Mapping) else None
    if name == GRID_PLACE:
        return GridPlaceRule.from_record(record)
    if name == RULE_NAME:
        return SequentialRule.from_record(record)
    raise ValueError(f"unknown sequential rule {name!r}; known: {GRID_PLACE}, {RULE_NAME}")


def make_rule(name: str, n_max: int, radii: Sequence[float]) -> SequentialRule | GridPlaceRule:
    """The rule ``name`` (a protocol's ``rule``) with cap ``n_max`` deciding ``radii``."""
    if name == GRID_PLACE:
        return GridPlaceRule(int(n_max), tuple(float(r) for r in radii))
    if name == RULE_NAME:
        return SequentialRule(int(n_max), tuple(float(r) for r in radii))
    raise ValueError(f"unknown sequential rule {name!r}; known: {GRID_PLACE}, {RULE_NAME}")


def can_certify(rule, alpha: float, n0: int) -> bool:
    """Whether ``rule`` certifies anything at all: its bound passes 1/2 (``mixture-cs-v2``),
    or H_0: p_A <= 1/2 is rejected (``grid-place-v1``, with the most favourable prior),
    at some look if every sample agreed."""
    if isinstance(rule, SequentialRule):
        return best_bound(rule, alpha) > 0.5
    every = np.arange(len(rule.looks))
    a, b = rule.priors(n0, n0)
    return bool(np.any(rule.rejects(rule.looks, every, HALF, a, b, alpha)))


def check_n_max(protocol) -> None:
    """Raise a one-line :class:`~harness.foundation.errors.ParameterError` naming the value
    and the fix when a sequential protocol's ``n_max`` is too small for its bound to pass
    1/2 even if every sample agreed (then no input certifies the grid's first radius)."""
    from harness.foundation.errors import ParameterError

    grid, name = tuple(protocol.grid), protocol.rule or RULE_NAME

    def certifies(n_max: int) -> bool:
        return can_certify(make_rule(name, n_max, grid), protocol.alpha, protocol.n0)

    if certifies(protocol.n_max):
        return
    least = next(n for n in range(protocol.n_max + 1, 1 << 40) if certifies(n))
    raise ParameterError(
        f"n_max = {protocol.n_max} cannot certify the grid's first radius {grid[0]:g}: even if "
        f"all {protocol.n_max} samples agreed, the sequential rule {name!r} at "
        f"α = {protocol.alpha:g} never certifies p_A > 1/2; set n_max >= {least} "
        "(certification.n_max in a benchmark file)"
    )
