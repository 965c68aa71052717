"""How a batch of noisy inputs x + σ(x)·ε is filled under each noise scheme.

- :class:`PhiloxNoise` (``philox-v1``, :mod:`harness.engine.noise`): every row of a
  batch from its (seed, stream, input id, sample index) in one vectorized pass.
- :class:`BlockNoise` (``block-v1``): blocks of :data:`NOISE_BLOCK` samples, block b of
  input i from a torch generator seeded by :func:`~harness.engine.noise.noise_seed` of
  (seed, stream, i, b); drawn in parallel threads on CPU, reused once used up.

A scheme is told the inputs of one sampling call (:meth:`begin`) and then fills each
batch of it (:meth:`fill`); ``block`` is the size no batch segment may cross (None: any).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from harness.engine.noise import noise_key, noise_seed, noisy_batch

NOISE_BLOCK = 256
"""Samples per independently seeded noise block (part of the reproducibility contract)."""

Segments = list[list[tuple[int, int, int]]]
"""A window of batches, each a list of (job index, first sample, number of samples)."""


@dataclass
class Job:
    """One input of a sampling call: its samples up to index ``num`` (exclusive), the next
    one to draw being ``done`` (the call's first sample index, then advancing)."""

    x: torch.Tensor
    sigma: float
    input_id: int
    num: int
    done: int = 0


class PhiloxNoise:
    """``philox-v1``: the noise of every row computed from its coordinates."""

    block: int | None = None

    def __init__(self, device: torch.device, seed: int) -> None:
        self.device, self.seed = device, seed

    def begin(self, x: torch.Tensor, jobs: list[Job], stream: int) -> None:
        self.flat_x = x.reshape(len(x), -1)
        self.keys = torch.tensor(
            [noise_key(self.seed, stream, job.input_id) for job in jobs], device=self.device
        )
        self.sigma = torch.tensor([job.sigma for job in jobs], device=self.device)

    def fill(
        self, window: Segments, b: int, rows: torch.Tensor, samples: torch.Tensor | None,
        buffer: torch.Tensor, fill: int,
    ) -> None:  # fmt: skip
        """Batch ``b`` of ``window`` (its job index ``rows`` and sample indices) into ``buffer``."""
        noisy_batch(self.flat_x, self.sigma, self.keys, rows, samples,
                    buffer.view(len(buffer), -1)[:fill])  # fmt: skip


class BlockNoise:
    """``block-v1``: noise blocks drawn by seeded torch generators, in parallel on CPU."""

    block: int | None = NOISE_BLOCK

    def __init__(self, device: torch.device, seed: int, threads: int) -> None:
        self.device, self.seed, self._threads = device, seed, threads
        self._pool = ThreadPoolExecutor(threads) if threads > 1 else None
        self._local = threading.local()
        self._free_blocks: list[torch.Tensor] = []

    def forget_blocks(self) -> None:
        """Drop the reusable blocks (the inputs' shape changed)."""
        self._free_blocks = []

    def begin(self, x: torch.Tensor, jobs: list[Job], stream: int) -> None:
        self.jobs, self.stream = jobs, stream
        self.blocks: dict[tuple[int, int], torch.Tensor] = {}

    def fill(
        self, window: Segments, b: int, rows: torch.Tensor, samples: torch.Tensor | None,
        buffer: torch.Tensor, fill: int,
    ) -> None:  # fmt: skip
        """Batch ``b`` of ``window``, x + σ·(rows of noise blocks), into ``buffer``."""
        self._fill_blocks(self.jobs, window, b, self.stream, buffer, self.blocks)

    def _fill_blocks(
        self,
        jobs: list[Job],
        window: Segments,
        b: int,
        stream: int,
        buffer: torch.Tensor,
        blocks: dict[tuple[int, int], torch.Tensor],
    ) -> None:
        """block-v1: batch ``b`` of the window, x + σ·(rows of noise blocks), into ``buffer``.

        ``blocks`` holds the drawn blocks not yet used up; when some of this batch's are
        missing, they are drawn together with the next batches' (up to one per noise
        thread), so that small batches also draw in parallel. A block is returned to
        the free list once its last sample is used.
        """
        missing: dict[tuple[int, int], None] = {}
        for index, start, _ in window[b]:
            key = (index, start // NOISE_BLOCK)
            if key not in blocks:
                missing[key] = None
        if missing:
            for later in window[b + 1 :]:
                for index, start, _ in later:
                    if len(missing) >= self._threads:
                        break
                    key = (index, start // NOISE_BLOCK)
                    if key not in blocks:
                        missing[key] = None
            blocks.update(self._draw_blocks(jobs, list(missing), stream))
        fill = 0
        for index, start, take in window[b]:
            job = jobs[index]
            key = (index, start // NOISE_BLOCK)
            offset = start % NOISE_BLOCK
            torch.add(
                job.x, blocks[key][offset : offset + take], alpha=job.sigma,
                out=buffer[fill : fill + take],
            )  # fmt: skip
            fill += take
            end = start + take
            if end % NOISE_BLOCK == 0 or end == job.num:
                self._free_blocks.append(blocks.pop(key))

    def _draw_blocks(
        self, jobs: list[Job], draws: list[tuple[int, int]], stream: int
    ) -> dict[tuple[int, int], torch.Tensor]:
        """The noise blocks keyed (job index, block index), drawn in parallel threads on CPU."""
        shape = (NOISE_BLOCK, *jobs[draws[0][0]].x.shape)
        empty = [
            self._free_blocks.pop() if self._free_blocks else torch.empty(shape, device=self.device)
            for _ in draws
        ]
        if self._pool is not None and len(draws) > 1:
            drawn = list(
                self._pool.map(lambda k, t: self._draw(jobs[k[0]], t, k[1], stream), draws, empty)
            )
        else:
            drawn = [
                self._draw(jobs[k[0]], t, k[1], stream) for k, t in zip(draws, empty, strict=True)
            ]
        return dict(zip(draws, drawn, strict=True))

    def _draw(self, job: Job, block: torch.Tensor, block_index: int, stream: int) -> torch.Tensor:
        generator = getattr(self._local, "generator", None)
        if generator is None:
            generator = self._local.generator = torch.Generator(device=self.device)
        generator.manual_seed(noise_seed(self.seed, stream, job.input_id, block_index))
        return block.normal_(generator=generator)
