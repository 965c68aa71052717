"""What the harness and a plugin host send each other, as wire values
(:mod:`harness.plugin.hosting.shared.wire`): the harness's dataclasses to plain data and back.

Everything a plugin host answers is read here into the harness's own types with the
types checked (a claim's class an integer, its radius and bound numbers, ...); it is a
claim to audit, never evidence (harness/README.md, "Plugin host").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields
from typing import Any

import numpy as np
import torch

from harness.engine.draws import Claim, Draws, Evidence
from harness.foundation.errors import ContractError, IdrsError
from harness.foundation.protocol import CertificationProtocol
from harness.foundation.regularity import Regularity, regularity_from_record, regularity_record
from harness.foundation.runstate import StateRecord
from harness.foundation.storable import in_int64
from harness.mathematics.radius import Recomputed
from harness.mathematics.rules import rule_from_record


def protocol_message(protocol: CertificationProtocol) -> dict[str, Any]:
    return asdict(protocol)


def protocol_from(message: Mapping[str, Any]) -> CertificationProtocol:
    names = {f.name for f in fields(CertificationProtocol)}
    return CertificationProtocol(**{k: v for k, v in message.items() if k in names})


def regularity_message(regularity: Regularity) -> dict[str, Any]:
    return regularity_record(regularity)


def regularity_from(message: Any, who: str) -> Regularity:
    try:
        return regularity_from_record(dict(message))
    except Exception as exc:
        raise ContractError(f"{who} declares a regularity that is not one of the harness's "
                            f"(Constant, SemiElastic, Lipschitz, Unregularized): {exc}") from None  # fmt: skip


def draws_message(draws: Draws) -> dict[str, Any]:
    return {"kind": draws.kind, "n0": draws.n0, "n": draws.n, "sigma": draws.sigma,
            "selection": draws.selection, "estimation": draws.estimation,
            "estimation_sq": draws.estimation_sq,
            "levels": None if draws.levels is None else list(draws.levels),
            "alpha": draws.alpha, "rule": None if draws.rule is None else draws.rule.record(),
            "looks": draws.looks, "stops": draws.stops, "thresholds": draws.thresholds,
            "scale": draws.scale, "centre": draws.centre}  # fmt: skip


def draws_from(message: Mapping[str, Any]) -> Draws:
    levels, rule = message.get("levels"), message.get("rule")
    return Draws(str(message["kind"]), int(message["n0"]), int(message["n"]),
                 np.asarray(message["sigma"]), np.asarray(message["selection"]),
                 np.asarray(message["estimation"]), _array(message.get("estimation_sq")),
                 None if levels is None else tuple(float(v) for v in levels),
                 message.get("alpha"), None if rule is None else rule_from_record(rule),
                 _array(message.get("looks")), _array(message.get("stops")),
                 _array(message.get("thresholds")), _array(message.get("scale")),
                 _array(message.get("centre")))  # fmt: skip


def _array(value: Any) -> np.ndarray | None:
    return None if value is None else np.asarray(value)


def evidence_message(evidence: Evidence) -> dict[str, Any]:
    sigma_draws = evidence.sigma_draws
    return {"input_ids": list(evidence.input_ids), "x": evidence.x, "sigma": evidence.sigma,
            "alpha": evidence.alpha, "base": draws_message(evidence.base),
            "sigma_draws": None if sigma_draws is None else draws_message(sigma_draws)}  # fmt: skip


def evidence_from(message: Mapping[str, Any], device: torch.device) -> Evidence:
    sigma_draws = message.get("sigma_draws")
    return Evidence(tuple(int(i) for i in message["input_ids"]), message["x"].to(device),
                    np.asarray(message["sigma"]), float(message["alpha"]),
                    draws_from(message["base"]),
                    None if sigma_draws is None else draws_from(sigma_draws))  # fmt: skip


def claim_message(claim: Any) -> dict[str, Any]:
    """A certifier's answer as data (in the plugin host; what it returned is checked by
    the harness when read back, :func:`claims_from`)."""
    if not isinstance(claim, Claim):
        return {"not_a_claim": type(claim).__name__}
    return {"prediction": claim.prediction, "radius": claim.radius, "p_lower": claim.p_lower,
            "predict": claim.predict, "evidence": dict(claim.evidence),
            "ellipsoid": claim.ellipsoid}  # fmt: skip


def claims_from(message: Any, who: str) -> list[Any]:
    """The claims a plugin host sent, typed; anything else is a :class:`ContractError`
    naming the certifier (``who``)."""
    if not isinstance(message, list):
        raise ContractError(f"{who} answered {type(message).__name__}, not a list of claims")
    out: list[Any] = []
    for item in message:
        if not isinstance(item, dict) or "not_a_claim" in item:
            kind = item.get("not_a_claim") if isinstance(item, dict) else type(item).__name__
            raise ContractError(f"{who} returned a {kind}; a certifier returns one harness.Claim "
                                "per input (docs/plugins.md)")  # fmt: skip
        prediction, predict = item.get("prediction"), item.get("predict")
        radius, bound = item.get("radius"), item.get("p_lower")
        evidence = item.get("evidence")
        if not (_integer(prediction) and _integer(predict) and _number(radius)
                and _number(bound) and isinstance(evidence, dict)):  # fmt: skip
            raise ContractError(f"{who} returned a claim of the wrong types: {item!r:.200}")
        ellipsoid = item.get("ellipsoid")
        if ellipsoid is not None and not _number(ellipsoid):
            raise ContractError(f"{who} returned a claim whose ellipsoid is not a number: "
                                f"{item!r:.200}")  # fmt: skip
        out.append(Claim(int(prediction), float(radius), float(bound), int(predict), evidence,
                         None if ellipsoid is None else float(ellipsoid)))  # fmt: skip
    return out


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def sigma_from(sigma: Any, count: int, who: str, input_shape: tuple[int, ...] = ()) -> torch.Tensor:
    """σ of ``count`` inputs as a σ-provider in a plugin host answered it: a real floating
    tensor of shape ``[count]``, or a diagonal scale ``[count, d]`` or ``[count, *input_shape]``
    (:mod:`harness.engine.scale`; d the inputs' dimension) (else a :class:`ContractError`),
    finite and positive (else an :class:`IdrsError`, as
    :func:`harness.certification.certify.checked_sigma`, which then holds it to its range,
    says of an in-process one), each naming the σ-provider (``who``)."""
    if not isinstance(sigma, torch.Tensor):
        raise ContractError(f"{who} returned {type(sigma).__name__} for σ; a σ-provider "
                            f"returns a real floating tensor of shape [B] ({count})")  # fmt: skip
    if not sigma.dtype.is_floating_point:
        raise ContractError(f"{who} returned σ of dtype {sigma.dtype}; a σ-provider returns a "
                            "real floating tensor (float32 or float64)")  # fmt: skip
    shapes = [(count,)]
    if input_shape:
        shapes += [(count, math.prod(input_shape)), (count, *input_shape)]
    if tuple(sigma.shape) not in shapes:
        raise ContractError(f"{who} returned σ of shape {tuple(sigma.shape)} for {count} "
                            f"inputs; a σ-provider returns shape {' or '.join(map(str, shapes))}")  # fmt: skip
    bad = ~(torch.isfinite(sigma) & (sigma > 0))
    if bool(bad.any()):
        k = int(torch.nonzero(bad.reshape(count, -1).any(dim=1))[0, 0])
        value = float(sigma[k].reshape(-1)[bad[k].reshape(-1)][0])
        raise IdrsError(f"{who} returned σ = {value:.6g} (entry {k}); σ must be "
                        "positive and finite")  # fmt: skip
    return sigma


def records_message(records: Sequence[StateRecord]) -> list[dict[str, Any]]:
    return [{"seq": r.seq, "record": r.record, "data": r.data} for r in records]


def records_from(message: Any, who: str) -> list[StateRecord]:
    """The state records a certifier in a plugin host staged, typed (a position SQLite
    stores: :func:`~harness.foundation.storable.in_int64`); anything else is a
    :class:`ContractError` naming it (``who``)."""
    out = []
    for item in message or []:
        if not (isinstance(item, dict) and _integer(item.get("seq")) and in_int64(item["seq"])
                and isinstance(item.get("record"), dict) and isinstance(item.get("data"), bytes)):  # fmt: skip
            raise ContractError(f"{who} staged a state record of the wrong types: {item!r:.200}")
        out.append(StateRecord(item["seq"], item["record"], item["data"]))
    return out


def recomputed_message(recomputed: Recomputed) -> dict[str, Any]:
    return {name: np.asarray(getattr(recomputed, name)) for name in
            ("n0", "n", "bound", "prediction", "radius")}  # fmt: skip


def recomputed_from(message: Any, count: int, who: str) -> Recomputed:
    try:
        arrays = {name: np.asarray(message[name], dtype=np.float64) for name in
                  ("n0", "n", "bound", "prediction", "radius")}  # fmt: skip
    except (KeyError, TypeError, ValueError):
        raise ContractError(f"{who} answered a re-derivation of the wrong form") from None
    if any(a.shape != (count,) for a in arrays.values()):
        raise ContractError(f"{who} re-derived {count} certificates into arrays of the wrong shape")
    return Recomputed(arrays["n0"].astype(np.int64), arrays["n"].astype(np.int64),
                      arrays["bound"], arrays["prediction"].astype(np.int64), arrays["radius"])  # fmt: skip
