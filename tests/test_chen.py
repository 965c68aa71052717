"""Insta-RS σ search (Súkeník et al. 2022, App. C.3, Alg. 2) and its certificates."""

import math
import sqlite3
import tomllib

import numpy as np
import pytest
import torch
from scipy import stats

from harness import cohen_radius
from harness.engine.sampling import SamplingEngine
from harness.foundation.errors import ParameterError
from harness.foundation.progress import Progress
from harness.foundation.regularity import Unregularized
from harness.plugin.manager import PluginManager
from harness.running.benchmark import parse_benchmark
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark
from plugins.chen.config import SEARCH_DEFAULTS, SearchConfig
from plugins.chen.search import (
    STEP_STRIDE,
    STREAM_SEARCH,
    InstanceSigma,
    draw_starts,
    empirical_radius,
    input_keys,
    search_sigma,
)

CPU = torch.device("cpu")


class Ball(torch.nn.Module):
    """f(x) = [‖x‖ <= 1] as two logits (0, 1 − ‖x‖): class 1 is "inside"."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        margin = 1.0 - x.flatten(1).norm(dim=1)
        return torch.stack([torch.zeros_like(margin), margin], dim=1)


def _config(**overrides) -> SearchConfig:
    return SearchConfig.from_params({**SEARCH_DEFAULTS, **overrides})


def _engine(model, classes=2, batch_size=4096, seed=0) -> SamplingEngine:
    return SamplingEngine(model.eval(), classes, CPU, batch_size=batch_size, seed=seed)


def _mlp(d=20, classes=3) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(d, 16), torch.nn.ReLU(), torch.nn.Linear(16, classes)
    ).eval()


def _on_line(distances, dim=2) -> torch.Tensor:
    """Points d·e_1 (+ a tiny distinct offset along e_2 so that every input is unique)."""
    x = torch.zeros(len(distances), dim)
    x[:, 0] = torch.as_tensor(np.asarray(distances), dtype=torch.float32)
    return x


def _reference_sigma(engine, x_one, config, seed) -> float:
    """Alg. 2 transcribed literally for one input (no batching), on the same noise."""
    key = input_keys(x_one[None])[0]
    levels, steps = draw_starts(config, seed, key)
    m = config.num_samples

    def radius(level, k, j):
        sigma = math.sqrt(level) * config.sigma0
        counts = engine.counts(x_one[None], [sigma], [key], m, STREAM_SEARCH + k * STEP_STRIDE + j)
        e_a = min(counts.max() / m, 1 - 1 / (2 * m))
        return sigma * stats.norm.ppf(e_a)

    finals, radii = [], []
    for k in range(config.num_starts):
        level, s = float(levels[k]), float(steps[k])
        m_k = radius(level, k, 0)
        j = 1
        while j <= config.max_steps and 1 <= level + s <= config.max_level:
            r_new = radius(level + s, k, j)
            if r_new >= m_k:
                level, m_k = level + s, r_new
                j += 1
            else:
                break
        finals.append(level)
        radii.append(m_k)
    return math.sqrt(finals[int(np.argmax(radii))]) * config.sigma0


@pytest.mark.parametrize("base", ["mlp", "linear"])
def test_batched_search_equals_the_literal_one_input_algorithm(base, linear_model):
    config = _config(num_samples=64, num_starts=3, max_steps=6)
    if base == "mlp":  # 3 classes, untrained: the top class changes between evaluations
        engine = _engine(_mlp(), classes=3, batch_size=700)
        x = torch.rand(8, 20, generator=torch.Generator().manual_seed(0)) * 2
    else:  # flat and increasing radii: many accepted steps
        engine = _engine(linear_model(torch.tensor([1.0, 0.0]), 0.0), batch_size=700)
        x = _on_line(np.linspace(0.1, 3.0, 12))
        x[:, 1] = 0.5
    result = search_sigma(engine, x, config, seed=5)
    assert result.steps.sum() >= 5
    single = [_reference_sigma(engine, x[i], config, seed=5) for i in range(len(x))]
    assert result.sigma == pytest.approx(single, rel=1e-12)


def test_reproducible_and_independent_of_batching():
    model = _mlp()
    config = _config(num_samples=50, num_starts=3, max_steps=5)
    x = torch.rand(10, 20) * 2
    first = InstanceSigma(_engine(model, 3, batch_size=1024), config, seed=1)(x)
    again = InstanceSigma(_engine(model, 3, batch_size=1024), config, seed=1)(x)
    assert torch.equal(first, again)
    # other batch size, other batch composition and order: the same σ(x) per input
    other = InstanceSigma(_engine(model, 3, batch_size=37), config, seed=1)
    order = torch.randperm(10, generator=torch.Generator().manual_seed(0))
    shuffled = torch.cat([other(x[order[:3]]), other(x[order[3:]])])
    assert torch.equal(shuffled, first[order])
    # another seed draws other starts and other noise
    assert not torch.equal(InstanceSigma(_engine(model, 3), config, seed=2)(x), first)


@pytest.mark.parametrize("sampling", ["uniform", "stratified"])
def test_sigma_stays_in_sigma0_to_sqrt_t_sigma0(sampling):
    sigma0, t = 0.3, 9.0
    config = _config(
        sigma=sigma0, max_level=t, start_level_max=t, num_samples=40, start_sampling=sampling
    )
    x = torch.rand(40, 20) * 3
    provider = InstanceSigma(_engine(_mlp(), 3), config, seed=0)
    sigma = provider(x)
    assert isinstance(provider.regularity, Unregularized)
    assert sigma.dtype == torch.float64 and sigma.shape == (40,)
    assert bool((sigma >= sigma0 * (1 - 1e-12)).all() and (sigma <= math.sqrt(t) * sigma0).all())
    result = provider.last
    assert ((result.start_level >= 1) & (result.start_level <= t)).all()
    assert (np.abs(result.step) <= 1).all()
    assert ((result.level >= 1) & (result.level <= t)).all()
    assert len(np.unique(result.sigma)) > 10  # σ really varies per input


def test_starts_follow_the_documented_sampling():
    uniform = _config(num_starts=4000)
    levels, steps = draw_starts(uniform, seed=0, key=123)
    assert stats.kstest(levels, stats.uniform(1, 15).cdf).pvalue > 1e-3
    assert stats.kstest(steps, stats.uniform(-1, 2).cdf).pvalue > 1e-3
    strat = _config(num_starts=8, start_sampling="stratified")
    levels, steps = draw_starts(strat, seed=0, key=123)
    edges = 1 + 15 * np.arange(9) / 8
    assert ((levels >= edges[:-1]) & (levels < edges[1:])).all()  # one start per stratum
    assert (steps[::2] > 0).all() and (steps[1::2] < 0).all()
    assert levels.tolist() == draw_starts(strat, seed=0, key=123)[0].tolist()
    assert levels.tolist() != draw_starts(strat, seed=0, key=124)[0].tolist()


def test_empirical_radius_is_sigma_times_probit_of_clamped_top_frequency():
    counts = np.array([[500, 0, 0], [300, 150, 50], [100, 120, 280]])
    sigma = np.array([0.5, 1.0, 2.0])
    expected = sigma * stats.norm.ppf([1 - 1 / 1000, 0.6, 0.56])
    assert empirical_radius(counts, sigma, 500) == pytest.approx(expected, rel=1e-12)
    assert np.isfinite(empirical_radius(counts, sigma, 500)).all()


def test_hill_climbing_on_a_strictly_increasing_radius(linear_model):
    # far from a linear boundary every sample has the same class: Ê_A is clamped and
    # R = √l·σ0·Φ⁻¹(1 − 1/(2M)) grows with l, so a start with s > 0 climbs until the
    # next step would leave [1, T] (or max_steps is reached), and one with s < 0
    # stops at once; σ(x) is the σ of the highest final l.
    config = _config(num_starts=5, num_samples=20, max_steps=12)
    x = _on_line([50.0, 60.0, 70.0])
    result = search_sigma(_engine(linear_model(torch.tensor([1.0, 0.0]), 0.0)), x, config, seed=3)
    for i in range(len(x)):
        finals = []
        for level, s in zip(result.start_level[i], result.step[i], strict=True):
            steps = 0
            while s > 0 and steps < config.max_steps and level + s <= config.max_level:
                level, steps = level + s, steps + 1
            finals.append(level)
        assert result.level[i] == pytest.approx(finals, rel=1e-12)
        assert result.sigma[i] == pytest.approx(math.sqrt(max(finals)) * config.sigma0)


def test_on_a_linear_classifier_sigma_grows_with_distance_from_the_boundary(linear_model):
    # Exactly, Ê_A = Φ(d/σ): R(σ) = d is flat while Φ(d/σ) < 1 − 1/(2M), and
    # R = σ·Φ⁻¹(1 − 1/(2M)) ≈ 3.09σ grows with σ once d/σ > 3.09. Far points must
    # therefore climb to σ ≈ √T·σ0, points at moderate distance wander on a flat
    # (noisy) radius. (Right at the boundary the max over classes biases the noisy R
    # upwards with σ as well, so σ is large there too: the comparison starts at d = 0.5.)
    config = _config(num_samples=200)
    distances = np.repeat([0.5, 1.0, 2.0, 4.0], 16)
    x = _on_line(distances)
    x[:, 1] = torch.arange(len(x)) * 0.01  # distinct inputs, same distance to x_1 = 0
    sigma = search_sigma(_engine(linear_model(torch.tensor([1.0, 0.0]), 0.0)), x, config, 0).sigma
    moderate = sigma[distances <= 1.0].mean()
    far, farthest = sigma[distances == 2.0].mean(), sigma[distances == 4.0].mean()
    assert farthest > 0.95 * math.sqrt(config.max_level) * config.sigma0
    assert farthest > far + 0.05 > moderate + 0.1
    assert stats.spearmanr(distances, sigma).statistic > 0.5


def _ball_violations(distances, sigma):
    """Pairs (i, j) on a line through 0 with |d_i − d_j| < R_i and different exact predictions.

    Exact smoothed probability of "inside" at x with its own σ(x): the noncentral χ²
    CDF; the claimed radius is Cohen's formula at σ(x) with the exact p_A.
    """
    p_in = stats.ncx2.cdf(1 / sigma**2, 2, distances**2 / sigma**2)
    prediction = (p_in > 0.5).astype(int)
    radius = cohen_radius(np.maximum(p_in, 1 - p_in), sigma)
    gap = np.abs(distances[:, None] - distances[None, :])
    claimed = (gap < radius[:, None]) & (prediction[:, None] != prediction[None, :])
    return np.argwhere(claimed), prediction, radius


def test_ball_classifier_has_a_point_inside_a_claimed_radius_predicted_differently():
    distances = np.linspace(0.0, 2.0, 41)
    x = _on_line(distances)
    engine = _engine(Ball())
    provider = InstanceSigma(engine, _config(), seed=0)  # the method's defaults
    sigma = provider(x).numpy()
    pairs, prediction, radius = _ball_violations(distances, sigma)
    assert len(pairs) > 0
    # e.g. a point far outside gets σ near √T·σ0 and a radius that reaches a point
    # inside whose own small σ keeps its exact smoothed prediction "inside"
    i, j = max(pairs, key=lambda p: distances[p[0]])
    assert prediction[i] == 0 and prediction[j] == 1 and distances[i] > 1.0 > distances[j]
    assert np.linalg.norm(x[i] - x[j]) < radius[i]
    assert sigma[i] > 2 * sigma[j]
    # control: the same detector finds nothing when the search is pinned to σ0 (T = 1):
    # Cohen's radius at a constant σ is exact-sound
    pinned = InstanceSigma(engine, _config(max_level=1.0, start_level_max=1.0), seed=0)
    assert len(_ball_violations(distances, pinned(x).numpy())[0]) == 0


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("sigma", 0.0),
        ("num_starts", 0),
        ("num_samples", 2.5),
        ("max_level", 0.5),
        ("start_level_max", 20.0),
        ("max_step_size", -1.0),
        ("start_sampling", "sobol"),
        ("max_steps", -1),
    ],
)
def test_invalid_parameters_are_rejected_before_any_work(key, value):
    manager = PluginManager(third_party=False)
    method = manager.registry.get("methods", "chen-fgss")
    with pytest.raises(ParameterError, match=key if key != "start_level_max" else "start_level"):
        method.check({**method.defaults, key: value})


BALL_RUN = """
name = "chen-ball"
seed = 0
shard_size = 16

