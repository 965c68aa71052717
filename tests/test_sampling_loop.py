"""The sampling loop, split by noise scheme and smoothing kind, gives the counts and sums
of the single loop it replaced, bit for bit.

``frozen_run`` is that loop as it stood before the split (kept only here, unchanged but
for the names of the helpers it calls: the block drawing moved to
:class:`harness.engine.noise_schemes.BlockNoise`, made per call, the job record to ``Job``,
whose last sample is ``end``).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from harness.engine.accumulators import SoftStats
from harness.engine.noise import noise_key, noisy_batch
from harness.engine.noise_schemes import NOISE_BLOCK, BlockNoise, Job
from harness.engine.sampling import SamplingEngine


def frozen_run(self, x, sigma, input_ids, num, stream, soft=False):
    if len(x) != len(input_ids):
        raise ValueError(f"{len(x)} inputs but {len(input_ids)} input ids")
    sigmas = torch.as_tensor(sigma, dtype=torch.float64).flatten().tolist()
    x = x.to(self.device, torch.float32)
    jobs = [Job(x[i], float(s), int(i_id), num)
            for i, (s, i_id) in enumerate(zip(sigmas, input_ids, strict=True))]  # fmt: skip
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

    def result(index):
        if soft:
            return SoftStats(num, acc[index].cpu().numpy(), acc_sq[index].cpu().numpy())
        return acc[index].cpu().numpy()

    ones = None if soft else torch.ones(self.batch_size, dtype=torch.int64, device=self.device)
    total = torch.zeros((), dtype=torch.float64, device=self.device)
    buffer = self._batch_buffer(x.shape[1:])
    blocks = None if philox else BlockNoise(self._blocks, self.seed, jobs, stream)
    cursor = 0
    with torch.no_grad():
        for window in self._plan(jobs, None if philox else NOISE_BLOCK):
            rows_w, samples_w, offsets = self._window_rows(window, philox)
            flat_w = None if soft else rows_w * classes
            for b, segments in enumerate(window):
                lo, hi = offsets[b], offsets[b + 1]
                fill = hi - lo
                rows = rows_w[lo:hi]
                if philox:
                    noisy_batch(flat_x, sigma_t, keys, rows, samples_w[lo:hi],
                                buffer.view(len(buffer), -1)[:fill])  # fmt: skip
                else:
                    blocks.fill(window, b, rows, None, buffer, fill)
                for index, start, take in segments:
                    jobs[index].done = start + take
                if self.pad_batches and fill < len(buffer):
                    buffer[fill:].zero_()
                    logits = self.model(buffer)[:fill]
                else:
                    logits = self.model(buffer[:fill])
                total += logits.sum(dtype=torch.float64)
                if soft:
                    probs = torch.softmax(logits.double(), dim=1)
                    acc.index_add_(0, rows, probs)
                    acc_sq.index_add_(0, rows, probs * probs)
                else:
                    flat = flat_w[lo:hi] + logits.argmax(dim=1)
                    acc.view(-1).index_add_(0, flat, ones[:fill])
                while cursor < len(jobs) and jobs[cursor].done == jobs[cursor].end:
                    assert bool(torch.isfinite(total))
                    yield cursor, result(cursor)
                    cursor += 1
    for index in range(cursor, len(jobs)):
        yield index, result(index)


def _engine(noise: str, batch: int, pad: bool) -> SamplingEngine:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 5)
    ).eval()
    return SamplingEngine(model, 5, torch.device("cpu"), batch, seed=7, noise=noise,
                          pad_batches=pad, noise_threads=2)  # fmt: skip


def _flat(results):
    out = []
    for index, value in results:
        if isinstance(value, SoftStats):
            out.append((index, value.num, value.sums.tobytes(), value.sums_sq.tobytes()))
        else:
            out.append((index, value.tobytes()))
    return out


@pytest.mark.parametrize(
    ("noise", "soft", "batch", "pad"),
    list(itertools.product(["philox-v1", "block-v1"], [False, True], [96, 1000], [False, True])),
)
def test_split_loop_is_bit_identical_to_the_single_loop(noise, soft, batch, pad):
    x = torch.rand(5, 6, generator=torch.Generator().manual_seed(1))
    sigma = [0.1, 0.5, 2.0, 0.25, 1.0]
    ids = [3, 40, 41, 7, 1000]
    for num in (700, 1, 0):  # across noise blocks and batches; one sample; none
        split = _engine(noise, batch, pad)
        frozen = _engine(noise, batch, pad)
        new = _flat(split.run(x, sigma, ids, num, stream=1, soft=soft))
        old = _flat(frozen_run(frozen, x, sigma, ids, num, 1, soft=soft))
        assert [r[0] for r in new] == list(range(5))
        assert new == old
        if num and not soft:  # the counts are whole: every sample counted once
            counts = np.stack([np.frombuffer(r[1], dtype=np.int64) for r in new])
            assert (counts.sum(1) == num).all()


def test_one_engine_reused_across_calls_matches_fresh_engines():
    """The block scheme keeps its used blocks for reuse; a second call still draws the
    same noise as a fresh engine."""
    x = torch.rand(3, 6, generator=torch.Generator().manual_seed(2))
    engine = _engine("block-v1", 96, True)
    first = engine.counts(x, [0.3, 0.3, 0.3], [0, 1, 2], 500, stream=0)
    second = engine.counts(x, [0.3, 0.3, 0.3], [5, 6, 7], 300, stream=1)
    assert np.array_equal(
        first, _engine("block-v1", 96, True).counts(x, [0.3] * 3, [0, 1, 2], 500, 0)
    )
    assert np.array_equal(
        second, _engine("block-v1", 96, True).counts(x, [0.3] * 3, [5, 6, 7], 300, 1)
    )
