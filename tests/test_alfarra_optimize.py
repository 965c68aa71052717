"""OptimizeSigma (Alfarra et al. 2022, Alg. 1): closed forms, an independent one-input
reference, finite differences, reproducibility and σ > 0."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from scipy.stats import norm

from harness.engine.noise import noise_seed
from harness.foundation.errors import ParameterError
from harness.plugin.manager import PluginManager
from plugins.alfarra.optimize_sigma import (
    STREAM_OPTIMIZE,
    OptimizedSigma,
    content_keys,
    optimize_sigma,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _mlp(d=6, classes=4, seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(d, 16), torch.nn.Tanh(), torch.nn.Linear(16, classes)
    ).to(dtype)
    return model.eval()


def _reference_one_input(model, x, sigma0, key, seed, stream, steps, samples, beta, sigma_min):
    """Alg. 1 for one input, written out step by step (scalar σ, plain torch autograd)."""
    sigma = float(sigma0)
    gen = torch.Generator().manual_seed(0)
    for k in range(steps):
        gen.manual_seed(noise_seed(seed, stream, key, k))
        delta = torch.randn((samples, *x.shape), generator=gen, dtype=x.dtype)
        s = torch.tensor(sigma, dtype=torch.float64, requires_grad=True)
        probs = torch.softmax(model(x[None] + s.to(x.dtype) * delta), dim=1).double().mean(0)
        e_a, e_b = torch.sort(probs, descending=True).values[:2].clamp(0.02, 0.98)
        radius = s / 2 * (torch.special.ndtri(e_a) - torch.special.ndtri(e_b))
        radius.backward()
        sigma = max(sigma + beta * float(s.grad), sigma_min)
    return sigma


def test_batched_equals_the_one_input_reference_on_the_same_noise():
    model = _mlp()
    x = torch.randn(7, 6, generator=torch.Generator().manual_seed(1))
    keys = [11, 3, 2**40 + 5, 0, 99, 7, 12345678901]
    kw = dict(seed=5, stream=STREAM_OPTIMIZE, steps=6, samples=3, beta=0.05, sigma_min=1e-3)
    # chunks of 2 inputs (max_batch = 6 samples), i.e. batches unlike the one-input runs
    batched = optimize_sigma(model, x, 0.3, keys, max_batch=6, **kw).numpy()
    reference = [_reference_one_input(model, x[i], 0.3, keys[i], **kw) for i in range(len(x))]
    assert np.allclose(batched, reference, rtol=1e-6, atol=0)
    assert len(set(np.round(batched, 8))) == len(x)  # the inputs really differ


def test_sigma_of_an_input_does_not_depend_on_its_batch():
    model = _mlp()
    provider = OptimizedSigma(model, 0.3, steps=5, samples=2, beta=0.05, sigma_min=1e-3, seed=2)
    x = torch.randn(6, 6, generator=torch.Generator().manual_seed(3))
    full = provider(x)
    perm = torch.tensor([4, 0, 5, 2, 1, 3])
    assert torch.allclose(provider(x[perm]), full[perm], rtol=1e-6, atol=0)
    assert torch.allclose(provider(x[2:3]), full[2:3], rtol=1e-6, atol=0)
    # σ(x) is a function of x: the same input twice in one batch gets the same σ
    twice = provider(torch.cat([x[:1], x[:1]]))
    assert twice[0] == twice[1]


def test_reproducible_with_a_seed_and_different_with_another():
    model = _mlp()
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(4))
    make = lambda seed: OptimizedSigma(model, 0.3, 8, 1, 0.05, 1e-3, seed=seed)  # noqa: E731
    assert torch.equal(make(0)(x), make(0)(x))
    assert not torch.allclose(make(0)(x), make(1)(x))


def test_clamped_far_from_the_boundary_sigma_grows_by_beta_times_probit_098_per_step(ball_model):
    """Far outside the ball E_A > 0.98 and E_B < 0.02 are clamped, so ∂R/∂σ = Φ⁻¹(0.98)."""
    x = torch.tensor([[50.0, 0.0]])
    steps, beta, sigma0 = 40, 0.1, 0.25
    sigma = OptimizedSigma(ball_model(), sigma0, steps, 16, beta, 1e-3, seed=0)(x)
    assert float(sigma[0]) == pytest.approx(sigma0 + steps * beta * norm.ppf(0.98), rel=1e-9)


def test_one_step_is_beta_times_a_finite_difference_of_the_radius():
    model = _mlp(dtype=torch.float64)
    x = torch.randn(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    keys, seed, samples, beta, sigma0 = [1, 2, 3], 9, 64, 0.01, 0.4
    sigma1 = optimize_sigma(
        model, x, sigma0, keys, seed=seed, stream=STREAM_OPTIMIZE, steps=1, samples=samples,
        beta=beta, sigma_min=1e-3,
    )  # fmt: skip
    for i in range(3):
        gen = torch.Generator().manual_seed(noise_seed(seed, STREAM_OPTIMIZE, keys[i], 0))
        delta = torch.randn((samples, 6), generator=gen, dtype=torch.float64)

        def radius(s, i=i, delta=delta):
            with torch.no_grad():
                p = np.sort(torch.softmax(model(x[i] + s * delta), 1).mean(0).numpy())[::-1]
            e = np.clip(p[:2], 0.02, 0.98)
            return s / 2 * (norm.ppf(e[0]) - norm.ppf(e[1]))

        h = 1e-6
        slope = (radius(sigma0 + h) - radius(sigma0 - h)) / (2 * h)
        assert abs(slope) > 1e-3  # a step that really moves
        assert float(sigma1[i]) == pytest.approx(sigma0 + beta * slope, rel=1e-9, abs=1e-10)


def test_sigma_stays_positive_and_is_floored_at_sigma_min(ball_model):
    # inside the unit ball at σ = 0.5 the radius decreases in σ: a huge step overshoots below 0
    x = torch.zeros(1, 2)
    sigma = OptimizedSigma(
        ball_model(), 0.5, steps=1, samples=256, beta=100.0, sigma_min=1e-3, seed=0
    )
    assert float(sigma(x)[0]) == 1e-3
    rng = np.random.default_rng(0)
    for trial in range(10):
        model = _mlp(seed=trial)
        x = torch.as_tensor(rng.normal(size=(5, 6)) * rng.uniform(0.1, 5), dtype=torch.float32)
        beta = float(10 ** rng.uniform(-3, 2))
        out = OptimizedSigma(model, float(rng.uniform(0.01, 1)), 10, 2, beta, 1e-4, seed=trial)(x)
        assert bool((out >= 1e-4).all()) and bool(torch.isfinite(out).all())


def test_zero_steps_return_sigma0_and_content_keys_follow_the_bytes():
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(6))
    out = OptimizedSigma(_mlp(), 0.37, 0, 1, 1e-4, 1e-3, seed=0)(x)
    assert out.tolist() == [0.37] * 3 and out.dtype == torch.float64
    keys = content_keys(x)
    assert keys == content_keys(x.clone()) and len(set(keys)) == 3
    assert content_keys(x[1:2]) == keys[1:2]


@pytest.mark.parametrize(
    "bad",
    [{"steps": -1}, {"samples": 0}, {"beta": -1.0}, {"sigma_min": 0.0}, {"sigma": 0.0},
     {"steps": 1.5}, {"memory_certifier": "memory"}],
)  # fmt: skip
def test_invalid_parameters_are_rejected_before_any_work(bad):
    manager = PluginManager(third_party=False)
    method = manager.registry.get("methods", "alfarra-ds-memory")
    with pytest.raises(ParameterError):
        method.check({**method.defaults, **bad})


@pytest.mark.parametrize("samples", [1, 3])
def test_sigma_is_bit_identical_alone_and_anywhere_in_any_batch(samples):
    """σ(x) is a pure function of x and the seed: computed alone, in a batch of 7 and at
    several positions of a batch of 64 it is the same float, bit for bit (a matrix
    product's rows depend on its number of rows, which the padded chunks fix)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 200), torch.nn.ReLU(),
                                torch.nn.Linear(200, 10)).eval()  # fmt: skip
    x = torch.rand(64, 784, generator=torch.Generator().manual_seed(5))
    kw = dict(seed=3, stream=STREAM_OPTIMIZE, steps=4, samples=samples, beta=0.05, sigma_min=1e-3)

    def sigma(batch):
        return optimize_sigma(model, batch, 0.25, content_keys(batch), **kw)

    full = sigma(x)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(6))
    shuffled = sigma(x[perm])[torch.argsort(perm)]
    for i in (0, 5, 63):
        assert torch.equal(sigma(x[i : i + 1]), full[i : i + 1])
    assert torch.equal(sigma(x[5:12]), full[5:12])
    assert torch.equal(shuffled, full)
    assert len(set(full.tolist())) > 32  # σ really depends on the input


