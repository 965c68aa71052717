"""The Triton kernels of ``philox-v1`` (:mod:`harness.engine.noise` states the formulas).

- :func:`philox_rounds`: Philox-4×32-10 (Salmon et al., SC 2011, §4.2) on uint32 lanes:
  ``umulhi`` is the high word of the 64-bit product, a uint32 product and sum wrap modulo
  2³², as in the reference philox4x32 (and in :func:`harness.engine.philox.philox4x32`).
- :func:`philox_words_kernel`: the four raw words of given counters under given keys
  (what the tests compare bit for bit with the torch path).
- :func:`noisy_batch_kernel`: one pass that draws the keyed noise of every (row, group of
  four coordinates) and writes x + σ·ε, four contiguous floats per lane;
  :func:`noisy_batch_diagonal_kernel` the same with a scale per coordinate (x + σ_k·ε_k).

Importing this module imports Triton; :mod:`harness.engine.noise` imports it lazily.
Constants are ``tl.constexpr`` globals, the only globals a compiled kernel may read.
"""

from __future__ import annotations

import triton
import triton.language as tl

from harness.engine.philox import PHILOX_M0, PHILOX_M1, PHILOX_ROUNDS, PHILOX_W0, PHILOX_W1

M0 = tl.constexpr(PHILOX_M0)
M1 = tl.constexpr(PHILOX_M1)
W0 = tl.constexpr(PHILOX_W0)
W1 = tl.constexpr(PHILOX_W1)
ROUNDS = tl.constexpr(PHILOX_ROUNDS)
TWO_PI = tl.constexpr(6.283185307179586)
UNIT = tl.constexpr(2.0**-24)


@triton.jit
def philox_rounds(c0, c1, c2, c3, k0, k1):
    """Philox-4×32-10 of uint32 counters (c0, c1, c2, c3) under uint32 keys (k0, k1)."""
    for _ in tl.static_range(ROUNDS):
        a = c0
        b = c2
        c0 = tl.umulhi(M1, b) ^ c1 ^ k0
        c2 = tl.umulhi(M0, a) ^ c3 ^ k1
        c1 = tl.mul(b, M1, sanitize_overflow=False)
        c3 = tl.mul(a, M0, sanitize_overflow=False)
        k0 = tl.add(k0, W0, sanitize_overflow=False)
        k1 = tl.add(k1, W1, sanitize_overflow=False)
    return c0, c1, c2, c3


@triton.jit
def _word(ptr, index):
    """The uint32 held in the low half of an int64 element."""
    return tl.load(ptr + index).to(tl.uint32)


