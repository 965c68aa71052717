"""The sampling engine: reproducible noise, counts, soft statistics, NaN outputs."""

from itertools import pairwise

import numpy as np
import pytest
import torch

from harness.engine.noise import _splitmix64, noise_seed, noise_seeds, splitmix64_array
from harness.engine.noise_schemes import NOISE_BLOCK
from harness.engine.sampling import NOISE_SCHEMES, SamplingEngine
from harness.foundation.errors import ModelOutputError


class RecordingModel(torch.nn.Module):
    """Records every noisy row it sees; predicts the sign of the first coordinate's noise."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[torch.Tensor] = []

    def forward(self, x):
        self.rows.append(x.clone())
        return torch.stack([torch.zeros(len(x)), x[:, 0] - x[:, 0].round()], dim=1)


def _noise_by_input(x, sigma, batch_size, num, ids, order=None, noise="block-v1"):
    """Run the engine and recover each input's noise sequence from the recorded rows."""
    model = RecordingModel()
    engine = SamplingEngine(
        model, 2, torch.device("cpu"), batch_size=batch_size, seed=11, noise=noise
    )
    order = list(range(len(ids))) if order is None else order
    engine.counts(x[order], sigma[order], [ids[i] for i in order], num, stream=1)
    rows = torch.cat(model.rows)
    # inputs are far apart (x_i = 1000·i), so each row belongs to the nearest input
    owner = torch.cdist(rows, x).argmin(dim=1)
    return {ids[i]: (rows[owner == i] - x[i]) / sigma[i] for i in range(len(ids))}


@pytest.mark.slow
@pytest.mark.parametrize("noise", NOISE_SCHEMES)
def test_noise_is_identical_for_any_batch_size_and_batch_composition(noise):
    d, num = 5, 2 * NOISE_BLOCK + 37
    x = torch.arange(4, dtype=torch.float32)[:, None].repeat(1, d) * 1000
    sigma = torch.tensor([0.5, 1.0, 2.0, 0.25])
    ids = [3, 17, 99, 4]
    reference = _noise_by_input(x, sigma, 4096, num, ids, noise=noise)
    for batch_size in (1, 7, 4096):
        got = _noise_by_input(x, sigma, batch_size, num, ids, noise=noise)
        for i in ids:
            assert torch.equal(got[i], reference[i]), (batch_size, i)
    alone = _noise_by_input(x[1:2], sigma[1:2], 7, num, ids[1:2], noise=noise)
    assert torch.equal(alone[17], reference[17])
    shuffled = _noise_by_input(x, sigma, 100, num, ids, order=[2, 0, 3, 1], noise=noise)
    assert all(torch.equal(shuffled[i], reference[i]) for i in ids)
    # different inputs get different noise, and the noise looks standard normal
    assert not torch.equal(reference[3], reference[17])
    pooled = torch.cat(list(reference.values())).flatten()
    assert abs(pooled.mean()) < 0.1 and abs(pooled.std() - 1) < 0.1


@pytest.mark.parametrize("noise", NOISE_SCHEMES)
def test_a_draw_nested_in_a_drawing_engine_leaves_both_draws_as_alone(noise):
    """A certifier or σ-provider drawing on the run's engine between two of the run's
    inputs (here also on another input shape): the run's counts are those of an
    undisturbed run, bit for bit, and the nested draw those of a fresh engine."""

    def engine():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 5))  # fmt: skip
        return SamplingEngine(model.eval(), 5, torch.device("cpu"), batch_size=96, seed=3,
                              noise=noise, pad_batches=True, noise_threads=2)  # fmt: skip

    x = torch.rand(4, 6, generator=torch.Generator().manual_seed(1))
    sigma, ids = [0.2, 0.5, 1.0, 0.3], [10, 11, 12, 13]
    undisturbed = engine().counts(x, sigma, ids, 700, stream=1)
    shared = engine()
    outer = shared.run(x, sigma, ids, 700, 1)
    got = dict([next(outer)])
    nested = {shape: shared.counts(torch.rand(3, *shape, generator=torch.Generator().manual_seed(2)),
                                   [0.4] * 3, [10, 11, 99], 500, stream=1)
              for shape in ((6,), (2, 3))}  # fmt: skip
    got |= dict(outer)
    assert sorted(got) == [0, 1, 2, 3]
    assert np.array_equal(np.stack([got[k] for k in range(4)]), undisturbed)
    for shape, counts in nested.items():
        fresh = engine().counts(torch.rand(3, *shape, generator=torch.Generator().manual_seed(2)),
                                [0.4] * 3, [10, 11, 99], 500, stream=1)  # fmt: skip
        assert np.array_equal(counts, fresh), shape


