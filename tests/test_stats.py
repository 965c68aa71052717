"""harness.mathematics.stats against independent SciPy computations."""

import numpy as np
import pytest
from scipy import optimize, stats

from harness.foundation.errors import ParameterError
from harness.mathematics.stats import (
    binomial_pvalue,
    binomial_pvalues,
    clopper_pearson_lower,
    clopper_pearson_lower_array,
    clopper_pearson_upper,
    hoeffding_lower,
)


def _lower_by_root(k: int, n: int, alpha: float) -> float:
    """The p at which P(X >= k | p) = alpha (the definition of the one-sided bound)."""
    return optimize.brentq(
        lambda p: stats.binom.sf(k - 1, n, p) - alpha, 1e-15, 1 - 1e-15, xtol=1e-14
    )


@pytest.mark.parametrize(
    ("k", "n", "alpha"),
    [(1, 10, 0.05), (7, 10, 0.05), (990, 1000, 0.001), (99990, 100000, 0.001), (50, 100, 0.3)],
)
def test_clopper_pearson_lower_matches_binomial_tail_root(k, n, alpha):
    assert clopper_pearson_lower(k, n, alpha) == pytest.approx(
        _lower_by_root(k, n, alpha), abs=1e-10
    )


def test_clopper_pearson_edges():
    assert clopper_pearson_lower(0, 10, 0.05) == 0.0
    # all successes: the bound solves p^n = alpha
    assert clopper_pearson_lower(100, 100, 0.001) == pytest.approx(0.001 ** (1 / 100), rel=1e-12)
    assert clopper_pearson_upper(10, 10, 0.05) == 1.0
    assert clopper_pearson_upper(0, 100, 0.001) == pytest.approx(1 - 0.001 ** (1 / 100), rel=1e-9)


def test_clopper_pearson_array_equals_scalar():
    k = np.array([0, 3, 50, 100])
    got = clopper_pearson_lower_array(k, np.full(4, 100), 0.01)
    assert got.tolist() == [clopper_pearson_lower(int(i), 100, 0.01) for i in k]


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, 2.0])
def test_alpha_outside_unit_interval_is_rejected(alpha):
    with pytest.raises(ParameterError, match="alpha must lie in"):
        clopper_pearson_lower(5, 10, alpha)


def test_binomial_pvalue_matches_exact_two_sided_sum():
    for k, n in [(60, 100), (40, 100), (8, 10), (500, 1000)]:
        pmf = stats.binom.pmf(np.arange(n + 1), n, 0.5)
        exact = pmf[pmf <= pmf[k] * (1 + 1e-7)].sum()
        assert binomial_pvalue(k, n) == pytest.approx(min(exact, 1.0), rel=1e-9)
    assert binomial_pvalue(0, 0) == 1.0


def test_vectorized_binomial_pvalues_are_scipys_binomtest():
    rng = np.random.default_rng(0)
    n = np.concatenate([np.arange(1, 40), rng.integers(40, 200_000, 60)])
    k = np.array([rng.integers(0, m + 1) for m in n])
    k[:39] = n[:39] // 2  # the middle (p = 1), and its neighbours below
    expected = [stats.binomtest(int(a), int(b), 0.5).pvalue for a, b in zip(k, n, strict=True)]
    assert np.allclose(binomial_pvalues(k, n), expected, rtol=1e-9, atol=1e-300)
    assert binomial_pvalues(np.array([0, 3]), np.array([0, 3])).tolist() == [1.0, 0.25]


def test_hoeffding_bound_is_never_tighter_than_clopper_pearson_for_bernoulli():
    for k in (10, 500, 990):
        n, alpha = 1000, 0.001
        assert hoeffding_lower(k / n, n, alpha) <= clopper_pearson_lower(k, n, alpha)
