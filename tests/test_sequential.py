"""Sequential CERTIFY (issue 33): the anytime-valid bound, the stopping rule, the rounds the
harness draws, S0's re-derivation of the looks, the refusals, and the spec's checks."""

import json
import subprocess
import sys
from dataclasses import replace

import mpmath as mp
import numpy as np
import pytest
import torch
from scipy import stats
from scipy.special import ndtr

from harness.audit.evidence import Declaration, rederive
from harness.certification.certify import HardSmoothingCertifier, certify_drawn
from harness.engine.draws import Claim, Draws
from harness.engine.sampling import STREAM_ESTIMATION, SamplingEngine
from harness.foundation.errors import ContractError, IdrsError, ParameterError
from harness.foundation.protocol import CertificationProtocol
from harness.foundation.regularity import Constant, SemiElastic
from harness.mathematics import sequential
from harness.mathematics.crossing import crossing_probability, worst_crossing
from harness.mathematics.radius import COHEN, SUKENIK, RadiusFormula, cohen_recompute
from harness.mathematics.sequential import SequentialRule
from harness.mathematics.stats import clopper_pearson_lower_array as cp_lower
from harness.mathematics.stats import clopper_pearson_upper_array as cp_upper
from harness.mathematics.worstcase import certified_radius, semi_elastic_threshold
from harness.running.benchmark import DEFAULT_BENCHMARK, load_benchmark
from plugins.cohen.certifier import CohenCertifier

GRID = (0.0, 0.25, 0.5, 0.75, 1.0)


def test_schedule_is_geometric_and_a_single_look_is_clopper_pearson_at_alpha():
    rule = SequentialRule(100_000, GRID)
    looks = rule.looks
    assert looks[0] == 100 and looks[-1] == 100_000
    assert np.all(looks[1:-1] == np.ceil(np.round(1.1 * looks[:-2], 6))) and looks[1] == 110
    assert looks[-1] / looks[-2] >= 1.1  # no look just before n_max
    one = SequentialRule(105, GRID)
    assert one.looks.tolist() == [105]
    assert one.look_bounds(80, 0, 1e-3) == pytest.approx(stats.beta.ppf(1e-3, 80, 26), rel=1e-12)


def test_clopper_pearson_bounds_match_scipy_exact_interval():
    """The last look's bound is at least the one-sided exact (Clopper–Pearson) bound at
    α/2: that of SciPy's two-sided exact interval at twice the level."""
    for k, n, a in [(0, 50, 0.01), (37, 50, 0.01), (50, 50, 0.001), (9_990, 10_000, 1e-4)]:
        interval = stats.binomtest(k, n).proportion_ci(confidence_level=1 - 2 * a, method="exact")
        assert float(cp_lower(k, n, a)) == pytest.approx(interval.low, rel=1e-9, abs=1e-300)
        assert float(cp_upper(k, n, a)) == pytest.approx(interval.high, rel=1e-9)
    rule = SequentialRule(10_000, GRID)
    assert rule.look_bounds(9_990, len(rule.looks) - 1, 2e-4) >= cp_lower(9_990, 10_000, 1e-4)


def _log_mixture(k, n, t, a=1.0, b=0.0625):
    """log M_n(t) of the beta-binomial mixture, in mpmath at 50 digits."""
    mp.mp.dps = 50
    k, n, t = mp.mpf(k), mp.mpf(n), mp.mpf(t)
    return (mp.log(mp.beta(a + k, b + n - k)) - mp.log(mp.beta(a, b)) - k * mp.log(t)
            - (n - k) * mp.log(1 - t))  # fmt: skip


@pytest.mark.parametrize(("k", "n"), [(7, 10), (900, 1_000), (5_000, 5_000), (99_000, 100_000),
                                      (288_489, 288_489)])  # fmt: skip
