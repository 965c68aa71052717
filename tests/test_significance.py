"""Intervals and the paired comparisons of a board, against SciPy and hand computation."""

from __future__ import annotations

import pytest
from scipy import stats

from harness.mathematics.significance import (
    mcnemar_exact,
    mean_interval,
    newcombe_interval,
    paired_comparison,
    paired_difference,
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


def _newcombe_by_hand(a: int, b: int, c: int, d: int) -> tuple[float, float]:
    """Newcombe's (1998) method 10 written out from the paper's formulas: Wilson's score
    interval in closed form, (2k + z² ± z·√(z² + 4k(1 − k/n))) / (2(n + z²)), and φ with
    Newcombe's correction (as in Altman et al. 2000, ch. 6)."""
    import math

    z = stats.norm.ppf(0.975)
    n = a + b + c + d

    def wilson(k):
        centre, half = 2 * k + z * z, z * math.sqrt(z * z + 4 * k * (1 - k / n))
        return (centre - half) / (2 * (n + z * z)), (centre + half) / (2 * (n + z * z))

    p1, p2 = (a + b) / n, (a + c) / n
    (l1, u1), (l2, u2) = wilson(a + b), wilson(a + c)
    big_a = (a + b) * (c + d) * (a + c) * (b + d)
    cross = a * d - b * c
    corrected = cross - n / 2 if cross > n / 2 else (cross if cross < 0 else 0)
    phi = corrected / math.sqrt(big_a) if big_a else 0.0
    low = p1 - p2 - math.sqrt((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2)
    high = p1 - p2 + math.sqrt((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2)
    return low, high


@pytest.mark.parametrize(
    "a, b, c, d",
    [(14, 5, 0, 22),  # Altman et al. 2000, Table 6.2 (Newcombe's paired example)
     (2, 0, 1, 1), (0, 0, 0, 4), (4, 0, 0, 0), (0, 3, 0, 1), (330, 4, 0, 166),
     (170, 90, 80, 160), (481, 2, 7, 10)],
)  # fmt: skip
def test_the_paired_difference_interval_is_newcombes_method_10(a, b, c, d):
    assert newcombe_interval(a, b, c, d) == pytest.approx(_newcombe_by_hand(a, b, c, d), abs=1e-9)
    low, high = newcombe_interval(a, b, c, d)
    assert -1 <= low <= (b - c) / (a + b + c + d) <= high <= 1


def test_altmans_table_6_2_example():
    """Altman et al.'s Table 6.2: 5 pairs discordant one way, none the other, of 41: the
    difference 5/41 = 0.122 and an interval that excludes 0, 0.0115 to 0.2265 (the
    formulas worked by hand)."""
    low, high = newcombe_interval(14, 5, 0, 22)
    assert (round(low, 4), round(high, 4)) == (0.0115, 0.2265)


def test_a_paired_difference_counts_the_discordant_inputs_and_reads_its_interval():
    row = {i: i < 30 for i in range(100)}  # certifies 0-29
    reference = {i: 10 <= i < 30 for i in range(100)}  # certifies 10-29
    d = paired_difference(row, reference, 0.5)
    assert (d.inputs, d.row_only, d.reference_only, d.difference) == (100, 10, 0, 0.1)
    assert (d.low, d.high) == pytest.approx(_newcombe_by_hand(20, 10, 0, 70), abs=1e-9)
    assert d.reading == "above" and d.low > 0
    assert paired_difference(reference, row, 0.5).reading == "below"
    same = paired_difference(row, row, 0.5)  # nothing discordant: 0, in a non-degenerate interval
    assert same.difference == 0 and same.low < 0 < same.high and same.reading == "not separated"
    assert paired_difference(row, {1: True}, 0.5) is None  # other inputs: not paired


@pytest.mark.parametrize("values", [[1.0, 0.0, 1.5, 0.5], [0.2] * 5 + [0.0] * 195,
                                    [0.1 * k for k in range(500)]])  # fmt: skip
def test_the_acr_interval_is_students_t_interval_clipped_at_0(values):
    import statistics

    mean = statistics.fmean(values)
    low, high = stats.t.interval(0.95, len(values) - 1, loc=mean, scale=stats.sem(values))
    assert mean_interval(values) == pytest.approx((max(low, 0.0), high), rel=1e-12, abs=1e-15)
    assert mean_interval([0.3]) is None
