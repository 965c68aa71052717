"""Deterministic kernels on CUDA: the same inputs give the same bits, in this process or another.

A replay compares a run's stored quantities with quantities recomputed later, in another
process (harness/README.md, "Replay"). On a CPU torch's kernels are deterministic for a
fixed thread count (:mod:`harness.engine.arithmetic` records it). On CUDA some are not:
atomic additions of floats (``index_add_``, ``scatter_add_``, the backward passes of
gathers, pooling and some cuDNN convolution algorithms) add in whatever order the threads
arrive, so a σ found by gradient ascent, a σ-network trained when the method is built or a
soft smoothing's sums could differ in their last bits between two computations of the same
thing. Every process that computes a run's stored quantities (the runner, the checks, the
replay process, a plugin host, ``harness.api.certify``, a board's σ recomputation) does so
inside :func:`deterministic_kernels`:

- ``torch.use_deterministic_algorithms(True, warn_only=True)``: torch's deterministic
  implementation of every op that has one (cuDNN restricted to deterministic algorithms);
  an op without one warns, once per op, and runs as before (if its result reaches a stored
  σ, the replay check sees a σ that depends on the batch);
- ``CUBLAS_WORKSPACE_CONFIG = :4096:8`` unless set (what cuBLAS needs for reproducible
  results with several streams; torch refuses deterministic matmuls without it);
- ``torch.utils.deterministic.fill_uninitialized_memory = False``: the deterministic mode
  would otherwise fill every new tensor with NaN, a pass over memory the engine's buffers
  never need (each is written before it is read).

The engine's own accumulation is deterministic without the mode: class counts are integer
atomics (exact in any order; :class:`~harness.engine.accumulators.HardCounts` lets them
run as atomics inside the mode, which would otherwise sort every batch), and soft sums
are added by ``index_put_(accumulate=True)``, which on CUDA sorts the rows by input and
sums each input's rows of a batch in order (:class:`~harness.engine.accumulators.SoftSums`).

On a CPU nothing changes: its runs stay bit for bit what they were.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

CUBLAS_WORKSPACE = ":4096:8"
"""cuBLAS's workspace setting for reproducible results (NVIDIA's cuBLAS documentation,
"Results reproducibility")."""


def enable_deterministic_kernels(device: torch.device | str) -> None:
    """On CUDA: torch's deterministic algorithms (warn-only), cuBLAS's reproducible
    workspace, no NaN filling of new tensors, for the rest of the process (the replay process
    and a plugin host, which exist to compute a run's quantities; :func:`kernels_restored`
    scopes it). On any other device nothing."""
    if torch.device(device).type != "cuda":
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False


@contextmanager
def kernels_restored() -> Iterator[None]:
    """The settings :func:`enable_deterministic_kernels` changes, restored after the block
    as they were before it (only when changed: setting the mode imports torch's compiler
    configuration, over a second on a CPU, where the block never changes it)."""
    fill = torch.utils.deterministic
    saved = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             fill.fill_uninitialized_memory)  # fmt: skip
    try:
        yield
    finally:
        mode = (torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled())  # fmt: skip
        if mode != saved[:2]:
            torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        fill.fill_uninitialized_memory = saved[2]


@contextmanager
def deterministic_kernels(device: torch.device | str) -> Iterator[None]:
    """:func:`enable_deterministic_kernels` inside the block, the settings before restored
    after."""
    with kernels_restored():
        enable_deterministic_kernels(device)
        yield
