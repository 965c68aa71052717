"""The checks ask σ in few, large calls (harness.audit.sigma_calls), at the points a
search of one input at a time asks: the same audit entropy picks the same points.

Each check's batched search is held to a one-at-a-time computation written here (S2's
pairs and ascent, S3's random points and ascents) or to the per-trial, per-certificate
path it replaces (S1's trials, S4's exact flips), on a 12-dimensional ``ball-N`` run, so
that the flip rays along ±∇σ and the random rays are drawn."""

from __future__ import annotations

import math
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

from harness import hookimpl, outputs_for_inputs
from harness.audit import coverage_rounds
from harness.audit.audit import Budget, parse_entropy
from harness.audit.ball_attacks import flip_among, search_points
from harness.audit.counterexamples import _exact_flips
from harness.audit.coverage import check_coverage
from harness.audit.justification import sigma_extremes
from harness.audit.session import audits
from harness.audit.sigma_calls import sigma_and_gradients
from harness.audit.sigma_regularity import SCALES, check_sigma_regularity
from harness.foundation.certificate import ABSTAIN
from harness.foundation.progress import Progress
from harness.foundation.regularity import SemiElastic
from harness.plugin.components import CertifierSpec, MethodSpec, SigmaProviderSpec
from harness.running.benchmark import parse_benchmark
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark
from harness.store.store import ResultStore
from plugins.cohen.certifier import CohenCertifier

TINY = Budget("tiny", coverage_trials=24, coverage_n=200, pairs=8, ascent_steps=3,
              audited_inputs=6, attack_steps=2, attack_samples=16, orders=3)  # fmt: skip
ENTROPY = parse_entropy("0123456789abcdef0123456789abcdef")


class ClosedFormSigma:
    """σ(x) = 0.25·exp(0.05·‖x − c‖) (log σ 0.05-Lipschitz), differentiable, each row's σ
    its own in float64: a batch and a point alone agree bit for bit."""

    regularity = SemiElastic(0.05)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        centre = torch.full((x[0].numel(),), 0.3, dtype=torch.float64, device=x.device)
        return 0.25 * torch.exp(0.05 * (x.flatten(1).double() - centre).norm(dim=1))


class ModelSigma:
    """σ from the base model's output at x: a σ of each exact classifier S1 places."""

    regularity = SemiElastic(0.05)

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            first = torch.softmax(self.model(x.float()).double(), dim=1)[:, 0]
        return 0.2 + 0.1 * first


