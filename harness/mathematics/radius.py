"""Radius formulas: pure functions from a certificate's stored evidence to its claims.

A certifier declares the :class:`RadiusFormula` its certificates follow
(``Certifier.radius_formula``). The formula re-derives, for every stored certificate,
the number of samples its evidence holds, the lower bound on p_A, the prediction and the
largest radius the formula allows, from three things only: the stored evidence (class
counts or mean outputs), the run's :class:`~harness.foundation.protocol.CertificationProtocol` and
the σ-provider's *declared* regularity. The soundness check S0
(:mod:`harness.audit.evidence`) calls it on every stored certificate; because the
function is a module-level function (:func:`is_pure`), it cannot read a certifier's
private state (e.g. a different α).

Built in: :data:`COHEN` (Cohen et al. 2019, Thm 1: R = σ Φ⁻¹(p_A_lower)) and
:data:`SUKENIK` (Súkeník et al. 2022, Thm 3.2, rate r from the declared
``SemiElastic(r)``), both on the harness's bound of the stored class counts
(:func:`hard_bounds`: Clopper–Pearson, or under sequential sampling the anytime-valid
bound of :mod:`harness.mathematics.sequential` at the stored looks). A formula may also
declare its ``threshold``: the bound at which it reaches each radius of a grid, which
sequential sampling needs to decide an input's place on the grid.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from harness.foundation.certificate import ABSTAIN, unlabelled
from harness.foundation.errors import IdrsError
from harness.foundation.protocol import CertificationProtocol
from harness.foundation.regularity import Constant, Regularity, SemiElastic


@dataclass(frozen=True)
class Recomputed:
    """What a formula derives for each certificate (arrays in the order of the rows).

    ``n0`` and ``n``: samples behind the class selection and the estimate; ``bound``: the
    lower confidence bound on p_A (or on the mean output of the class, for soft
    smoothing); ``prediction``: the class certified (``ABSTAIN`` if none); ``radius``:
    the largest radius the formula certifies.
    """

    n0: np.ndarray
    n: np.ndarray
    bound: np.ndarray
    prediction: np.ndarray
    radius: np.ndarray


Recompute = Callable[..., Recomputed]
"""``recompute(rows, inputs, protocol, regularity[, inner=formula]) -> Recomputed``."""
Threshold = Callable[..., np.ndarray]
"""``threshold(radii, sigma, dim, regularity) -> [B, G]``: per input (σ [B]) the least
bound on p_A at which the formula certifies each radius (> 0) of ``radii``; a pure
module-level function, like ``recompute``."""


@dataclass(frozen=True)
class RadiusFormula:
    """A named radius formula; ``inner`` is the wrapped formula of a wrapper (a memory);
    ``threshold`` where the formula reaches a radius (:data:`Threshold`), if declared."""

    name: str
    recompute: Recompute
    inner: RadiusFormula | None = None
    threshold: Threshold | None = None

    def derive(
        self,
        rows: Sequence[Mapping[str, Any]],
        inputs: torch.Tensor,
        protocol: CertificationProtocol,
        regularity: Regularity,
    ) -> Recomputed:
        """Re-derive ``rows`` (stored certificates; ``inputs`` in the same order); the
        formula sees them without their labels."""
        extra = {} if self.inner is None else {"inner": self.inner}
        return self.recompute(unlabelled(rows), inputs, protocol, regularity, **extra)

    def impure_parts(self) -> list[str]:
        """Names of the functions of this formula (and its inner ones) that are not pure."""
        parts = [self.recompute] + ([self.threshold] if self.threshold is not None else [])
        bad = [_name(f) for f in parts if not is_pure(f)]
        return bad + (self.inner.impure_parts() if self.inner is not None else [])

    def grid_threshold(self) -> Threshold | None:
        """The threshold of this formula, else of the formula it wraps (a memory places
        an input by its inner certificate), else None."""
        if self.threshold is not None:
            return self.threshold
        return None if self.inner is None else self.inner.grid_threshold()


def is_pure(function: Callable) -> bool:
    """A plain module-level function without a closure (importable by its qualified name)."""
    if not inspect.isfunction(function) or function.__closure__:
        return False
    try:
        module = importlib.import_module(function.__module__)
    except ImportError:
        return False
    return getattr(module, function.__qualname__, None) is function


def _name(function: Callable) -> str:
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', repr(function))}"


def base_counts(row: Mapping[str, Any], key: str) -> list[int] | None:
    """The base model's class counts ``key`` (``selection`` or ``estimation``) of a stored
    certificate, from the harness's draws (``draws["base"]``) of a hard smoothing."""
    base = (row.get("draws") or {}).get("base")
    if base is None or base.get("kind") != "hard":
        return None
    return base.get(key)


