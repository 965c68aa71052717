"""UCAN's certification-wise noise (issue 59, item 4): its generator, its training on the
frozen base model (μ ≡ 0), the σ-provider ``ucan-npg``, the certifier ``ucan-geometric``
and both methods in a run, with S0 passing ``ucan`` and flagging ``ucan-geometric``."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from scipy.stats import beta, norm

from harness.audit.audit import BUDGETS
from harness.audit.evidence import check_evidence
from harness.audit.replay import check_replay
from harness.audit.session import audits
from harness.engine.noise import noise_seed
from harness.engine.sampling import SamplingEngine
from harness.engine.scale import recorded_scale
from harness.foundation.data import Dataset
from harness.foundation.errors import ParameterError
from harness.foundation.progress import Progress
from harness.foundation.protocol import CertificationProtocol
from harness.foundation.regularity import Unregularized
from harness.foundation.verdict import Verdict
from harness.plugin.components import BuildContext, RunMemo
from harness.running.preparation import RunOptions
from harness.store.store import ResultStore
from harness.store.storedrun import load_runs
from plugins.anisotropic.certifier import AnisotropicCertifier
from plugins.ucan import METHOD_DEFAULTS, check_params
from plugins.ucan.certifier import GeometricCertifier
from plugins.ucan.fit import (
    STREAM_INIT,
    STREAM_MEAN_INIT,
    STREAM_NOISE,
    fit_generators,
    fitting_examples,
    noise_provider,
    obtain_generators,
)
from plugins.ucan.generator import ImageGenerator, VectorGenerator, initial_generator

ENTROPY = int("5ca1ed", 16)
TINY = {**METHOD_DEFAULTS, "epochs": 2, "train_examples": 24, "batch": 8, "train_samples": 3}
"""Training small enough for a test: 6 steps on 24 examples."""


def _images(shape=(1, 6, 6), count=24, seed=0) -> tuple[Dataset, torch.nn.Module]:
    """Random images and a linear classifier of them (3 classes)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(count, *shape, generator=gen)
    y = torch.randint(0, 3, (count,), generator=gen)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(int(np.prod(shape)), 3))
    return Dataset("tiny-images", x, y, x[:8], y[:8], 3), model


def _fit(dataset, model, params=TINY, seed=0, centred=False):
    """(G2, losses), or with ``centred`` ((G1, G2), losses)."""
    mean, scale, losses = fit_generators(model, dataset, params, torch.device("cpu"), seed,
                                         Progress(enabled=False), centred)  # fmt: skip
    return ((mean, scale) if centred else scale), losses


def obtain_scale_generator(context, params):
    return obtain_generators(context, params, centred=False)[1]


def _context(dataset, model, **changes) -> BuildContext:
    context = BuildContext(dataset, model, torch.device("cpu"), 0, CertificationProtocol(n0=10, n=50),
                           SamplingEngine(model, 3, torch.device("cpu"), 64, 0),
                           Progress(enabled=False))  # fmt: skip
    return dataclasses.replace(context, **changes)


# --- the generator ---------------------------------------------------------------------


def _conv(inputs: int, outputs: int) -> int:
    return outputs * (inputs * 9 + 1)


@pytest.mark.parametrize("channels", [1, 3])
def test_the_image_generator_is_ucans_network_and_answers_the_input_shape(channels):
    """UCAN's NoiseGenerator at nf = gc = 16: its parameter count from the layers' shapes,
    the input's shape out, values in [-1, 1] (tanh), also far outside the data's range."""
    generator = initial_generator((channels, 5, 7), 3)
    assert isinstance(generator, ImageGenerator)
    expected = (_conv(channels, 16) + _conv(16, 16) + _conv(32, 16) + _conv(48, 16)
                + _conv(64, 16) + _conv(80, 16) + _conv(16, channels))  # fmt: skip
    assert sum(p.numel() for p in generator.parameters()) == expected
    x = torch.randn(4, channels, 5, 7) * 100
    with torch.no_grad():
        v = generator(x)
    assert v.shape == x.shape and float(v.abs().max()) <= 1.0
    assert float(v.abs().max()) > 0.9  # saturates: the range is tanh's


@pytest.mark.parametrize("shape", [(2,), (7,), (2, 3)])
def test_inputs_that_are_not_images_get_an_mlp_with_a_tanh_output(shape):
    generator = initial_generator(shape, 3)
    assert isinstance(generator, VectorGenerator)
    x = torch.randn(5, *shape) * 100
    with torch.no_grad():
        v = generator(x)
    assert v.shape == x.shape and float(v.abs().max()) <= 1.0


