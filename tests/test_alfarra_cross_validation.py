"""K of OptimizeSigma cross-validated on the training split (Alfarra et al. 2022, Table 1):
the choice is the argmax of an independently computed ACR, never reads the test split, is
recorded and reused by a rebuilt method, and explicit K settings are untouched."""

import json

import numpy as np
import pytest
import torch
from scipy import stats

from harness.certification.method import build_method
from harness.engine.noise import noise_seed
from harness.engine.sampling import SamplingEngine
from harness.foundation.data import Dataset
from harness.foundation.errors import ParameterError
from harness.foundation.progress import Progress
from harness.foundation.protocol import CertificationProtocol
from harness.plugin.components import BuildContext, RunMemo
from plugins.alfarra import OPTIMIZER_DEFAULTS, check_optimizer
from plugins.alfarra.cross_validation import (
    STREAM_CV_ESTIMATION,
    STREAM_CV_SELECTION,
    choose_steps,
    held_out,
)
from plugins.alfarra.optimize_sigma import (
    STREAM_OPTIMIZE,
    content_keys,
    optimize_sigma,
    sigma_path,
)

CV = {"sigma": 0.05, "steps": "cross-validated", "samples": 4, "beta": 0.02,
      "steps_candidates": [1, 4, 16, 64], "cv_examples": 16}  # fmt: skip
"""A setting whose candidates give distinct ACRs with an interior maximum on :func:`_data`."""
PROTOCOL = CertificationProtocol(n0=20, n=200, alpha=0.01, batch_size=256)


pytestmark = pytest.mark.usefixtures("one_thread")


def _data(test_x=None, d=4, n=40):
    gen = torch.Generator().manual_seed(0)
    radius = torch.rand(n, 1, generator=gen) * 0.9
    x = torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1) * radius
    y = torch.ones(n, dtype=torch.long)
    test_x = x[:8] if test_x is None else test_x
    return Dataset("ball-cv", x, y, test_x, torch.zeros(len(test_x), dtype=torch.long), 2)


def _context(model, dataset, manager, root=None, memos=None):
    return BuildContext(
        dataset, model, torch.device("cpu"), 0, PROTOCOL,
        SamplingEngine(model, 2, torch.device("cpu"), 256, 0), Progress(enabled=False),
        registry=manager.registry, recipe_hash="c" * 64, artifact_root=root,
        memos=memos or RunMemo(),
    )  # fmt: skip


def _reference_sigma(model, x, sigma0, key, steps, samples, beta):
    """Alg. 1 for one input, step by step (as the paper's code), on the provider's noise."""
    sigma = float(sigma0)
    gen = torch.Generator()
    for k in range(steps):
        gen.manual_seed(noise_seed(0, STREAM_OPTIMIZE, key, k))
        delta = torch.randn((samples, *x.shape), generator=gen, dtype=x.dtype)
        s = torch.tensor(sigma, dtype=torch.float64, requires_grad=True)
        probs = torch.softmax(model(x[None] + s.to(x.dtype) * delta), dim=1).double().mean(0)
        e_a, e_b = torch.sort(probs, descending=True).values[:2].clamp(0.02, 0.98)
        (s / 2 * (torch.special.ndtri(e_a) - torch.special.ndtri(e_b))).backward()
        sigma = max(sigma + beta * float(s.grad), 1e-3)
    return sigma


def test_every_step_read_from_one_ascent_is_that_many_steps_bit_for_bit(ball_model):
    x = _data().train_x[:20]
    keys = content_keys(x)
    common = dict(seed=0, stream=STREAM_OPTIMIZE, samples=2, beta=0.02, sigma_min=1e-3)
    path = sigma_path(ball_model(), x, 0.05, keys, steps=9, read_at=(0, 3, 7), **common)
    assert sorted(path) == [0, 3, 7, 9]
    for k, sigma in path.items():
        assert torch.equal(sigma, optimize_sigma(ball_model(), x, 0.05, keys, steps=k, **common))
    assert not torch.equal(path[3], path[7])


def test_the_chosen_k_is_the_argmax_of_the_acr_computed_independently(ball_model):
    data = _data()
    engine = SamplingEngine(ball_model(), 2, torch.device("cpu"), 256, 0)
    candidates = CV["steps_candidates"]
    choice = choose_steps(
        engine, data.train_x, data.train_y, sigma0=CV["sigma"], samples=CV["samples"],
        beta=CV["beta"], sigma_min=1e-3, seed=0, candidates=candidates,
        examples=CV["cv_examples"], n0=PROTOCOL.n0, n=PROTOCOL.n, alpha=PROTOCOL.alpha,
    )  # fmt: skip
    index = np.round(np.linspace(0, len(data.train_x) - 1, CV["cv_examples"])).astype(int)
    x, labels = data.train_x[index], data.train_y[index].numpy()
    acr = []
    for k in candidates:
        keys = content_keys(x)
        sigma = torch.tensor([_reference_sigma(ball_model(), x[i], CV["sigma"], keys[i], k,
                                               CV["samples"], CV["beta"]) for i in range(len(x))])  # fmt: skip
        top = engine.counts(x, sigma, index.tolist(), PROTOCOL.n0, STREAM_CV_SELECTION).argmax(1)
        counts = engine.counts(x, sigma, index.tolist(), PROTOCOL.n, STREAM_CV_ESTIMATION)
        k_top = counts[np.arange(len(index)), top]
        lower = stats.beta.ppf(PROTOCOL.alpha, k_top, PROTOCOL.n - k_top + 1)  # Clopper–Pearson
        good = (lower > 0.5) & (top == labels)
        acr.append(float(np.where(good, sigma.numpy() * stats.norm.ppf(lower), 0.0).mean()))
    assert len(set(acr)) == len(acr)  # the candidates differ, so the choice means something
    assert choice.acr == pytest.approx(acr, rel=1e-6)  # σ in float32 forward passes
    assert choice.steps == candidates[int(np.argmax(acr))]
    assert choice.steps not in (candidates[0], candidates[-1])  # an interior maximum
    assert list(choice.examples) == index.tolist()