def hard_bounds(rows: Sequence[Mapping[str, Any]], alpha: float):
    """CERTIFY's statistics from the harness's class counts (Cohen et al. 2019, CERTIFY).

    ĉ_A = argmax of the selection counts, p_A_lower = Clopper–Pearson lower bound of
    the estimation count of ĉ_A at level ``alpha``; for draws made sequentially (their
    ``looks`` and ``rule``), the rule's anytime-valid bound at the looks stored
    (:mod:`harness.mathematics.sequential`). Returns (n0, n, ĉ_A, p_A_lower); a row
    without the harness's hard draws gets n0 = n = 0 and bound 0.
    """
    from harness.mathematics.stats import clopper_pearson_lower_array

    selections = [base_counts(r, "selection") for r in rows]
    estimations = [base_counts(r, "estimation") for r in rows]
    width = max((len(c or []) for c in selections), default=1) or 1
    selection = np.array([c or [0] * width for c in selections], dtype=np.int64)
    estimation = np.array([c or [0] * width for c in estimations], dtype=np.int64)
    selection = selection.reshape(len(rows), -1)
    estimation = estimation.reshape(len(rows), -1)
    top = np.argmax(selection, axis=1) if len(rows) else np.zeros(0, dtype=np.int64)
    n0, n = selection.sum(axis=1), estimation.sum(axis=1)
    k = estimation[np.arange(len(rows)), top] if len(rows) else np.zeros(0, dtype=np.int64)
    bound = np.zeros(len(rows))
    looked = np.array([_looks(r) is not None for r in rows], dtype=bool)
    ok = (n >= 1) & ~looked
    if np.any(ok):
        bound[ok] = clopper_pearson_lower_array(k[ok], n[ok], alpha)
    for i in np.flatnonzero(looked):
        bound[i] = sequential_bound(rows[i]["draws"]["base"], int(top[i]), alpha)
    return n0, n, top, bound


def _looks(row: Mapping[str, Any]) -> list | None:
    base = (row.get("draws") or {}).get("base") or {}
    return base.get("looks") if base.get("kind") == "hard" else None


def sequential_bound(record: Mapping[str, Any], top: int, alpha: float) -> float:
    """The bound on p of class ``top`` that hard draws made sequentially (a stored
    record with ``looks`` and ``rule``) give at their last look: the running maximum of
    the rule's bounds (:meth:`~harness.mathematics.sequential.SequentialRule.look_bounds`),
    or under the grid-place rule the threshold of the place its stored ``thresholds``
    and selection counts decide (:mod:`harness.mathematics.gridplace`); 0 if malformed."""
    from harness.mathematics.gridplace import GridPlaceRule
    from harness.mathematics.rules import rule_from_record

    try:
        rule = rule_from_record(record["rule"])
        counts = [int(look["counts"][top]) for look in record["looks"]]
        if not counts or len(counts) > len(rule.looks):
            return 0.0
        if isinstance(rule, GridPlaceRule):
            thresholds = np.array([record["thresholds"]], dtype=np.float64)
            return float(rule.stopped_bounds(np.array([counts]), np.array([len(counts) - 1]),
                                             thresholds, [int(record["selection"][top])],
                                             int(record["n0"]), alpha)[0])  # fmt: skip
        return float(rule.bounds(np.array([counts]), alpha)[0, -1])
    except (KeyError, TypeError, ValueError, IndexError):
        return 0.0


def cohen_recompute(rows, inputs, protocol: CertificationProtocol, regularity) -> Recomputed:
    """R = σ Φ⁻¹(p_A_lower) where p_A_lower > 1/2, else abstain (Cohen et al. 2019, Thm 1)."""
    from scipy.special import ndtri

    n0, n, top, bound = hard_bounds(rows, protocol.alpha)
    sigma = np.array([float(r["sigma"]) for r in rows])
    certified = bound > 0.5
    radius = np.where(certified, sigma * ndtri(np.where(certified, bound, 0.75)), 0.0)
    return Recomputed(n0, n, bound, np.where(certified, top, ABSTAIN), radius)


