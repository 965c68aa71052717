"""The Gaussian mixture of Mohapatra et al. (2021), §3.1: distribution, seeding, registry,
and that its defaults make the bounded class shrink inside the hidden-cost σ range."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import optimize, stats

from plugins.datasets.gauss_mix import EPSILON, SIGMA_O, A, K, load_gauss_mix, sample_gauss_mix


def _mixture_cdf(x):
    """CDF of class 0's first coordinate: (1 − 2ε)·N(−a, σ_o²) + 2ε·N(k·a, σ_o²)."""
    return (1 - 2 * EPSILON) * stats.norm.cdf(x, -A, SIGMA_O) + 2 * EPSILON * stats.norm.cdf(
        x, K * A, SIGMA_O
    )


def test_class_conditional_distributions_match_the_paper():
    points, labels = sample_gauss_mix(3, 4000, np.random.default_rng(7))
    assert points.shape == (8000, 3) and np.bincount(labels).tolist() == [4000, 4000]
    centre, mixture = points[labels == 1], points[labels == 0]
    assert stats.kstest(centre[:, 0], stats.norm(0, SIGMA_O).cdf).pvalue > 1e-3
    assert stats.kstest(mixture[:, 0], _mixture_cdf).pvalue > 1e-3
    for other in (centre[:, 1:], mixture[:, 1:]):  # isotropic σ_o off the first axis
        assert stats.kstest(other.ravel(), stats.norm(0, SIGMA_O).cdf).pvalue > 1e-3
    # a wrong mixture weight is rejected by the same test
    wrong = lambda x: 0.5 * stats.norm.cdf(x, -A, SIGMA_O) + 0.5 * stats.norm.cdf(x, K * A, SIGMA_O)  # noqa: E731
    assert stats.kstest(mixture[:, 0], wrong).pvalue < 1e-6


def test_theorem_1_condition_holds_for_the_defaults():
    assert K > 1 / (2 * EPSILON) - 1
    assert 2 * EPSILON * K * A - (1 - 2 * EPSILON) * A > 0  # class 0's mean is positive


def test_seeded_and_dimensioned():
    a, b, c = load_gauss_mix(2, seed=1), load_gauss_mix(2, seed=1), load_gauss_mix(2, seed=2)
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    assert not torch.equal(a.train_x, c.train_x)
    assert a.train_x.shape == (4000, 2) and a.test_x.shape == (1000, 2)
    assert a.train_x.dtype == torch.float32 and a.num_classes == 2
    assert a.name == "gauss-mix-2" and load_gauss_mix(1).name == "gauss-mix"


def test_registered_as_gauss_mix_and_a_family(manager):
    registry = manager.registry
    one = registry.get("datasets", "gauss-mix").load(
        seed=0, **registry.family_args("datasets", "gauss-mix")
    )
    five = registry.get("datasets", "gauss-mix-5").load(
        seed=0, **registry.family_args("datasets", "gauss-mix-5")
    )
    assert one.input_shape == (1,) and five.input_shape == (5,)


def _bayes_centre_interval() -> tuple[float, float]:
    """The region where the centre class is the more likely one (equal priors)."""

    def log_ratio(x):
        centre = stats.norm.pdf(x, 0, SIGMA_O)
        mixture = (1 - 2 * EPSILON) * stats.norm.pdf(x, -A, SIGMA_O) + 2 * EPSILON * stats.norm.pdf(
            x, K * A, SIGMA_O
        )
        return np.log(centre) - np.log(mixture)

    return optimize.brentq(log_ratio, -A, 0.0), optimize.brentq(log_ratio, 0.0, K * A)


@pytest.mark.parametrize(("sigma", "predicted"), [(0.12, True), (1.0, True), (2.0, False)])
def test_smoothing_the_bayes_classifier_shrinks_the_bounded_class(sigma, predicted):
    """At the centre x = 0, g predicts the centre class iff P(l < σε < r) > 1/2."""
    left, right = _bayes_centre_interval()
    assert -A < left < 0 < right < K * A
    p_centre = stats.norm.cdf(right / sigma) - stats.norm.cdf(left / sigma)
    assert (p_centre > 0.5) == predicted
