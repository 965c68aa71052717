"""S1: coverage on base classifiers whose smoothed classifier is known exactly.

The method (its σ-provider and certifier, rebuilt on an analytic base model) certifies
trial inputs that are **the run's own certified inputs**, in the run's dimension N, with
the run's training data as the σ-provider's data (so a kNN σ, for instance, behaves as
on the benchmark). The analytic models are one-hot (see :mod:`harness.soundness.analytic`),
so hard and soft smoothed classifiers are both exact and share the decision boundary
P(f = 1) = 1/2; soft certifiers are thereby audited against the exact soft expectation.

- **linear-N**: per round, f = [w·x > b] with a random unit w and b the median of w·x
  over the inputs (half the inputs on each side). For any σ(x) the smoothed boundary is
  the hyperplane, so a certificate (x0, R, ĉ) is false iff ĉ is wrong or R > |w·x0 − b|.
  This audits calibration: the p_A bound, its α, the radius formula.
- **ball-N**: one ball per trial, f = [‖x − c‖ <= ρ], with c = x0 + σ_ref·u (u a random
  unit vector, σ_ref = σ(x0)) and ρ with χ²_N(ρ²/σ_ref²; 1) = q, q uniform in
  [0.02, 0.98]: x0 sits near the smoothed boundary and ρ ≈ σ_ref·√N. There
  P(inside) = χ²_N(ρ²/σ²; ‖x − c‖²/σ²) moves by ~√(2N)·Δσ/σ standard deviations when σ
  changes (Súkeník et al. 2022, Thm 2.3/2.4), which is where radii computed as if σ were
  constant break. A certificate is false when a point of B(x0, R) has an exact smoothed
  prediction other than ĉ (with the method's own σ at that point), searched on rays
  from x0 (:func:`harness.soundness.counterexamples.ball_flip`), the rays along ±∇σ
  included. Memory certificates keep σ constant inside each certified ball (Alfarra et
  al., App. C) and get a fresh certifier per trial (each trial is another classifier).
  For a σ-smoothing (dual RS) σ at each point is drawn by the harness from the
  σ-estimator, and a point counts only if it flips at every level plausible there
  (:func:`harness.soundness.sigma_smoothing.ball_flip`).

**Null.** A valid certifier issues a false certificate with probability at most α per
*trial* (per input it is asked about, abstentions included), so the number of false
certificates among T trials is tested against Binomial(T, α), one-sided. The two
sub-tests are combined by Holm's step-down procedure at
:data:`~harness.soundness.verdict.P_THRESHOLD` (family-wise error <= the threshold).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import stats

from harness.certificate import ABSTAIN
from harness.certify import (
    certifier_label,
    certify_drawn,
    certify_inputs,
    checked_sigma,
    sigma_of,
    sigma_smoothing,
)
from harness.data import Dataset
from harness.protocol import CertificationProtocol
from harness.soundness import sigma_smoothing as smoothed
from harness.soundness.analytic import BallClassifier, LinearClassifier
from harness.soundness.audit import Audit
from harness.soundness.counterexamples import ball_flip, sigma_and_gradient, sigma_in_ball
from harness.soundness.verdict import P_THRESHOLD, CheckResult, Verdict, false_certificates_pvalue
from harness.stats import holm_rejections

NAME = "coverage"
QUANTILES = (0.02, 0.98)
"""Range of the exact P(inside) at the trial input (with σ_ref) over ball trials."""


def detectable_rate(trials: int, alpha: float, threshold: float, power: float = 0.9) -> float:
    """The smallest false-certificate rate that Binomial(trials, ·) flags with ``power``.

    k_min = least count with P(Binomial(trials, α) >= k_min) < threshold; the rate ρ
    solves P(Binomial(trials, ρ) >= k_min) = power.
    """
    if trials < 1:
        return 1.0
    k_min = int(stats.binom.isf(threshold, trials, alpha)) + 1
    while k_min <= trials and false_certificates_pvalue(k_min, trials, alpha) >= threshold:
        k_min += 1
    if k_min > trials:
        return 1.0
    low, high = alpha, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if stats.binom.sf(k_min - 1, trials, mid) < power else (low, mid)
    return high


def _protocol(audit: Audit) -> CertificationProtocol:
    n = audit.budget.coverage_n
    return CertificationProtocol(n0=max(1, n // 8), n=n, alpha=audit.context.protocol.alpha,
                                 batch_size=audit.context.protocol.batch_size)  # fmt: skip


def _dataset(audit: Audit, kind: str, model: torch.nn.Module, points: torch.Tensor) -> Dataset:
    """The run's training inputs (the σ-provider's data) and trial inputs, labelled by ``model``."""
    train = audit.context.dataset.train_x
    with torch.no_grad():
        test_y = model(points.to(audit.context.device)).argmax(1).cpu()
    return Dataset(f"{kind}-{points[0].numel()}", train, torch.zeros(len(train), dtype=torch.long),
                   points, test_y, 2, ("0", "1"))  # fmt: skip


def _certify(audit: Audit, context, provider, certifier, x: torch.Tensor, ids: list[int]):
    """Certificates of a rebuilt method, drawn and claimed as in a run."""
    certificates = certify_inputs(context, audit.method, provider, certifier, x, ids)
    return sorted(certificates, key=lambda c: c.input_id)


def _linear_trials(audit: Audit, points: torch.Tensor, trials: int, gen: torch.Generator) -> dict:
    device, dim = audit.context.device, points[0].numel()
    model = LinearClassifier(dim, one_hot=True).to(device)
    protocol = _protocol(audit)
    provider = certifier = context = None
    failures, done, example = 0, 0, None
    flat = points.flatten(1).double()
    while done < trials:
        take = min(trials - done, len(points))
        normal = torch.randn(dim, generator=gen, dtype=torch.float64)
        normal /= normal.norm()
        offset = float((flat[:take] @ normal).median())
        model.set_plane(normal, offset)
        if certifier is None or certifier.order_dependent:  # a memory lives for one classifier
            dataset = _dataset(audit, "linear", model, points[:take])
            provider, certifier, context = audit.rebuild(dataset, model, protocol)
        x = points[:take].to(device)
        for c in _certify(audit, context, provider, certifier, x, list(range(done, done + take))):
            if c.prediction == ABSTAIN or c.radius <= 0:
                continue
            signed = float(flat[c.input_id - done] @ normal) - offset
            if c.prediction != int(signed > 0) or c.radius > abs(signed):
                failures += 1
                example = example or {"model": f"linear-{dim}", "trial": c.input_id,
                                      "input": c.input_id - done, "radius": c.radius,
                                      "distance_to_boundary": abs(signed),
                                      "prediction": c.prediction}  # fmt: skip
        done += take
    return {"trials": trials, "failures": failures, "example": example}


def _ball_trials(audit: Audit, points: torch.Tensor, trials: int, gen: torch.Generator) -> dict:
    device, dim = audit.context.device, points[0].numel()
    model = BallClassifier(dim, one_hot=True).to(device)
    protocol = _protocol(audit)
    dataset = _dataset(audit, "ball", model, points)
    provider, certifier, context = audit.rebuild(dataset, model, protocol)
    sigma_ref = _reference_sigma(audit, context, provider, points.to(device))
    failures, certified, example = 0, 0, None
    rng = np.random.default_rng(audit.context.seed + 17)
    for t in range(trials):
        k = t % len(points)
        x0, s = points[k : k + 1].to(device), float(sigma_ref[k])
        u = torch.randn(dim, generator=gen, dtype=torch.float64)
        q = rng.uniform(*QUANTILES)
        radius = s * math.sqrt(stats.ncx2.ppf(q, dim, 1.0))
        model.set_ball(x0.flatten().double().cpu() + s * u / u.norm(), radius)
        if certifier.order_dependent:  # a memory lives for one classifier
            provider, certifier, context = audit.rebuild(dataset, model, protocol)
        if sigma_smoothing(provider) is None:  # σ and ∇σ in one evaluation of the provider
            sigma, gradient = sigma_and_gradient(provider, x0)
            sigma = checked_sigma(sigma, 1, audit.method.sigma_provider).double().cpu().numpy()
            drawn = None
        else:  # σ drawn by the harness; a smoothed choice among levels has no gradient
            sigma, drawn = sigma_of(context, provider, x0, [t], audit.method.sigma_provider)
            gradient = None
        [c] = certify_drawn(context.engine, protocol, certifier, x0, [t], sigma, drawn,
                            label=certifier_label(context, audit.method))  # fmt: skip
        if c.prediction == ABSTAIN or c.radius <= 0:
            continue
        certified += 1
        ball_sigma = None
        if certifier.order_dependent:  # memory certificates: σ is constant inside each ball
            ball_sigma = certifier.ball_sigmas([vars(c)])
        if drawn is None:
            flip = ball_flip(sigma_in_ball(provider, ball_sigma, t), model, x0[0], c.radius,
                             c.prediction, gen, None if ball_sigma else gradient)  # fmt: skip
        else:  # flips at every σ level plausible at the point, drawn by the harness
            flip = smoothed.ball_flip(audit, context, sigma_smoothing(provider), model, x0[0],
                                      c.radius, c.prediction, int(np.argmax(drawn.selection[0])),
                                      gen, f"coverage/ball/{t}", trials)  # fmt: skip
        if flip is not None:
            failures += 1
            example = example or {"model": f"ball-{dim}", "trial": t, "input": k,
                                  "ball_radius": radius, "exact_p_inside_at_input": q,
                                  "radius": c.radius, "prediction": c.prediction,
                                  **{key: v for key, v in flip.items() if key != "point"}}  # fmt: skip
    return {"trials": trials, "certified": certified, "failures": failures, "example": example}


def _reference_sigma(audit: Audit, context, provider, points: torch.Tensor) -> torch.Tensor:
    """σ at the trial inputs (float64, CPU) that sizes each trial's ball: the provider's
    answer, or for a σ-smoothing the level the harness's draws choose."""
    if sigma_smoothing(provider) is None:
        with torch.no_grad():
            return provider(points).double().cpu()
    sigma, _ = sigma_of(context, provider, points, None, audit.method.sigma_provider)
    return torch.from_numpy(sigma)