def test_the_initialization_is_seeded_and_leaves_the_global_generator_alone():
    state = torch.random.get_rng_state()
    a, b, c = (initial_generator((1, 4, 4), s) for s in (5, 5, 6))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.first.weight, c.first.weight)


# --- training ----------------------------------------------------------------------------


def _cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return -(logits.log_softmax(1)[torch.arange(len(y)), y]).mean()


@pytest.mark.parametrize("measure", ["smallest", "geometric"])
def test_the_first_steps_loss_is_ucans_loss_computed_independently(measure):
    """One step's loss: Σ_k CE(f(x + λ·v⊙ε_k), y) − K·m(v), v = |G2(x)| at the initial
    weights, m = min|v| over the batch or mean|v|, ε the seeded draws of stream 122."""
    dataset, model = _images()
    params = {**TINY, "measure": measure, "epochs": 1, "train_examples": 8, "batch": 8}
    _, losses = _fit(dataset, model, params, seed=4)
    assert len(losses) == 1
    x, y, order = fitting_examples(dataset, params, torch.device("cpu"), 4)
    permutation = torch.randperm(len(x), generator=order)
    x, y = x[permutation], y[permutation]
    eps = torch.randn((3, *x.shape),
                      generator=torch.Generator().manual_seed(noise_seed(4, STREAM_NOISE, 0, 0)))  # fmt: skip
    with torch.no_grad():
        v = initial_generator((1, 6, 6), noise_seed(4, STREAM_INIT, 0, 0))(x).abs()
        m = v.min() if measure == "smallest" else v.mean()
        expected = sum(float(_cross_entropy(model(x + 0.25 * e * v), y) - m) for e in eps)
    assert losses[0] == pytest.approx(expected, rel=1e-5)


def test_the_centred_first_loss_is_ucans_with_the_mean_generator():
    """With G1 (``ucan-npg-centred``): Σ_k CE(f(x + μ + λ·v⊙ε_k), y) − K·min|v|, μ = λ·G1(x),
    v = |G2(x + μ)| (UCAN's ``train_certification_noise.py``), at the initial weights of
    both (G1 from stream 123); one step trains both generators."""
    dataset, model = _images()
    params = {**TINY, "epochs": 1, "train_examples": 8, "batch": 8}
    (mean, scale), losses = _fit(dataset, model, params, seed=4, centred=True)
    x, y, order = fitting_examples(dataset, params, torch.device("cpu"), 4)
    permutation = torch.randperm(len(x), generator=order)
    x, y = x[permutation], y[permutation]
    eps = torch.randn((3, *x.shape),
                      generator=torch.Generator().manual_seed(noise_seed(4, STREAM_NOISE, 0, 0)))  # fmt: skip
    g1 = initial_generator((1, 6, 6), noise_seed(4, STREAM_MEAN_INIT, 0, 0))
    g2 = initial_generator((1, 6, 6), noise_seed(4, STREAM_INIT, 0, 0))
    with torch.no_grad():
        mu = 0.25 * g1(x)
        v = g2(x + mu).abs()
        expected = sum(float(_cross_entropy(model(x + mu + 0.25 * e * v), y) - v.min())
                       for e in eps)  # fmt: skip
    assert losses[0] == pytest.approx(expected, rel=1e-5)
    assert not torch.equal(mean.first.weight, g1.first.weight)
    assert not torch.equal(scale.first.weight, g2.first.weight)


def test_the_centred_provider_answers_ucans_mean_and_scale(tmp_path, monkeypatch):
    """centre(x) = λ·G1(x) and σ = λ·max(|G2(x + μ)|, floor), here from the trained
    generators' own float32 forward (relative 1e-5), stored and reloaded together; the
    provider without G1 has no ``centre`` at all (its noise is centred at x)."""
    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path))
    dataset, model = _images()
    context = _context(dataset, model, recipe_hash="1" * 64)
    mean, generator = obtain_generators(context, TINY, centred=True)
    provider = noise_provider(context, TINY, centred=True)
    x = dataset.test_x
    with torch.no_grad():
        mu = 0.25 * mean(x)
        expected = 0.25 * generator(x + mu).abs().clamp_min(TINY["floor"])
    assert torch.allclose(provider.centre(x).double(), mu.double(), rtol=1e-5, atol=1e-7)
    assert torch.allclose(provider(x).double(), expected.double(), rtol=1e-5, atol=0)
    assert (
        len(list((tmp_path / "plugins" / "ucan" / ("1" * 64)).glob("noise-generators-*.pt"))) == 1
    )
    again = obtain_generators(dataclasses.replace(context, memos=RunMemo()), TINY, centred=True)
    assert torch.equal(again[0].first.weight, mean.first.weight)
    assert torch.equal(again[1].first.weight, generator.first.weight)
    assert not hasattr(noise_provider(context, TINY, centred=False), "centre")


