"""Cohen's CERTIFY: the radius formula and coverage on a linear base classifier."""

import pytest
import torch
from scipy import stats

from harness.certification.certify import certify_drawn
from harness.engine.draws import Evidence
from harness.engine.sampling import SamplingEngine
from harness.foundation.certificate import ABSTAIN
from harness.foundation.protocol import CertificationProtocol
from plugins.cohen.certifier import CohenCertifier, ConstantSigma


def _certify_linear(linear_model, radius_scale=1.0, trials=600, d=784, alpha=0.05, seed=0):
    """Certify ``trials`` random points against f = [w·x > b]; return (violations, certified)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(d, generator=gen)
    w /= w.norm()
    b = 0.1
    sigma = 0.5
    model = linear_model(w, b)
    # points at signed distances spread so that p_A covers (0.5, 1)
    distances = torch.empty(trials).uniform_(-1.2, 1.2, generator=gen)
    base = torch.rand(trials, d, generator=gen)
    x = base - ((base @ w - b) - distances)[:, None] * w[None, :]
    engine = SamplingEngine(model, 2, torch.device("cpu"), batch_size=4096, seed=seed)

    class Scaled(CohenCertifier):
        def radius(self, p_lower, s):
            return radius_scale * super().radius(p_lower, s)

    protocol = CertificationProtocol(n0=64, n=512, alpha=alpha)
    sig = ConstantSigma(sigma)(x).numpy()
    violations = certified = 0
    for cert in certify_drawn(engine, protocol, Scaled(), x, list(range(trials)), sig):
        if cert.prediction == ABSTAIN:
            continue
        certified += 1
        true_class = int(distances[cert.input_id] > 0)
        true_radius = abs(float(distances[cert.input_id]))
        # the smoothed classifier's boundary is the hyperplane itself
        if cert.prediction != true_class or cert.radius > true_radius:
            violations += 1
    return violations, certified


def test_radius_from_stored_counts_is_sigma_times_probit_of_clopper_pearson():
    evidence = Evidence.from_counts([1, 9, 0], [20, 970, 10], 0.25, alpha=0.001)
    [cert] = CohenCertifier().certify(evidence)
    p_lower = stats.beta.ppf(0.001, 970, 1000 - 970 + 1)
    assert cert.prediction == 1
    assert cert.p_lower == pytest.approx(p_lower, rel=1e-12)
    assert cert.radius == pytest.approx(0.25 * stats.norm.ppf(p_lower), rel=1e-12)
    assert cert.predict == 1


def test_abstains_when_lower_bound_is_at_most_one_half():
    [cert] = CohenCertifier().certify(Evidence.from_counts([6, 4], [55, 45], 1.0, alpha=0.001))
    assert cert.prediction == ABSTAIN and cert.radius == 0.0
    assert cert.predict == ABSTAIN  # 55 vs 45 is no evidence at level 0.001


def test_coverage_on_linear_classifier_is_consistent_with_alpha(linear_model):
    alpha = 0.05
    violations, certified = _certify_linear(linear_model, alpha=alpha)
    assert certified >= 500
    # one-sided binomial test: more violations than alpha allows?
    assert stats.binomtest(violations, certified, alpha, alternative="greater").pvalue > 1e-3


def test_coverage_test_detects_a_doubled_radius(linear_model):
    violations, certified = _certify_linear(linear_model, radius_scale=2.0, alpha=0.05)
    assert stats.binomtest(violations, certified, 0.05, alternative="greater").pvalue < 1e-6
