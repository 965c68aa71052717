"""S0: every stored certificate re-derived from its own evidence (no model, no sampling).

For every certificate of the row, with the run's protocol (n0, n, α) and the σ-provider's
*declared* regularity, the certifier's declared :class:`~harness.radius.RadiusFormula`
(a pure module-level function, :func:`harness.radius.is_pure`) recomputes the samples
behind the evidence, the lower bound on p_A (Clopper–Pearson on the stored class counts
for hard smoothing, Cohen et al. 2019; the declared soft bound for soft smoothing), the
prediction and the largest radius. The row is ``violated`` at the first certificate,
in stored order, where

1. its stored α differs from the run's α;
2. its evidence does not hold n0 selection and n estimation samples;
3. its stored bound exceeds the recomputed one (relative tolerance 1e-9);
4. it certifies a class the formula does not certify;
5. its stored radius exceeds the recomputed one (relative tolerance 1e-9).

A conservative certificate (smaller bound or radius) passes. A formula that is not a pure
function is ``unjustified``: its radii cannot be re-derived independently of the
certifier. Applicability: every row (the check always applies).
"""

from __future__ import annotations

import numpy as np

from harness.certificate import ABSTAIN
from harness.soundness.audit import Audit
from harness.soundness.verdict import CheckResult, Verdict

NAME = "evidence"
RELATIVE = 1e-9
"""Relative tolerance of the bound and radius comparisons (floating-point rounding only)."""


def check_evidence(audit: Audit) -> CheckResult:
    formula = audit.certifier.radius_formula
    protocol = audit.context.protocol
    rows = audit.certificates
    impure = formula.impure_parts()
    if impure:
        return CheckResult(NAME, Verdict.UNJUSTIFIED,
                           f"radius formula {formula.name!r} is not a pure module-level function "
                           f"({', '.join(impure)}); its radii cannot be re-derived from the evidence",
                           {"formula": formula.name})  # fmt: skip
    ids = np.array([int(r["input_id"]) for r in rows])
    alpha = np.array([float(r["alpha"]) for r in rows])
    stored_bound = np.array([float(r["p_lower"]) for r in rows])
    stored_pred = np.array([int(r["prediction"]) for r in rows])
    stored_radius = np.array([float(r["radius"]) for r in rows])
    inputs = audit.inputs.detach().cpu()
    derived = formula.derive(rows, inputs, protocol, audit.sigma_provider.regularity)
    evidence = {"formula": formula.name, "certificates": len(rows), "alpha": protocol.alpha,
                "n0": protocol.n0, "n": protocol.n}  # fmt: skip
    tests = [
        ("α", alpha != protocol.alpha, alpha, np.full(len(rows), protocol.alpha),
         "stored α {s} differs from the run's α {r}"),
        ("n0", np.asarray(derived.n0) != protocol.n0, np.asarray(derived.n0),
         np.full(len(rows), protocol.n0), "its evidence holds {s} selection samples, not n0 = {r}"),
        ("n", np.asarray(derived.n) != protocol.n, np.asarray(derived.n),
         np.full(len(rows), protocol.n), "its evidence holds {s} estimation samples, not n = {r}"),
        ("bound", ~(stored_bound <= derived.bound * (1 + RELATIVE)), stored_bound, derived.bound,
         "stored bound on p_A {s} exceeds the bound {r} recomputed from its evidence at α = "
         f"{protocol.alpha:g}"),
        ("prediction", (stored_pred != ABSTAIN) & (stored_pred != derived.prediction), stored_pred,
         derived.prediction, "certifies class {s}, the evidence certifies {r} (-1: abstain)"),
        ("radius", ~(stored_radius <= derived.radius * (1 + RELATIVE)), stored_radius,
         derived.radius, f"stored radius {{s}} exceeds the radius {{r}} of formula {formula.name!r}"),
    ]  # fmt: skip
    failed = {name: int(bad.sum()) for name, bad, *_ in tests if bad.any()}
    evidence["mismatches"] = failed
    for name, bad, stored, recomputed, text in tests:
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            message = text.format(s=_num(stored[k]), r=_num(recomputed[k]))
            evidence["first"] = {"input_id": int(ids[k]), "quantity": name,
                                 "stored": stored[k].item(), "recomputed": recomputed[k].item()}  # fmt: skip
            others = "; ".join(f"{n}: {c}" for n, c in failed.items())
            return CheckResult(NAME, Verdict.VIOLATED,
                               f"input {int(ids[k])}: {message} (mismatching certificates, by "
                               f"quantity: {others})", evidence)  # fmt: skip
    return CheckResult(NAME, Verdict.SOUND,
                       f"all {len(rows)} certificates re-derived from their evidence by "
                       f"{formula.name!r} at α = {protocol.alpha:g}", evidence)  # fmt: skip


def _num(value) -> str:
    """The shortest decimal that round-trips: two different numbers never print alike."""
    value = value.item() if isinstance(value, np.generic) else value
    return repr(float(value)) if isinstance(value, float) else str(value)