def sigma_choice_recompute(
    records: list[dict], protocol: CertificationProtocol, alpha: float
) -> Recomputed:
    """A σ-smoothing's choice re-derived from its σ draws (``records``, one per certificate):
    the chosen level's bound at the smoothing's α share and R_σ = σ_v Φ⁻¹(p_σ lower), 0 where
    it is <= 1/2 (Cohen et al. 2019, Thm 1 on the σ-estimator)."""
    rows = [{"sigma": rec["sigma"], "draws": {"base": rec}} for rec in records]
    return cohen_recompute(rows, None, replace(protocol, alpha=float(alpha)), None)


def semi_elastic_rate(regularity: Regularity) -> float:
    """r of a declared ``SemiElastic(r)`` (0 for ``Constant``); anything else raises."""
    if isinstance(regularity, Constant):
        return 0.0
    if isinstance(regularity, SemiElastic):
        return float(regularity.rate)
    raise IdrsError(
        f"the semi-elastic radius (Súkeník et al. 2022, Thm 3.2) needs a σ-provider that "
        f"declares SemiElastic(rate) or Constant, got {regularity.describe()}"
    )


def sukenik_recompute(rows, inputs, protocol: CertificationProtocol, regularity) -> Recomputed:
    """CR of Súkeník et al. (2022), Thm 3.2 at the declared rate r, on p_A_lower."""
    from harness.mathematics.worstcase import certified_radius

    n0, n, top, bound = hard_bounds(rows, protocol.alpha)
    sigma = np.array([float(r["sigma"]) for r in rows])
    certified = bound > 0.5
    radius = np.zeros(len(rows))
    if np.any(certified):
        dim = int(inputs[0].numel())
        radius[certified] = np.asarray(
            certified_radius(bound[certified], sigma[certified], semi_elastic_rate(regularity), dim)
        )
    return Recomputed(n0, n, bound, np.where(certified, top, ABSTAIN), radius)


def cohen_threshold(radii, sigma, dim, regularity) -> np.ndarray:
    """Φ(r/σ): Cohen's radius σΦ⁻¹(p) reaches r (> 0) at p = Φ(r/σ) (Cohen et al. 2019, Thm 1)."""
    from scipy.special import ndtr

    return ndtr(np.asarray(radii, dtype=np.float64)[None, :] / np.asarray(sigma, float)[:, None])


_SEMI_ELASTIC_ROWS: dict[tuple, np.ndarray] = {}
"""Thresholds of Thm 3.2 already solved in this process, by (radii, rate, dim, σ): S1's
trials certify the run's inputs one at a time, each σ several times."""
_SEMI_ELASTIC_LIMIT = 100_000


def sukenik_threshold(radii, sigma, dim, regularity) -> np.ndarray:
    """The least p_A at which Thm 3.2 certifies each radius at the declared rate
    (:func:`~harness.mathematics.worstcase.semi_elastic_threshold`, which solves each σ on
    its own, so a σ solved before is looked up)."""
    from harness.mathematics.worstcase import semi_elastic_threshold

    radii = tuple(float(r) for r in np.ravel(radii))
    sigma = np.asarray(sigma, dtype=np.float64).ravel()
    rate, dim = semi_elastic_rate(regularity), int(dim)
    keys = [(radii, rate, dim, float(s)) for s in sigma]
    missing = sorted({key[3] for key in keys if key not in _SEMI_ELASTIC_ROWS})
    if missing:
        rows = semi_elastic_threshold(
            np.array(radii)[None, :], np.array(missing)[:, None], rate, dim
        )
        if len(_SEMI_ELASTIC_ROWS) + len(missing) > _SEMI_ELASTIC_LIMIT:
            _SEMI_ELASTIC_ROWS.clear()
        for s, row in zip(missing, rows, strict=True):
            _SEMI_ELASTIC_ROWS[(radii, rate, dim, s)] = row
    return np.array([_SEMI_ELASTIC_ROWS[key] for key in keys]).reshape(len(sigma), len(radii))


