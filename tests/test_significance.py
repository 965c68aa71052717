"""Intervals and the paired test of a board, against SciPy's exact binomial test."""

from __future__ import annotations

import pytest
from scipy import stats

from harness.mathematics.significance import (
    mcnemar_exact,
    paired_comparison,
    proportion_interval,
    widest_half_width,
)


@pytest.mark.parametrize("k, n", [(0, 4), (3, 4), (4, 4), (142, 200), (1, 500), (9999, 10000)])
def test_clopper_pearson_interval_is_scipy_s_exact_interval(k, n):
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    assert proportion_interval(k, n) == pytest.approx((ci.low, ci.high), abs=1e-12)


@pytest.mark.parametrize("b, c", [(0, 0), (1, 0), (3, 0), (0, 7), (5, 5), (12, 3), (40, 61)])
def test_mcnemar_exact_is_a_binomial_test_on_the_discordant_inputs(b, c):
    expected = 1.0 if b + c == 0 else stats.binomtest(min(b, c), b + c, 0.5).pvalue
    assert mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("n", [1, 4, 199, 200])
def test_widest_half_width_over_all_counts(n):
    brute = max((hi - lo) / 2 for lo, hi in (proportion_interval(k, n) for k in range(n + 1)))
    assert widest_half_width(n) == pytest.approx(brute, rel=1e-12)


def test_paired_comparison_counts_discordant_inputs():
    leader = {1: True, 2: True, 3: False, 4: True}
    row = {1: True, 2: False, 3: True, 4: False}
    paired = paired_comparison(leader, row, 0.5)
    assert (paired.leader_only, paired.row_only, paired.inputs) == (2, 1, 4)
    assert paired.p_value == pytest.approx(stats.binomtest(1, 3, 0.5).pvalue) and paired.tie
    assert paired_comparison(leader, {1: True}, 0.5) is None  # other inputs: not paired
    many = {i: True for i in range(30)}
    assert not paired_comparison(many, {i: i >= 20 for i in range(30)}, 0.5).tie  # 20 vs 0
