"""The Monte Carlo sampling engine: the hot path of certification (Cohen et al. 2019, §3.2).

A batch of noisy samples mixes many inputs, each with its own σ(x). The noise of sample j
of input i in stream s depends on (seed, s, i, j) alone, whatever the batch size, the
other inputs in the batch, or the order of work. Two schemes (the protocol's ``noise``):

- ``philox-v1`` (:mod:`harness.engine.noise`): a counter-based generator evaluated for the
  whole mixed batch in one vectorized pass (one fused Triton kernel on CUDA); the same
  noise on every device up to float rounding.
- ``block-v1`` (every run made before the protocol recorded a scheme): noise drawn in
  *blocks* of :data:`NOISE_BLOCK` samples; block b of input i in stream s comes from a
  torch generator seeded by a hash of (seed, s, i, b), and sample j is row
  j mod NOISE_BLOCK of block j div NOISE_BLOCK. Faster on CPU, where torch's
  generator beats integer arithmetic in torch ops; device-specific.

Class counts (hard smoothing) or probability sums (soft smoothing) are accumulated on the
device. The host never waits on the device per batch: when inputs finish, their results
and a finiteness flag of all logits so far are copied to pinned host memory without
blocking, and each is handed to the caller once its copy has landed (checked between
batches; on a CPU at once). Every call keeps its own state, so a call made while
another one's generator is in flight draws correctly and leaves the other's draws as
they would have been.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch

from harness.engine.accumulators import HardCounts, SoftStats, SoftSums
from harness.engine.noise_schemes import BlockNoise, BlockPool, Job, PhiloxNoise
from harness.engine.precision import PrecisionModel
from harness.foundation.errors import ModelOutputError
from harness.foundation.protocol import NOISE_SCHEMES, SIGMA_MAX

PLAN_WINDOW = 64
"""Batches planned at once (their row indices are made in one host-to-device copy)."""


class EngineTally:
    """Noisy samples drawn, and rows passed through base models (padding included), by the
    engines of this process: what the soundness checks' cost reports read
    (:mod:`harness.audit.cost`)."""

    def __init__(self) -> None:
        self.samples = 0
        self.rows = 0


TALLY = EngineTally()
"""The tally of every engine of this process."""

STREAM_SELECTION = 0
"""Noise stream of CERTIFY's n0 selection samples."""
STREAM_ESTIMATION = 1
"""Noise stream of CERTIFY's n estimation samples (also used by PREDICT)."""