def test_ties_go_to_the_smallest_k_and_the_held_out_slice_lies_in_the_training_split(ball_model):
    data = _data()
    engine = SamplingEngine(ball_model(), 2, torch.device("cpu"), 256, 0)
    choice = choose_steps(engine, data.train_x, data.train_y, sigma0=0.05, samples=1, beta=0.0,
                          sigma_min=1e-3, seed=0, candidates=[8, 2, 4], examples=10, n0=20,
                          n=200, alpha=0.01)  # fmt: skip
    assert choice.candidates == (2, 4, 8) and len(set(choice.acr)) == 1  # β = 0: σ never moves
    assert choice.steps == 2
    assert held_out(500, 40).tolist() == list(range(40))
    assert held_out(3, 40).tolist() == [0, 20, 39]


def test_the_choice_never_reads_the_test_split(ball_model, manager, tmp_path):
    """The method built on two datasets with the same training split and different test
    splits (one of NaNs) chooses the same K from the same training inputs."""
    choices = []
    for i, test_x in enumerate([None, torch.full((8, 4), float("nan"))]):
        context = _context(ball_model(), _data(test_x), manager, tmp_path / str(i))
        provider, _ = build_method(manager.registry, "alfarra-ds", CV, context)
        [saved] = (tmp_path / str(i)).glob("plugins/alfarra/*/steps-*.json")
        choices.append((provider.steps, json.loads(saved.read_text())["choice"]))
    assert choices[0] == choices[1]
    assert max(choices[0][1]["examples"]) < len(_data().train_x)
    assert choices[0][0] == choices[0][1]["steps"] == 4


def test_the_choice_is_recorded_and_a_rebuilt_method_and_the_memory_use_it(
    ball_model, manager, tmp_path, monkeypatch
):
    from plugins.alfarra import cross_validation

    calls = []
    original = cross_validation.choose_steps

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(cross_validation, "choose_steps", counting)
    context = _context(ball_model(), _data(), manager, tmp_path)
    plain, _ = build_method(manager.registry, "alfarra-ds", CV, context)
    memory, _ = build_method(manager.registry, "alfarra-ds-memory", CV, context)
    assert plain.steps == memory.steps == 4 and len(calls) == 1  # one choice per run and model
    rebuilt, _ = build_method(manager.registry, "alfarra-ds", CV,
                              _context(ball_model(), _data(), manager, tmp_path))  # a new run: a fresh memo  # fmt: skip
    assert rebuilt.steps == 4 and len(calls) == 1  # read from the recorded file
    [saved] = tmp_path.glob("plugins/alfarra/*/steps-*.json")
    record = json.loads(saved.read_text())
    record["choice"]["steps"] = 16  # the file is what a rebuilt method uses
    saved.write_text(json.dumps(record))
    again, _ = build_method(
        manager.registry, "alfarra-ds", CV, _context(ball_model(), _data(), manager, tmp_path)
    )
    assert again.steps == 16 and len(calls) == 1
    saved.write_text("{not json")  # damaged: chosen again
    healed, _ = build_method(
        manager.registry, "alfarra-ds", CV, _context(ball_model(), _data(), manager, tmp_path)
    )
    assert healed.steps == 4 and len(calls) == 2


def test_explicit_k_settings_build_as_before_without_choosing(
    ball_model, manager, tmp_path, monkeypatch
):
    from plugins.alfarra import cross_validation

    monkeypatch.setattr(cross_validation, "choose_steps", lambda *a, **k: pytest.fail("chose K"))
    context = _context(ball_model(), _data(), manager, tmp_path)
    for setting, steps in (({"sigma": 0.25}, 100), ({"sigma": 0.25, "steps": 7}, 7)):
        provider, _ = build_method(manager.registry, "alfarra-ds", setting, context)
        assert provider.steps == steps
    assert OPTIMIZER_DEFAULTS["steps"] == 100  # published boards were certified at this K
    assert not list(tmp_path.glob("plugins/alfarra/*/*"))


@pytest.mark.parametrize(
    "change",
    [{"steps": "cross-validate"}, {"steps_candidates": []}, {"steps_candidates": [4, 4]},
     {"steps_candidates": [0, 4]}, {"steps_candidates": [2.5]}, {"steps_candidates": "16"},
     {"cv_examples": 0}, {"cv_examples": True}],
)  # fmt: skip
def test_invalid_cross_validation_settings_are_rejected(change):
    check_optimizer({**OPTIMIZER_DEFAULTS, **CV})
    with pytest.raises(ParameterError):
        check_optimizer({**OPTIMIZER_DEFAULTS, **CV, **change})
