"""Counter-based Gaussian noise: ε of sample j, coordinate k of input i in stream s is a function.

Scheme ``philox-v1``. The key is a 64-bit hash of (seed, stream, input id), split into two
32-bit words (k0, k1); the counter is (j, ⌊k/4⌋, 0, 0). Philox-4×32-10 (Salmon et al.,
"Parallel random numbers: as easy as 1, 2, 3", SC 2011, §4.2: 10 rounds of
c ← (hi(M1·c2) ⊕ c1 ⊕ k0, lo(M1·c2), hi(M0·c0) ⊕ c3 ⊕ k1, lo(M0·c0)), key bumped by the
Weyl constants between rounds) turns each counter into four 32-bit words x0..x3, the top
24 bits of each a uniform u = (x >> 8 + ½)·2⁻²⁴ in (0, 1), and Box–Muller turns (u0, u1)
into coordinates 4g, 4g+1 and (u2, u3) into 4g+2, 4g+3:

    ε = √(−2 ln u_a)·cos(2π u_b),   ε' = √(−2 ln u_a)·sin(2π u_b).

Nothing depends on the batch, the device or the order of work, so a whole mixed batch is
drawn in one vectorized pass (:func:`gaussian_noise`, torch integer ops on CPU or GPU), and
on CUDA in one fused Triton kernel that also forms x_i + σ_i·ε (:func:`noisy_batch`); the
two agree up to float rounding of log, sqrt, cos and sin.
"""

from __future__ import annotations

import math
import warnings

import torch

PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
PHILOX_ROUNDS = 10
_LOW32 = 0xFFFFFFFF
_MASK64 = (1 << 64) - 1


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
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


def noise_key(seed: int, stream: int, input_id: int) -> tuple[int, int]:
    """The Philox key (k0, k1) of one input's noise in one stream."""
    z = mix64(seed, stream, input_id, 0x5048494C)  # the last word separates it from block seeds
    return z & _LOW32, z >> 32