[dataset]
name = "ball-2"
test_every = 2
test_count = 64

[model]
architecture = "ball-2"
trainer = "none"

[certification]
n0 = 50
n = 1000
alpha = 0.001
batch_size = 1024

[[methods]]
name = "chen-fgss"
settings = [{ num_samples = 200 }]

[[methods]]
name = "cohen"
settings = [{ sigma = 0.25 }]
"""


def test_runs_next_to_cohen_and_its_certificates_are_violated_on_the_ball(tmp_path):
    manager = PluginManager(third_party=False)
    spec = parse_benchmark(tomllib.loads(BALL_RUN))
    db = tmp_path / "r.sqlite"
    run_id = run_benchmark(spec, RunOptions(db=db), Progress(enabled=False), manager)
    dataset = manager.registry.get("datasets", "ball-N").load(dim=2, seed=0)
    with sqlite3.connect(db) as con:
        rows = con.execute(
            "SELECT method, input_id, prediction, radius, sigma FROM certificates WHERE run_id = ?",
            (run_id,),
        ).fetchall()

    def violations(method):
        mine = [r for r in rows if r[0] == method]
        assert len(mine) == 64
        ids = [r[1] for r in mine]
        x = dataset.test_x[ids].double().numpy()
        sigma = np.array([r[4] for r in mine])
        # exact smoothed prediction of each input at its own σ(x)
        p_in = stats.ncx2.cdf(1 / sigma**2, 2, (x**2).sum(1) / sigma**2)
        exact = (p_in > 0.5).astype(int)
        dist = np.linalg.norm(x[:, None] - x[None, :], axis=2)
        claimed = np.array([r[2] for r in mine])
        radius = np.array([r[3] for r in mine])
        # input j inside the certified ball of input i, exactly predicted otherwise
        bad = (
            (claimed[:, None] >= 0)
            & (dist < radius[:, None])
            & (exact[None, :] != claimed[:, None])
        )
        return int(bad.sum()), sigma

    chen_bad, chen_sigma = violations("chen-fgss")
    cohen_bad, cohen_sigma = violations("cohen")
    assert chen_sigma.min() >= 0.25 - 1e-12 and chen_sigma.max() <= 1.0 + 1e-12
    assert chen_sigma.std() > 0.1 and np.all(cohen_sigma == 0.25)
    assert chen_bad > 0 and cohen_bad == 0


def test_registering_the_plugin_imports_neither_torch_nor_scipy():
    import subprocess
    import sys

    code = "import sys, plugins.chen; print('torch' in sys.modules or 'scipy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class _ShapeRecorder(torch.nn.Module):
    """The base model, recording how many rows each forward pass receives."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model, self.rows = model, []

    def forward(self, x):
        self.rows.append(len(x))
        return self.model(x)


