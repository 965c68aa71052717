"""The certificate of dual randomized smoothing: min(R_σ, R_c) with α split (Sun et al. 2026).

For an input x the harness hands over two smoothings it drew itself (docs/plugins.md, "The
contract a certifier and a σ-provider declare"):

- the σ-estimator's (``evidence.sigma_draws``): k̂ = argmax of its n0 selection counts,
  p_σ = Clopper–Pearson lower bound of k̂'s estimation count at α_σ (the share the
  σ-provider declares), R_σ = σ_v Φ⁻¹(p_σ) where p_σ > 1/2 (Cohen et al. 2019, Thm 1 on
  the estimator): with probability >= 1 − α_σ the smoothed estimator chooses level k̂
  on the whole ball B(x, R_σ), so σ is constant there;
- the base model's at σ(x) = levels[k̂] (``evidence.base``): CERTIFY's ĉ_A and p_A lower
  bound at ``evidence.alpha`` = α − α_σ, R_c = σ(x) Φ⁻¹(p_A).

On B(x, R_σ) the input-dependent smoothed classifier is the constant-σ one at σ(x)
(Sun et al. 2026, Thms 4.1/4.2: local constancy), which is constant on B(x, R_c); so the class ĉ_A
is certified on B(x, min(R_σ, R_c)), failing with probability <= α_σ + (α − α_σ) = α by
the union bound. Where p_σ <= 1/2 the σ choice itself is not certified and the
certifier abstains. PREDICT composes likewise: the base model's PREDICT at α − α_σ,
answered only when the estimator's PREDICT (the binomial test of its top two
estimation counts at α_σ) returns k̂.

The declared formula is :data:`harness.COHEN` (R_c); check S0 re-derives R_c at the α
left after the σ-smoothing's share and R_σ from the σ draws, and holds every radius to
both.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from scipy import stats

from harness import (
    ABSTAIN,
    COHEN,
    Claim,
    ContractError,
    Draws,
    Evidence,
    HardSmoothingCertifier,
    clopper_pearson_lower,
    cohen_radius,
)


def sigma_certificate(draws: Draws) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per input: (k̂, p_σ lower bound at the draws' α share, R_σ; 0 where p_σ <= 1/2)."""
    top = np.argmax(draws.selection, axis=1)
    count = draws.estimation[np.arange(len(draws)), top]
    bound = np.array([clopper_pearson_lower(int(k), draws.n, draws.alpha) for k in count])
    certified = bound > 0.5
    radius = np.zeros(len(draws))
    if certified.any():
        radius[certified] = cohen_radius(bound[certified], draws.sigma[certified])
    return top, bound, radius


def level_predict(counts: np.ndarray, alpha: float) -> int:
    """PREDICT on the estimator's counts: the top level if the two-sided binomial test of
    its count against the runner-up's rejects p = 1/2 at ``alpha`` (Cohen et al. 2019)."""
    order = np.argsort(counts)[::-1]
    top, runner_up = int(counts[order[0]]), int(counts[order[1]])
    if top + runner_up == 0:
        return ABSTAIN
    p = stats.binomtest(top, top + runner_up, 0.5, alternative="two-sided").pvalue
    return int(order[0]) if p <= alpha else ABSTAIN


class DualCertifier(HardSmoothingCertifier):
    """CERTIFY at σ(x) capped at R_σ; abstains where the σ choice is not certified."""

    radius_formula = COHEN

    def radius(self, p_lower: np.ndarray, sigma: np.ndarray) -> np.ndarray:
        """R_c = σ(x)·Φ⁻¹(p_A_lower) (Cohen et al. 2019, Thm 1), before the cap at R_σ."""
        return np.asarray(cohen_radius(p_lower, sigma))

    def certify(self, evidence: Evidence) -> list[Claim]:
        drawn = evidence.sigma_draws
        if drawn is None:
            raise ContractError(
                "the dual-rs certifier needs the harness's draws of a σ-smoothing "
                "(Evidence.sigma_draws); pair it with the dual-rs-estimator σ-provider"
            )
        level, p_sigma, r_sigma = sigma_certificate(drawn)
        claims = []
        for k, claim in enumerate(super().certify(evidence)):
            sure = r_sigma[k] > 0
            certified = sure and claim.prediction != ABSTAIN
            agrees = level_predict(drawn.estimation[k], drawn.alpha) == level[k]
            claims.append(replace(
                claim,
                prediction=claim.prediction if certified else ABSTAIN,
                radius=float(min(claim.radius, r_sigma[k])) if certified else 0.0,
                predict=claim.predict if agrees else ABSTAIN,
                evidence={"level": int(level[k]), "p_sigma_lower": float(p_sigma[k]),
                          "r_sigma": float(r_sigma[k]), "r_classifier": float(claim.radius)},
            ))  # fmt: skip
        return claims
