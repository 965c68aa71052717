"""S1's view of sequential sampling: which samples a calibration score rests on, and the
exact test that the run's sequential bound is anytime-valid
(:mod:`harness.mathematics.sequential`, :mod:`harness.mathematics.crossing`)."""

from __future__ import annotations

import numpy as np

from harness.audit.audit import Audit
from harness.foundation.protocol import CertificationProtocol


def first_look(protocol: CertificationProtocol) -> int:
    """The estimation samples behind a trial's calibration score: n, or under sequential
    sampling the first look's (the one look drawn whatever the counts: a later look's
    count is not binomial given the data-dependent decision to draw it)."""
    if protocol.sampling == "fixed":
        return protocol.n
    from harness.certification.rounds import sequential_rule

    return int(sequential_rule(protocol).looks[0])


def sequential_validity(audit: Audit, protocol: CertificationProtocol) -> dict:
    """The exact sub-test of a sequential run (:mod:`harness.mathematics.crossing`): the
    probability that the rule's bound ever exceeds the true p_A, computed by dynamic
    programming for the run's rule and S1's (capped) one, at p log-spaced towards 1 and
    just below the grid thresholds of the audited certificates' σ; under the grid-place
    rule, the probability that it ever rejects H_j: p_A <= τ_j at p_A = τ_j, for each
    tested value at those σ and the priors of the audited certificates' selection counts
    (:func:`_priors`). It must not exceed α. Exact, so it never flags a valid rule."""
    from harness.certification.rounds import sequential_rule
    from harness.mathematics.crossing import audit_points, worst_crossing, worst_rejection
    from harness.mathematics.gridplace import GridPlaceRule, tested_values
    from harness.mathematics.radius import grid_thresholds

    run = audit.context.protocol
    sigma = np.unique([float(c["sigma"]) for c in audit.certificates])
    sigma = sigma[np.linspace(0, len(sigma) - 1, min(len(sigma), 16)).astype(int)]
    rules = {sequential_rule(p).n_max: sequential_rule(p) for p in (run, protocol)}
    thresholds = grid_thresholds(audit.certifier.radius_formula, run.grid, sigma,
                                 int(audit.inputs[0].numel()), audit.sigma_provider.regularity)  # fmt: skip
    if isinstance(sequential_rule(run), GridPlaceRule):
        tau, priors = tested_values(thresholds), _priors(audit, run)
        worst = [{"n_max": n_max, **worst_rejection(rule, run.alpha, tau, priors)}
                 for n_max, rule in sorted(rules.items())]  # fmt: skip
    else:
        worst = [{"n_max": n_max, **worst_crossing(rule, run.alpha, audit_points(rule, thresholds))}
                 for n_max, rule in sorted(rules.items())]  # fmt: skip
    text = ", ".join(f"{w['ratio_to_alpha']:.3g}α at n_max = {w['n_max']:,} (p = {w['worst_p']:.6g})"
                     for w in worst)  # fmt: skip
    return {"rule": sequential_rule(run).record(), "rules": worst,
            "summary": f"sequential bound (exact, {worst[0]['points']} values of p per rule): the "
                       f"largest probability that it ever exceeds p_A is {text}, against α"}  # fmt: skip


PRIORS = 3
"""Priors the exact test of the grid-place rule covers: those of the least, the median
and the largest selection count of ĉ_A among the audited certificates."""


def _priors(audit: Audit, run: CertificationProtocol) -> np.ndarray:
    """[P, 2]: (a, b) of the grid-place rule's prior at ĉ_A's selection counts of the
    audited certificates (:data:`PRIORS` of them); that of a count of n0 when none are
    stored."""
    from harness.certification.rounds import sequential_rule

    counts = sorted(int(max(base["selection"])) for c in audit.certificates
                    if (base := (c.get("draws") or {}).get("base") or {}).get("selection"))  # fmt: skip
    picks = [counts[0], counts[len(counts) // 2], counts[-1]][:PRIORS] if counts else [run.n0]
    a, b = sequential_rule(run).priors(np.array(picks), run.n0)
    return np.unique(np.stack([a, b], axis=1), axis=0)
