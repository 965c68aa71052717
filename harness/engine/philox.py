"""Philox-4×32-10, the block function of the ``philox-v1`` noise: its constants and its
evaluation with torch integer ops.

Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC 2011), §4.2: 10 rounds of

    c ← (hi(M1·c2) ⊕ c1 ⊕ k0, lo(M1·c2), hi(M0·c0) ⊕ c3 ⊕ k1, lo(M0·c0)),

the key (k0, k1) bumped by the Weyl constants (W0, W1) between rounds. The torch path
(:func:`philox4x32`, used by :mod:`harness.engine.noise`) and the Triton kernels
(:mod:`harness.engine.noise_kernels`) read the constants from here, so the two compute the
same words.
"""

from __future__ import annotations

import torch

PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
"""The round multipliers."""
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
"""The Weyl constants added to the key between rounds."""
PHILOX_ROUNDS = 10
_LOW32 = 0xFFFFFFFF


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
