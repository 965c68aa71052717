"""The grid-place rule (issue 60): its e-processes against mpmath, its exact rejection
probability against α and against a Monte Carlo of the rule itself, PREDICT at the
stopping time, the rounds the harness draws under it, S0's re-derivation, and earlier
(mixture-cs-v2) records still read as they were."""

import json

import mpmath as mp
import numpy as np
import pytest
import torch
from scipy.special import ndtr

from harness.audit.evidence import Declaration, rederive
from harness.certification.certify import certify_drawn
from harness.engine.draws import Draws
from harness.engine.sampling import SamplingEngine
from harness.foundation.errors import ParameterError
from harness.foundation.protocol import CertificationProtocol
from harness.foundation.regularity import Constant
from harness.mathematics import gridplace
from harness.mathematics.crossing import rejection_probability, worst_rejection
from harness.mathematics.gridplace import GridPlaceRule, anytime_predictions
from harness.mathematics.radius import COHEN
from harness.mathematics.rules import rule_from_record
from harness.mathematics.sequential import SequentialRule
from harness.running.benchmark import benchmark_from_dict
from plugins.cohen.certifier import CohenCertifier

GRID = (0.0, 0.25, 0.5, 0.75, 1.0)
THRESHOLDS = ndtr(np.array([[0.25, 0.5, 0.75, 1.0]]) / 0.25)  # σ = 0.25: Φ(1) … Φ(4)


@pytest.mark.parametrize(("c", "n", "tau", "a", "b"), [
    (90, 100, 0.8, 1.0, 0.0625), (950, 1_000, 0.9, 81.0, 20.0625),
    (10_000, 10_000, 0.99995, 101.0, 0.0625), (60, 100, 0.5, 1.0, 1.0),
    (99_990, 100_000, 0.9999, 100.0, 1.0625),
])  # fmt: skip
def test_log_evidence_is_the_truncated_beta_mixture(c, n, tau, a, b):
    """log E against mpmath's incomplete beta functions at 50 digits."""
    mp.mp.dps = 50
    t = mp.mpf(tau)
    exact = (mp.log(mp.betainc(a + c, b + n - c, t, 1)) - mp.log(mp.betainc(a, b, t, 1))
             - c * mp.log(t) - (n - c) * mp.log(1 - t))  # fmt: skip
    assert float(gridplace.log_evidence(c, n, tau, a, b)) == pytest.approx(float(exact), abs=1e-8)
    k, m = 30, 12
    pair = mp.log(2 ** (k + m + 1) * mp.betainc(k + 1, m + 1, mp.mpf(1) / 2, 1))
    assert float(gridplace.pair_log_evidence(k, m)) == pytest.approx(float(pair), abs=1e-10)


def test_the_tested_values_sit_above_the_thresholds_and_unreached_radii_are_never_rejected():
    tau = gridplace.tested_values(np.array([[0.8, 0.99, np.inf]]))[0]
    assert tau[0] == gridplace.HALF > 0.5 and np.all(tau[1:3] > [0.8, 0.99])
    assert np.all(1 - tau[1:3] >= (1 - np.array([0.8, 0.99])) * (1 - 2e-6)) and tau[3] == np.inf
    rule = GridPlaceRule(10_000, GRID)
    assert not rule.rejects(10_000, len(rule.looks) - 1, np.inf, 101.0, 0.0625, 0.5)


@pytest.mark.parametrize("alpha", [1e-3, 0.1])
def test_each_place_is_false_with_probability_at_most_alpha_exactly(alpha):
    """The dynamic programme at p = τ_j (the worst p of H_j) for every tested value at
    σ = 0.25 and priors of 0, 60 and 100 agreeing selection samples of 100."""
    rule = GridPlaceRule(2_500, GRID)
    priors = np.stack(rule.priors(np.array([0, 60, 100]), 100), axis=1)
    worst = worst_rejection(rule, alpha, gridplace.tested_values(THRESHOLDS), priors)
    assert worst["ratio_to_alpha"] <= 1.0 and worst["points"] == 15
    assert worst["ratio_to_alpha"] > 0.05  # the check is not trivial


@pytest.mark.usefixtures("naive_sequential_rule")
def test_an_exact_test_of_each_place_at_every_look_is_caught():
    rule = GridPlaceRule(2_500, GRID)
    priors = np.stack(rule.priors(np.array([60]), 100), axis=1)
    assert (
        worst_rejection(rule, 1e-3, gridplace.tested_values(THRESHOLDS), priors)["ratio_to_alpha"]
        > 2.0
    )