def check_coverage(audit: Audit) -> CheckResult:
    alpha, budget = audit.context.protocol.alpha, audit.budget
    points = audit.inputs.float().cpu()
    gen = torch.Generator().manual_seed(audit.context.seed + 11)
    dim = points[0].numel()
    half = max(1, budget.coverage_trials // 2)
    evidence: dict = {"alpha": alpha, "dimension": dim, "null": "Binomial(trials, α), one-sided",
                      "correction": f"Holm over 2 sub-tests at {P_THRESHOLD:g}",
                      "power": f"{half} trials per sub-test flag a false-certificate rate >= "
                               f"{detectable_rate(half, alpha, P_THRESHOLD / 2):.3g} with "
                               f"probability 0.9"}  # fmt: skip
    names = (f"linear-{dim}", f"ball-{dim}")
    runs = (_linear_trials, _ball_trials)
    pvalues = []
    for name, run in zip(names, runs, strict=True):
        result = run(audit, points, half, gen)
        result["p_value"] = false_certificates_pvalue(result["failures"], result["trials"], alpha)
        evidence[name] = result
        pvalues.append(result["p_value"])
    rejected = holm_rejections(pvalues, P_THRESHOLD)
    summary = [
        f"{name}: {evidence[name]['failures']}/{evidence[name]['trials']} trials give a false "
        f"certificate (p = {p:.3g}{', rejected' if r else ''})"
        for name, p, r in zip(names, pvalues, rejected, strict=True)
    ]
    verdict = Verdict.VIOLATED if any(rejected) else Verdict.SOUND
    return CheckResult(NAME, verdict, "; ".join(summary) + f"; {evidence['power']}", evidence)