def default_noise(device: torch.device) -> str:
    """The scheme ``noise = "auto"`` resolves to: philox-v1 on CUDA, block-v1 elsewhere."""
    return "philox-v1" if torch.device(device).type == "cuda" else "block-v1"


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``auto`` picks cuda when available, else cpu."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class SamplingEngine:
    """Counts the base model's predictions under Gaussian noise x + σ(x)·ε.

    :param model: the base classifier (logits), already on ``device`` and in eval mode.
    :param num_classes: size of the count vectors.
    :param batch_size: noisy samples per forward pass, decided before the engine is made
        (a protocol's ``auto`` is resolved by :func:`harness.engine.batchsize.auto_batch_size`)
        and fixed for its lifetime.
    :param seed: the run's seed; noise is a function of (seed, stream, input id, index).
    :param noise_threads: threads that draw noise blocks in parallel (CPU, block-v1
        only); defaults to torch's intra-op thread count.
    :param noise: the noise scheme, one of :data:`NOISE_SCHEMES`, or ``auto``
        (:func:`default_noise` of the device).
    :param pad_batches: give every forward pass the full ``batch_size`` rows (a partial
        batch is padded with zeros and the padding's outputs dropped). A BLAS routine
        may round a row differently for another number of rows, so each sample's logits
        are then bit-identical whatever batch it shares, where at that shape a row's
        logits depend on the row alone (a run measures it: :func:`harness.engine.
        arithmetic.rows_independent`); for per-input σ searches (:meth:`padded`). A padded
        engine tells a :class:`~harness.engine.precision.PrecisionModel` its batch size,
        the shape it compiles or captures in CUDA graphs (:mod:`harness.engine.forward`).
    """

    serves_model = True
    """Whether the engine's forward passes go through ``model`` (its batch shape served)."""

    def __init__(
        self,
        model: torch.nn.Module,
        num_classes: int,
        device: torch.device,
        batch_size: int = 1024,
        seed: int = 0,
        noise_threads: int | None = None,
        noise: str = "auto",
        pad_batches: bool = False,
    ) -> None:
        self.model = model
        self.pad_batches = pad_batches
        self.num_classes = num_classes
        self.device = torch.device(device)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(
                f"batch_size must be a positive integer, got {batch_size!r} (resolve 'auto' "
                "with harness.engine.batchsize.auto_batch_size before making the engine)"
            )
        self.batch_size = batch_size
        self.seed = seed
        self.noise = default_noise(self.device) if noise == "auto" else noise
        if self.noise not in NOISE_SCHEMES:
            raise ValueError(
                f"unknown noise scheme {noise!r}; known: auto, {', '.join(NOISE_SCHEMES)}"
            )
        threads = 1 if self.device.type != "cpu" else (noise_threads or torch.get_num_threads())
        self._threads = threads
        self._blocks = BlockPool(self.device, threads) if self.noise == "block-v1" else None
        self._buffer: torch.Tensor | None = None
        if pad_batches and self.serves_model and isinstance(model, PrecisionModel):
            model.serve(batch_size)

    def padded(self) -> SamplingEngine:
        """The same engine (model, seed, noise, batch size) with ``pad_batches`` on."""
        return SamplingEngine(
            self.model, self.num_classes, self.device, self.batch_size, self.seed,
            self._threads, self.noise, pad_batches=True,
        )  # fmt: skip

    def counts(
        self,
        x: torch.Tensor,
        sigma: Sequence[float] | torch.Tensor,
        input_ids: Sequence[int],
        num: int,
        stream: int,
        start: int = 0,
    ) -> np.ndarray:
        """Hard smoothing: counts [B, C] of argmax f(x_i + σ_i ε) over samples
        ``start`` … ``start + num − 1`` of each input (:meth:`run`)."""
        out = np.zeros((len(input_ids), self.num_classes), dtype=np.int64)
        for index, counts in self.run(x, sigma, input_ids, num, stream, soft=False, start=start):
            out[index] = counts
        return out

    def soft_stats(
        self,
        x: torch.Tensor,
        sigma: Sequence[float] | torch.Tensor,
        input_ids: Sequence[int],
        num: int,
        stream: int,
        start: int = 0,
    ) -> list[SoftStats]:
        """Soft smoothing: per-class sums of softmax f(x_i + σ_i ε) and of their squares
        (samples ``start`` … ``start + num − 1`` of the stream)."""
        out: list[SoftStats] = [None] * len(input_ids)  # type: ignore[list-item]
        for index, result in self.run(x, sigma, input_ids, num, stream, soft=True, start=start):
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
        start: int = 0,
    ) -> Iterator[tuple[int, np.ndarray | SoftStats]]:
        """Sample ``num`` noisy copies of every input; yield (index, result) as each finishes.

        ``sigma`` is σ(x_i) [B], or a diagonal scale [B, d] or [B, *input_shape]
        (:mod:`harness.engine.scale`): x_i + scale_i·ε, ε the same noise, coordinate by
        coordinate (a scale of c everywhere draws the samples of σ = c bit for bit).

        The copies are samples ``start`` … ``start + num − 1`` of each input's stream: the
        same noise a call with ``start + num`` samples gives those indices, so a stream
        can be drawn in consecutive rounds (sequential CERTIFY). Inputs are consumed in
        order, so they finish one after another and a caller can store each result at
        once (nothing is lost but the inputs in flight).
        """
        if len(x) != len(input_ids):
            raise ValueError(f"{len(x)} inputs but {len(input_ids)} input ids")
        if isinstance(start, bool) or not isinstance(start, int | np.integer) or start < 0:
            raise ValueError(f"start must be an integer >= 0, got {start!r}")
        x = x.to(self.device, torch.float32)
        sigmas, scale = _noise_levels(sigma, x, len(input_ids))
        TALLY.samples += num * len(input_ids)
        jobs = [
            Job(x[i], float(s), int(i_id), int(start) + num, int(start),
                None if scale is None else scale[i])
            for i, (s, i_id) in enumerate(zip(sigmas, input_ids, strict=True))
        ]  # fmt: skip
        kind = SoftSums if soft else HardCounts
        acc = kind(len(jobs), self.num_classes, self.batch_size, self.device)
        if self._blocks is None:
            scheme: PhiloxNoise | BlockNoise = PhiloxNoise(self.device, self.seed, x, jobs, stream)
        else:
            scheme = BlockNoise(self._blocks, self.seed, jobs, stream)
        finished = self._sample(jobs, scheme, acc, self._batch_buffer(x.shape[1:]))
        for index in finished:
            yield index, acc.result(index, num)

    def _sample(
        self, jobs: list[Job], scheme: PhiloxNoise | BlockNoise, acc: HardCounts | SoftSums,
        buffer: torch.Tensor,
    ) -> Iterator[int]:  # fmt: skip
        """Every batch of ``jobs`` in order: filled by the noise ``scheme``, through the
        model (padded to the full batch with ``pad_batches``), into ``acc``; yields each
        job's index once all its samples are in and on the host (every index, also when
        num = 0)."""
        # Σ of all logits in float64: non-finite iff some logit is (no float32 logit can
        # overflow it), one reduction per batch instead of a test of every logit
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        reads = _HostReads(acc, total, len(jobs))
        cursor = 0  # jobs[:cursor] are finished and their reads under way
        with torch.no_grad():
            for window in self._plan(jobs, scheme.block):
                rows_w, samples_w, offsets = self._window_rows(window, scheme.block is None)
                acc.begin_window(rows_w)
                for b, segments in enumerate(window):
                    lo, hi = offsets[b], offsets[b + 1]
                    fill = hi - lo
                    samples = None if samples_w is None else samples_w[lo:hi]
                    scheme.fill(window, b, rows_w[lo:hi], samples, buffer, fill)
                    for index, begin, take in segments:
                        jobs[index].done = begin + take
                    logits = self._forward(buffer, fill)
                    total += logits.sum(dtype=torch.float64)
                    acc.add(lo, hi, rows_w[lo:hi], logits)
                    first = cursor
                    while cursor < len(jobs) and jobs[cursor].done == jobs[cursor].end:
                        cursor += 1
                    reads.start(first, cursor)
                    yield from reads.landed(jobs)
        reads.start(cursor, len(jobs))  # num = 0: nothing to sample
        yield from reads.landed(jobs, wait=True)

    def _forward(self, buffer: torch.Tensor, fill: int) -> torch.Tensor:
        """The logits of the batch's first ``fill`` rows (with ``pad_batches``, of the
        whole buffer with the rest zeroed, the padding's outputs dropped)."""
        if self.pad_batches and fill < len(buffer):
            buffer[fill:].zero_()
            TALLY.rows += len(buffer)
            return self.model(buffer)[:fill]
        TALLY.rows += fill
        return self.model(buffer[:fill])

    def _batch_buffer(self, shape: torch.Size) -> torch.Tensor:
        """The batch of noisy inputs, allocated once (fresh pages are costly to touch)."""
        if self._buffer is None or self._buffer.shape[1:] != shape:
            self._buffer = torch.empty((self.batch_size, *shape), device=self.device)
        return self._buffer

    def _plan(
        self, jobs: list[Job], block: int | None
    ) -> Iterator[list[list[tuple[int, int, int]]]]:
        """The batches, in windows of up to :data:`PLAN_WINDOW`: each batch a list of
        (job index, first sample, number of samples) segments.

        Batches are filled greedily in job order (their composition is part of what the
        model sees, so it never changes). With a ``block`` size, no segment crosses a
        noise block (each is a slice of one).
        """
        window: list[list[tuple[int, int, int]]] = []
        batch: list[tuple[int, int, int]] = []
        room = self.batch_size
        for index, job in enumerate(jobs):
            done = job.done
            while done < job.end:
                take = min(room, job.end - done)
                if block is not None:
                    take = min(take, block - done % block)
                batch.append((index, done, take))
                done += take
                room -= take
                if room == 0:
                    window.append(batch)
                    batch, room = [], self.batch_size
                    if len(window) == PLAN_WINDOW:
                        yield window
                        window = []
        if batch:
            window.append(batch)
        if window:
            yield window

    def _window_rows(
        self, window: list[list[tuple[int, int, int]]], philox: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None, list[int]]:
        """For every row of a window's batches: its job index and (philox) its sample
        index, as device tensors expanded on the device from the window's segments (one
        small transfer: the host's work is per segment, not per row); and each batch's
        first row."""
        segments = [seg for batch in window for seg in batch]
        offsets = [0]
        for batch in window:
            offsets.append(offsets[-1] + sum(t for _, _, t in batch))
        rows_total = offsets[-1]
        index, start, take = self._to_device(np.array(segments, dtype=np.int64).T.copy())
        rows = torch.repeat_interleave(index, take, output_size=rows_total)
        samples = None
        if philox:  # sample index = start of the segment + position in it
            first_row = torch.cumsum(take, 0) - take
            shift = torch.repeat_interleave(first_row - start, take, output_size=rows_total)
            samples = torch.arange(rows_total, device=self.device) - shift
        return rows, samples, offsets

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        """A host array on the device; on CUDA through pinned memory without blocking
        (a copy from pageable memory would wait for the device to drain)."""
        tensor = torch.from_numpy(array)
        if self.device.type != "cuda":
            return tensor.to(self.device)
        return tensor.pin_memory().to(self.device, non_blocking=True)


