"""S0: every stored certificate re-derived from the harness's own draws (no model, no sampling).

The evidence of a certificate is what the harness drew (:mod:`harness.engine.draws`): the
base model's selection and estimation samples at σ(x) (class counts or mean outputs),
and, for a σ-provider that declares a :class:`~harness.engine.draws.SigmaSmoothing`, the
σ-estimator's draws. No plugin reports samples, so a certifier that altered counts, n,
the streams, or chose its class from other samples claims something these draws do
not derive.

For every certificate of the row, with the run's protocol (n0, n, α) and the σ-provider's
*declared* regularity, the certifier's declared :class:`~harness.mathematics.radius.RadiusFormula`
(a pure module-level function, :func:`harness.mathematics.radius.is_pure`) recomputes the samples
behind the draws, the lower bound on p_A (Clopper–Pearson on the class counts for hard
smoothing, Cohen et al. 2019; the declared soft bound for soft smoothing), the
prediction and the largest radius. For a σ-smoothing the harness itself re-derives the
σ level (levels[argmax of its selection counts]) and the radius R_σ = noise·Φ⁻¹(p_lower)
within which σ is constant (Cohen et al. 2019, Thm 1 on the σ-estimator; Sun et al.
2026), and the formula gets the α left after the σ-smoothing's share. The row is
``violated`` at the first certificate, in stored order, where

1. its stored α differs from the run's α;
2. its draws are not of the certifier's smoothing kind, or do not hold n0 selection and
   n estimation samples, or were made at another σ than the one stored;
3. its stored bound exceeds the recomputed one (relative tolerance 1e-9);
4. it certifies a class the formula does not certify;
5. its stored radius exceeds the recomputed one (relative tolerance 1e-9);
6. (σ-smoothing) its σ is not the level the σ draws choose, its σ draws are missing or
   declare another α share or levels than the σ-provider, its radius exceeds R_σ, or it
   certifies a class where R_σ = 0 (the σ level itself is not certified there, so even
   the claim at x rests on a σ that may not be σ(x));
7. (a diagonal scale) its σ is not the smallest axis of the scale its draws record, or
   the region it claims beside the ℓ2 ball exceeds the ellipsoid re-derived from them
   (:mod:`harness.audit.scale_evidence`).

A conservative certificate (smaller bound or radius) passes. The check's evidence
records the declaration it re-derived against (:class:`Declaration`: the formula by its
importable qualified name, the regularity as data, the σ-smoothing's noise, levels and α
share) and a SHA-256 of the certificates it audited (:func:`certificates_digest`), from
which a board's verifier re-derives it (:mod:`harness.reports.leaderboard.recheck`). A formula that is not a pure
function is ``unjustified``: its radii cannot be re-derived independently of the
certifier. A run certified before the harness drew the evidence itself (no draws
stored) is an ``error``: nothing the harness drew backs its counts; re-run it.
Applicability: every row (the check always applies).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from harness.audit.audit import Audit
from harness.audit.scale_evidence import scale_tests
from harness.certification.certify import sigma_smoothing
from harness.engine.draws import Draws, SigmaSmoothing
from harness.foundation.certificate import ABSTAIN
from harness.foundation.protocol import CertificationProtocol
from harness.foundation.regularity import Regularity, regularity_from_record, regularity_record
from harness.foundation.verdict import CheckResult, Verdict
from harness.mathematics.radius import RadiusFormula, formula_from_record, formula_record

NAME = "evidence"
RELATIVE = 1e-9
"""Relative tolerance of the bound and radius comparisons (floating-point rounding only)."""


@dataclass(frozen=True)
class Declaration:
    """What a row's certificates are re-derived against: the certifier's declared
    ``formula`` and ``smoothing`` kind, the σ-provider's declared ``regularity`` and
    its σ-smoothing (noise, levels, α share; the model is not needed), if any."""

    formula: RadiusFormula
    regularity: Regularity
    smoothing: str
    sigma_smoothing: SigmaSmoothing | None = None

    @classmethod
    def of(cls, audit: Audit) -> Declaration:
        declared = sigma_smoothing(audit.sigma_provider)
        return cls(audit.certifier.radius_formula, audit.sigma_provider.regularity,
                   audit.certifier.smoothing, declared)  # fmt: skip

    def record(self) -> dict[str, Any]:
        """The declaration as data (formula by qualified name, regularity by kind)."""
        smoothing = self.sigma_smoothing
        return {"formula": formula_record(self.formula),
                "regularity": regularity_record(self.regularity), "smoothing": self.smoothing,
                "sigma_smoothing": None if smoothing is None else {
                    "noise": float(smoothing.noise), "alpha": float(smoothing.alpha),
                    "levels": [float(v) for v in smoothing.levels]}}  # fmt: skip

    @staticmethod
    def same_meaning(ours: dict[str, Any], theirs: dict[str, Any]) -> bool:
        """Whether two declaration records (:meth:`record`, each read back by
        :meth:`from_record`) declare the same: a formula is its name, its ``recompute`` and
        its ``inner`` formula; its ``threshold`` (where it reaches each grid radius, which
        records hold since sequential sampling) is compared only where both name one: a
        record made before thresholds were recorded means the same formula."""

        def formula(mine: dict[str, Any] | None, other: dict[str, Any] | None):
            if mine is None or other is None:
                return mine, other
            mine = {k: v for k, v in mine.items() if k != "threshold" or "threshold" in other}
            inner = formula(mine.get("inner"), other.get("inner"))[0]
            return {**mine, "inner": inner} if "inner" in mine else mine, other

        ours = {**ours, "formula": formula(ours.get("formula"), theirs.get("formula"))[0]}
        return ours == theirs

    @classmethod
    def from_record(
        cls, record: dict[str, Any], resolve: Callable[[dict], RadiusFormula] = formula_from_record
    ) -> Declaration:
        """The inverse of :meth:`record`; the formula resolved by ``resolve`` (default
        :func:`harness.mathematics.radius.formula_from_record`: idrs-bench's own formulas;
        :meth:`harness.plugin.manager.PluginManager.formula` also those of installed
        plugins, through a plugin host)."""
        declared = record.get("sigma_smoothing")
        smoothing = None if declared is None else SigmaSmoothing(
            None, float(declared["noise"]), tuple(declared["levels"]), float(declared["alpha"]))  # fmt: skip
        return cls(resolve(record["formula"]),
                   regularity_from_record(record["regularity"]), str(record["smoothing"]),
                   smoothing)  # fmt: skip


def check_evidence(audit: Audit) -> CheckResult:
    return rederive(audit.certificates, audit.inputs.detach().cpu(), audit.context.protocol,
                    Declaration.of(audit))  # fmt: skip


def certificates_digest(rows: list[dict[str, Any]]) -> str:
    """SHA-256 of the certificates as audited (every stored column but the shard, in
    input order, canonical JSON): a board's verifier finds any later edit of them. The
    load behind ``seconds`` is hashed where recorded (digests of runs before it unchanged)."""
    keys = ("input_id", "label", "prediction", "predict", "radius", "p_lower", "sigma", "alpha",
            "seconds", "evidence", "draws")  # fmt: skip
    if any(r.get("load") is not None for r in rows):
        keys += ("load",)
    if any(r.get("region") is not None for r in rows):  # (a region beside the ℓ2 ball)
        keys += ("region",)
    items = sorted(([r.get(k) for k in keys] for r in rows), key=lambda item: int(item[0]))
    text = json.dumps(items, sort_keys=True, separators=(",", ":"), default=_jsonable)
    return hashlib.sha256(text.encode()).hexdigest()


def rederive(
    rows: list[dict[str, Any]], inputs: torch.Tensor | None, protocol: CertificationProtocol,
    declaration: Declaration, exact: bool = False,
) -> CheckResult:  # fmt: skip
    """S0 on ``rows`` (stored certificates; ``inputs`` in the same order, or None when
    the formula needs none). With ``exact``, the stored bound, prediction and radius must
    also *equal* the re-derived ones (relative 1e-9), not merely stay below them: how a
    board's verifier catches a claim edited in either direction."""
    formula = declaration.formula
    impure = formula.impure_parts()
    if impure:
        return CheckResult(NAME, Verdict.UNJUSTIFIED,
                           f"radius formula {formula.name!r} is not a pure module-level function "
                           f"({', '.join(impure)}); its radii cannot be re-derived from the evidence",
                           {"formula": formula.name})  # fmt: skip
    legacy = [r for r in rows if not r.get("draws")]
    if legacy:
        return CheckResult(NAME, Verdict.ERROR,
                           f"{len(legacy)} of {len(rows)} certificates (e.g. input "
                           f"{legacy[0]['input_id']}) carry no draws of the harness: the run was "
                           "certified before the harness drew the evidence itself, so its counts "
                           "are the certifier's own report; re-run the benchmark",
                           {"without_draws": len(legacy)})  # fmt: skip
    ids = np.array([int(r["input_id"]) for r in rows])
    alpha = np.array([float(r["alpha"]) for r in rows])
    stored_bound = np.array([float(r["p_lower"]) for r in rows])
    stored_pred = np.array([int(r["prediction"]) for r in rows])
    stored_radius = np.array([float(r["radius"]) for r in rows])
    stored_sigma = np.array([float(r["sigma"]) for r in rows])
    base = [r["draws"].get("base") or {} for r in rows]
    drawn_sigma = np.array([float(b.get("sigma", np.nan)) for b in base])
    kind_ok = np.array([b.get("kind") == declaration.smoothing for b in base])
    sigma_test, r_sigma, spent = _sigma_smoothing(declaration.sigma_smoothing, protocol, rows)
    derived = formula.derive(rows, inputs, replace(protocol, alpha=protocol.alpha - spent),
                             declaration.regularity)  # fmt: skip
    evidence = {"formula": formula.name, "certificates": len(rows), "alpha": protocol.alpha,
                "n0": protocol.n0, "n": protocol.estimation_cap, "declaration": declaration.record(),
                "certificates_sha256": certificates_digest(rows)}  # fmt: skip
    if spent:
        evidence["sigma_smoothing_alpha"] = spent
    if protocol.sampling == "sequential":
        evidence["sampling"] = "sequential"
    tests = [
        ("α", alpha != protocol.alpha, alpha, np.full(len(rows), protocol.alpha),
         "stored α {s} differs from the run's α {r}"),
        ("smoothing", ~kind_ok, np.array([b.get("kind") for b in base], dtype=object),
         np.full(len(rows), declaration.smoothing, dtype=object),
         "the harness drew a {s} smoothing, the certifier declares {r}"),
        ("σ", ~(drawn_sigma == stored_sigma), stored_sigma, drawn_sigma,
         "stored σ {s} differs from the σ {r} the harness drew at"),
        ("n0", np.asarray(derived.n0) != protocol.n0, np.asarray(derived.n0),
         np.full(len(rows), protocol.n0), "its evidence holds {s} selection samples, not n0 = {r}"),
        *_samples_tests(rows, inputs, protocol, declaration, np.asarray(derived.n), spent),
        ("bound", ~(stored_bound <= derived.bound * (1 + RELATIVE)), stored_bound, derived.bound,
         "stored bound on p_A {s} exceeds the bound {r} recomputed from its evidence at α = "
         f"{protocol.alpha - spent:g}"),
        ("prediction", (stored_pred != ABSTAIN) & (stored_pred != derived.prediction), stored_pred,
         derived.prediction, "certifies class {s}, the evidence certifies {r} (-1: abstain)"),
        ("radius", ~(stored_radius <= derived.radius * (1 + RELATIVE)), stored_radius,
         derived.radius, f"stored radius {{s}} exceeds the radius {{r}} of formula {formula.name!r}"),
        *sigma_test,
        *scale_tests(rows, inputs, np.asarray(derived.bound, dtype=np.float64), exact),
        ("R_σ", ~(stored_radius <= r_sigma * (1 + RELATIVE)), stored_radius, r_sigma,
         "stored radius {s} exceeds R_σ = {r}, the radius within which its σ-smoothing keeps σ "
         "constant"),
    ]  # fmt: skip
    if exact:
        claimed = np.minimum(np.asarray(derived.radius, dtype=np.float64), r_sigma)
        # a σ-smoothing whose level is not certified (R_σ = 0) abstains
        predicted = np.where(r_sigma > 0, np.asarray(derived.prediction), ABSTAIN)
        tests += [
            ("bound (exact)", ~_close(stored_bound, derived.bound), stored_bound, derived.bound,
             "stored bound on p_A {s} is not the bound {r} re-derived from its evidence"),
            ("prediction (exact)", stored_pred != predicted, stored_pred, predicted,
             "claims class {s}, its evidence gives {r} (-1: abstain)"),
            ("radius (exact)", ~_close(stored_radius, claimed), stored_radius, claimed,
             f"stored radius {{s}} is not the radius {{r}} formula {formula.name!r} re-derives"),
        ]  # fmt: skip
    failed = {name: int(bad.sum()) for name, bad, *_ in tests if bad.any()}
    evidence["mismatches"] = failed
    for name, bad, stored, recomputed, text in tests:
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            message = text.format(s=_num(stored[k]), r=_num(recomputed[k]))
            evidence["first"] = {"input_id": int(ids[k]), "quantity": name,
                                 "stored": _plain(stored[k]), "recomputed": _plain(recomputed[k])}  # fmt: skip
            others = "; ".join(f"{n}: {c}" for n, c in failed.items())
            return CheckResult(NAME, Verdict.VIOLATED,
                               f"input {int(ids[k])}: {message} (mismatching certificates, by "
                               f"quantity: {others})", evidence)  # fmt: skip
    return CheckResult(NAME, Verdict.SOUND,
                       f"all {len(rows)} certificates re-derived from their evidence by "
                       f"{formula.name!r} at α = {protocol.alpha:g}", evidence)  # fmt: skip


