"""Counter-based noise (philox-v1): known answers, Gaussian statistics, devices, the kernel."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from scipy import stats

from harness.engine.noise import gaussian_noise, noise_key, noisy_batch
from harness.engine.philox import philox4x32
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


KERNEL_SIGNATURES = {
    "noisy_batch_kernel": ({"x_ptr": "*fp32", "sigma_ptr": "*fp32", "key_ptr": "*i64",
                            "row_ptr": "*i64", "sample_ptr": "*i64", "out_ptr": "*fp32",
                            "rows": "i32", "dim": "i32", "groups": "i32"}, {"BLOCK": 256}),
    "philox_words_kernel": ({"counter_ptr": "*i64", "key_ptr": "*i64", "out_ptr": "*i64",
                             "count": "i32"}, {"BLOCK": 128}),
}  # fmt: skip


def _compile(kernel, signature: dict, constexprs: dict, arch: int):
    """``kernel`` compiled for CUDA compute capability ``arch`` without a device (Triton
    3.2+ names constexprs in the signature; 3.0/3.1 keyed arguments by position)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", arch, 32)
    try:
        source = ASTSource(kernel, signature={**signature, **dict.fromkeys(constexprs,
                                                                           "constexpr")},
                           constexprs=constexprs)  # fmt: skip
    except TypeError:
        names = list(signature) + list(constexprs)
        source = ASTSource(kernel, signature={names.index(k): v for k, v in signature.items()},
                           constants={names.index(k): v for k, v in constexprs.items()})  # fmt: skip
    return triton.compiler.compile(source, target=target)


@pytest.mark.parametrize("arch", [80, 90])
def test_the_kernels_compile_for_real_cuda_targets(arch):
    """What a GPU compiles, compiled here for A100 (sm_80) and H100/H200 (sm_90): the
    interpreter accepts what compilation refuses (e.g. a global that is not a constexpr)."""
    pytest.importorskip("triton")
    from harness.engine import noise_kernels

    for name, (signature, constexprs) in KERNEL_SIGNATURES.items():
        compiled = _compile(getattr(noise_kernels, name), signature, constexprs, arch)
        ptx = compiled.asm["ptx"]
        assert f".target sm_{arch}" in ptx
        assert "mul.hi.u32" in ptx  # Philox's hi word: the unsigned multiply-high
        assert len(compiled.asm["cubin"]) > 0  # Triton's bundled ptxas assembled it
        if name == "noisy_batch_kernel":  # IEEE square root: the documented ROUNDING holds
            assert "sqrt.rn.f32" in ptx and "sqrt.approx" not in ptx


INTERPRETED = """
import torch
from harness.engine.noise import (ROUNDING, _noisy_batch_triton, _probe_kernel, gaussian_noise,
                                  noise_key, philox4x32)
from harness.engine.noise_kernels import philox_words
kat = [((0, 0, 0, 0), (0, 0)), ((2**32 - 1,) * 4, (2**32 - 1,) * 2),
       ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0))]
g = torch.Generator().manual_seed(0)
counters = torch.cat([torch.tensor([c for c, _ in kat]), torch.randint(0, 2**32, (500, 4), generator=g)])
keys = torch.cat([torch.tensor([k for _, k in kat]), torch.randint(0, 2**32, (500, 2), generator=g)])
print([hex(int(w)) for w in philox_words(counters[:3], keys[:3]).flatten()])
torch_words = torch.stack(philox4x32(*counters.T, *keys.T), 1)
print(bool(torch.equal(philox_words(counters, keys), torch_words)))
for dim in (785, 2, 12):
    x = torch.rand(3, dim, generator=g); sigma = torch.tensor([0.5, 1.0, 2.0])
    key = torch.tensor([noise_key(0, 1, i) for i in range(3)])
    rows = torch.tensor([0, 2, 1, 1, 0]); samples = torch.tensor([0, 7, 123456, 3, 2**31 + 5])
    got = _noisy_batch_triton(x, sigma, key, rows, samples, torch.empty(5, dim))
    eps = gaussian_noise(key[rows], samples, dim)
    error = ((got - x[rows]) / sigma[rows, None] - eps).abs() / (1 + eps.abs())
    print(float(error.max() / ROUNDING), float((got - x[rows] - sigma[rows, None] * eps).abs().max()))
print(_probe_kernel(torch.device("cpu")))
"""


@pytest.mark.slow
def test_the_kernels_match_the_torch_ops_in_the_interpreter():
    """Triton's CPU interpreter runs the kernels: the Philox words equal the torch path's
    and the Random123 known answers bit for bit (uint32 multiply-high, wrap-around
    products and key sums); the noise agrees within ROUNDING, every row its own input,
    sample and σ, for dimensions below, at and off a multiple of four."""
    triton = pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", INTERPRETED], capture_output=True, text=True,
                            env=env, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0] == str(
        [
            hex(w)
            for w in (
                0x6627E8D5,
                0xE169C58D,
                0xBC57AC4C,
                0x9B00DBD8,
                0x408F276D,
                0x41C83B0E,
                0xA20BC7C6,
                0x6D5451FD,
                0xD16CFE09,
                0x94FDCCEB,
                0x5001E420,
                0x24126EA1,
            )
        ]
    )
    assert lines[1] == "True"
    for line in lines[2:5]:
        relative, absolute = map(float, line.split())
        assert relative <= 1 and absolute < 1e-5
    assert lines[5] == f"triton {triton.__version__}"  # the probe a CUDA run makes passes


def test_a_failing_kernel_falls_back_to_torch_ops_warning_once(monkeypatch):
    """On a kernel that does not run, the probe falls back: one warning per process that
    says what it costs; later draws use the torch ops silently, and say so (the
    run's arithmetic records it)."""
    import warnings

    from harness.engine import noise

    monkeypatch.setattr(noise, "_kernel_state", {})

    def broken(*args):
        raise RuntimeError("no kernel image is available")

    monkeypatch.setattr(noise, "_noisy_batch_triton", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert noise._probe_kernel(torch.device("cpu")) == noise.TORCH_OPS
        noise._fall_back("again")
    assert len(caught) == 1 and "several times slower" in str(caught[0].message)
    assert "no kernel image is available" in str(caught[0].message)
    assert noise.noise_kernel("cpu") is None  # a CPU always draws with torch ops


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


@pytest.mark.parametrize("arch", [80, 90])
def test_the_diagonal_scale_kernel_compiles_for_real_cuda_targets(arch):
    """The kernel that multiplies the noise per coordinate (tests/test_diagonal_scale.py)."""
    pytest.importorskip("triton")
    from harness.engine import noise_kernels

    signature, constexprs = KERNEL_SIGNATURES["noisy_batch_kernel"]
    signature = {("scale_ptr" if k == "sigma_ptr" else k): v for k, v in signature.items()}
    compiled = _compile(noise_kernels.noisy_batch_diagonal_kernel, signature, constexprs, arch)
    ptx = compiled.asm["ptx"]
    assert f".target sm_{arch}" in ptx and "sqrt.rn.f32" in ptx and compiled.asm["cubin"]
