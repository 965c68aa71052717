"""Analytic base classifiers: their exact smoothed probabilities against Monte Carlo."""

import numpy as np
import pytest
import torch
from scipy.stats import binomtest

from harness.audit.analytic import BallClassifier, LinearClassifier, load_ball_dataset
from harness.engine.sampling import SamplingEngine


@pytest.mark.parametrize("dim", [2, 50])
def test_ball_probability_matches_monte_carlo_with_input_dependent_sigma(dim):
    model = BallClassifier(dim, radius=1.0)
    x = np.zeros((3, dim))
    x[:, 0] = [0.0, 0.9, 1.5]
    sigma = np.array([0.3, 0.5, 1.0]) if dim == 2 else np.array([0.1, 0.12, 0.2])
    exact = model.smoothed_probability(x, sigma)
    engine = SamplingEngine(model, 2, torch.device("cpu"), batch_size=4096, seed=1)
    counts = engine.counts(torch.tensor(x, dtype=torch.float32), sigma, [0, 1, 2], 20000, 1)
    for i in range(3):
        assert binomtest(int(counts[i, 1]), 20000, exact[i]).pvalue > 1e-4


def test_linear_probability_is_phi_of_distance_over_sigma():
    model = LinearClassifier(5, offset=0.2)
    x = np.zeros((2, 5))
    x[:, 0] = [0.2, 1.2]
    assert model.smoothed_probability(x, np.array([1.0, 0.5])).tolist() == pytest.approx(
        [0.5, 0.97724986805]
    )


def test_ball_dataset_is_seeded_and_labelled_by_the_ball():
    a, b = load_ball_dataset(3, seed=4), load_ball_dataset(3, seed=4)
    assert torch.equal(a.test_x, b.test_x)
    assert torch.equal(a.test_y, (a.test_x.norm(dim=1) <= 1.0).long())
    assert 0.4 < a.train_y.float().mean() < 0.6
