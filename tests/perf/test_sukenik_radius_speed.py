"""Benchmark: Thm 3.2 certified radius for a CIFAR-sized batch (harness.worstcase).

1000 inputs, dim = 3072, p_A ~ U[0.5, 0.99999], sigma0 = 0.25, semi-elasticity
r = 0.01.  Reports the median wall time per input (target: <= 5 ms on 2 CPU cores).

Run with:  python3 -m pytest tests/perf/test_sukenik_radius_speed.py -m perf -p no:cacheprovider -s
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special as sc

from harness.worstcase import certified_radius

N_INPUTS = 1000
DIM = 3072
SIGMA0 = 0.25
RATE = 0.01
TARGET_MS_PER_INPUT = 5.0


@pytest.fixture(scope="module")
def p_a() -> np.ndarray:
    return np.random.default_rng(2022).uniform(0.5, 0.99999, N_INPUTS)


@pytest.mark.perf
def test_certified_radius_speed_cifar_batch(benchmark, p_a):
    certified_radius(p_a[:8], SIGMA0, RATE, DIM)  # warm caches (quadrature nodes, chi2 window)
    radii = benchmark.pedantic(
        certified_radius, args=(p_a, SIGMA0, RATE, DIM), rounds=5, iterations=1, warmup_rounds=0
    )
    median_s = benchmark.stats.stats.median
    ms_per_input = 1e3 * median_s / N_INPUTS
    benchmark.extra_info["n_inputs"] = N_INPUTS
    benchmark.extra_info["dim"] = DIM
    benchmark.extra_info["median_ms_per_input"] = ms_per_input
    print(
        f"\ncertified_radius: {N_INPUTS} inputs, dim={DIM}, sigma0={SIGMA0}, rate={RATE}: "
        f"median {1e3 * median_s:.1f} ms per batch = {ms_per_input:.3f} ms per input"
    )
    cohen = SIGMA0 * sc.ndtri(p_a)
    assert radii.shape == (N_INPUTS,)
    assert np.all((radii > 0) & (radii <= cohen))
    assert ms_per_input <= TARGET_MS_PER_INPUT


@pytest.mark.perf
def test_certified_radius_speed_single_input(benchmark):
    """Latency of one scalar call (includes all per-call overhead)."""
    r = benchmark(certified_radius, 0.99, SIGMA0, RATE, DIM)
    assert 0 < r <= SIGMA0 * sc.ndtri(0.99)
    print(f"\ncertified_radius single input: median {1e3 * benchmark.stats.stats.median:.2f} ms")