def test_a_padded_engine_forwards_full_batches_and_counts_the_same():
    torch.manual_seed(1)
    base = torch.nn.Sequential(torch.nn.Linear(30, 40), torch.nn.ReLU(), torch.nn.Linear(40, 4))
    recorder = _ShapeRecorder(base.eval())
    plain = SamplingEngine(recorder, 4, CPU, batch_size=96, seed=3)
    x = torch.rand(5, 30, generator=torch.Generator().manual_seed(2))
    expected = plain.counts(x, [0.3] * 5, [10, 11, 12, 13, 14], 70, 1)
    assert set(recorder.rows) != {96}  # 350 samples: the last batch is partial
    recorder.rows.clear()
    padded = plain.padded()
    np.testing.assert_array_equal(
        padded.counts(x, [0.3] * 5, [10, 11, 12, 13, 14], 70, 1), expected
    )
    assert set(recorder.rows) == {96}


def test_chen_sigma_is_bit_identical_whatever_the_inputs_searched_with_it():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 200), torch.nn.ReLU(), torch.nn.Linear(200, 10)
    )
    engine = SamplingEngine(model.eval(), 10, CPU, batch_size=256, seed=0).padded()
    config = _config(num_samples=50, num_starts=2, max_steps=4)
    x = torch.rand(9, 784, generator=torch.Generator().manual_seed(3))
    alone = [search_sigma(engine, x[i : i + 1], config, seed=1).sigma[0] for i in (0, 4)]
    together = search_sigma(engine, x, config, seed=1).sigma
    shuffled = search_sigma(engine, x.flip(0)[2:], config, seed=1).sigma  # x[6], ..., x[0]
    assert [together[0], together[4]] == alone
    assert [shuffled[6], shuffled[2]] == alone