@triton.jit
def philox_words_kernel(counter_ptr, key_ptr, out_ptr, count, BLOCK: tl.constexpr):
    """out[i, :] = philox4x32(counter[i, :], key[i, :]) for i < count; every array int64
    holding uint32 words (counters [count, 4], keys [count, 2], out [count, 4])."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < count
    i = tl.where(live, i, 0)
    c0, c1, c2, c3 = philox_rounds(
        _word(counter_ptr, 4 * i), _word(counter_ptr, 4 * i + 1), _word(counter_ptr, 4 * i + 2),
        _word(counter_ptr, 4 * i + 3), _word(key_ptr, 2 * i), _word(key_ptr, 2 * i + 1),
    )  # fmt: skip
    tl.store(out_ptr + 4 * i, c0.to(tl.int64), mask=live)
    tl.store(out_ptr + 4 * i + 1, c1.to(tl.int64), mask=live)
    tl.store(out_ptr + 4 * i + 2, c2.to(tl.int64), mask=live)
    tl.store(out_ptr + 4 * i + 3, c3.to(tl.int64), mask=live)


@triton.jit
def _uniform(word):
    """(word >> 8 + ½)·2⁻²⁴ in (0, 1), exact in float32."""
    return ((word >> 8).to(tl.float32) + 0.5) * UNIT


@triton.jit
def _keyed_noise(key_ptr, row_ptr, sample_ptr, rows, dim, groups, BLOCK: tl.constexpr):
    """The noise of every (row, group of four coordinates) lane of one program: each lane's
    row ``r``, its input ``job`` = row[r], its coordinates ``coord`` [BLOCK, 4] (``mask``:
    those that exist) and ε [BLOCK, 4], from the counter (sample[r], g, 0, 0) under the key
    of ``job``, Box–Muller on (u0, u1) and (u2, u3)."""
    t = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # rows·groups < 2³¹ per launch
    live = t < rows * groups
    t = tl.where(live, t, 0)
    r = t // groups
    g = t - r * groups
    r = r.to(tl.int64)
    job = tl.load(row_ptr + r)  # int64: job·dim may pass 2³¹
    c0, c1, c2, c3 = philox_rounds(
        tl.load(sample_ptr + r).to(tl.uint32), g.to(tl.uint32), tl.zeros_like(g).to(tl.uint32),
        tl.zeros_like(g).to(tl.uint32), _word(key_ptr, 2 * job), _word(key_ptr, 2 * job + 1),
    )  # fmt: skip
    ra = tl.sqrt_rn(-2.0 * tl.log(_uniform(c0)))
    rb = tl.sqrt_rn(-2.0 * tl.log(_uniform(c2)))
    ta = TWO_PI * _uniform(c1)
    tb = TWO_PI * _uniform(c3)
    # join stacks on a new last axis: [g, i, j] = (j ? join(e1, e3) : join(e0, e2))[g, i]
    # is coordinate 4g + 2i + j after the reshape
    pairs = tl.join(
        tl.join(ra * tl.cos(ta), rb * tl.cos(tb)), tl.join(ra * tl.sin(ta), rb * tl.sin(tb))
    )
    eps = tl.reshape(pairs, (BLOCK, 4))
    coord = 4 * g[:, None] + tl.arange(0, 4)[None, :]
    mask = live[:, None] & (coord < dim)
    return r, job, coord, mask, eps


@triton.jit
def noisy_batch_kernel(
    x_ptr, sigma_ptr, key_ptr, row_ptr, sample_ptr, out_ptr, rows, dim, groups,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """out[r, 4g + j] = x[job, 4g + j] + σ[job]·ε_j for job = row[r], each lane one
    (row, group g) pair (:func:`_keyed_noise`)."""
    r, job, coord, mask, eps = _keyed_noise(key_ptr, row_ptr, sample_ptr, rows, dim, groups,
                                            BLOCK)  # fmt: skip
    xv = tl.load(x_ptr + job[:, None] * dim + coord, mask=mask)
    sig = tl.load(sigma_ptr + job)[:, None]
    tl.store(out_ptr + r[:, None] * dim + coord, xv + sig * eps, mask=mask)


@triton.jit
def noisy_batch_diagonal_kernel(
    x_ptr, scale_ptr, key_ptr, row_ptr, sample_ptr, out_ptr, rows, dim, groups,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """out[r, k] = x[job, k] + scale[job, k]·ε_k: :func:`noisy_batch_kernel` with a
    diagonal scale [J, dim] (:mod:`harness.engine.scale`) in place of one σ per input."""
    r, job, coord, mask, eps = _keyed_noise(key_ptr, row_ptr, sample_ptr, rows, dim, groups,
                                            BLOCK)  # fmt: skip
    xv = tl.load(x_ptr + job[:, None] * dim + coord, mask=mask)
    sig = tl.load(scale_ptr + job[:, None] * dim + coord, mask=mask)
    tl.store(out_ptr + r[:, None] * dim + coord, xv + sig * eps, mask=mask)


def philox_words(counters, keys):
    """philox4x32 of ``counters`` [N, 4] under ``keys`` [N, 2] (int64 tensors holding
    uint32 words, on a CUDA device, or anywhere under ``TRITON_INTERPRET=1``) by
    :func:`philox_words_kernel`: [N, 4] int64."""
    import torch

    counters, keys = counters.contiguous(), keys.contiguous()
    out = torch.empty_like(counters)
    block = 128
    philox_words_kernel[(triton.cdiv(len(out), block),)](counters, keys, out, len(out), BLOCK=block)
    return out
