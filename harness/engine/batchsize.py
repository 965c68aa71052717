"""``batch_size = "auto"``: the batch of noisy samples worth running at once.

The best batch differs by a factor of 20 between a small MLP and ResNet-110, so it is
probed once per (model architecture and arithmetic, device, input shape) and cached on
disk under the cache directory (``batch-size.json``):

- CUDA (throughput, bounded by memory): the rate in samples/s of forward + argmax
  (synchronized, after a warm-up that also lets cuDNN's benchmark mode time its
  algorithms) over batches of 256, 512, ... samples (at most :data:`MAX_BATCH`), until a
  batch runs out of memory, a forward pass takes over a second, or two doublings in a row
  fail to gain :data:`CUDA_MIN_GAIN`; the choice is the smallest batch within
  :data:`CUDA_TOLERANCE` of the best rate seen (a larger one only pads more), and never
  above half the largest batch that fitted (room for the noise, the accumulators and
  memory fragmentation). A large batch can be slower than a smaller one (ResNet-110's
  convolutions), so memory alone does not decide.
- CPU (memory is rarely the limit, throughput is): batches of 64, 128, ... samples
  (at most :data:`MAX_CPU_BATCH`) while the forward throughput still grows by 10% per
  doubling and two forward passes take under a second; the choice is the last batch
  that still gained.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch

MAX_BATCH = 1 << 16
MAX_CPU_BATCH = 8192
CACHE_FILE = "batch-size.json"
CUDA_MIN_GAIN = 1.03
"""A doubling that does not raise the rate by 3 % has not gained."""
CUDA_TOLERANCE = 0.97
"""Batches whose rate is within 3 % of the best are as good (measurement noise)."""


def _cache_key(model: torch.nn.Module, input_shape: tuple[int, ...], device: torch.device) -> str:
    params = [(tuple(p.shape), str(p.dtype)) for p in model.parameters()]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    key = [repr(model), params, name, list(input_shape), torch.__version__]
    if device.type == "cuda":  # chosen by throughput since; earlier memory-only choices expire
        key.append("throughput")
    text = json.dumps(key)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def auto_batch_size(
    model: torch.nn.Module,
    input_shape: tuple[int, ...],
    device: torch.device | str,
    cache_dir: Path | None = None,
) -> int:
    """The batch size ``"auto"`` stands for, probed once and cached (see the module)."""
    from harness.foundation.artifacts import default_cache_dir

    device = torch.device(device)
    path = Path(cache_dir or default_cache_dir()) / CACHE_FILE
    key = _cache_key(model, input_shape, device)
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if isinstance(cached.get(key), int) and cached[key] >= 1:
        return cached[key]
    probe = _probe_cuda if device.type == "cuda" else _probe_cpu
    with torch.no_grad():
        size = probe(model, input_shape, device)
    cached[key] = size
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cached, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache only costs a probe next time
    return size


def _forward(model, input_shape, device, batch: int) -> None:
    model(torch.rand((batch, *input_shape), device=device)).argmax(dim=1)


def _probe_cuda(model, input_shape, device) -> int:
    def measure(batch: int) -> float | None:
        try:
            return _cuda_rate(model, input_shape, device, batch)
        except torch.cuda.OutOfMemoryError:
            return None
        finally:
            torch.cuda.empty_cache()

    batch = choose_by_rate(measure, 256, MAX_BATCH)
    if batch is None:
        raise RuntimeError(
            f"the model does not fit a batch of 256 inputs of shape {list(input_shape)} on "
            f"{device}; set [certification] batch_size to a smaller number"
        )
    return batch


def _cuda_rate(model, input_shape, device, batch: int) -> float:
    """Samples per second of forward + argmax at ``batch``: after a warm-up, repeated
    until 3 passes and 0.2 s (or one pass over a second)."""
    x = torch.rand((batch, *input_shape), device=device)
    model(x).argmax(dim=1)
    torch.cuda.synchronize(device)
    done, start = 0, time.perf_counter()
    while True:
        model(x).argmax(dim=1)
        done += 1
        torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        if (done >= 3 and seconds >= 0.2) or seconds > 1.0:
            return done * batch / seconds


def choose_by_rate(measure, first: int, last: int) -> int | None:
    """The batch size the CUDA probe chooses (see the module) from ``measure(batch)``, the
    rate at ``batch`` or None when it does not fit, over ``first``, 2·``first``, ... ``last``;
    None when not even ``first`` fits."""
    rates: dict[int, float] = {}
    batch, best, stalled, fitted_all = first, 0.0, 0, True
    while batch <= last:
        rate = measure(batch)
        if rate is None:
            fitted_all = False
            break
        rates[batch] = rate
        stalled = 0 if rate >= best * CUDA_MIN_GAIN else stalled + 1
        best = max(best, rate)
        if stalled >= 2 or batch / rate > 1.0:  # no gain, or a pass of over a second
            break
        batch *= 2
    if not rates:
        return None
    choice = min(b for b, r in rates.items() if r >= CUDA_TOLERANCE * best)
    if not fitted_all:  # room beside the largest batch that fitted
        choice = min(choice, max(first, max(rates) // 2))
    return choice


def _probe_cpu(model, input_shape, device, min_gain: float = 1.1, max_seconds: float = 1.0) -> int:
    best_rate, best = 0.0, 64
    batch = 64
    while batch <= MAX_CPU_BATCH:
        _forward(model, input_shape, device, batch)  # warm-up (allocations)
        start = time.perf_counter()
        for _ in range(2):
            _forward(model, input_shape, device, batch)
        seconds = time.perf_counter() - start
        rate = 2 * batch / seconds
        if rate < best_rate * min_gain:
            break
        best_rate, best = rate, batch
        if seconds > max_seconds:  # a large model: the plateau is reached, the probe slow
            break
        batch *= 2
    return best
