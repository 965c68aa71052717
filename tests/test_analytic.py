"""Analytic base classifiers: their exact smoothed probabilities against Monte Carlo, and
their placements per input (check S1 asks σ of many trials at once)."""

import numpy as np
import pytest
import torch
from scipy.stats import binomtest, ncx2, norm

from harness import outputs_for_inputs
from harness.audit.analytic import (
    BallClassifier,
    LinearClassifier,
    PlacementWithheld,
    load_ball_dataset,
)
from harness.engine.precision import PrecisionModel
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


def _placements(model, dim: int, count: int, seed: int):
    """``count`` random placements of ``model`` (planes or balls through the unit cube)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        vector = torch.randn(dim, generator=gen)
        scalar = float(torch.rand((), generator=gen)) + 0.5
        if isinstance(model, LinearClassifier):
            model.set_plane(vector, scalar - 1.0)
        else:
            model.set_ball(0.3 * vector, scalar)
        out.append(model.placement())
    return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("family", [LinearClassifier, BallClassifier])
def test_a_model_with_a_placement_per_input_answers_each_point_with_its_inputs(family, device):
    """Inside ``per_input``, ``outputs_for_inputs`` answers each point as the model placed for
    the input it stands for answers it alone, and ``class_probabilities`` each input with
    its own closed form (SciPy's normal and noncentral χ² CDFs, computed here); a plain
    call, or a point of an input without a placement, raises ``PlacementWithheld``."""
    dim, count = 6, 5
    model = family(dim, one_hot=True, num_classes=4, classes=(3, 1)).to(device)
    placements = _placements(model, dim, count, seed=2)
    inputs = torch.rand(count, dim).to(device)
    points = inputs.repeat_interleave(3, 0) + 0.4 * torch.randn(3 * count, dim).to(device)
    owner = torch.arange(count, device=device).repeat_interleave(3)
    owner[-1] = -1  # a padding row: answered, its output discarded
    sigma = np.linspace(0.2, 0.6, count)
    expected, closed_form = [], []
    for r, k in enumerate(owner.tolist()):
        model.set_placement(placements[max(k, 0)])
        expected.append(model(points[r : r + 1])[0])
    for k, (vector, scalar) in enumerate(placements):
        v, x = vector.double().cpu().numpy(), inputs[k].double().cpu().numpy()
        if family is LinearClassifier:
            side = norm.cdf((x @ v - scalar) / np.linalg.norm(v) / sigma[k])
        else:
            side = ncx2.cdf(scalar**2 / sigma[k] ** 2, dim, np.sum((x - v) ** 2) / sigma[k] ** 2)
        closed_form.append(side)
    with model.per_input(inputs, placements):
        got = outputs_for_inputs(model, points, inputs, owner)
        wrapped = outputs_for_inputs(PrecisionModel(model, "fp32", False), points, inputs, owner)
        probabilities = model.class_probabilities(inputs.cpu().numpy(), sigma)
        with pytest.raises(PlacementWithheld):
            model(points)
        with pytest.raises(PlacementWithheld):
            outputs_for_inputs(model, points, torch.rand(count, dim, device=device), owner)
    assert torch.equal(got.argmax(1), torch.stack(expected).argmax(1))
    assert torch.equal(wrapped, got)
    assert probabilities[:, 1] == pytest.approx(np.array(closed_form), rel=1e-9, abs=1e-12)
    assert probabilities[:, 3] == pytest.approx(1 - np.array(closed_form), rel=1e-9, abs=1e-12)
    model(points)  # placed again outside


def test_outputs_for_inputs_is_the_forward_of_a_model_without_classifiers_per_input():
    model = torch.nn.Linear(4, 3)
    points = torch.randn(6, 4)
    owner = torch.tensor([0, 0, 1, 1, -1, -1])
    assert torch.equal(outputs_for_inputs(model, points, points[:2], owner), model(points))
    rounded = PrecisionModel(model, "bf16", False)  # in the protocol's arithmetic: its forward
    assert torch.equal(outputs_for_inputs(rounded, points, points[:2], owner), rounded(points))
