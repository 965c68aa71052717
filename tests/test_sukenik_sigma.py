"""The kNN σ-provider of Súkeník et al. (2022), eq. (1): exactness and semi-elasticity."""

import math

import numpy as np
import pytest
import torch

from harness.foundation.regularity import SemiElastic
from plugins.sukenik.knn_sigma import TRAIN_CHUNK, KnnSigma, knn_mean_distance, propose_m


def _brute_force(queries, train, k, exclude_self=False):
    d = np.linalg.norm(
        queries.numpy()[:, None, :].astype(np.float64) - train.numpy()[None].astype(np.float64),
        axis=2,
    )
    d.sort(axis=1)
    return d[:, 1 : k + 1].mean(1) if exclude_self else d[:, :k].mean(1)


def test_knn_mean_distance_is_exact_across_chunks():
    gen = torch.Generator().manual_seed(0)
    train = torch.rand(TRAIN_CHUNK + 300, 5, generator=gen)
    queries = torch.rand(17, 5, generator=gen)
    got = knn_mean_distance(queries, train, 7).numpy()
    assert np.allclose(got, _brute_force(queries, train, 7), rtol=1e-12, atol=1e-12)
    own = knn_mean_distance(train[:9], train, 4, exclude_self=True).numpy()
    assert np.allclose(own, _brute_force(train[:9], train, 4, exclude_self=True), rtol=1e-12)


def test_sigma_formula_and_clamp():
    gen = torch.Generator().manual_seed(1)
    train = torch.rand(200, 3, generator=gen)
    x = torch.rand(6, 3, generator=gen) * 4
    provider = KnnSigma(train, sigma_b=0.5, rate=0.3, k=5, m=0.2)
    expected = 0.5 * np.exp(0.3 * (_brute_force(x, train, 5) - 0.2))
    assert np.allclose(provider(x).numpy(), expected, rtol=1e-12)
    assert provider.regularity == SemiElastic(0.3)
    clamped = KnnSigma(train, sigma_b=0.5, rate=0.3, k=5, m=0.2, max_ratio=1.1)(x).numpy()
    assert np.allclose(clamped, np.minimum(expected, 0.55), rtol=1e-12)


def test_propose_m_rules():
    gen = torch.Generator().manual_seed(2)
    train = torch.rand(300, 4, generator=gen)
    d = _brute_force(train, train, 6, exclude_self=True)
    assert propose_m(train, 6, "min", sample=300) == pytest.approx(d.min(), rel=1e-5)
    assert propose_m(train, 6, "median", sample=300) == pytest.approx(np.median(d), rel=1e-3)


@pytest.mark.parametrize("max_ratio", [0.0, 1.05])
def test_semi_elasticity_holds_under_random_pairs_and_gradient_ascent(max_ratio):
    gen = torch.Generator().manual_seed(3)
    rate = 0.2
    train = torch.rand(500, 10, generator=gen)
    provider = KnnSigma(train, 0.5, rate, k=20, m=0.5, max_ratio=max_ratio)
    x0 = torch.rand(32, 10, generator=gen, dtype=torch.float64)
    worst = 0.0
    for scale in (1e-3, 1e-2, 0.1, 1.0, 3.0):
        d = torch.randn(32, 10, generator=gen, dtype=torch.float64)
        x1 = x0 + scale * d / d.norm(dim=1, keepdim=True)
        q = (torch.log(provider(x1)) - torch.log(provider(x0))).abs() / scale
        worst = max(worst, float(q.max()))
    # gradient ascent on the quotient
    x1 = (x0 + 0.05 * torch.randn(32, 10, generator=gen, dtype=torch.float64)).requires_grad_(True)
    s0 = provider(x0).detach()
    for _ in range(50):
        q = (torch.log(provider(x1)) - torch.log(s0)).abs() / (x1 - x0).norm(dim=1)
        worst = max(worst, float(q.detach().max()))
        (g,) = torch.autograd.grad(q.sum(), x1)
        x1 = (
            (x1 + 0.01 * g / g.norm(dim=1, keepdim=True).clamp_min(1e-12))
            .detach()
            .requires_grad_(True)
        )
    assert worst <= rate * (1 + 1e-9)
    assert worst > 0.5 * rate  # the search does reach near the bound (it could fail)
    assert math.isfinite(worst)