def simulate(rule, probs, n0, thresholds, trials, alpha, rng):
    """The rule itself on ``trials`` multinomial streams of class probabilities ``probs``
    (ĉ_A from n0 selection samples): each trial's stopping n, place, and PREDICT at the
    stop, anytime-valid and the fixed-n binomial test's."""
    from harness.certification.predict import predictions_from_counts

    probs = np.asarray(probs, dtype=np.float64)
    top = np.argmax(rng.multinomial(n0, probs, size=trials), axis=1)
    selected = rng.binomial(n0, probs[top])  # ĉ_A's selection count (its prior)
    tau = np.repeat(gridplace.tested_values(thresholds), trials, axis=0)
    a, b = rule.priors(selected, n0)
    counts = np.zeros((trials, len(probs)), dtype=np.int64)
    ever = np.zeros(tau.shape, dtype=bool)
    place, stop_n = np.zeros(trials, dtype=np.int64), np.zeros(trials, dtype=np.int64)
    running, before = np.arange(trials), 0
    for k, n in enumerate(rule.looks.tolist()):
        if running.size == 0:
            break
        counts[running] += rng.multinomial(n - before, probs, size=running.size)
        here = counts[running, top[running]]
        ever[running], place[running] = rule.advance(ever[running], here, k, tau[running],
                                                     a[running], b[running], alpha)  # fmt: skip
        stop = rule.stops(k, here, place[running], tau[running], a[running], b[running], alpha)
        stop_n[running[stop]] = n
        running, before = running[~stop], n
    return (stop_n, place, top, anytime_predictions(counts, alpha),
            predictions_from_counts(counts, alpha))  # fmt: skip


def test_a_monte_carlo_of_the_rule_matches_the_exact_probability_and_stays_below_alpha():
    """At p_A = τ_2 and α = 0.3 (a rejection frequent enough to estimate): 20,000 count
    paths reject H_2 as often as the dynamic programme says; 12,000 runs of the rule itself
    (its rounds, futility stops and priors from the selection counts) give a false place
    (> 2) less often than α."""
    rule, alpha = GridPlaceRule(3_000, GRID), 0.3
    tau = float(gridplace.tested_values(THRESHOLDS)[0, 2])
    a, b = rule.priors(98, 100)  # the likeliest selection count at p_A = τ_2 ≈ 0.977
    exact = rejection_probability(rule, alpha, tau, float(a), float(b))
    rng = np.random.default_rng(1)
    steps = np.diff(np.concatenate([[0], rule.looks]))
    counts = np.cumsum(rng.binomial(steps, tau, size=(20_000, len(steps))), axis=1)
    hit = rule.rejects(counts, np.arange(len(steps))[None, :], tau, a, b, alpha).any(axis=1)
    assert abs(hit.mean() - exact) < 4 * np.sqrt(exact * (1 - exact) / 20_000)
    assert 0.01 < exact <= alpha  # valid, and the check is not trivial
    trials = 12_000
    _, place, top, _, _ = simulate(rule, [tau, 1 - tau], 100, THRESHOLDS, trials, alpha, rng)
    false = np.mean((place > 2) & (top == 0))
    assert 0.02 < false <= alpha + 3 * np.sqrt(alpha * (1 - alpha) / trials)


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("alpha", [0.1, 0.05])
def test_the_review_monte_carlo_false_places_stay_below_alpha(alpha):
    """The review's Monte Carlo on the new rule: σ = 0.25, the board's grid, n_max = 10⁵,
    p_A at 1/2, 0.505, just below Φ(1) … Φ(4) and 0.9999, 4,000 runs each."""
    rule = GridPlaceRule(100_000, GRID)
    rng = np.random.default_rng(7)
    t = THRESHOLDS[0]
    for p in [0.5, 0.505, *(t * (1 - 1e-9)), 0.9999]:
        _, place, top, _, _ = simulate(rule, [p, 1 - p], 100, THRESHOLDS, 4_000, alpha, rng)
        true = int(p > 0.5) + int(np.sum(t <= p)) if p > 0.5 else 0
        false = np.mean(np.where(top == 0, place > true, place > 0))
        assert false <= alpha + 3 * np.sqrt(alpha * (1 - alpha) / 4_000), (p, false)


def test_predict_at_the_stopping_time_keeps_its_alpha():
    """Two classes, p_A = 0.501, α = 0.05 (the review's case): the anytime-valid PREDICT
    at the rule's stop returns the wrong class (1) at most α of the time."""
    rule, alpha, trials = GridPlaceRule(100_000, GRID), 0.05, 10_000
    _, _, _, anytime, _ = simulate(rule, [0.501, 0.499], 100, THRESHOLDS, trials, alpha,
                                   np.random.default_rng(3))  # fmt: skip
    wrong = np.mean(anytime == 1)
    assert wrong <= alpha + 3 * np.sqrt(alpha * (1 - alpha) / trials)
    # and the test has power: a clear top class is predicted
    counts = np.array([[700, 200, 100], [40, 35, 25]])
    assert anytime_predictions(counts, 1e-3).tolist() == [0, -1]