def _samples_tests(
    rows: list[dict], inputs, protocol: CertificationProtocol, declaration: Declaration,
    n: np.ndarray, spent: float,
) -> list:  # fmt: skip
    """The estimation samples behind each certificate: n of them (fixed sampling), or, drawn
    sequentially, looks that follow the run's rule (:func:`harness.mathematics.sequential.look_problems`,
    :func:`harness.mathematics.gridplace.look_problems`: its schedule, cumulative counts,
    and a stop where the rule stops) with the rule's record, at the α the certifier's
    formula gets; under the grid-place rule, tested at the thresholds the declared
    formula gives at the certificate's σ."""
    if protocol.sampling == "fixed":
        looked = np.array([bool(r["draws"].get("base", {}).get("looks")) for r in rows])
        return [("n", (n != protocol.n) | looked, n, np.full(len(rows), protocol.n),
                 "its evidence holds {s} estimation samples, not n = {r} (or was drawn in rounds)")]  # fmt: skip
    from harness.certification.rounds import sequential_rule
    from harness.mathematics.gridplace import GridPlaceRule, stored_thresholds
    from harness.mathematics.gridplace import look_problems as grid_look_problems
    from harness.mathematics.radius import grid_thresholds
    from harness.mathematics.sequential import look_problems

    rule = sequential_rule(protocol)
    grid = isinstance(rule, GridPlaceRule)
    bases = [r["draws"].get("base") or {} for r in rows]
    ruled = np.array([b.get("rule") == rule.record() and bool(b.get("looks")) for b in bases])
    problems = np.array([None] * len(rows), dtype=object)
    tested = np.array([None] * len(rows), dtype=object)  # grid-place: the stored thresholds
    derived = np.array([None] * len(rows), dtype=object)
    ok = np.flatnonzero(ruled)
    if ok.size:
        dim = int(inputs[0].numel()) if inputs is not None and len(inputs) else 1
        sigma = np.array([float(rows[i]["sigma"]) for i in ok])
        thresholds = grid_thresholds(declaration.formula, rule.radii, sigma, dim,
                                     declaration.regularity)  # fmt: skip
        top = np.array([int(np.argmax(bases[i]["selection"])) for i in ok])
        estimation = [bases[i]["estimation"] for i in ok]
        looks = [bases[i]["looks"] for i in ok]
        if grid:
            selection = np.array([bases[i]["selection"] for i in ok], dtype=np.int64)
            problems[ok] = grid_look_problems(rule, looks, top, estimation, selection,
                                              protocol.n0, thresholds, protocol.alpha - spent)  # fmt: skip
            for j, i in enumerate(ok):
                tested[i] = bases[i].get("thresholds")
                derived[i] = stored_thresholds(thresholds[j]).tolist()
        else:
            problems[ok] = look_problems(rule, looks, top, estimation, thresholds,
                                         protocol.alpha - spent)  # fmt: skip
    found = np.array([p is not None for p in problems])
    moved = np.array(
        [d is not None and not _same(t, d) for t, d in zip(tested, derived, strict=True)]
    )
    return [
        ("rule", ~ruled, np.array([b.get("rule") for b in bases], dtype=object),
         np.full(len(rows), rule.record(), dtype=object),
         "its draws were made by the sequential rule {s}, the run's is {r}"),
        ("thresholds", moved, tested, derived,
         "the grid thresholds its draws were tested at are {s}, its formula's are {r}"),
        ("looks", found, problems, np.full(len(rows), "none"), "its looks depart from the rule: {s}"),
    ]  # fmt: skip