def test_a_call_of_several_chunks_ascends_them_together_as_each_point_alone():
    """The ascent of a call of 150 points (3 chunks of 64 rows, in lock-step) gives each
    point the σ of its ascent alone within the replay check's tolerance (bit for bit where
    the BLAS rounds no row of the gradient by its position: not MKL's AVX-512 kernels,
    whose odd rows differ in their last bits), and the σ of the one-input reference
    written out step by step up to rounding."""
    from harness.audit.replay import SIGMA_TOLERANCE

    model = _mlp(d=6)
    x = torch.randn(150, 6, generator=torch.Generator().manual_seed(8))
    keys = content_keys(x)
    kw = dict(seed=4, stream=STREAM_OPTIMIZE, steps=5, samples=1, beta=0.05, sigma_min=1e-3)
    together = optimize_sigma(model, x, 0.3, keys, **kw)
    for i in (0, 63, 64, 127, 128, 149):
        alone = optimize_sigma(model, x[i : i + 1], 0.3, keys[i : i + 1], **kw)
        assert float(alone) == pytest.approx(float(together[i]), rel=SIGMA_TOLERANCE, abs=0)
        reference = _reference_one_input(model, x[i], 0.3, keys[i], **kw)
        assert float(together[i]) == pytest.approx(reference, rel=1e-6)
    assert len(set(together.tolist())) > 100  # σ really depends on the point


