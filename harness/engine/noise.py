"""Counter-based Gaussian noise: ε of sample j, coordinate k of input i in stream s is a function.

Scheme ``philox-v1``. The key is a 64-bit hash of (seed, stream, input id), split into two
32-bit words (k0, k1); the counter is (j, ⌊k/4⌋, 0, 0). Philox-4×32-10
(:mod:`harness.engine.philox`) turns each counter into four 32-bit words x0..x3, the top
24 bits of each a uniform u = (x >> 8 + ½)·2⁻²⁴ in (0, 1), and Box–Muller turns (u0, u1)
into coordinates 4g, 4g+1 and (u2, u3) into 4g+2, 4g+3:

    ε = √(−2 ln u_a)·cos(2π u_b),   ε' = √(−2 ln u_a)·sin(2π u_b).

Nothing depends on the batch, the device or the order of work, so a whole mixed batch is
drawn in one vectorized pass (:func:`gaussian_noise`, torch integer ops on CPU or GPU), and
on CUDA in one fused Triton kernel that also forms x_i + σ_i·ε (:func:`noisy_batch`,
:mod:`harness.engine.noise_kernels`); the two give the same Philox words and agree within
:data:`ROUNDING` (float rounding of log, cos and sin, and a fused multiply-add).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Sequence

import numpy as np
import torch

from harness.engine.philox import philox4x32

_LOW32 = 0xFFFFFFFF
_MASK64 = (1 << 64) - 1


_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
"""splitmix64's increment and multipliers (Steele, Lea & Flood 2014; Vigna's splitmix64.c)."""


def _splitmix64(z: int) -> int:
    z = (z + _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
    return z ^ (z >> 31)


def mix64(*parts: int) -> int:
    """A 64-bit hash of integer coordinates (splitmix64 chained over the parts)."""
    z = 0
    for part in parts:
        z = _splitmix64(z ^ (part & _MASK64))
    return z


def noise_seed(seed: int, stream: int, input_id: int, block: int) -> int:
    """The generator seed of one noise block: a 63-bit hash of its four coordinates."""
    return mix64(seed, stream, input_id, block) >> 1


def splitmix64_array(z: np.ndarray) -> np.ndarray:
    """:func:`_splitmix64` of every element of a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = z + np.uint64(_GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
    return z ^ (z >> np.uint64(31))


def noise_seeds(seed: int, stream: int, input_ids: Sequence[int], block: int) -> list[int]:
    """:func:`noise_seed` of each of ``input_ids`` in one block, computed together (the
    same integers: the chain's input-id and block links vectorized over the ids)."""
    prefix = np.uint64(mix64(seed, stream))
    ids = np.array([i & _MASK64 for i in input_ids], dtype=np.uint64)
    z = splitmix64_array(splitmix64_array(prefix ^ ids) ^ np.uint64(block & _MASK64))
    return (z >> np.uint64(1)).tolist()


def noise_key(seed: int, stream: int, input_id: int) -> tuple[int, int]:
    """The Philox key (k0, k1) of one input's noise in one stream."""
    z = mix64(seed, stream, input_id, 0x5048494C)  # the last word separates it from block seeds
    return z & _LOW32, z >> 32


def _uniform(x: torch.Tensor) -> torch.Tensor:
    return ((x >> 8).to(torch.float32) + 0.5) * (2.0**-24)


def _box_muller(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    radius = torch.sqrt(-2.0 * torch.log(_uniform(a)))
    angle = (2.0 * math.pi) * _uniform(b)
    return radius * torch.cos(angle), radius * torch.sin(angle)


def gaussian_noise(
    keys: torch.Tensor, samples: torch.Tensor, dim: int, chunk: int | None = None
) -> torch.Tensor:
    """Standard normal noise [R, dim] for rows with Philox keys ``keys`` [R, 2] and sample
    indices ``samples`` [R] (int64 tensors on the target device).

    Evaluated in chunks of about ``chunk`` counters (default: 2¹⁴ on CPU, where the
    integer work then stays in cache; all at once elsewhere).
    """
    if chunk is None:
        chunk = 1 << 14 if samples.device.type == "cpu" else 1 << 62
    groups = (dim + 3) // 4
    rows = len(samples)
    out = torch.empty(rows, groups * 4, device=samples.device, dtype=torch.float32)
    g = torch.arange(groups, device=samples.device, dtype=torch.int64)[None, :]
    step = max(1, chunk // groups)
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        k = keys[start:stop]
        x0, x1, x2, x3 = philox4x32(samples[start:stop, None], g, 0, 0, k[:, :1], k[:, 1:])
        view = out[start:stop].view(stop - start, groups, 4)
        view[:, :, 0], view[:, :, 1] = _box_muller(x0, x1)
        view[:, :, 2], view[:, :, 3] = _box_muller(x2, x3)
    return out[:, :dim]


def noisy_batch(
    x: torch.Tensor,
    sigma: torch.Tensor,
    keys: torch.Tensor,
    rows: torch.Tensor,
    samples: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor:
    """out[r] = x[rows[r]] + sigma[rows[r]]·ε(keys[rows[r]], samples[r]), flattened to [R, d].

    ``x`` [J, d] float32 holds the distinct inputs, ``sigma`` [J] float32 and ``keys``
    [J, 2] int64 their σ and Philox keys; ``rows`` [R] and ``samples`` [R] int64 name each
    row's input and sample index. A ``sigma`` [J, d] is a diagonal scale
    (:mod:`harness.engine.scale`), multiplied coordinate by coordinate: the same ε, and a
    row of c's gives the samples of σ = c bit for bit. On CUDA, one fused Triton kernel
    (:mod:`harness.engine.noise_kernels`) when :func:`noise_kernel` says it works; else
    torch ops. The two agree within :data:`ROUNDING` (not bit for bit: a run's
    arithmetic records which one drew its noise).
    """
    if x.is_cuda and noise_kernel(x.device) != TORCH_OPS:
        try:
            return _noisy_batch_triton(x, sigma, keys, rows, samples, out)
        except Exception as exc:  # a kernel that compiled but failed to run here
            _fall_back(f"the fused Triton noise kernel failed ({type(exc).__name__}: {exc})")
    noise = gaussian_noise(keys[rows], samples, x.shape[1])
    torch.index_select(x, 0, rows, out=out)
    return out.addcmul_(sigma[rows] if sigma.dim() == 2 else sigma[rows, None], noise)


ROUNDING = 2.0**-20
"""|ε_kernel − ε_torch| <= ROUNDING·(1 + |ε|) for every coordinate: both paths form u
exactly and differ only in the rounding of log, sqrt, cos and sin (each within a few
float32 ulps, 2⁻²³ relative) and in whether x + σε is fused into one FMA."""

TORCH_OPS = "torch ops"
KERNEL_BLOCK = 256
"""(row, group of four coordinates) pairs per program of the fused kernel."""
_kernel_state: dict[str, str] = {}  # "backend": what draws philox-v1 noise on CUDA here


def noise_kernel(device: torch.device | str) -> str | None:
    """What draws ``philox-v1`` noise on ``device`` in this process: ``"triton X.Y.Z"``
    (the fused kernel, compiled and checked on first use), :data:`TORCH_OPS`, or None on
    a CPU (always torch ops there). Part of the run's arithmetic fingerprint."""
    if torch.device(device).type != "cuda":
        return None
    if "backend" not in _kernel_state:
        _kernel_state["backend"] = _probe_kernel(torch.device(device))
    return _kernel_state["backend"]


def _probe_kernel(device: torch.device) -> str:
    """Compile the fused kernels (one σ per input, a diagonal scale) and run each once on a
    tiny batch against the torch ops."""
    try:
        import triton
    except ImportError:
        return _fall_back("Triton is not installed")
    x = torch.rand(2, 9, device=device)
    sigma = torch.tensor([0.5, 2.0], device=device)
    keys = torch.tensor([noise_key(0, 1, 0), noise_key(0, 1, 1)], device=device)
    rows = torch.tensor([1, 0, 1], device=device)
    samples = torch.tensor([0, 3, 2**31 + 5], device=device)
    eps = gaussian_noise(keys[rows], samples, 9)
    scale = torch.linspace(0.5, 2.0, 18, device=device).view(2, 9)  # harness.engine.scale
    for s, rowwise in ((sigma, sigma[rows, None]), (scale, scale[rows])):
        try:
            got = _noisy_batch_triton(x, s, keys, rows, samples, torch.empty(3, 9, device=device))
        except Exception as exc:
            return _fall_back(f"the fused Triton noise kernel failed ({type(exc).__name__}: {exc})")
        bound = rowwise * ROUNDING * (1 + eps.abs()) + 1e-6
        if not bool(((got - (x[rows] + rowwise * eps)).abs() <= bound).all()):
            return _fall_back(
                "the fused Triton noise kernel computed other noise than the torch ops"
            )
    return f"triton {triton.__version__}"


def _fall_back(why: str) -> str:
    """Warn (once per process) that CUDA noise is drawn with torch ops, and at what cost."""
    if _kernel_state.get("backend") != TORCH_OPS:
        warnings.warn(
            f"{why}; drawing the same philox-v1 noise with torch ops instead, several times "
            "slower (ten integer passes over every batch; `idrs-bench bench --device cuda` "
            "shows the engine's rate against the raw forward pass)",
            RuntimeWarning,
            stacklevel=3,
        )
    _kernel_state["backend"] = TORCH_OPS
    return TORCH_OPS


def _noisy_batch_triton(x, sigma, keys, rows, samples, out):
    """:func:`noisy_batch` by the fused kernel, in launches of fewer than 2³¹ lanes."""
    import triton

    from harness.engine.noise_kernels import noisy_batch_diagonal_kernel, noisy_batch_kernel

    kernel = noisy_batch_diagonal_kernel if sigma.dim() == 2 else noisy_batch_kernel
    x, sigma, keys = x.contiguous(), sigma.contiguous(), keys.contiguous()
    dim = x.shape[1]
    groups = (dim + 3) // 4
    step = max(1, (2**31 - KERNEL_BLOCK) // groups)
    # Triton launches on the current device: make it the tensors' (cuda:1 in its process)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        for start in range(0, len(rows), step):
            stop = min(len(rows), start + step)
            lanes = (stop - start) * groups
            kernel[(triton.cdiv(lanes, KERNEL_BLOCK),)](
                x, sigma, keys, rows[start:stop].contiguous(), samples[start:stop].contiguous(),
                out[start:stop], stop - start, dim, groups, BLOCK=KERNEL_BLOCK,
            )  # fmt: skip
    return out