def _same(stored, derived) -> bool:
    """Stored grid thresholds equal to the re-derived ones (up to :data:`RELATIVE`)."""
    try:
        stored = np.asarray(stored, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    derived = np.asarray(derived, dtype=np.float64)
    return stored.shape == derived.shape and bool(np.all(_close(stored, derived)))


def _close(stored: np.ndarray, derived) -> np.ndarray:
    """Equal up to a relative :data:`RELATIVE` (or both within 1e-12 of each other)."""
    derived = np.asarray(derived, dtype=np.float64)
    return np.abs(stored - derived) <= np.maximum(RELATIVE * np.maximum(np.abs(stored),
                                                                        np.abs(derived)), 1e-12)  # fmt: skip


def _sigma_smoothing(
    declared: SigmaSmoothing | None, protocol: CertificationProtocol, rows: list[dict]
) -> tuple[list, np.ndarray, float]:
    """The σ-smoothing's tests, R_σ per certificate (inf without a σ-smoothing) and the α
    it spends, re-derived from the harness's σ draws against the provider's declaration."""
    records = [r["draws"].get("sigma") for r in rows]
    present = np.array([rec is not None for rec in records])
    if declared is None:
        test = (
            "σ draws",
            present,
            present,
            np.zeros(len(rows), dtype=bool),
            "the certificate carries σ-smoothing draws ({s}), its σ-provider declares none",
        )
        return [test], np.full(len(rows), np.inf), 0.0
    from harness.mathematics.radius import sigma_choice_recompute

    test = (
        "σ draws",
        ~present,
        present,
        np.ones(len(rows), dtype=bool),
        "σ-smoothing draws present: {s}, the σ-provider declares a σ-smoothing",
    )
    if not present.all():
        return [test], np.zeros(len(rows)), float(declared.alpha)
    draws = Draws.from_records(records)
    levels = np.asarray(declared.levels, dtype=np.float64)
    chosen = levels[np.argmax(draws.selection, axis=1)]
    derived = sigma_choice_recompute(records, protocol, declared.alpha)
    protocol = replace(protocol, alpha=float(declared.alpha))
    stored_sigma = np.array([float(r["sigma"]) for r in rows])
    stored_pred = np.array([int(r["prediction"]) for r in rows])
    declared_as = np.array([rec.get("levels") == list(levels) and rec.get("alpha") == declared.alpha
                            and rec.get("sigma") == declared.noise for rec in records])  # fmt: skip
    n_ok = (np.asarray(derived.n0) == protocol.n0) & (np.asarray(derived.n) == protocol.n)
    tests = [
        test,
        (
            "σ-smoothing",
            ~declared_as,
            declared_as,
            np.ones(len(rows), dtype=bool),
            "its σ draws were made as the σ-provider declares (noise, levels, α share): {s}",
        ),
        (
            "σ samples",
            ~n_ok,
            np.asarray(derived.n),
            np.full(len(rows), protocol.n),
            "its σ draws hold {s} estimation samples (and n0 selection samples), not n = {r}",
        ),
        (
            "σ level",
            ~(stored_sigma == chosen),
            stored_sigma,
            chosen,
            "stored σ {s} is not the level {r} its σ draws choose",
        ),
        (
            "σ certified",
            (stored_pred != ABSTAIN) & ~(np.asarray(derived.radius) > 0),
            stored_pred,
            np.full(len(rows), ABSTAIN),
            "certifies class {s} where its σ draws do not certify the σ level (R_σ = 0), so "
            "it must abstain ({r})",
        ),
    ]
    return tests, np.asarray(derived.radius), float(declared.alpha)


def _jsonable(value):
    return value.tolist() if hasattr(value, "tolist") else str(value)


def _plain(value):
    """A numpy scalar as the Python value it holds (JSON-able); other values unchanged."""
    return value.item() if isinstance(value, np.generic) else value


def _num(value) -> str:
    """The shortest decimal that round-trips: two different numbers never print alike."""
    value = value.item() if isinstance(value, np.generic) else value
    return repr(float(value)) if isinstance(value, float) else str(value)