def test_a_non_finite_gradient_in_any_chunk_is_an_error_naming_the_model():
    from harness.foundation.errors import ModelOutputError

    class Broken(torch.nn.Module):  # NaN logits for inputs far from the origin
        def __init__(self):
            super().__init__()
            self.mlp = _mlp(d=6)

        def forward(self, x):
            return torch.where(x.norm(dim=1, keepdim=True) > 10, torch.nan, self.mlp(x))

    x = torch.randn(70, 6, generator=torch.Generator().manual_seed(9))
    x[66] *= 100  # in the second chunk only
    kw = dict(seed=4, stream=STREAM_OPTIMIZE, steps=3, samples=1, beta=0.05, sigma_min=1e-3)
    with pytest.raises(ModelOutputError, match="non-finite gradient"):
        optimize_sigma(Broken(), x, 0.3, content_keys(x), **kw)
    assert torch.isfinite(optimize_sigma(Broken(), x[:64], 0.3, content_keys(x[:64]), **kw)).all()


def test_the_ascent_is_the_same_bit_for_bit_in_any_batch_where_mkl_rounds_rows_alike():
    """Under ``MKL_CBWR=AVX2`` (MKL's reproducible AVX2 kernels, which round every row of
    a product alike) the ascent alone and in a batch agree bit for bit: what differs on an
    AVX-512 CPU is the BLAS's rounding, not the ascent."""
    if "mkl" not in torch.__config__.show().lower():
        pytest.skip("torch is not built with MKL here")
    script = (
        "import torch\n"
        "from plugins.alfarra.optimize_sigma import STREAM_OPTIMIZE, content_keys, optimize_sigma\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))\n"
        "x = torch.randn(150, 6, generator=torch.Generator().manual_seed(8))\n"
        "keys = content_keys(x)\n"
        "kw = dict(seed=4, stream=STREAM_OPTIMIZE, steps=5, samples=1, beta=0.05, sigma_min=1e-3)\n"
        "together = optimize_sigma(model, x, 0.3, keys, **kw)\n"
        "print(sum(not torch.equal(optimize_sigma(model, x[i:i+1], 0.3, keys[i:i+1], **kw),\n"
        "                          together[i:i+1]) for i in range(150)))\n"
    )
    env = {**os.environ, "MKL_CBWR": "AVX2", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    assert done.stdout.strip() == "0"