def test_mixture_bound_is_where_robbins_martingale_reaches_one_over_alpha(k, n):
    """The confidence sequence's lower end: M_n (mpmath's, not the code's) excludes the
    bound, and a relative 10⁻⁹ of the gap to 1 above it is within the rounding margin."""
    alpha = 1e-3
    lower = float(sequential.mixture_lower(k, n, alpha))
    assert _log_mixture(k, n, lower) >= mp.log(1 / alpha)
    above = lower + 1e-9 * (1 - lower)
    assert _log_mixture(k, n, above) < mp.log(1 / alpha) + 2 * sequential.MARGIN
    assert np.all(np.diff(sequential.mixture_lower(np.arange(n // 2, n + 1, max(1, n // 50)),
                                                   n, alpha)) >= 0)  # fmt: skip


def test_crossing_probability_matches_monte_carlo():
    """The exact dynamic programme against 40,000 simulated count paths (a large α, so
    that the crossing is frequent enough to estimate)."""
    rule = SequentialRule(600, GRID)
    alpha, p = 0.3, 0.8
    exact = crossing_probability(rule, alpha, p)
    rng = np.random.default_rng(0)
    steps = np.diff(np.concatenate([[0], rule.looks]))
    counts = np.cumsum(rng.binomial(steps, p, size=(40_000, len(steps))), axis=1)
    crossed = (rule.bounds(counts, alpha)[:, -1] > p).mean()
    assert abs(crossed - exact) < 4 * np.sqrt(exact * (1 - exact) / 40_000)
    assert 0.02 < exact < 0.3  # the bound holds, and the check is not trivial


CROSSING_POINTS = 1 - np.geomspace(0.5, 1e-4, 40)


def test_the_rule_is_anytime_valid():
    valid = worst_crossing(SequentialRule(2_500, GRID), 1e-3, CROSSING_POINTS)
    assert valid["ratio_to_alpha"] <= 1.0


@pytest.mark.usefixtures("naive_sequential_rule")
def test_a_plain_clopper_pearson_bound_at_every_look_is_not_anytime_valid():
    naive = worst_crossing(SequentialRule(2_500, GRID), 1e-3, CROSSING_POINTS)
    assert naive["ratio_to_alpha"] > 2.0


def test_stopping_rule_for_agreeing_samples_stops_at_the_first_look_certifying_the_top():
    """Every sample agreeing at σ = 0.5: the top radius 1.0 needs p >= Φ(2); the input
    stops at the first look where Robbins' mixture (in mpmath) excludes Φ(2) at α/2."""
    rule = SequentialRule(100_000, GRID)
    sigma = np.array([0.5])
    thresholds = ndtr(np.array([[0.25, 0.5, 0.75, 1.0]]) / sigma[:, None])
    target = mp.log(2 / mp.mpf("1e-3"))
    expected = next(k for k, n in enumerate(rule.looks.tolist())
                    if _log_mixture(n, n, ndtr(2.0)) >= target)  # fmt: skip
    for k, n in enumerate(rule.looks):
        bound = rule.bounds(np.array([rule.looks[: k + 1]]), 1e-3)[:, -1]
        if rule.stops(k, np.array([n]), bound, thresholds, 1e-3)[0]:
            break
    assert k == expected and rule.looks[k] < 1.25 * np.log(1e3) / -np.log(ndtr(2.0))


def test_stopping_rule_decides_abstention_early_and_runs_near_a_threshold():
    rule = SequentialRule(100_000, GRID)
    thresholds = ndtr(np.array([[0.25, 0.5, 0.75, 1.0]]) / 0.25)
    # a third of 1,000 samples agree: p_A < 1/2 is plain, nothing can be certified
    k = int(np.searchsorted(rule.looks, 1_000))
    n = int(rule.looks[k])
    bound = rule.bounds(np.array([[0] * k + [n // 3]]), 1e-3)[:, -1]
    assert rule.stops(k, np.array([n // 3]), bound, thresholds, 1e-3)[0]
    # p̂ just above Φ(1) (radius 0.25 at σ = 0.25): undecided after 1,000 samples
    count = int(np.ceil(n * (ndtr(1.0) + 0.002)))
    bound = rule.bounds(np.array([[0] * k + [count]]), 1e-3)[:, -1]
    assert not rule.stops(k, np.array([count]), bound, thresholds, 1e-3)[0]


def test_semi_elastic_threshold_is_where_the_radius_of_thm_3_2_reaches_the_grid():
    radii = np.array([0.25, 0.5, 0.75])
    sigma = np.array([0.25, 0.3, 0.5])
    assert np.array_equal(semi_elastic_threshold(radii, sigma, 0.0, 784), ndtr(radii / sigma))
    t = semi_elastic_threshold(radii, sigma, 0.01, 784)
    assert np.all(t > ndtr(radii / sigma))  # Thm B.6: never above Cohen's radius
    at = certified_radius(t, sigma, 0.01, 784)
    below = certified_radius(1 - (1 - t) * (1 + 1e-6), sigma, 0.01, 784)
    assert np.all(at >= radii * (1 - 1e-8)) and np.all(below < radii)


def test_sukenik_thresholds_are_the_same_one_at_a_time_as_in_a_batch():
    """Each σ is solved on its own and remembered: S1 certifies trials one at a time, S0
    re-derives a run's stops in one batch, and both must see the same thresholds."""
    from harness.mathematics import radius

    radii, regularity = [0.25, 0.5, 0.75, 1.0], SemiElastic(0.01)
    sigma = np.array([0.2, 0.25, 0.31, 0.25])
    radius._SEMI_ELASTIC_ROWS.clear()
    batch = radius.sukenik_threshold(radii, sigma, 784, regularity)
    single = np.vstack([semi_elastic_threshold(np.array(radii)[None, :], s, 0.01, 784)
                        for s in sigma])  # fmt: skip
    assert np.array_equal(batch, single) and np.array_equal(batch[1], batch[3])
    assert np.array_equal(
        radius.sukenik_threshold(radii, sigma[::-1], 784, regularity), batch[::-1]
    )
    assert len(radius._SEMI_ELASTIC_ROWS) == 3


def _protocol(n_max=20_000, **kw):
    """A protocol of the ``mixture-cs-v2`` rule (earlier runs'; the grid-place rule's own
    tests are tests/test_gridplace.py)."""
    kw.setdefault("rule", "mixture-cs-v2")
    return CertificationProtocol(n0=100, n=n_max, alpha=1e-3, batch_size=500, noise="philox-v1",
                                 sampling="sequential", grid=GRID, **kw)  # fmt: skip


def test_rounds_are_the_fixed_runs_first_samples_and_s0_rederives_them(half_space):
    engine = SamplingEngine(half_space.model, 2, torch.device("cpu"), 500, seed=5, noise="philox-v1",
                            pad_batches=True)  # fmt: skip
    protocol = _protocol()
    x, ids, sigma = half_space.inputs()
    certs = list(certify_drawn(engine, protocol, CohenCertifier(), x, ids, sigma,
                               regularity=Constant(0.5)))  # fmt: skip
    assert sorted(c.input_id for c in certs) == ids  # yielded as each stops
    certs.sort(key=lambda c: c.input_id)
    rule = SequentialRule(protocol.n_max, GRID)
    for c, i in zip(certs, range(len(ids)), strict=True):
        base = c.draws["base"]
        n = base["n"]
        assert [look["n"] for look in base["looks"]] == rule.looks[: len(base["looks"])].tolist()
        fixed = engine.counts(x[i : i + 1], sigma[i : i + 1], [ids[i]], n, STREAM_ESTIMATION)[0]
        assert base["estimation"] == fixed.tolist()  # the fixed run's first n samples
    samples = [c.draws["base"]["n"] for c in certs]
    assert samples[0] < 2_000 and samples[1] < 2_000  # every sample agrees: decided early
    assert samples[-1] > 2_000  # the input at the radius-0.25 threshold needs more
    rows = [vars(c) for c in certs]
    declaration = Declaration(COHEN, Constant(0.5), "hard")
    result = rederive(rows, x, protocol, declaration, exact=True)
    assert result.verdict == "sound", result.summary
    # the fixed-n certificate from the same counts is never smaller than the sequential one
    fixed_rows = [{**r, "draws": {"base": {k: v for k, v in r["draws"]["base"].items()
                                           if k not in ("looks", "rule")}}} for r in rows]  # fmt: skip
    fixed = cohen_recompute(fixed_rows, x, replace(protocol, sampling="fixed", n_max=None,
                                                   grid=None, rule=None), None)  # fmt: skip
    assert np.all(fixed.bound >= np.array([c.p_lower for c in certs]) - 1e-12)


def _tampered(rows, edit):
    out = json.loads(json.dumps(rows))
    edit(out)
    return out


def test_s0_catches_looks_that_do_not_follow_the_rule(half_space):
    engine = SamplingEngine(
        half_space.model, 2, torch.device("cpu"), 500, seed=5, noise="philox-v1"
    )
    protocol = _protocol()
    x, ids, sigma = half_space.inputs()
    rows = sorted((vars(c) for c in certify_drawn(engine, protocol, CohenCertifier(), x, ids,
                                                  sigma, regularity=Constant(0.5))),
                  key=lambda r: r["input_id"])  # fmt: skip
    declaration = Declaration(COHEN, Constant(0.5), "hard")

    def truncate(rows):  # stop one look early
        base = rows[-1]["draws"]["base"]
        base["looks"] = base["looks"][:-1]
        base["estimation"] = base["looks"][-1]["counts"]
        base["n"] = base["looks"][-1]["n"]

    def pad(rows):  # a look's count raised
        look = rows[1]["draws"]["base"]["looks"][0]
        look["counts"] = [look["counts"][0] - 1, look["counts"][1] + 1]

    def other_rule(rows):
        rows[0]["draws"]["base"]["rule"]["final_share"] = 0.9

    for edit, quantity in ((truncate, "looks"), (pad, "looks"), (other_rule, "rule")):
        result = rederive(_tampered(rows, edit), x, protocol, declaration)
        assert result.verdict == "violated" and result.evidence["first"]["quantity"] == quantity


class _OwnBound(HardSmoothingCertifier):
    """A certifier that computes Clopper–Pearson itself at the final counts."""

    radius_formula = COHEN

    def radius(self, p_lower, sigma):
        return sigma * stats.norm.ppf(p_lower)

    def certify(self, evidence):
        top = np.argmax(evidence.base.selection, axis=1)
        n = evidence.base.estimation.sum(axis=1)
        k = evidence.base.estimation[np.arange(len(top)), top]
        bound = stats.beta.ppf(evidence.alpha, np.maximum(k, 1), n - np.maximum(k, 1) + 1)
        return [Claim(int(t) if b > 0.5 else -1, float(self.radius(b, s)) if b > 0.5 else 0.0,
                      float(b)) for t, b, s in zip(top, bound, evidence.sigma, strict=True)]  # fmt: skip


def test_a_certifier_with_its_own_bound_or_formula_is_refused_by_name(half_space):
    engine = SamplingEngine(
        half_space.model, 2, torch.device("cpu"), 500, seed=5, noise="philox-v1"
    )
    x, ids, sigma = half_space.inputs()
    with pytest.raises(
        ContractError, match=r"certifier .own. claimed the bound .* computes its own"
    ):
        list(certify_drawn(engine, _protocol(), _OwnBound(), x, ids, sigma, label="certifier 'own'",
                           regularity=Constant(0.5)))  # fmt: skip

    class NoThreshold(CohenCertifier):
        radius_formula = RadiusFormula("plain", cohen_recompute)

    with pytest.raises(IdrsError, match="formula 'plain' declares no threshold"):
        list(certify_drawn(engine, _protocol(), NoThreshold(), x, ids, sigma,
                           regularity=Constant(0.5)))  # fmt: skip

    class Soft(CohenCertifier):
        smoothing = "soft"

    with pytest.raises(IdrsError, match=r"certifier .soft. certifies soft smoothing.*fixed"):
        list(certify_drawn(engine, _protocol(), Soft(), x, ids, sigma, label="certifier 'soft'"))


def test_sukenik_formula_is_certified_sequentially_and_rederived(half_space):
    engine = SamplingEngine(
        half_space.model, 2, torch.device("cpu"), 500, seed=5, noise="philox-v1"
    )
    x, ids, sigma = half_space.inputs()
    from plugins.sukenik.certifier import SukenikCertifier

    certifier = SukenikCertifier(SemiElastic(0.01), 3)
    rows = [vars(c) for c in certify_drawn(engine, _protocol(), certifier, x, ids, sigma,
                                           regularity=SemiElastic(0.01))]  # fmt: skip
    result = rederive(rows, x, _protocol(), Declaration(SUKENIK, SemiElastic(0.01), "hard"),
                      exact=True)  # fmt: skip
    assert result.verdict == "sound", result.summary


def test_draws_record_round_trips():
    rule = SequentialRule(1_000, GRID)
    looks = np.zeros((2, len(rule.looks), 3), dtype=np.int64)
    looks[0, 0], looks[1, :2] = [90, 6, 4], [[98, 1, 1], [107, 2, 1]]
    draws = Draws("hard", 100, 1_000, np.array([0.2, 0.3]), np.array([[90, 5, 5], [99, 1, 0]]),
                  np.array([[90, 6, 4], [107, 2, 1]]), rule=rule, looks=looks,
                  stops=np.array([0, 1]))  # fmt: skip
    back = Draws.from_records([draws.record(0), draws.record(1)])
    assert back.samples().tolist() == [100, 110] and np.array_equal(back.looks, looks)
    assert np.array_equal(back.lower_bound(np.array([0, 0]), 1e-3),
                          draws.lower_bound(np.array([0, 0]), 1e-3))  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (['certification.sampling="sequentail"'], "unknown sampling 'sequentail'; choose"),
        (["certification.n_max=5000"], 'n_max = 5000 is the cap of sampling = "sequential"'),
        (['certification.sampling="sequential"', "certification.n_max=5"],
         "n_max = 5 cannot certify the grid's first radius 0.*n_max >= 10"),
        (['certification.sampling="sequential"', "radii=[0.5, 0.25]"],
         r"radii = \[0.5, 0.25\] is not sorted.*\[0.25, 0.5\]"),
        (['certification.sampling="sequential"', "radii=[]"], r"needs the radius grid .* got \[\]: set radii"),
    ],
)  # fmt: skip
def test_bad_sequential_specs_are_one_line_errors(overrides, message):
    with pytest.raises((ParameterError, IdrsError), match=message) as info:
        load_benchmark(DEFAULT_BENCHMARK, overrides)
    assert "\n" not in str(info.value)


def test_spec_errors_come_before_torch_and_fixed_runs_keep_their_ids():
    code = ("import sys\nfrom harness.running.benchmark import load_benchmark, DEFAULT_BENCHMARK\n"
            "try:\n    load_benchmark(DEFAULT_BENCHMARK, ['certification.sampling=\"x\"'])\n"
            "except Exception as e:\n    print(type(e).__name__, 'torch' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["ParameterError", "False"]
    fixed = load_benchmark(DEFAULT_BENCHMARK, []).to_dict()["protocol"]
    assert not {"sampling", "n_max", "grid"} & set(fixed)
    seq = load_benchmark(DEFAULT_BENCHMARK, ['certification.sampling="sequential"'])
    assert seq.to_dict()["protocol"]["n_max"] == 10_000 and seq.protocol.grid == GRID


def test_the_replay_redraws_every_look_and_names_the_first_that_differs(half_space):
    from harness.audit.replay import judge
    from harness.engine.sampling import STREAM_SELECTION
    from harness.running.redraw import _rounds
    from harness.running.redraw_request import look_sizes

    engine = SamplingEngine(half_space.model, 2, torch.device("cpu"), 500, seed=5, noise="block-v1",
                            pad_batches=True)  # fmt: skip
    x, ids, sigma = half_space.inputs()
    rows = {c.input_id: vars(c) for c in certify_drawn(engine, _protocol(), CohenCertifier(), x,
                                                       ids, sigma, regularity=Constant(0.5))}  # fmt: skip
    sizes = look_sizes([rows[i]["draws"]["base"] for i in ids])
    replayed = _rounds(engine, x, sigma, ids, sizes, STREAM_ESTIMATION)
    replayed["selection"] = engine.counts(x, sigma, ids, 100, STREAM_SELECTION).tolist()
    evidence = {"inputs": ids, "mode": "exact", "arithmetic": {}, "replayed": {"base": replayed},
                "sigma": {"alone": list(sigma), "batch": list(sigma), "order": list(range(5))}}  # fmt: skip
    assert judge(evidence, rows)[0] == "sound"
    look = rows[ids[-1]]["draws"]["base"]["looks"][1]
    look["counts"] = [look["counts"][0] + 1, look["counts"][1] - 1]
    verdict, summary, _ = judge(evidence, rows)
    assert verdict == "violated" and f"input {ids[-1]}, stream 1 (base look 2" in summary


def test_a_memory_claiming_an_enclosing_balls_class_passes_the_bound_check():
    from harness.certification.rounds import check_bounds

    rule = SequentialRule(1_000, GRID)
    looks = np.zeros((1, len(rule.looks), 3), dtype=np.int64)
    looks[0, 0] = [100, 0, 0]
    draws = Draws("hard", 100, 1_000, np.array([0.5]), np.array([[100, 0, 0]]),
                  np.array([[100, 0, 0]]), rule=rule, looks=looks, stops=np.array([0]))  # fmt: skip
    bound = float(draws.lower_bound(np.array([0]), 1e-3)[0])
    check_bounds([Claim(2, 0.1, bound)], draws, 1e-3, "memory")  # class 2: another ball's
    with pytest.raises(ContractError, match="memory claimed the bound"):
        check_bounds([Claim(0, 0.1, float(cp_lower(100, 100, 1e-3)))], draws, 1e-3, "memory")
