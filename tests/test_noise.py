"""Counter-based noise (philox-v1): known answers, Gaussian statistics, devices, the kernel."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from scipy import stats

from harness.engine.noise import gaussian_noise, noise_key, noisy_batch, philox4x32
from harness.engine.sampling import SamplingEngine


def _t(v: int) -> torch.Tensor:
    return torch.tensor([v], dtype=torch.int64)


@pytest.mark.parametrize(
    ("counter", "key", "expected"),
    [  # Random123 known-answer vectors of Philox-4x32-10 (kat_vectors)
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ],
)
def test_philox_matches_the_random123_known_answers(counter, key, expected):
    out = philox4x32(*[_t(c) for c in counter], *[_t(k) for k in key])
    assert [int(o) for o in out] == list(expected)


def _draw(inputs: int, samples: int, dim: int, stream: int = 1) -> torch.Tensor:
    keys = torch.tensor([noise_key(4, stream, i) for i in range(inputs)])
    rows = torch.arange(inputs).repeat_interleave(samples)
    index = torch.arange(samples).repeat(inputs)
    return gaussian_noise(keys[rows], index, dim).view(inputs, samples, dim)


def test_noise_is_standard_normal():
    noise = _draw(8, 500, 37).double()  # 148,000 values, dim not a multiple of 4
    flat = noise.flatten().numpy()
    assert abs(flat.mean()) < 5 / np.sqrt(flat.size)
    assert abs(flat.var() - 1) < 5 * np.sqrt(2 / flat.size)
    assert stats.kstest(flat, stats.norm.cdf).pvalue > 1e-3
    # every coordinate of the Box–Muller quadruple is N(0, 1) on its own
    for k in range(4):
        assert stats.kstest(noise[..., k].flatten().numpy(), stats.norm.cdf).pvalue > 1e-3
    # fourth moment of a normal is 3
    assert abs((flat**4).mean() - 3) < 0.1


def test_noise_is_uncorrelated_across_inputs_samples_coordinates_and_streams():
    noise = _draw(6, 2000, 8).double().numpy()
    bound = 5 / np.sqrt(2000 * 8)

    def corr(a, b):
        return float(np.corrcoef(a.ravel(), b.ravel())[0, 1])

    assert abs(corr(noise[0], noise[1])) < bound  # two inputs, same sample indices
    assert abs(corr(noise[2, :-1], noise[2, 1:])) < bound  # consecutive samples
    assert abs(corr(noise[3, :, 0::2], noise[3, :, 1::2])) < 5 / np.sqrt(2000 * 4)  # cos/sin
    assert abs(corr(noise[3, :, 0::4], noise[3, :, 2::4])) < 5 / np.sqrt(2000 * 2)
    other = _draw(6, 2000, 8, stream=0).double().numpy()
    assert abs(corr(noise, other)) < 5 / np.sqrt(noise.size)
    # the squares too (Box–Muller shares one radius between a cos/sin pair)
    assert abs(corr(noise[4, :, 0::2] ** 2, noise[4, :, 1::2] ** 2)) < 5 / np.sqrt(2000 * 4)


def test_noisy_batch_is_x_plus_sigma_times_the_noise_of_each_row():
    x = torch.rand(3, 10)
    sigma = torch.tensor([0.5, 1.0, 2.0])
    keys = torch.tensor([noise_key(0, 1, i) for i in (7, 8, 9)])
    rows = torch.tensor([2, 0, 0, 1])
    samples = torch.tensor([5, 0, 1, 99])
    out = noisy_batch(x, sigma, keys, rows, samples, torch.empty(4, 10))
    for r in range(4):
        alone = gaussian_noise(keys[rows[r : r + 1]], samples[r : r + 1], 10)[0]
        assert torch.allclose(out[r], x[rows[r]] + sigma[rows[r]] * alone, atol=1e-6)


def test_triton_kernel_matches_the_torch_ops_in_the_interpreter():
    """The fused CUDA kernel, run by Triton's CPU interpreter, gives the torch-ops noise."""
    pytest.importorskip("triton")
    code = """
import torch
from harness.engine.noise import _noisy_batch_triton, gaussian_noise, noise_key
x = torch.rand(3, 785); sigma = torch.tensor([0.5, 1.0, 2.0])
keys = torch.tensor([noise_key(0, 1, i) for i in range(3)])
rows = torch.tensor([0, 2, 1, 1, 0]); samples = torch.tensor([0, 7, 123456, 3, 2**31 + 5])
got = _noisy_batch_triton(x, sigma, keys, rows, samples, torch.empty(5, 785))
ref = x[rows] + sigma[rows, None] * gaussian_noise(keys[rows], samples, 785)
print(float((got - ref).abs().max()))
"""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert float(result.stdout.strip().splitlines()[-1]) < 1e-5


@pytest.mark.gpu
def test_cuda_noise_equals_cpu_noise_up_to_float_rounding():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 5)).eval()
    x = torch.rand(5, 3, 8, 8)
    sigma = torch.tensor([0.1, 0.25, 0.5, 1.0, 2.0])
    keys = torch.tensor([noise_key(3, 1, i) for i in range(5)])
    rows = torch.arange(5).repeat_interleave(300)
    samples = torch.arange(300).repeat(5)
    flat = x.flatten(1)
    cpu = noisy_batch(flat, sigma, keys, rows, samples, torch.empty(1500, 192))
    cuda = noisy_batch(
        flat.cuda(), sigma.cuda(), keys.cuda(), rows.cuda(), samples.cuda(),
        torch.empty(1500, 192, device="cuda"),
    )  # fmt: skip
    assert torch.allclose(cuda.cpu(), cpu, rtol=1e-5, atol=1e-5)
    counts = [
        SamplingEngine(
            model.to(device), 5, torch.device(device), batch_size=b, seed=3, noise="philox-v1"
        ).counts(x, sigma, list(range(5)), 2000, stream=1)
        for device, b in (("cpu", 512), ("cuda", 700))
    ]
    assert np.abs(counts[0] - counts[1]).sum() <= 4  # argmax flips only at float near-ties