def grid_thresholds(formula: RadiusFormula, radii, sigma, dim: int, regularity) -> np.ndarray:
    """[B, G]: where ``formula`` (or the formula it wraps) reaches each radius > 0 of
    ``radii`` at each σ; an error naming the formula if it declares no threshold."""
    threshold = formula.grid_threshold()
    if threshold is None:
        raise IdrsError(
            f"radius formula {formula.name!r} declares no threshold (RadiusFormula.threshold), "
            "so sequential sampling cannot tell where its radius reaches each grid radius; "
            'certify it with sampling = "fixed"'
        )
    positive = [float(r) for r in radii if r > 0]
    sigma = np.asarray(sigma, dtype=np.float64)
    if not positive:
        return np.zeros((len(sigma), 0))
    return np.asarray(threshold(positive, sigma, dim, regularity), dtype=np.float64)


COHEN = RadiusFormula("cohen", cohen_recompute, threshold=cohen_threshold)
SUKENIK = RadiusFormula("sukenik-thm3.2", sukenik_recompute, threshold=sukenik_threshold)


def formula_record(formula: RadiusFormula) -> dict[str, Any]:
    """A formula as data: its name, the importable qualified name of its ``recompute``
    and its ``inner`` formula's record (as a board's run export holds it); a formula that
    lives in a plugin host carries the record it was declared with (``recorded``)."""
    recorded = getattr(formula, "recorded", None)
    if recorded:
        return dict(recorded)
    out: dict[str, Any] = {"name": formula.name, "recompute": _name(formula.recompute)}
    if formula.threshold is not None:
        out["threshold"] = _name(formula.threshold)
    if formula.inner is not None:
        out["inner"] = formula_record(formula.inner)
    return out


def trusted_packages() -> set[str]:
    """Top-level packages whose functions a formula record may name: ``harness`` and those
    of every installed ``idrs_bench`` entry point (the built-in plugins and the
    third-party ones installed here)."""
    from importlib.metadata import entry_points

    return {"harness"} | {ep.value.split(":")[0].split(".")[0]
                          for ep in entry_points(group="idrs_bench")}  # fmt: skip


def builtin_packages() -> set[str]:
    """Top-level packages of idrs-bench itself: ``harness`` and those of its own
    ``idrs_bench`` entry points (the built-in plugins). A formula of these is resolved in
    the harness's process; any other runs in a plugin host (harness/README.md)."""
    from importlib.metadata import entry_points

    return {"harness"} | {ep.value.split(":")[0].split(".")[0]
                          for ep in entry_points(group="idrs_bench")
                          if ep.dist is not None and ep.dist.name == "idrs-bench"}  # fmt: skip


_MOVED = {"harness.radius": __name__}
"""Where a module that records name has moved (databases and boards written before
``harness/`` was laid out in layers hold the old names)."""


def formula_from_record(record: dict[str, Any], packages: set[str] | None = None) -> RadiusFormula:
    """The formula a record names, resolved only from ``packages`` (default
    :func:`builtin_packages`: the harness's process imports no third-party code; a plugin
    host passes :func:`trusted_packages`) and only if it is pure (:func:`is_pure`);
    anything else is an error naming it."""
    packages = builtin_packages() if packages is None else packages
    qualified = str(record.get("recompute", ""))
    function = _trusted_function(qualified, packages)
    threshold = record.get("threshold")
    threshold = _trusted_function(threshold, packages) if threshold else None
    inner = formula_from_record(record["inner"], packages) if record.get("inner") else None
    return RadiusFormula(str(record.get("name", qualified.rpartition(".")[2])), function, inner,
                         threshold)  # fmt: skip


def _trusted_function(qualified: str, packages: set[str]) -> Callable:
    """The pure function a record names by its qualified name, from ``packages`` only."""
    module, _, name = qualified.rpartition(".")
    module = _MOVED.get(module, module)
    if module.split(".")[0] not in packages:
        raise IdrsError(
            f"radius formula {qualified!r} is not provided by idrs-bench (packages "
            f"{', '.join(sorted(packages))}); it comes from package {module.split('.')[0]!r}: "
            "install the plugin that provides it (its formula is re-derived by a plugin host)"
        )
    try:
        function = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise IdrsError(f"radius formula {qualified!r} cannot be imported here") from None
    if not is_pure(function):
        raise IdrsError(f"radius formula {qualified!r} is not a pure module-level function")
    return function
