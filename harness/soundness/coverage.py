"""S1: coverage on base classifiers whose smoothed classifier is known exactly (DESIGN §8).

The method (its own σ-provider and certifier, rebuilt on the analytic model) certifies
many independent trial points. A certificate (x0, R, ĉ) fails when some x in B(x0, R)
has an exact smoothed prediction other than ĉ:

- ``linear-N`` in the run's own dimension, f = [x_1 > 1/2]: for any σ(x) the smoothed
  boundary is the hyperplane, so the certificate fails iff ĉ is wrong or R exceeds the
  distance |x0_1 − 1/2|;
- ``ball-2``, f = [‖x‖ <= 1]: the exact smoothed prediction at x uses the method's own
  σ(x) in χ²_2(1/σ(x)²; ‖x‖²/σ(x)²) > 1/2, searched on a polar grid of B(x0, R)
  (:func:`harness.soundness.counterexamples.ball_flip`). Memory certificates keep σ
  constant inside each certified ball (Alfarra et al., App. C), so their balls are
  checked against the smoothed classifier at that constant σ.

A valid certificate fails with probability at most α, so the number of failures among
the certified trials is tested against Binomial(certified, α) (one-sided); a p-value
below :data:`harness.soundness.verdict.P_THRESHOLD` is a violation.
"""

from __future__ import annotations

import math

import torch

from harness.certificate import ABSTAIN
from harness.data import Dataset
from harness.protocol import CertificationProtocol
from harness.soundness.analytic import BallClassifier, LinearClassifier, load_ball_dataset
from harness.soundness.audit import Audit
from harness.soundness.counterexamples import ball_flip, sigma_in_ball
from harness.soundness.verdict import P_THRESHOLD, CheckResult, Verdict, false_certificates_pvalue

NAME = "coverage"


def _linear_dataset(dim: int, shape: tuple[int, ...], seed: int, count: int) -> Dataset:
    gen = torch.Generator().manual_seed(seed)
    train = torch.rand(2000, *shape, generator=gen)
    test = torch.rand(count, *shape, generator=gen)
    label = lambda x: (x.flatten(1)[:, 0] > 0.5).long()  # noqa: E731
    return Dataset(f"linear-{dim}", train, label(train), test, label(test), 2, ("below", "above"))


def _certify(audit: Audit, dataset: Dataset, model: torch.nn.Module):
    budget = audit.budget
    protocol = CertificationProtocol(
        n0=max(1, budget.coverage_n // 8), n=budget.coverage_n, alpha=audit.context.protocol.alpha,
        batch_size=audit.context.protocol.batch_size,
    )  # fmt: skip
    provider, certifier, context = audit.rebuild(dataset, model.to(audit.context.device), protocol)
    x = dataset.test_x.to(context.device)
    with torch.no_grad():
        sigma = provider(x)
    certs = sorted(certifier.certify(x, sigma, list(range(len(x)))), key=lambda c: c.input_id)
    ball_sigma = None
    if certifier.order_dependent:  # memory certificates: σ is constant inside each ball
        ball_sigma = certifier.ball_sigmas([vars(c) for c in certs])
    return provider, ball_sigma, [c for c in certs if c.prediction != ABSTAIN and c.radius > 0], x


def _linear_failures(audit: Audit) -> tuple[int, int, dict | None]:
    shape = tuple(audit.inputs.shape[1:])
    dim = math.prod(shape)
    dataset = _linear_dataset(dim, shape, audit.context.seed + 11, audit.budget.coverage_trials)
    model = LinearClassifier(dim, offset=0.5)
    _, _, certs, x = _certify(audit, dataset, model)
    failures, example = 0, None
    for c in certs:
        signed = float(x[c.input_id].flatten()[0]) - 0.5
        if c.prediction != int(signed > 0) or c.radius > abs(signed):
            failures += 1
            example = example or {"model": f"linear-{dim}", "input": c.input_id, "radius": c.radius,
                                  "true_radius": abs(signed), "prediction": c.prediction}  # fmt: skip
    return failures, len(certs), example


def _ball_failures(audit: Audit) -> tuple[int, int, dict | None]:
    dataset = load_ball_dataset(
        2, seed=audit.context.seed + 13, test_size=audit.budget.coverage_trials // 2
    )
    model = BallClassifier(2, 1.0)
    provider, ball_sigma, certs, x = _certify(audit, dataset, model)
    gen = torch.Generator().manual_seed(audit.context.seed + 13)
    failures, example = 0, None
    for c in certs:
        sigma_of = sigma_in_ball(provider, ball_sigma, c.input_id)
        flip = ball_flip(sigma_of, model, x[c.input_id], c.radius, c.prediction, gen)
        if flip is not None:
            failures += 1
            example = example or {"model": "ball-2", "input": x[c.input_id].tolist(), "radius": c.radius,
                                  "prediction": c.prediction, **flip}  # fmt: skip
    return failures, len(certs), example


def check_coverage(audit: Audit) -> CheckResult:
    alpha = audit.context.protocol.alpha
    evidence: dict = {"alpha": alpha}
    worst_p, summary = 1.0, []
    for name, run in (("linear", _linear_failures), ("ball-2", _ball_failures)):
        failures, certified, example = run(audit)
        p = false_certificates_pvalue(failures, certified, alpha)
        evidence[name] = {
            "certified": certified,
            "failures": failures,
            "p_value": p,
            "example": example,
        }
        summary.append(f"{name}: {failures}/{certified} certificates fail (p = {p:.2g})")
        worst_p = min(worst_p, p)
    verdict = Verdict.VIOLATED if worst_p < P_THRESHOLD else Verdict.SOUND
    return CheckResult(NAME, verdict, "; ".join(summary), evidence)
