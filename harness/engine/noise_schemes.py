"""How a batch of noisy inputs x + σ(x)·ε is filled under each noise scheme.

- :class:`PhiloxNoise` (``philox-v1``, :mod:`harness.engine.noise`): every row of a
  batch from its (seed, stream, input id, sample index) in one vectorized pass.
- :class:`BlockNoise` (``block-v1``): blocks of :data:`NOISE_BLOCK` samples, block b of
  input i from a torch generator seeded by :func:`~harness.engine.noise.noise_seed` of
  (seed, stream, i, b); drawn in parallel threads on CPU, reused once used up
  (:class:`BlockPool`, the part an engine keeps between calls). A block a call leaves
  part-used is kept for the next call, which resumes in it (sequential rounds).

A scheme object is made for one sampling call (its inputs and stream) and fills each
batch of it (:meth:`fill`); ``block`` is the size no batch segment may cross (None: any).
Each call has its own, so a call made while another is in flight (a certifier drawing
on the run's engine between two of the run's inputs) leaves the other's draws alone.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from harness.engine.noise import noise_key, noise_seed, noisy_batch

NOISE_BLOCK = 256
"""Samples per independently seeded noise block (part of the reproducibility contract)."""

KEPT_BYTES = 1 << 28
"""Most bytes of part-used blocks an engine keeps for its next calls (the oldest go first)."""

Segments = list[list[tuple[int, int, int]]]
"""A window of batches, each a list of (job index, first sample, number of samples)."""


@dataclass
class Job:
    """One input of a sampling call: samples ``done`` … ``end`` − 1 of its stream, the
    first ``done`` of them already drawn (a call from sample ``start`` begins at it).
    ``scale``: its diagonal scale (float32, the shape of ``x``; :mod:`harness.engine.scale`),
    whose smallest axis is then ``sigma``; None: noise at ``sigma``."""

    x: torch.Tensor
    sigma: float
    input_id: int
    end: int
    done: int = 0
    scale: torch.Tensor | None = None


class PhiloxNoise:
    """``philox-v1``: the noise of every row computed from its coordinates."""

    block: int | None = None

    def __init__(self, device: torch.device, seed: int, x: torch.Tensor, jobs: list[Job],
                 stream: int) -> None:  # fmt: skip
        self.flat_x = x.reshape(len(x), -1)
        self.keys = torch.tensor(
            [noise_key(seed, stream, job.input_id) for job in jobs], device=device
        )
        if jobs and jobs[0].scale is not None:  # a diagonal scale [J, d]
            self.sigma = torch.stack([job.scale.reshape(-1) for job in jobs]).to(device)
        else:
            self.sigma = torch.tensor([job.sigma for job in jobs], device=device)

    def fill(
        self, window: Segments, b: int, rows: torch.Tensor, samples: torch.Tensor | None,
        buffer: torch.Tensor, fill: int,
    ) -> None:  # fmt: skip
        """Batch ``b`` of ``window`` (its job index ``rows`` and sample indices) into ``buffer``."""
        noisy_batch(self.flat_x, self.sigma, self.keys, rows, samples,
                    buffer.view(len(buffer), -1)[:fill])  # fmt: skip


class BlockPool:
    """What ``block-v1`` keeps between calls: the noise threads, each thread's generator,
    the used-up blocks of each shape, free for reuse (fresh pages are costly), and the
    blocks a call left part-used, by what seeds them (seed, stream, input id, block, shape):
    a call that starts inside one (a sequential round) resumes it instead of drawing it
    again."""

    def __init__(self, device: torch.device, threads: int) -> None:
        self.device, self.threads = device, threads
        self.executor = ThreadPoolExecutor(threads) if threads > 1 else None
        self.local = threading.local()
        self.free: dict[tuple[int, ...], list[torch.Tensor]] = {}
        self.kept: OrderedDict[tuple, torch.Tensor] = OrderedDict()
        self.kept_bytes = 0

    def keep(self, identity: tuple, block: torch.Tensor) -> None:
        replaced = self.resume(identity)  # a call nested in another drew the same block
        if replaced is not None:
            self.give_back(replaced)
        self.kept[identity] = block
        self.kept_bytes += block.nbytes
        while self.kept_bytes > KEPT_BYTES:
            _, oldest = self.kept.popitem(last=False)
            self.kept_bytes -= oldest.nbytes
            self.give_back(oldest)

    def resume(self, identity: tuple) -> torch.Tensor | None:
        block = self.kept.pop(identity, None)
        if block is not None:
            self.kept_bytes -= block.nbytes
        return block

    def take(self, shape: tuple[int, ...]) -> torch.Tensor:
        free = self.free.get(shape)
        return free.pop() if free else torch.empty(shape, device=self.device)

    def give_back(self, block: torch.Tensor) -> None:
        self.free.setdefault(tuple(block.shape), []).append(block)


class BlockNoise:
    """``block-v1``: noise blocks drawn by seeded torch generators, in parallel on CPU."""

    block: int | None = NOISE_BLOCK

    def __init__(self, pool: BlockPool, seed: int, jobs: list[Job], stream: int) -> None:
        self.pool, self.seed, self.jobs, self.stream = pool, seed, jobs, stream
        self.blocks: dict[tuple[int, int], torch.Tensor] = {}

    def fill(
        self, window: Segments, b: int, rows: torch.Tensor, samples: torch.Tensor | None,
        buffer: torch.Tensor, fill: int,
    ) -> None:  # fmt: skip
        """Batch ``b`` of ``window``, x + σ·(rows of noise blocks), into ``buffer`` (with a
        diagonal scale, x + scale·(rows), coordinate by coordinate).

        ``blocks`` holds the drawn blocks not yet used up; when some of this batch's are
        missing, they are drawn together with the next batches' (up to one per noise
        thread), so that small batches also draw in parallel. A block goes back to the
        pool once its last sample is used.
        """
        jobs, blocks, pool = self.jobs, self.blocks, self.pool
        missing: dict[tuple[int, int], None] = {}
        for index, start, _ in window[b]:
            key = (index, start // NOISE_BLOCK)
            if key not in blocks:
                kept = pool.resume(self._identity(key))
                if kept is None:
                    missing[key] = None
                else:
                    blocks[key] = kept
        if missing:
            for later in window[b + 1 :]:
                for index, start, _ in later:
                    if len(missing) >= pool.threads:
                        break
                    key = (index, start // NOISE_BLOCK)
                    if key not in blocks and self._identity(key) not in pool.kept:
                        missing[key] = None
            blocks.update(self._draw_blocks(list(missing)))
        fill = 0
        for index, start, take in window[b]:
            job = jobs[index]
            key = (index, start // NOISE_BLOCK)
            offset = start % NOISE_BLOCK
            if job.scale is None:
                torch.add(
                    job.x, blocks[key][offset : offset + take], alpha=job.sigma,
                    out=buffer[fill : fill + take],
                )  # fmt: skip
            else:  # the same rounding as alpha = σ where the scale is σ everywhere
                torch.addcmul(job.x, blocks[key][offset : offset + take], job.scale,
                              out=buffer[fill : fill + take])  # fmt: skip
            fill += take
            end = start + take
            if end % NOISE_BLOCK == 0:
                pool.give_back(blocks.pop(key))
            elif end == job.end:
                pool.keep(self._identity(key), blocks.pop(key))

    def _identity(self, key: tuple[int, int]) -> tuple:
        """What seeds block ``key`` (job index, block index), and its shape."""
        job = self.jobs[key[0]]
        return (self.seed, self.stream, job.input_id, key[1], tuple(job.x.shape))

    def _draw_blocks(self, draws: list[tuple[int, int]]) -> dict[tuple[int, int], torch.Tensor]:
        """The noise blocks keyed (job index, block index), drawn in parallel threads on CPU."""
        shape = (NOISE_BLOCK, *self.jobs[draws[0][0]].x.shape)
        empty = [self.pool.take(shape) for _ in draws]
        executor = self.pool.executor
        if executor is not None and len(draws) > 1:
            drawn = list(executor.map(self._draw, draws, empty))
        else:
            drawn = [self._draw(k, t) for k, t in zip(draws, empty, strict=True)]
        return dict(zip(draws, drawn, strict=True))

    def _draw(self, key: tuple[int, int], block: torch.Tensor) -> torch.Tensor:
        local = self.pool.local
        generator = getattr(local, "generator", None)
        if generator is None:
            generator = local.generator = torch.Generator(device=self.pool.device)
        job = self.jobs[key[0]]
        generator.manual_seed(noise_seed(self.seed, self.stream, job.input_id, key[1]))
        return block.normal_(generator=generator)