def test_noise_seed_separates_coordinates():
    seeds = {noise_seed(0, s, i, b) for s in range(2) for i in range(50) for b in range(50)}
    assert len(seeds) == 2 * 50 * 50
    assert all(0 <= s < 2**63 for s in seeds)


def test_splitmix64_gives_vignas_reference_outputs_and_noise_seeds_each_noise_seed():
    """splitmix64 from state 0: its first three outputs in Vigna's reference splitmix64.c
    (0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f), scalar and vectorized;
    ``noise_seeds`` is ``noise_seed`` of every id (64-bit content keys among them)."""
    golden = 0x9E3779B97F4A7C15
    states = [0, golden, (2 * golden) % 2**64]
    reference = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    assert [_splitmix64(z) for z in states] == reference
    assert splitmix64_array(np.array(states, dtype=np.uint64)).tolist() == reference
    ids = [0, 1, 7, 2**63 + 5, 2**64 - 1, 0xDEADBEEF]
    for block in (0, 3, 2**40):
        assert noise_seeds(11, 100, ids, block) == [noise_seed(11, 100, i, block) for i in ids]
    assert noise_seeds(11, 100, [], 0) == []


@pytest.mark.slow
@pytest.mark.parametrize("noise", NOISE_SCHEMES)
def test_counts_agree_across_batch_sizes_up_to_near_ties(noise):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5)
    ).eval()
    x = torch.rand(9, 20)
    sigma = torch.linspace(0.1, 1.0, 9)
    results = [
        SamplingEngine(model, 5, torch.device("cpu"), batch_size=b, seed=2, noise=noise).counts(
            x, sigma, list(range(9)), 300, stream=0
        )
        for b in (1, 7, 4096)
    ]
    for counts in results:
        assert counts.sum(axis=1).tolist() == [300] * 9
        # a float forward pass may flip an argmax at an exact near-tie: allow a handful
        assert np.abs(counts - results[0]).sum() <= 4


def test_counts_match_exact_probability_of_a_linear_classifier(linear_model):
    from scipy.stats import binomtest, norm

    w = torch.zeros(10)
    w[0] = 1.0
    model = linear_model(w, 0.0)
    x = torch.zeros(3, 10)
    x[:, 0] = torch.tensor([0.0, 0.3, -0.5])
    sigma = torch.tensor([1.0, 0.5, 1.0])
    counts = SamplingEngine(model, 2, torch.device("cpu"), seed=5).counts(
        x, sigma, [0, 1, 2], 20000, 1
    )
    for i in range(3):
        p = norm.cdf(float(x[i, 0] / sigma[i]))
        assert binomtest(int(counts[i, 1]), 20000, p).pvalue > 1e-4


def test_soft_statistics_are_probability_sums():
    torch.manual_seed(1)
    model = torch.nn.Linear(6, 3).eval()
    x = torch.rand(4, 6)
    engine = SamplingEngine(model, 3, torch.device("cpu"), batch_size=50, seed=0)
    stats = engine.soft_stats(x, torch.full((4,), 0.3), [0, 1, 2, 3], 300, stream=1)
    for s in stats:
        assert s.num == 300
        assert s.sums.sum() == pytest.approx(300.0)
        assert np.all(s.sums_sq <= s.sums + 1e-12) and np.all(s.sums_sq >= s.sums**2 / 300 - 1e-9)
    # hard counts are the argmax of the same logits: the class with most mass agrees often
    hard = engine.counts(x, torch.full((4,), 0.3), [0, 1, 2, 3], 300, stream=1)
    assert (hard.argmax(1) == np.array([s.sums.argmax() for s in stats])).mean() >= 0.75


