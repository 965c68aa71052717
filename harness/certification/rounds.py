"""Sequential CERTIFY's draws: the estimation samples in rounds, until each input's place
on the radius grid is decided by the run's rule (:mod:`harness.mathematics.gridplace`, or
:mod:`harness.mathematics.sequential` for runs made under ``mixture-cs-v2``).

The harness draws every round itself, for every input of a call still running, in one
engine call per round (samples n_{k−1} … n_k − 1 of stream 1, :meth:`SamplingEngine.run`
with ``start``: the same samples a fixed run draws first), and applies the rule to its own
counts; the certifier is not asked between rounds and never sees more than the draws of
inputs that have stopped. Which methods it serves (:func:`unsupported`): a hard certifier
whose declared radius formula states where it reaches each grid radius (its
``threshold``), with a σ-provider that does not smooth σ itself. A certifier that computes
its own bound from the counts instead of taking the harness's
(:meth:`~harness.engine.draws.Evidence.lower_bound`) claims more than the harness's bound
and is stopped at its first claim (:func:`check_bounds`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from harness.engine.draws import HARD, Claim, Draws
from harness.engine.sampling import STREAM_ESTIMATION, SamplingEngine
from harness.foundation.errors import ContractError
from harness.foundation.protocol import CertificationProtocol
from harness.mathematics.gridplace import GridPlaceRule, stored_thresholds, tested_values
from harness.mathematics.rules import make_rule
from harness.mathematics.sequential import RULE_NAME, SequentialRule

RELATIVE = 1e-9
"""Relative tolerance of a claimed bound against the harness's (floating-point rounding)."""


def sequential_rule(protocol: CertificationProtocol) -> SequentialRule | GridPlaceRule:
    """The run's rule (its protocol's ``rule``): its cap n_max and the grid it decides."""
    return make_rule(protocol.rule or RULE_NAME, int(protocol.n_max), tuple(protocol.grid))


def unsupported(what: str, certifier: Any, sigma_smoothed: bool) -> str | None:
    """Why ``what`` (e.g. ``method 'NAME'``) cannot be certified sequentially, as one line
    naming it and the fix, or None when it can."""
    fix = 'certify it with sampling = "fixed"'
    if certifier.smoothing != HARD:
        return (f"{what} certifies soft smoothing (mean outputs); the sequential bound is on "
                f"class counts, so {fix}")  # fmt: skip
    if sigma_smoothed:
        return (f"{what} draws σ from a σ-smoothing, whose own draws the sequential rule does "
                f"not cover; {fix}")  # fmt: skip
    formula = certifier.radius_formula
    if formula.grid_threshold() is None:
        return (f"{what}: its radius formula {formula.name!r} declares no threshold (where its "
                f"radius reaches a grid radius), which the stopping rule needs; {fix}")  # fmt: skip
    return None


@dataclass
class Stopped:
    """Inputs of a call (``index`` into it) whose sampling stopped, and their draws."""

    index: np.ndarray
    draws: Draws
    seconds: np.ndarray


def draw_in_rounds(
    engine: SamplingEngine, rule: SequentialRule | GridPlaceRule, x: torch.Tensor, sigma: np.ndarray,
    ids: list[int], selection: np.ndarray, thresholds: np.ndarray, alpha: float, n0: int,
    chunk: int, in_order: bool, scale: np.ndarray | None = None,
) -> Iterator[Stopped]:  # fmt: skip
    """The estimation draws of ``ids`` in rounds; yields inputs as they stop, at most
    ``chunk`` at a time (``in_order``: only the next inputs of the call, in order, for an
    order-dependent certifier). ĉ_A is the top class of ``selection``; ``thresholds``
    [B, G] are the grid's at each input's σ (the grid-place rule stores them). With a
    diagonal ``scale`` [B, d] the samples are drawn at it (``sigma``: its smallest axes)."""
    count, classes = len(ids), engine.num_classes
    top = np.argmax(selection, axis=1) if count else np.zeros(0, dtype=np.int64)
    looks = np.zeros((count, len(rule.looks), classes), dtype=np.int64)
    bound = np.zeros(count)
    grid = isinstance(rule, GridPlaceRule)
    if grid:  # the tested values, each input's prior (its selection counts) and its place
        tau = tested_values(thresholds) if count else np.zeros((0, 1))
        a, b = rule.priors(selection[np.arange(count), top], n0)
        ever = np.zeros(tau.shape, dtype=bool)
        place = np.zeros(count, dtype=np.int64)
    stops = np.full(count, -1, dtype=np.int64)
    seconds = np.zeros(count)
    running = np.arange(count)
    done = np.zeros(count, dtype=bool)
    cursor = 0
    before = 0
    for k, n in enumerate(rule.looks.tolist()):
        if running.size == 0:
            break
        start = time.perf_counter()
        noise = sigma[running] if scale is None else scale[running]
        counts = engine.counts(x[running], noise, [ids[i] for i in running],
                               n - before, STREAM_ESTIMATION, start=before)  # fmt: skip
        looks[running, k] = counts + (looks[running, k - 1] if k else 0)
        here = looks[running, k, top[running]]
        if grid:
            ever[running], place[running] = rule.advance(ever[running], here, k, tau[running],
                                                         a[running], b[running], alpha)  # fmt: skip
            stop = rule.stops(k, here, place[running], tau[running], a[running], b[running],
                              alpha)  # fmt: skip
        else:
            bound[running] = np.maximum(bound[running], rule.look_bounds(here, k, alpha))
            stop = rule.stops(k, here, bound[running], thresholds[running], alpha)
        stops[running[stop]] = k
        seconds[running] += (time.perf_counter() - start) / running.size
        running = running[~stop]
        before = n
        finished = np.flatnonzero((stops >= 0) & ~done)
        if in_order:
            end = cursor
            while end < count and stops[end] >= 0:
                end += 1
            finished = np.arange(cursor, end)
            cursor = end
        for lo in range(0, len(finished), chunk):
            index = finished[lo : lo + chunk]
            done[index] = True
            estimation = looks[index, stops[index]]
            draws = Draws(HARD, n0, rule.n_max, sigma[index], selection[index], estimation,
                          rule=rule, looks=looks[index], stops=stops[index],
                          thresholds=stored_thresholds(thresholds[index]) if grid else None,
                          scale=None if scale is None else scale[index])  # fmt: skip
            yield Stopped(index, draws, seconds[index])


def check_bounds(claims: list[Claim], draws: Draws, alpha: float, who: str) -> None:
    """A :class:`ContractError` naming the certifier when a claim's bound exceeds every
    class's harness bound (a memory may claim an enclosing ball's class with ĉ_A's bound):
    it computed its own bound from the counts."""
    classes = draws.selection.shape[1]
    best = np.max([draws.lower_bound(np.full(len(draws), c), alpha) for c in range(classes)],
                  axis=0)  # fmt: skip
    for claim, bound in zip(claims, best, strict=True):
        if claim.p_lower > bound * (1 + RELATIVE) + 1e-15:
            raise ContractError(
                f"{who} claimed the bound {claim.p_lower!r} where the harness's sequential bound "
                f'is {float(bound)!r}: under sampling = "sequential" a certifier takes its bound '
                "from the harness (harness.Evidence.lower_bound), and this one computes its own "
                'from the counts; certify it with sampling = "fixed"'
            )