def test_training_is_seeded_and_leaves_the_classifier_untouched():
    dataset, model = _images()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    (a, la), (b, lb), (c, _) = (_fit(dataset, model, seed=s) for s in (0, 0, 1))
    assert la == lb and len(la) == 6
    for p, q in zip(a.state_dict().values(), b.state_dict().values(), strict=True):
        assert torch.equal(p, q)
    assert not torch.equal(a.first.weight, c.first.weight)
    initial = initial_generator((1, 6, 6), noise_seed(0, STREAM_INIT, 0, 0))
    assert not torch.equal(a.first.weight, initial.first.weight)  # G2 was trained
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.requires_grad for p in model.parameters()) and model.training


# --- the σ-provider ----------------------------------------------------------------------


def test_the_provider_answers_lambda_times_the_floored_generator_output(tmp_path, monkeypatch):
    """σ = λ·max(|G2(x)|, floor) in float32 [B, *input_shape], computed here from the trained
    G2's own float32 forward; a row's scale is the same alone and in a batch (relative 1e-6)."""
    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path))
    dataset, model = _images()
    context = _context(dataset, model)
    generator = obtain_scale_generator(context, TINY)
    x = dataset.test_x
    with torch.no_grad():
        v = generator(x).abs().double()
    floor = float(v.median())  # half of the axes at the floor
    provider = noise_provider(
        context, {**TINY, "floor": floor}, centred=False
    )  # the same fit (λ = 0.25)
    scale = provider(x)
    assert isinstance(provider.regularity, Unregularized)
    assert scale.dtype == torch.float32 and scale.shape == x.shape
    expected = 0.25 * torch.maximum(v, torch.tensor(floor, dtype=torch.float64))
    assert torch.allclose(scale.double(), expected, rtol=1e-5, atol=0)
    floored = v < floor
    assert floored.any() and (~floored).any()
    assert torch.all(scale[floored] == np.float32(0.25 * floor))
    assert float(scale.min()) > 0 and float(scale.max()) <= 0.25
    alone = torch.cat([provider(x[k : k + 1]) for k in range(len(x))])
    assert float(((alone - scale).abs() / scale).max()) <= 1e-6


def test_the_generator_is_stored_reloaded_and_retrained_when_damaged(tmp_path, monkeypatch):
    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path))
    dataset, model = _images()
    context = _context(dataset, model, recipe_hash="0" * 64)
    first = obtain_scale_generator(context, TINY)
    assert obtain_scale_generator(context, dict(TINY)) is first  # the run's memo
    (path,) = (tmp_path / "plugins" / "ucan" / ("0" * 64)).glob("scale-generator-*.pt")
    reloaded = obtain_scale_generator(dataclasses.replace(context, memos=RunMemo()), TINY)
    assert reloaded is not first
    assert all(torch.equal(p, q) for p, q in zip(first.parameters(), reloaded.parameters(),
                                                 strict=True))  # fmt: skip
    path.write_bytes(b"damaged")
    retrained = obtain_scale_generator(dataclasses.replace(context, memos=RunMemo()), TINY)
    assert torch.equal(retrained.first.weight, first.first.weight)
    assert list(path.parent.glob("*.corrupt-*"))


# --- the certifier -----------------------------------------------------------------------


def test_the_geometric_certifier_claims_ucans_radius_and_the_ellipsoid(scaled_evidence):
    """R = Φ⁻¹(p_A_lower)·exp(mean log σ_i) (SciPy's beta and norm, NumPy's log), the
    ellipsoid κ = Φ⁻¹(p_A_lower) as ``anisotropic``'s; an abstention claims nothing."""
    scale = [[0.5, 0.25, 2.0, 1.0], [0.1, 0.1, 0.1, 0.1], [0.3, 0.2, 0.3, 0.3]]
    evidence = scaled_evidence([[60, 4, 0], [1, 99, 0], [30, 30, 40]],
                         [[9900, 100, 0], [10, 9985, 5], [3400, 3300, 3300]], scale)  # fmt: skip
    claims = GeometricCertifier().certify(evidence)
    balls = AnisotropicCertifier().certify(evidence)
    for k, count in ((0, 9900), (1, 9985)):
        p = beta.ppf(0.001, count, 10000 - count + 1)
        geometric = np.exp(np.mean(np.log(np.asarray(scale[k], dtype=np.float32).astype(float))))
        assert claims[k].radius == pytest.approx(norm.ppf(p) * geometric, rel=1e-12)
        assert claims[k].ellipsoid == pytest.approx(norm.ppf(p), rel=1e-12)
        assert claims[k].prediction == balls[k].prediction
    assert claims[0].radius > balls[0].radius  # above the ℓ2 ball: not an ℓ2 certificate
    assert claims[1].radius == pytest.approx(balls[1].radius, rel=1e-6)  # equal axes: the ball
    assert claims[2].prediction == -1 and claims[2].radius == 0 and claims[2].ellipsoid is None
    certifier = GeometricCertifier()
    assert certifier.diagonal_scale is True
    assert certifier.radius_formula is AnisotropicCertifier.radius_formula