class RoutedModelSigma(ModelSigma):
    """:class:`ModelSigma` asking the model through ``harness.outputs_for_inputs``, each point
    named by its input: S1 asks it of all its trials at once, each on its own classifier."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            outputs = outputs_for_inputs(self.model, x.float(), x, torch.arange(len(x)))
        return 0.2 + 0.1 * torch.softmax(outputs.double(), dim=1)[:, 0]


class SwappedClaims(CohenCertifier):
    """Claims the other class of two, at Cohen's radius: its claims flip at the ball's
    centre, and its formula certifies another class (S1's second flip search)."""

    def certify(self, evidence):
        return [replace(c, prediction=1 - c.prediction) if c.prediction != ABSTAIN else c
                for c in super().certify(evidence)]  # fmt: skip


@hookimpl
def idrs_register_sigma_providers(register) -> None:
    register(SigmaProviderSpec("closed-form-sigma", lambda context, params: ClosedFormSigma()))
    register(SigmaProviderSpec("model-sigma",
                               lambda context, params: ModelSigma(context.engine.model)))  # fmt: skip
    register(SigmaProviderSpec("routed-model-sigma",
                               lambda context, params: RoutedModelSigma(context.engine.model)))  # fmt: skip


@hookimpl
def idrs_register_certifiers(register) -> None:
    register(CertifierSpec("swapped-claims", lambda context, params, provider: SwappedClaims()))


@hookimpl
def idrs_register_methods(register) -> None:
    register(MethodSpec("closed-form", "closed-form-sigma", "sukenik", {"sigma": 0.25}))
    register(MethodSpec("model-sigma", "model-sigma", "sukenik", {"sigma": 0.25}))
    register(MethodSpec("routed-model-sigma", "routed-model-sigma", "sukenik", {"sigma": 0.25}))
    register(MethodSpec("swapped", "closed-form-sigma", "swapped-claims", {"sigma": 0.25}))


ASCENT = {"sigma": 0.25, "steps": 5, "samples": 4, "beta": 0.05}
"""Alfarra et al.'s ascent, short and with a step that moves σ by each classifier's counts."""
METHODS = [{"name": "cohen", "settings": [{"sigma": 0.25}]},
           {"name": "closed-form", "settings": [{}]},
           {"name": "model-sigma", "settings": [{}]},
           {"name": "routed-model-sigma", "settings": [{}]},
           {"name": "alfarra-ds", "settings": [ASCENT]},
           {"name": "alfarra-ds-memory", "settings": [ASCENT]},
           {"name": "chen-fgss", "settings": [{}]},
           {"name": "swapped", "settings": [{}]}]  # fmt: skip


@pytest.fixture(scope="module")
def ball_run(tmp_path_factory):
    """A finished ball-12 run (16 inputs, n = 200) of the methods above: (db, run id)."""
    from harness.plugin.manager import PluginManager

    raw = {
        "name": "sigma-calls", "seed": 3, "dataset": {"name": "ball-12", "test_count": 16},
        "model": {"architecture": "ball-N", "trainer": "none"},
        "certification": {"n0": 32, "n": 200, "alpha": 0.01, "batch_size": 4096},
        "methods": METHODS,
    }  # fmt: skip
    manager = PluginManager(third_party=False)
    manager.register(sys.modules[__name__], name="sigma-calls-test")
    db = tmp_path_factory.mktemp("sigma-calls") / "ball.sqlite"
    run_id = run_benchmark(parse_benchmark(raw), RunOptions(db=db), Progress(enabled=False),
                           manager)  # fmt: skip
    return db, run_id, manager


def _audit(ball_run, method: str):
    db, run_id, manager = ball_run
    store = ResultStore(db)
    try:
        return next(audits(store, run_id, RunOptions(db=db), Progress(enabled=False), manager,
                           method=method, budget=TINY, entropy=ENTROPY))  # fmt: skip
    finally:
        store.close()


class Recording:
    """A σ-provider wrapper that records every call's points."""

    def __init__(self, provider) -> None:
        self.provider, self.calls = provider, []
        self.regularity = getattr(provider, "regularity", None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(x.detach().clone())
        return self.provider(x)


def _calls(audit, run) -> tuple[int, object]:
    before = audit.queries.calls
    result = run(audit)
    return audit.queries.calls - before, result


@pytest.mark.parametrize(
    "method",
    ["cohen", "closed-form", "swapped", "model-sigma", "routed-model-sigma", "alfarra-ds",
     "alfarra-ds-memory", "chen-fgss"],
)  # fmt: skip
def test_s1_asks_a_rounds_sigma_at_once_with_the_evidence_of_one_trial_at_a_time(
    ball_run, method, monkeypatch
):  # fmt: skip
    """S1 with σ asked per round equals S1 trial by trial (the same trial inputs, classes,
    placements, rays and draws: the same evidence), in 2 queries per round for a σ that
    does not read the exact model (the swapped claims flip at every ball trial, and the
    formula's rays are asked in the same query); a σ that reads the model through
    ``outputs_for_inputs`` is asked per round too, each trial on its own classifier (after
    a query that finds σ reads the model); one that calls the model is asked trial by
    trial (after two queries per round that find it does)."""
    audit = _audit(ball_run, method)
    together_calls, together = _calls(audit, check_coverage)
    monkeypatch.setattr(coverage_rounds, "_batched", lambda rnd: False)
    alone_calls, alone = _calls(_audit(ball_run, method), check_coverage)
    assert together.evidence == alone.evidence
    assert together.verdict == alone.verdict
    assert alone_calls >= TINY.coverage_trials  # at least one query per trial
    ball = together.evidence["ball-12"]
    if method == "model-sigma":
        assert together_calls == alone_calls + 4  # withheld, then per input: σ reads the model
    elif method in ("routed-model-sigma", "alfarra-ds", "chen-fgss"):  # withheld, inputs, rays
        assert together_calls == 1 + 1 + 1 + 1 + 1, together_calls
    elif method == "alfarra-ds-memory":  # σ constant in a memory's balls: no rays asked
        assert together_calls == 2 + 2, together_calls
    elif method == "swapped":
        assert ball["failures"] > 1  # claims of the wrong class
        assert together_calls <= 3, together_calls
    else:
        assert together_calls <= 3, together_calls


def test_s1_asks_sigma_first_at_the_trial_inputs_its_entropy_draws(ball_run):
    """The first query of each family is σ at the round's trial inputs, in the order the
    audit's entropy draws them (computed here from the entropy)."""
    audit = _audit(ball_run, "closed-form")
    recording = Recording(audit.sigma_provider.uncounted)
    audit.rebuild = _recording_rebuild(audit.rebuild, recording)
    check_coverage(audit)
    half = TINY.coverage_trials // 2
    for family, first in (("linear", 0), ("ball", 1)):  # the linear round asks once
        rng = audit.rng(f"coverage/{family}/0")
        chosen = rng.choice(len(audit.inputs), min(half, len(audit.inputs)), replace=False)
        asked = recording.calls[first].cpu()
        assert torch.equal(asked, audit.inputs[torch.as_tensor(chosen)].float())
    assert len(recording.calls) <= 4


def _recording_rebuild(rebuild, recording):
    def rebuilt(*args, **kwargs):
        _, certifier, context = rebuild(*args, **kwargs)
        return recording, certifier, context

    return rebuilt


def _one_pair_search(provider, x0, directions, steps):
    """S2 for one input: σ asked one point at a time, the pairs then the ascent."""

    def sigma(x):
        return provider(x[None])[0].double()

    s0 = sigma(x0)
    best_q, best = torch.zeros((), dtype=torch.float64), x0
    for scale, d in directions:
        x1 = (x0.flatten() + d * (scale / d.norm())).view_as(x0)
        q = (torch.log(sigma(x1)) - torch.log(s0)).abs() / scale
        if q > best_q:
            best_q, best = q, x1
    x1 = best.clone()
    for _ in range(steps):
        x1 = x1.detach().requires_grad_(True)
        s1 = sigma(x1)
        dist = (x1 - x0).flatten().norm().double().clamp_min(1e-4)
        q = (torch.log(s1) - torch.log(s0)).abs() / dist
        (grad,) = torch.autograd.grad(q, x1)
        if q.detach() > best_q:
            best_q = q.detach()
        x1 = x1.detach() + 0.05 * grad / grad.norm().clamp_min(1e-12)
    return float(best_q)


def test_s2_asks_its_pairs_at_once_and_ascends_in_lockstep_as_one_input_alone(ball_run):
    audit = _audit(ball_run, "closed-form")
    calls, result = _calls(audit, check_sigma_regularity)
    assert calls == TINY.ascent_steps  # the inputs and pairs (the first step's graph), then steps
    chosen = audit.subset("sigma-regularity/inputs", len(audit.inputs), TINY.audited_inputs)
    x0 = audit.inputs[torch.as_tensor(chosen)].float()
    gen = audit.generator("sigma-regularity/pairs")
    per_scale = max(1, TINY.pairs // len(SCALES))
    draws = [(scale, torch.randn(x0.flatten(1).shape, generator=gen))
             for scale in SCALES for _ in range(per_scale)]  # fmt: skip
    worst = [_one_pair_search(ClosedFormSigma(), x0[i], [(s, d[i]) for s, d in draws],
                              TINY.ascent_steps) for i in range(len(x0))]  # fmt: skip
    assert result.evidence["worst_quotient"] == pytest.approx(max(worst), rel=1e-9)
    k = int(np.argmax(worst))
    assert result.evidence["input_id"] == audit.certificates[int(chosen[k])]["input_id"]


def _one_ball_extremes(sigma, x0, radius, randoms, starts, steps):
    """S3's search in one ball, σ asked one point at a time: random points, then the
    ascent of ± log σ from each start."""
    flat = x0.flatten()
    lo = hi = float(sigma(x0[None])[0])
    for fraction, d in randoms:
        s = float(sigma((flat + d * (fraction * radius / d.norm())).view_as(x0)[None])[0])
        lo, hi = min(lo, s), max(hi, s)
    for sign, start in zip((1.0, -1.0), starts, strict=True):
        x1 = flat + start
        for _ in range(steps):  # the start and steps - 1 moves (the last move unused)
            x1 = x1.detach().requires_grad_(True)
            s = sigma(x1.view_as(x0)[None])[0].double()
            lo, hi = min(lo, float(s.detach())), max(hi, float(s.detach()))
            (grad,) = torch.autograd.grad(torch.log(s), x1)
            delta = x1.detach() + sign * (radius / 4) * grad / grad.norm().clamp_min(1e-12) - flat
            x1 = flat + delta * min(1.0, float(radius / delta.norm().clamp_min(1e-12)))
    return lo, hi


def test_s3_asks_its_random_points_at_once_and_ascends_both_ways_in_lockstep():
    x0 = torch.rand(5, 1, 4, 3, generator=torch.Generator().manual_seed(2))
    radius = torch.tensor([0.3, 0.05, 1.0, 0.2, 0.6])
    recording = Recording(ClosedFormSigma())
    steps = 4
    lo, hi = sigma_extremes(recording, x0, radius, steps, torch.Generator().manual_seed(7), 1024)
    assert len(recording.calls) == steps  # inputs, random points, starts; each later point
    small = Recording(ClosedFormSigma())  # calls of at most 16 points, the same search
    assert np.array_equal(
        sigma_extremes(small, x0, radius, steps, torch.Generator().manual_seed(7), 16), (lo, hi)
    )
    assert max(len(c) for c in small.calls) <= 16 and len(small.calls) == 5 + steps - 1
    # the same draws, one ball at a time (S3 searches inside the rounded-in radius)
    from harness.audit.justification import _inside

    inside = _inside(x0.flatten(1), radius)
    gen = torch.Generator().manual_seed(7)
    flat = x0.flatten(1)
    randoms = [(f, torch.randn(flat.shape, generator=gen)) for f in (1.0, 0.5, 0.25)
               for _ in range(4)]  # fmt: skip
    starts = []
    for _ in range(2):
        start = 1e-3 * torch.randn(flat.shape, generator=gen) / math.sqrt(flat.shape[1])
        starts.append(start * (inside / 2 / start.norm(dim=1)).clamp(max=1.0)[:, None])
    for i in range(len(x0)):
        one = _one_ball_extremes(ClosedFormSigma(), x0[i], inside[i],
                                 [(f, d[i]) for f, d in randoms], [s[i] for s in starts], steps)  # fmt: skip
        assert (lo[i], hi[i]) == pytest.approx(one, rel=1e-6)


def test_s3_asks_a_sigma_without_gradient_once():
    recording = Recording(lambda x: torch.full((len(x),), 0.3, dtype=torch.float64))
    x0 = torch.rand(4, 6, generator=torch.Generator().manual_seed(1))
    lo, hi = sigma_extremes(recording, x0, torch.full((4,), 0.5), 10,
                            torch.Generator().manual_seed(0), 1024)  # fmt: skip
    assert len(recording.calls) == 1 and len(recording.calls[0]) == 4 * (1 + 12 + 2)
    assert np.all(lo == 0.3) and np.all(hi == 0.3)


def _one_ball_flip(provider, model, center, radius, prediction, gen):
    """One ball's exact-flip search alone: σ and ∇σ at its center, then σ at its search
    points, judged exactly (the searches' parts, asked one ball at a time)."""
    sigma, [gradient] = sigma_and_gradients(provider, center[None], 1)
    points = search_points(model, center, radius, gradient, gen)
    with torch.no_grad():
        rest = provider(points[1:]).double().numpy()
    return flip_among(model, center, points, np.concatenate([sigma.double().numpy(), rest]),
                      prediction)  # fmt: skip


def test_s4_exact_flips_ask_sigma_at_every_ball_at_once_as_one_ball_at_a_time(ball_run):
    """S4's exact flips on ball-N: σ and ∇σ at every certified input in one query, the
    rays of every ball in another, the flips found those of one ball at a time."""
    audit = _audit(ball_run, "swapped")  # claims of the wrong class: flips to find
    model = audit.context.model
    certified = [(c, x) for c, x in zip(audit.certificates, audit.inputs, strict=True)
                 if c["prediction"] != ABSTAIN and c["radius"] > 0]  # fmt: skip
    assert len(certified) > 4
    recording = Recording(audit.sigma_provider.uncounted)
    audit.sigma_provider = recording
    found = _exact_flips(audit, model, certified, None, torch.Generator().manual_seed(5))
    assert len(recording.calls) == 2
    gen, one = torch.Generator().manual_seed(5), Recording(ClosedFormSigma())
    alone = [_one_ball_flip(one, model, x, c["radius"], c["prediction"], gen)
             for c, x in certified]  # fmt: skip
    # the same centers, then the same rays (±∇σ, towards and away from the ball, random)
    assert torch.equal(recording.calls[0], torch.cat(one.calls[0::2]))
    assert torch.equal(recording.calls[1], torch.cat(one.calls[1::2]))
    assert sum(f is not None for f in found) > 1
    assert [f and f["point"] for f in found] == [f and f["point"] for f in alone]


def test_every_check_asks_sigma_in_few_calls(ball_run):
    """Per check, σ calls of a differentiable σ that does not read the model: S1 two per
    family; S2 and S3 one per point of their ascents (the first with the random points);
    S4 its exact flips two, its attack one per point of its path (the last confirmed); the
    replay check its batch and each input alone (by design)."""
    manager = ball_run[2]
    audit = _audit(ball_run, "closed-form")
    checks = {
        name: manager.registry.get("checks", name) for name in manager.registry.names("checks")
    }
    bounds = {"coverage": 4, "sigma-regularity": TINY.ascent_steps,
              "worst-case-justification": TINY.ascent_steps,
              "counterexamples": 2 + TINY.attack_steps,
              "replay": 1 + TINY.replay_inputs, "evidence": 0, "memory-order": 0}  # fmt: skip
    for name, check in checks.items():
        calls, _ = _calls(audit, check.run)
        assert calls <= bounds[name], (name, calls)
        if name in ("sigma-regularity", "worst-case-justification", "counterexamples"):
            assert calls == bounds[name], (name, calls)  # the searches ran