def test_proposed_m_is_computed_once_per_run_and_stored_for_later_runs(tmp_path, monkeypatch):
    """m ("min", App. E.1) comes from the run's memo, then from the plugin's artifact
    directory; it equals the brute-force minimum of the sampled mean kNN distances."""
    import dataclasses

    from harness.engine.sampling import SamplingEngine
    from harness.foundation.data import Dataset
    from harness.foundation.progress import Progress
    from harness.foundation.protocol import CertificationProtocol
    from harness.plugin.components import BuildContext, RunMemo
    from plugins import sukenik
    from plugins.sukenik import knn_sigma

    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(knn_sigma, "propose_m", lambda *a: calls.append(a) or propose_m(*a))
    train = torch.rand(40, 3, generator=torch.Generator().manual_seed(1))
    model = torch.nn.Linear(3, 2)
    dataset = Dataset("toy", train, torch.zeros(40, dtype=torch.long), train[:4],
                      torch.zeros(4, dtype=torch.long), 2)  # fmt: skip
    context = BuildContext(
        dataset, model, torch.device("cpu"), 0, CertificationProtocol(n0=10, n=20),
        SamplingEngine(model, 2, torch.device("cpu"), 8, 0), Progress(enabled=False),
        recipe_hash="ab" * 32,
    )  # fmt: skip
    params = {**sukenik.METHOD_DEFAULTS, "k": 3}
    first = sukenik._knn_sigma(context, params).m
    assert first == pytest.approx(_brute_force(train, train, 3, exclude_self=True).min(), rel=1e-5)
    assert sukenik._knn_sigma(dataclasses.replace(context, setting="s2"), params).m == first
    assert len(calls) == 1
    later_run = dataclasses.replace(context, memos=RunMemo())
    assert sukenik._knn_sigma(later_run, params).m == first  # read back bit for bit
    assert len(calls) == 1
    [stored] = (tmp_path / "plugins" / "sukenik" / ("ab" * 32)).iterdir()
    stored.write_text("damaged")
    assert sukenik._knn_sigma(dataclasses.replace(context, memos=RunMemo()), params).m == first
    assert len(calls) == 2


def test_the_float32_screen_finds_the_float64_neighbours(monkeypatch):
    """nearest_exact ranks as a float64 scan of the whole set: on Fashion-like data with
    exact duplicates, and on points so nearly equidistant that the screen's margin fails
    and the query is scanned in float64."""
    from plugins.sukenik import knn_sigma

    gen = torch.Generator().manual_seed(4)
    train = torch.rand(TRAIN_CHUNK + 500, 784, generator=gen)
    train[100:140] = train[7]  # duplicates: ties at equal distance
    queries = torch.cat([train[:3] + 0.01, torch.rand(5, 784, generator=gen)]).double()
    expected = _brute_force(queries, train, 20)
    got = knn_mean_distance(queries, train, 20).numpy()
    assert np.allclose(got, expected, rtol=1e-12, atol=0)
    # a shell of points all within float32 resolution of one distance: the margin fails
    direction = torch.randn(600, 784, generator=gen, dtype=torch.float64)
    centre = torch.full((784,), 0.5, dtype=torch.float64)
    shell = centre + 3.0 * direction / direction.norm(dim=1, keepdim=True)
    shell[:30] = centre + 2.999999 * direction[:30] / direction[:30].norm(dim=1, keepdim=True)
    shell = shell.float()
    sq = (shell.double() ** 2).sum(1)
    fallback = []
    scan = knn_sigma._scan
    monkeypatch.setattr(knn_sigma, "_scan", lambda q, *a: fallback.append(q.dtype) or scan(q, *a))
    best = knn_sigma.nearest_exact(centre[None], shell, sq, 20)
    assert fallback == [torch.float32, torch.float64]  # screened, then scanned in float64
    exact = ((shell.double() - centre) ** 2).sum(1)
    assert torch.equal(exact[best[0]].sort().values, exact.sort().values[:20])