# --- parameters --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [({"measure": "mean"}, "measure must be one of 'smallest', 'geometric'"),
     ({"sigma": 0}, "sigma must lie in"), ({"sigma": float("nan")}, "sigma must lie in"),
     ({"floor": 0.0}, "floor must lie in"), ({"floor": 1.5}, "floor must lie in"),
     ({"epochs": 0}, "epochs must be an integer >= 1"), ({"batch": 2.5}, "batch must be"),
     ({"train_samples": True}, "train_samples must be"), ({"lr": -1}, "lr must lie in"),
     ({"sigma": 1e-40, "floor": 1e-3}, "not a positive float32 scale")],
)  # fmt: skip
def test_invalid_parameters_are_clear_parameter_errors(change, message):
    check_params(METHOD_DEFAULTS)
    check_params({**METHOD_DEFAULTS, "measure": "geometric"})
    with pytest.raises(ParameterError, match=message):
        check_params({**METHOD_DEFAULTS, **change})


# --- a run ---------------------------------------------------------------------------------


RUN_SETTINGS = {"epochs": 1, "train_examples": 64, "batch": 32, "train_samples": 2, "sigma": 0.5}


@pytest.fixture
def ucan_run(tmp_path, monkeypatch, manager, replay_run):
    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path / "cache"))
    methods = [{"name": name, "settings": [RUN_SETTINGS]} for name in ("ucan", "ucan-geometric")]
    return replay_run(tmp_path, manager, methods, n=400, count=8)


def test_both_methods_run_and_s0_passes_ucan_and_flags_the_geometric_radius(
    manager, ucan_run, scaled_evidence
):
    """On ``ball-2``: ``ucan``'s radius is σ_min·Φ⁻¹(p_A_lower) of its recorded scale and S0
    re-derives it; ``ucan-geometric`` claims Φ⁻¹(p_A_lower)·geomean(scale), which S0 finds
    above Cohen's radius at σ_min, its declared formula (violated); both record the ellipsoid."""
    db, run_id = ucan_run
    (run,) = load_runs(db, [run_id])
    rows = {"ucan": [], "ucan-geometric": []}
    for c in run.certificates:
        rows[c.method].append(c)
    for name, certificates in rows.items():
        assert len(certificates) == 8, name
        certified = [c for c in certificates if c.prediction != -1]
        assert certified, f"{name} certifies some ball-2 inputs"
        for c in certificates:
            scale = recorded_scale(c.draws).astype(np.float64)
            assert scale.shape == (2,) and np.all(scale > 0) and np.all(scale <= 0.5)
            assert c.sigma == scale.min()
        for c in certified:
            kappa = norm.ppf(c.p_lower)
            scale = recorded_scale(c.draws).astype(np.float64)
            measure = scale.min() if name == "ucan" else np.exp(np.log(scale).mean())
            assert c.radius == pytest.approx(kappa * measure, rel=1e-9)
            assert c.region["factor"] == pytest.approx(kappa, rel=1e-12)
    store = ResultStore(db)
    try:
        by_name = {audit.method.name: audit for audit in audits(
            store, run_id, RunOptions(db=db), Progress(enabled=False), manager,
            budget=BUDGETS["small"], entropy=ENTROPY)}  # fmt: skip
    finally:
        store.close()
    sound = check_evidence(by_name["ucan"])
    assert sound.verdict == Verdict.SOUND, sound.summary
    flagged = check_evidence(by_name["ucan-geometric"])
    assert flagged.verdict == Verdict.VIOLATED, flagged.summary
    assert flagged.evidence["first"]["quantity"] == "radius"
    above = [c for c in rows["ucan-geometric"]
             if c.prediction != -1 and c.radius > c.sigma * norm.ppf(c.p_lower) * (1 + 1e-9)]  # fmt: skip
    assert flagged.evidence["mismatches"]["radius"] == len(above) > 0
    replayed = check_replay(by_name["ucan"])  # the stored generator answers the stored scales
    assert replayed.verdict == Verdict.SOUND, replayed.summary
