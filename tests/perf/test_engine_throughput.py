"""Engine throughput against the raw forward pass, and certification per input.

Run with ``python3 -m pytest tests/perf -m perf -s``. Every figure is a ratio of two
measurements taken in the same run on the same device with the same batch size:

- engine samples/s (noise drawn per input on the device, mixed batches, counts
  accumulated on the device) ÷ raw forward samples/s of the same model on a batch of
  inputs already in memory (the physical limit of certification);
- CohenCertifier seconds per input ÷ a straightforward one-input-at-a-time loop
  (Cohen et al.'s reference ``Smooth`` approach: repeat the input, add noise, count).
"""

from __future__ import annotations

import time

import pytest
import torch

from harness.protocol import CertificationProtocol
from harness.sampling import SamplingEngine, resolve_device
from plugins.cohen.certifier import CohenCertifier
from plugins.models import build_cnn, build_mlp

pytestmark = pytest.mark.perf

N, INPUTS, BATCH = 10_000, 64, 1024
DEVICE = resolve_device("auto")
BUILDERS = {"mlp": build_mlp, "cnn": build_cnn}


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return BUILDERS[name]((1, 28, 28), 10, {}).to(DEVICE).eval()


def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def _raw_forward_rate(model: torch.nn.Module, total: int) -> float:
    x = torch.rand(BATCH, 1, 28, 28, device=DEVICE)
    with torch.no_grad():
        for _ in range(3):
            model(x).argmax(1)
        _sync()
        start = time.perf_counter()
        done = 0
        while done < total:
            model(x).argmax(1)
            done += BATCH
        _sync()
    return done / (time.perf_counter() - start)


def _reference_certify(model, x, sigma, n0, n, batch):
    """One input at a time, as the reference implementation's Smooth.certify does."""
    counts = []
    with torch.no_grad():
        for xi in x:
            per_input = []
            for num in (n0, n):
                c = torch.zeros(10, dtype=torch.long, device=DEVICE)
                remaining = num
                while remaining > 0:
                    b = min(batch, remaining)
                    noisy = xi.repeat(b, 1, 1, 1) + torch.randn(b, *xi.shape, device=DEVICE) * sigma
                    c += torch.bincount(model(noisy).argmax(1), minlength=10)
                    remaining -= b
                per_input.append(c.cpu())
            counts.append(per_input)
    return counts


@pytest.mark.parametrize("arch", ["mlp", "cnn"])
def test_engine_vs_raw_forward(benchmark, arch):
    model = _model(arch)
    x = torch.rand(INPUTS, 1, 28, 28)
    sigma = torch.full((INPUTS,), 0.25)
    engine = SamplingEngine(model, 10, DEVICE, batch_size=BATCH, seed=0)
    engine.counts(x[:2], sigma[:2], [0, 1], BATCH, stream=1)  # warm-up
    raw_before = _raw_forward_rate(model, INPUTS * N // 4)
    start = time.perf_counter()
    benchmark.pedantic(
        lambda: engine.counts(x, sigma, list(range(INPUTS)), N, stream=1), rounds=1, iterations=1
    )
    engine_rate = INPUTS * N / (time.perf_counter() - start)
    raw_after = _raw_forward_rate(model, INPUTS * N // 4)
    raw = (raw_before + raw_after) / 2
    ratio = engine_rate / raw
    benchmark.extra_info.update(
        device=str(DEVICE), engine_samples_per_s=engine_rate, raw_samples_per_s=raw, ratio=ratio
    )
    print(
        f"\n[{arch} on {DEVICE}] engine {engine_rate:,.0f} samples/s, raw forward {raw:,.0f} "
        f"samples/s (before {raw_before:,.0f}, after {raw_after:,.0f}): ratio {ratio:.3f}"
    )
    assert ratio > 0


@pytest.mark.parametrize("arch", ["mlp", "cnn"])
def test_certify_per_input_vs_one_at_a_time(benchmark, arch):
    model = _model(arch)
    inputs = 64 if arch == "mlp" else 16
    x = torch.rand(inputs, 1, 28, 28, device=DEVICE)
    sigma = torch.full((inputs,), 0.25)
    protocol = CertificationProtocol(n0=100, n=N, alpha=0.001, batch_size=BATCH)
    engine = SamplingEngine(model, 10, DEVICE, batch_size=BATCH, seed=0)
    certifier = CohenCertifier(engine, protocol)
    start = time.perf_counter()
    benchmark.pedantic(
        lambda: list(certifier.certify(x, sigma, list(range(inputs)))), rounds=1, iterations=1
    )
    ours = (time.perf_counter() - start) / inputs
    start = time.perf_counter()
    _reference_certify(model, x, 0.25, protocol.n0, protocol.n, BATCH)
    _sync()
    reference = (time.perf_counter() - start) / inputs
    benchmark.extra_info.update(
        device=str(DEVICE), seconds_per_input=ours, reference_seconds_per_input=reference
    )
    print(
        f"\n[{arch} on {DEVICE}] certify {ours * 1e3:.1f} ms/input, one-at-a-time loop "
        f"{reference * 1e3:.1f} ms/input: speed-up {reference / ours:.2f}x"
    )
