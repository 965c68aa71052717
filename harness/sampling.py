"""The Monte Carlo sampling engine: the hot path of certification (Cohen et al. 2019, §3.2).

A batch of noisy samples mixes many inputs, each with its own σ(x). The noise of sample j
of input i in stream s depends on (seed, s, i, j) alone, whatever the batch size, the
other inputs in the batch, or the order of work. Two schemes (the protocol's ``noise``):

- ``philox-v1`` (:mod:`harness.noise`): a counter-based generator evaluated for the
  whole mixed batch in one vectorized pass (one fused Triton kernel on CUDA); the same
  noise on every device up to float rounding.
- ``block-v1`` (every run made before the protocol recorded a scheme): noise drawn in
  *blocks* of :data:`NOISE_BLOCK` samples; block b of input i in stream s comes from a
  torch generator seeded by a hash of (seed, s, i, b), and sample j is row
  j mod NOISE_BLOCK of block j div NOISE_BLOCK. Faster on CPU, where torch's
  generator beats integer arithmetic in torch ops; device-specific.

Class counts (hard smoothing) or probability sums (soft smoothing) are accumulated on the
device and copied back once per input, when it is done.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from harness.errors import ModelOutputError
from harness.noise import mix64, noise_key, noisy_batch
from harness.protocol import NOISE_SCHEMES

NOISE_BLOCK = 256
"""Samples per independently seeded noise block (part of the reproducibility contract)."""

STREAM_SELECTION = 0
"""Noise stream of CERTIFY's n0 selection samples."""
STREAM_ESTIMATION = 1
"""Noise stream of CERTIFY's n estimation samples (also used by PREDICT)."""


def noise_seed(seed: int, stream: int, input_id: int, block: int) -> int:
    """The generator seed of one noise block: a 63-bit hash of its four coordinates."""
    return mix64(seed, stream, input_id, block) >> 1


def default_noise(device: torch.device) -> str:
    """The scheme ``noise = "auto"`` resolves to: philox-v1 on CUDA, block-v1 elsewhere."""
    return "philox-v1" if torch.device(device).type == "cuda" else "block-v1"


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``auto`` picks cuda when available, else cpu."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


@dataclass
class SoftStats:
    """Soft smoothing evidence of one input: per-class sums of probabilities and squares."""

    num: int
    sums: np.ndarray
    sums_sq: np.ndarray

    @property
    def means(self) -> np.ndarray:
        return self.sums / self.num


@dataclass
class _Job:
    x: torch.Tensor
    sigma: float
    input_id: int
    num: int
    done: int = 0
    block_index: int = -1
    block: torch.Tensor | None = None