def _noise_levels(
    sigma: Sequence[float] | torch.Tensor | np.ndarray, x: torch.Tensor, count: int
) -> tuple[list[float], torch.Tensor | None]:
    """Each input's σ (float64; of a diagonal scale its smallest axis) and the scale itself
    (float32, on ``x``'s device, shaped as ``x``; None for one σ per input)."""
    sigma = torch.as_tensor(sigma, dtype=None if torch.is_tensor(sigma) else torch.float64)
    if sigma.dim() < 2 or count == 0:
        sigmas = sigma.to(torch.float64).flatten().tolist()
        if len(sigmas) != count:
            raise ValueError(f"{count} inputs but {len(sigmas)} values of sigma")
        return sigmas, None
    scale = sigma.detach().to("cpu", torch.float32).reshape(len(sigma), -1)
    if scale.shape != (count, x[0].numel()):
        raise ValueError(f"{count} inputs of {x[0].numel()} dimensions but a diagonal scale "
                         f"of shape {tuple(sigma.shape)}")  # fmt: skip
    sigmas = scale.min(dim=1).values.double().tolist()
    return sigmas, scale.to(x.device).view(count, *x.shape[1:])


class _HostReads:
    """The finished inputs' results on their way to the host, handed out in order.

    :meth:`start` copies the results of jobs ``lo:hi`` and the finiteness of the logits'
    running sum to pinned host memory without blocking (CUDA) and records an event;
    :meth:`landed` yields the jobs whose copies have landed, after checking that no
    logit so far was NaN or infinite (else a :class:`ModelOutputError` names the likely
    cause). On a CPU every copy lands at once.
    """

    def __init__(self, acc: HardCounts | SoftSums, total: torch.Tensor, jobs: int) -> None:
        self.acc, self.total = acc, total
        self.cuda = total.device.type == "cuda"
        self.finite = torch.empty(jobs + 1, dtype=torch.bool, pin_memory=self.cuda)
        self.pending: list[tuple[int, int, int, torch.cuda.Event | None]] = []
        self.started = 0

    def start(self, lo: int, hi: int) -> None:
        if hi <= lo:
            return
        slot = self.started
        self.started += 1
        event = None
        if self.cuda:
            self.acc.fetch(lo, hi)
            self.finite[slot].copy_(torch.isfinite(self.total), non_blocking=True)
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.total.device))
        else:
            self.finite[slot] = torch.isfinite(self.total)
        self.pending.append((lo, hi, slot, event))

    def landed(self, jobs: list[Job], wait: bool = False) -> Iterator[int]:
        while self.pending:
            lo, hi, slot, event = self.pending[0]
            if event is not None:
                if wait:
                    event.synchronize()
                elif not event.query():
                    return
            self.pending.pop(0)
            if not bool(self.finite[slot]):
                raise ModelOutputError(_nonfinite_message(jobs))
            yield from range(lo, hi)


def _nonfinite_message(jobs) -> str:
    """Name the likely cause of non-finite logits: σ out of range, or the model itself."""
    bad = [j for j in jobs if not (0 < j.sigma <= SIGMA_MAX) or not bool(torch.isfinite(j.x).all())]
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