def test_nan_model_outputs_are_a_clear_error():
    class NaNModel(torch.nn.Module):
        def forward(self, x):
            return torch.full((len(x), 2), float("nan"))

    engine = SamplingEngine(NaNModel(), 2, torch.device("cpu"), seed=0)
    with pytest.raises(ModelOutputError, match="NaN"):
        engine.counts(torch.zeros(2, 3), [0.5, 0.5], [0, 1], 10, stream=0)


@pytest.mark.gpu
def test_noise_is_identical_for_any_batch_size_on_cuda():
    torch.manual_seed(0)
    model = (
        torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
        .cuda()
        .eval()
    )
    x = torch.rand(9, 20, device="cuda")
    sigma = torch.linspace(0.1, 1.0, 9)
    results = [
        SamplingEngine(model, 5, torch.device("cuda"), batch_size=b, seed=2).counts(
            x, sigma, list(range(9)), 3000, 1
        )
        for b in (7, 4096)
    ]
    assert all(c.sum() == 9 * 3000 for c in results)
    assert np.abs(results[0] - results[1]).sum() <= 4


@pytest.mark.parametrize("noise", NOISE_SCHEMES)
def test_samples_from_a_start_index_are_those_of_one_longer_call(noise):
    """Drawing samples start … start + num − 1 gives those indices the noise (and counts)
    that one call of start + num samples gives them, whatever the batch; rounds that
    cover 0 … N − 1 sum to the counts of one call of N samples."""
    d = 3
    x = torch.arange(3, dtype=torch.float32)[:, None].repeat(1, d) * 1000
    sigma = torch.tensor([0.5, 1.0, 2.0])
    ids = [5, 8, 13]
    total = 2 * NOISE_BLOCK + 91
    whole = _noise_by_input(x, sigma, 64, total, ids, noise=noise)
    model = RecordingModel()
    engine = SamplingEngine(model, 2, torch.device("cpu"), batch_size=37, seed=11, noise=noise)
    bounds = [0, 100, 150, NOISE_BLOCK + 3, total]  # rounds that start inside noise blocks
    for lo, hi in pairwise(bounds):
        engine.counts(x, sigma, ids, hi - lo, stream=1, start=lo)
    rows = torch.cat(model.rows)
    owner = torch.cdist(rows, x).argmin(dim=1)
    for i, key in enumerate(ids):
        assert torch.equal((rows[owner == i] - x[i]) / sigma[i], whole[key])
    engine = SamplingEngine(torch.nn.Linear(d, 4), 4, torch.device("cpu"), batch_size=50,
                            seed=3, noise=noise, pad_batches=True)  # fmt: skip
    one = engine.counts(x / 1000, sigma, ids, total, stream=1)
    rounds = sum(engine.counts(x / 1000, sigma, ids, hi - lo, stream=1, start=lo)
                 for lo, hi in pairwise(bounds))  # fmt: skip
    assert np.array_equal(rounds, one) and one.sum() == 3 * total
    with pytest.raises(ValueError, match="start must be an integer >= 0"):
        engine.counts(x, sigma, ids, 10, stream=1, start=-1)


def test_rounds_resume_the_noise_block_the_last_round_left_part_used(monkeypatch):
    """block-v1: rounds of 100, 10, 11, … samples draw each noise block once (the part-used
    block is kept by the engine for its next call), not once per round."""
    from harness.engine import noise_schemes

    drawn = []
    original = noise_schemes.BlockNoise._draw
    monkeypatch.setattr(noise_schemes.BlockNoise, "_draw",
                        lambda self, key, block: drawn.append(key[1]) or original(self, key, block))  # fmt: skip
    engine = SamplingEngine(torch.nn.Linear(3, 4), 4, torch.device("cpu"), batch_size=50, seed=3,
                            noise="block-v1", pad_batches=True)  # fmt: skip
    x, sigma = torch.zeros(1, 3), torch.tensor([0.5])
    bounds = [0, 100, 110, 121, 134, 148, 163, 180, 198, 218, 240, 264, 291, 321, 600]
    counts = sum(engine.counts(x, sigma, [7], hi - lo, stream=1, start=lo)
                 for lo, hi in pairwise(bounds))  # fmt: skip
    assert sorted(drawn) == [0, 1, 2] and counts.sum() == 600