class SamplingEngine:
    """Counts the base model's predictions under Gaussian noise x + σ(x)·ε.

    :param model: the base classifier (logits), already on ``device`` and in eval mode.
    :param num_classes: size of the count vectors.
    :param batch_size: noisy samples per forward pass.
    :param seed: the run's seed; noise is a function of (seed, stream, input id, index).
    :param noise_threads: threads that draw noise blocks in parallel (CPU, block-v1
        only); defaults to torch's intra-op thread count.
    :param noise: the noise scheme, one of :data:`NOISE_SCHEMES`, or ``auto``
        (:func:`default_noise` of the device).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        num_classes: int,
        device: torch.device,
        batch_size: int = 1024,
        seed: int = 0,
        noise_threads: int | None = None,
        noise: str = "auto",
    ) -> None:
        self.model = model
        self.num_classes = num_classes
        self.device = torch.device(device)
        self.batch_size = batch_size
        self.seed = seed
        self.noise = default_noise(self.device) if noise == "auto" else noise
        if self.noise not in NOISE_SCHEMES:
            raise ValueError(
                f"unknown noise scheme {noise!r}; known: auto, {', '.join(NOISE_SCHEMES)}"
            )
        threads = 1 if self.device.type != "cpu" else (noise_threads or torch.get_num_threads())
        self._pool = ThreadPoolExecutor(threads) if threads > 1 else None
        self._local = threading.local()
        self._buffer: torch.Tensor | None = None
        self._free_blocks: list[torch.Tensor] = []

    def counts(
        self,
        x: torch.Tensor,
        sigma: Sequence[float] | torch.Tensor,
        input_ids: Sequence[int],
        num: int,
        stream: int,
    ) -> np.ndarray:
        """Hard smoothing: counts [B, C] of argmax f(x_i + σ_i ε) over ``num`` samples each."""
        out = np.zeros((len(input_ids), self.num_classes), dtype=np.int64)
        for index, counts in self.run(x, sigma, input_ids, num, stream, soft=False):
            out[index] = counts
        return out

    def soft_stats(
        self,
        x: torch.Tensor,
        sigma: Sequence[float] | torch.Tensor,
        input_ids: Sequence[int],
        num: int,
        stream: int,
    ) -> list[SoftStats]:
        """Soft smoothing: per-class sums of softmax f(x_i + σ_i ε) and of their squares."""
        out: list[SoftStats] = [None] * len(input_ids)  # type: ignore[list-item]
        for index, result in self.run(x, sigma, input_ids, num, stream, soft=True):
            out[index] = result
        return out

    def run(
        self,
        x: torch.Tensor,
        sigma: Sequence[float] | torch.Tensor,
        input_ids: Sequence[int],
        num: int,
        stream: int,
        soft: bool = False,
    ) -> Iterator[tuple[int, np.ndarray | SoftStats]]:
        """Sample ``num`` noisy copies of every input; yield (index, result) as each finishes.

        Inputs are consumed in order, so they finish one after another and a caller can
        store each result at once (nothing is lost but the inputs in flight).
        """
        if len(x) != len(input_ids):
            raise ValueError(f"{len(x)} inputs but {len(input_ids)} input ids")
        sigmas = torch.as_tensor(sigma, dtype=torch.float64).flatten().tolist()
        if len(sigmas) != len(input_ids):
            raise ValueError(f"{len(input_ids)} inputs but {len(sigmas)} values of sigma")
        x = x.to(self.device, torch.float32)
        jobs = [
            _Job(x[i], float(s), int(i_id), num)
            for i, (s, i_id) in enumerate(zip(sigmas, input_ids, strict=True))
        ]
        if self.batch_size == "auto":
            from harness.batchsize import auto_batch_size

            self.batch_size = auto_batch_size(self.model, tuple(x.shape[1:]), self.device)
        philox = self.noise == "philox-v1"
        if philox:
            flat_x = x.reshape(len(x), -1)
            keys = torch.tensor(
                [noise_key(self.seed, stream, job.input_id) for job in jobs], device=self.device
            )
            sigma_t = torch.tensor([job.sigma for job in jobs], device=self.device)
        classes = self.num_classes
        acc = torch.zeros(
            len(jobs), classes, device=self.device, dtype=torch.float64 if soft else torch.int64
        )
        acc_sq = torch.zeros_like(acc) if soft else None
        finite = torch.ones((), dtype=torch.bool, device=self.device)
        buffer = self._batch_buffer(x.shape[1:])
        cursor = 0
        with torch.no_grad():
            while cursor < len(jobs):
                segments = self._plan_batch(jobs, cursor, NOISE_BLOCK if not philox else None)
                plan = torch.tensor(segments, dtype=torch.int64).T.contiguous().to(self.device)
                fill = sum(take for _, _, take in segments)
                # output_size: no device-to-host sync to learn the length
                rows = torch.repeat_interleave(plan[0], plan[2], output_size=fill)
                if philox:
                    # sample index of every row: its segment's first sample + its place in it
                    first_row = torch.cumsum(plan[2], 0) - plan[2]
                    samples = torch.arange(fill, device=self.device) - torch.repeat_interleave(
                        first_row - plan[1], plan[2], output_size=fill
                    )
                    noisy_batch(
                        flat_x, sigma_t, keys, rows, samples, buffer.view(len(buffer), -1)[:fill]
                    )
                    for index, start, take in segments:
                        jobs[index].done = start + take
                else:
                    self._fill_blocks(jobs, segments, stream, buffer)
                logits = self.model(buffer[:fill])
                finite &= torch.isfinite(logits).all()
                if soft:
                    probs = torch.softmax(logits.double(), dim=1)
                    acc.index_add_(0, rows, probs)
                    acc_sq.index_add_(0, rows, probs * probs)
                else:
                    flat = rows * classes + logits.argmax(dim=1)
                    acc.view(-1).index_add_(0, flat, torch.ones_like(flat))
                while cursor < len(jobs) and jobs[cursor].done == jobs[cursor].num:
                    if not bool(finite):
                        raise ModelOutputError(_nonfinite_message(jobs))
                    jobs[cursor].block = None
                    if soft:
                        yield (
                            cursor,
                            SoftStats(num, acc[cursor].cpu().numpy(), acc_sq[cursor].cpu().numpy()),
                        )
                    else:
                        yield cursor, acc[cursor].cpu().numpy()
                    cursor += 1

    def _batch_buffer(self, shape: torch.Size) -> torch.Tensor:
        """The batch of noisy inputs, allocated once (fresh pages are costly to touch)."""
        if self._buffer is None or self._buffer.shape[1:] != shape:
            self._buffer = torch.empty((self.batch_size, *shape), device=self.device)
            self._free_blocks = []
        return self._buffer

    def _fill_blocks(
        self, jobs: list[_Job], segments: list[tuple[int, int, int]], stream: int, buffer
    ) -> None:
        """block-v1: noisy inputs x + σ·(rows of noise blocks) into ``buffer``."""
        blocks = self._draw_blocks(jobs, segments, stream)
        fill = 0
        for index, start, take in segments:
            job = jobs[index]
            block = blocks[index, start // NOISE_BLOCK]
            offset = start % NOISE_BLOCK
            torch.add(
                job.x, block[offset : offset + take], alpha=job.sigma,
                out=buffer[fill : fill + take],
            )  # fmt: skip
            job.done = start + take
            job.block_index, job.block = start // NOISE_BLOCK, block
            fill += take
        kept = {id(jobs[i].block) for i, _, _ in segments if jobs[i].done < jobs[i].num}
        self._free_blocks.extend(b for b in blocks.values() if id(b) not in kept)

    def _plan_batch(
        self, jobs: list[_Job], cursor: int, block: int | None
    ) -> list[tuple[int, int, int]]:
        """(job index, first sample, number of samples) segments filling one batch.

        With a ``block`` size, no segment crosses a noise block (each is a slice of one).
        """
        segments = []
        room = self.batch_size
        index = cursor
        done = jobs[cursor].done
        while room > 0 and index < len(jobs):
            job = jobs[index]
            if done == job.num:
                index += 1
                done = jobs[index].done if index < len(jobs) else 0
                continue
            take = min(room, job.num - done)
            if block is not None:
                take = min(take, block - done % block)
            segments.append((index, done, take))
            done += take
            room -= take
        return segments

    def _draw_blocks(
        self, jobs: list[_Job], segments: list[tuple[int, int, int]], stream: int
    ) -> dict[tuple[int, int], torch.Tensor]:
        """The noise block of every segment, keyed by (job index, block index).

        A job's partly used block is kept from the previous batch; the others are
        drawn, in parallel threads on CPU.
        """
        blocks = {}
        draws = []
        for index, start, _ in segments:
            key = (index, start // NOISE_BLOCK)
            if key in blocks or key in draws:
                continue
            job = jobs[index]
            if job.block_index == key[1]:
                blocks[key] = job.block
            else:
                draws.append(key)
        shape = (NOISE_BLOCK, *jobs[segments[0][0]].x.shape)
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
        blocks.update(zip(draws, drawn, strict=True))
        return blocks

    def _draw(self, job: _Job, block: torch.Tensor, block_index: int, stream: int) -> torch.Tensor:
        generator = getattr(self._local, "generator", None)
        if generator is None:
            generator = self._local.generator = torch.Generator(device=self.device)
        generator.manual_seed(noise_seed(self.seed, stream, job.input_id, block_index))
        return block.normal_(generator=generator)


def _nonfinite_message(jobs) -> str:
    """Name the likely cause of non-finite logits: σ out of range, or the model itself."""
    bad = [j for j in jobs if not (0 < j.sigma <= 1e30) or not bool(torch.isfinite(j.x).all())]
    if bad:
        return (
            f"the base model returned NaN or infinite logits on noisy inputs: input "
            f"{bad[0].input_id} has σ = {bad[0].sigma:.6g} (or a non-finite input), out of range, "
            "so x + σε overflows; the σ-provider is at fault, not the model checkpoint"
        )
    sigmas = [j.sigma for j in jobs]
    return (
        f"the base model returned NaN or infinite logits on noisy inputs (σ in "
        f"[{min(sigmas):.6g}, {max(sigmas):.6g}]); check the model checkpoint and that inputs "
        "are in its expected range"
    )