def test_the_rule_saves_samples_and_keeps_the_fixed_place_of_clear_inputs():
    """Every sample agreeing at σ = 0.5: the top place (radius 1, p_A > Φ(2)) is decided
    near Wald's log(1/α)/KL samples; at σ = 0.25 radius 1 needs p_A > Φ(4), out of reach
    of 10⁵ samples (218,105 at least), so the input stops once radius 0.75 is certified;
    with three classes near 1/3 the input abstains at the first look."""
    rule, alpha = GridPlaceRule(100_000, GRID), 1e-3
    half = ndtr(np.array([[0.25, 0.5, 0.75, 1.0]]) / 0.5)
    stop_n, place, _, _, _ = simulate(rule, [1.0, 0.0], 100, half, 4, alpha,
                                      np.random.default_rng(0))  # fmt: skip
    wald = np.log(1 / alpha) / -np.log(ndtr(2.0))
    assert np.all(place == 5) and np.all(stop_n < 1.3 * wald)
    stop_n, place, _, _, _ = simulate(rule, [1.0, 0.0], 100, THRESHOLDS, 4, alpha,
                                      np.random.default_rng(0))  # fmt: skip
    wald = np.log(1 / alpha) / -np.log(ndtr(3.0))
    assert np.all(place == 4) and np.all(stop_n < 1.3 * wald)
    stop_n, place, _, _, _ = simulate(rule, [0.34, 0.33, 0.33], 100, THRESHOLDS, 4, alpha,
                                      np.random.default_rng(0))  # fmt: skip
    assert np.all(stop_n == 100) and np.all(place == 0)


def _protocol(n_max=20_000):
    return CertificationProtocol(n0=100, n=n_max, alpha=1e-3, batch_size=500, noise="philox-v1",
                                 sampling="sequential", grid=GRID)  # fmt: skip


def test_rounds_certify_the_grid_radius_and_s0_rederives_and_catches_tampering(half_space):
    engine = SamplingEngine(half_space.model, 2, torch.device("cpu"), 500, seed=5, noise="philox-v1",
                            pad_batches=True)  # fmt: skip
    protocol = _protocol()
    assert protocol.rule == gridplace.RULE_NAME  # the default of a new sequential run
    x, ids, sigma = half_space.inputs()
    certs = sorted(certify_drawn(engine, protocol, CohenCertifier(), x, ids, sigma,
                                 regularity=Constant(0.5)), key=lambda c: c.input_id)  # fmt: skip
    for c in certs:
        base = c.draws["base"]
        assert base["rule"]["name"] == "grid-place-v1" and len(base["thresholds"]) == 4
        if c.prediction >= 0:  # the certificate is a grid radius (a hair above it)
            ratio = c.radius / np.array([1e-300, 0.25, 0.5, 0.75, 1.0])
            assert np.any((ratio >= 1) & (ratio < 1 + 1e-4)) or c.radius < 1e-6
    assert max(c.radius for c in certs) >= 1.0
    rows = [vars(c) for c in certs]
    declaration = Declaration(COHEN, Constant(0.5), "hard")
    result = rederive(rows, x, protocol, declaration, exact=True)
    assert result.verdict == "sound", result.summary
    back = Draws.from_records([r["draws"]["base"] for r in rows])
    assert isinstance(back.rule, GridPlaceRule)
    assert np.allclose(back.lower_bound(np.argmax(back.selection, axis=1), 1e-3),
                       [c.p_lower for c in certs])  # fmt: skip

    def edit(how):
        out = json.loads(json.dumps(rows))
        how(out)
        return rederive(out, x, protocol, declaration)

    def truncate(rows):
        base = rows[-1]["draws"]["base"]
        base["looks"] = base["looks"][:-1]
        base["estimation"] = base["looks"][-1]["counts"]

    def threshold(rows):
        rows[0]["draws"]["base"]["thresholds"][0] *= 0.99

    def prior(rows):  # more agreeing selection samples: another prior, other decisions
        rows[-1]["draws"]["base"]["selection"] = [0, 100]

    for how, quantity in ((truncate, "looks"), (threshold, "thresholds"), (prior, "looks")):
        result = edit(how)
        assert result.verdict == "violated" and result.evidence["first"]["quantity"] == quantity


def test_earlier_runs_keep_their_rule_and_a_spec_may_choose_it():
    raw = {"name": "x", "seed": 0, "radii": list(GRID),
           "dataset": {"name": "ball-2", "test_count": 4},
           "model": {"architecture": "ball-N", "trainer": "none"},
           "certification": {"n0": 10, "n": 1000, "sampling": "sequential"},
           "methods": [{"name": "cohen", "settings": [{"sigma": 0.25}]}]}  # fmt: skip
    from harness.running.benchmark import parse_benchmark

    new = parse_benchmark(raw).to_dict()
    assert new["protocol"]["rule"] == "grid-place-v1"
    old = json.loads(json.dumps(new))
    del old["protocol"]["rule"]  # stored before the protocol recorded its rule
    assert benchmark_from_dict(old).protocol.rule == "mixture-cs-v2"
    raw["certification"]["rule"] = "mixture-cs-v2"
    assert parse_benchmark(raw).protocol.rule == "mixture-cs-v2"
    raw["certification"]["rule"] = "mixture"
    with pytest.raises(ParameterError, match="unknown sequential rule 'mixture'; choose"):
        parse_benchmark(raw)
    v2 = SequentialRule(1_000, GRID)
    assert rule_from_record(v2.record()) == v2
    assert rule_from_record(GridPlaceRule(1_000, GRID).record()) == GridPlaceRule(1_000, GRID)
