"""``batch_size = "auto"``: the largest batch of noisy samples worth running at once.

The best batch differs by a factor of 20 between a small MLP and ResNet-110, so it is
probed once per (model architecture, device, input shape) and cached on disk under the
cache directory (``batch-size.json``):

- CUDA: batches of 256, 512, ... samples (at most :data:`MAX_BATCH`) until a forward pass
  runs out of memory; the choice is half the largest batch that fitted, which leaves
  room for the noise, the accumulators and memory fragmentation.
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


def _cache_key(model: torch.nn.Module, input_shape: tuple[int, ...], device: torch.device) -> str:
    params = [(tuple(p.shape), str(p.dtype)) for p in model.parameters()]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    text = json.dumps([repr(model), params, name, list(input_shape), torch.__version__])
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
    fitted = 0
    batch = 256
    while batch <= MAX_BATCH:
        try:
            _forward(model, input_shape, device, batch)
            torch.cuda.synchronize(device)
        except torch.cuda.OutOfMemoryError:
            break
        finally:
            torch.cuda.empty_cache()
        fitted = batch
        batch *= 2
    if fitted == 0:
        raise RuntimeError(
            f"the model does not fit a batch of 256 inputs of shape {list(input_shape)} on "
            f"{device}; set [certification] batch_size to a smaller number"
        )
    return max(256, fitted // 2) if fitted < MAX_BATCH else fitted


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
