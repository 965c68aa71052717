"""ExactSampling (harness.engine.exact): the class of each sample drawn from an analytic
model's closed-form probabilities has the law it has under Gaussian noise through the model,
and depends on (seed, stream, input id, index) alone."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from harness.audit.analytic import BallClassifier, LinearClassifier
from harness.engine.exact import ExactSampling, keyed_uniforms
from harness.engine.noise import mix64
from harness.engine.sampling import SamplingEngine
from harness.foundation.errors import ModelOutputError

DIM = 50


def _ball() -> BallClassifier:
    model = BallClassifier(DIM, one_hot=True, num_classes=5, classes=(3, 1))
    center = torch.zeros(DIM)
    center[0] = 0.3
    model.set_ball(center, 0.25 * math.sqrt(DIM))
    return model


def _engines(model, seed: int = 7) -> tuple[ExactSampling, SamplingEngine]:
    exact = ExactSampling(model, model.class_probabilities, model.num_classes, torch.device("cpu"),
                          256, seed, one_hot=True)  # fmt: skip
    gaussian = SamplingEngine(model, model.num_classes, torch.device("cpu"), 256, seed)
    return exact, gaussian


def test_keyed_uniforms_are_the_splitmix_chain_of_the_sample_coordinates():
    seed, stream, input_id = 11, 101, 2**40 + 3
    u = keyed_uniforms(seed, stream, input_id, 5, 4)
    expected = [(mix64(seed, stream, input_id, j) >> 11) * 2.0**-53 for j in range(5, 9)]
    assert u.tolist() == expected


def test_counts_have_the_models_law_under_gaussian_noise():
    """Per input, the counts are Binomial(n, P(inside)) (exact χ²_N CDF) and agree in law
    with counts drawn through the model with Gaussian noise."""
    model = _ball()
    exact, gaussian = _engines(model)
    x = torch.zeros(40, DIM)
    x[:, 1] = torch.linspace(-0.5, 0.5, 40)
    sigma = np.full(40, 0.25)
    n = 2000
    ids = list(range(40))
    mine = exact.counts(x, sigma, ids, n, stream=1)
    theirs = gaussian.counts(x, sigma, ids, n, stream=1)
    p = model.class_probabilities(x.double().numpy(), sigma)
    assert mine.sum(axis=1).tolist() == [n] * 40
    assert set(np.flatnonzero(mine.sum(axis=0))) <= {1, 3}  # only the model's two classes
    # z-scores of the inside counts against the exact binomial, and against the Gaussian path
    k, q = mine[:, 1], p[:, 1]
    z = (k - n * q) / np.sqrt(n * q * (1 - q))
    assert stats.chi2.sf(float(np.sum(z**2)), len(z)) > 1e-4
    diff = (mine[:, 1] - theirs[:, 1]) / np.sqrt(2 * n * q * (1 - q))
    assert stats.chi2.sf(float(np.sum(diff**2)), len(diff)) > 1e-4


def test_a_sample_depends_on_its_coordinates_alone():
    """Rounds continue the stream; an input in a batch gets what it gets alone."""
    model = LinearClassifier(DIM, one_hot=True, num_classes=3, classes=(0, 2))
    exact, _ = _engines(model)
    x = torch.randn(6, DIM, generator=torch.Generator().manual_seed(0)) * 0.1
    sigma = np.linspace(0.1, 0.6, 6)
    ids = [10, 11, 12, 13, 14, 15]
    whole = exact.counts(x, sigma, ids, 900, stream=3)
    parts = exact.counts(x, sigma, ids, 300, stream=3) + exact.counts(
        x, sigma, ids, 600, stream=3, start=300
    )
    assert (whole == parts).all()
    alone = np.stack([exact.counts(x[i : i + 1], sigma[i : i + 1], ids[i : i + 1], 900, 3)[0]
                      for i in range(6)])  # fmt: skip
    assert (whole == alone).all()
    assert not (whole == exact.counts(x, sigma, ids, 900, stream=4)).all()
    soft = exact.soft_stats(x, sigma, ids, 900, stream=3)
    assert np.allclose(np.stack([s.means for s in soft]) * 900, whole)
    assert exact.padded().counts(x, sigma, ids, 900, stream=3).tolist() == whole.tolist()


def test_noise_out_of_range_is_the_sigma_providers_fault():
    exact, _ = _engines(_ball())
    with pytest.raises(ModelOutputError, match="σ-provider is at fault"):
        exact.counts(torch.zeros(1, DIM), [float("nan")], [0], 10, stream=1)