def philox4x32(
    c0: torch.Tensor,
    c1: torch.Tensor,
    c2: torch.Tensor | int,
    c3: torch.Tensor | int,
    k0: torch.Tensor | int,
    k1: torch.Tensor | int,
) -> tuple[torch.Tensor, ...]:
    """Philox-4×32-10 of counters (c0, c1, c2, c3) under keys (k0, k1), uint32 held in int64.

    Arguments broadcast; an int64 product of two 32-bit words wraps modulo 2⁶⁴, whose low
    and high halves are the lo and hi words of the product.
    """
    for _ in range(PHILOX_ROUNDS):
        p0 = c0 * PHILOX_M0
        p1 = c2 * PHILOX_M1
        c0, c1, c2, c3 = (
            ((p1 >> 32) & _LOW32) ^ c1 ^ k0,
            p1 & _LOW32,
            ((p0 >> 32) & _LOW32) ^ c3 ^ k1,
            p0 & _LOW32,
        )
        k0 = (k0 + PHILOX_W0) & _LOW32
        k1 = (k1 + PHILOX_W1) & _LOW32
    return c0, c1, c2, c3


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
    row's input and sample index. On CUDA with Triton, one fused kernel; else torch ops.
    """
    if x.is_cuda and _triton_kernel() is not None:
        try:
            return _noisy_batch_triton(x, sigma, keys, rows, samples, out)
        except Exception as exc:
            global _TRITON_FAILED
            _TRITON_FAILED = True
            warnings.warn(
                f"the fused Triton noise kernel failed ({type(exc).__name__}: {exc}); "
                "drawing the same noise with torch ops instead",
                RuntimeWarning,
                stacklevel=2,
            )
    noise = gaussian_noise(keys[rows], samples, x.shape[1])
    torch.index_select(x, 0, rows, out=out)
    return out.addcmul_(sigma[rows, None], noise)


_TRITON_FAILED = False
_KERNEL = None


def _triton_kernel():
    """The fused kernel, compiled lazily; None without Triton."""
    global _KERNEL
    if _TRITON_FAILED:
        return None
    if _KERNEL is not None:
        return _KERNEL
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def _philox_noise_kernel(
        x_ptr, sigma_ptr, key_ptr, row_ptr, sample_ptr, out_ptr, dim, groups,
        BLOCK: tl.constexpr, ROUNDS: tl.constexpr,
    ):  # fmt: skip
        r = tl.program_id(0)
        g = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        job = tl.load(row_ptr + r)
        sample = tl.load(sample_ptr + r)
        k0 = tl.load(key_ptr + 2 * job).to(tl.uint32)
        k1 = tl.load(key_ptr + 2 * job + 1).to(tl.uint32)
        sig = tl.load(sigma_ptr + job)
        c0 = (g * 0 + sample).to(tl.uint32)
        c1 = g.to(tl.uint32)
        c2 = c1 * 0
        c3 = c2
        m0: tl.constexpr = PHILOX_M0
        m1: tl.constexpr = PHILOX_M1
        w0: tl.constexpr = PHILOX_W0
        w1: tl.constexpr = PHILOX_W1
        for _ in tl.static_range(ROUNDS):
            a, b = c0, c2
            c0 = tl.umulhi(m1, b) ^ c1 ^ k0
            c2 = tl.umulhi(m0, a) ^ c3 ^ k1
            c1 = tl.mul(m1, b, sanitize_overflow=False)
            c3 = tl.mul(m0, a, sanitize_overflow=False)
            k0 = tl.add(k0, w0, sanitize_overflow=False)
            k1 = tl.add(k1, w1, sanitize_overflow=False)
        scale: tl.constexpr = 2.0**-24
        u0 = ((c0 >> 8).to(tl.float32) + 0.5) * scale
        u1 = ((c1 >> 8).to(tl.float32) + 0.5) * scale
        u2 = ((c2 >> 8).to(tl.float32) + 0.5) * scale
        u3 = ((c3 >> 8).to(tl.float32) + 0.5) * scale
        ra = tl.sqrt(-2.0 * tl.log(u0))
        rb = tl.sqrt(-2.0 * tl.log(u2))
        ta = 6.283185307179586 * u1
        tb = 6.283185307179586 * u3
        base = job.to(tl.int64) * dim
        dest = r.to(tl.int64) * dim
        coord = 4 * g.to(tl.int64)
        valid = g < groups
        mask = valid & (coord < dim)
        xv = tl.load(x_ptr + base + coord, mask=mask)
        tl.store(out_ptr + dest + coord, xv + sig * (ra * tl.cos(ta)), mask=mask)
        mask = valid & (coord + 1 < dim)
        xv = tl.load(x_ptr + base + coord + 1, mask=mask)
        tl.store(out_ptr + dest + coord + 1, xv + sig * (ra * tl.sin(ta)), mask=mask)
        mask = valid & (coord + 2 < dim)
        xv = tl.load(x_ptr + base + coord + 2, mask=mask)
        tl.store(out_ptr + dest + coord + 2, xv + sig * (rb * tl.cos(tb)), mask=mask)
        mask = valid & (coord + 3 < dim)
        xv = tl.load(x_ptr + base + coord + 3, mask=mask)
        tl.store(out_ptr + dest + coord + 3, xv + sig * (rb * tl.sin(tb)), mask=mask)

    _KERNEL = _philox_noise_kernel
    return _KERNEL


def _noisy_batch_triton(x, sigma, keys, rows, samples, out):
    import triton

    kernel = _triton_kernel()
    dim = x.shape[1]
    groups = (dim + 3) // 4
    block = min(1024, triton.next_power_of_2(groups))
    grid = (len(rows), triton.cdiv(groups, block))
    kernel[grid](
        x.contiguous(), sigma.contiguous(), keys.contiguous(), rows.contiguous(),
        samples.contiguous(), out, dim, groups, BLOCK=block, ROUNDS=PHILOX_ROUNDS,
    )  # fmt: skip
    return out
