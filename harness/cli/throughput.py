"""What ``idrs-bench bench`` measures besides the engine: raw forward rates over batch
sizes and backend settings (the hardware's limit), and the reference CERTIFY loop.

- :func:`timed_rate`: samples per second of one step (a batch), after a warm-up.
- :func:`batch_sweep`: the raw rate (forward + argmax of a batch already in memory) over
  batches of ``first``, 2·``first``, ... until the memory runs out, a pass takes over a
  second, or two doublings in a row gain under 3 % (the rule of the CUDA batch probe,
  :mod:`harness.engine.batchsize`).
- :func:`limit_settings`: the backend settings the limit is taken over.
- :func:`reference_certify`: Cohen et al.'s ``Smooth.certify`` re-implemented, one input
  at a time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from harness.engine.batchsize import CUDA_MIN_GAIN


@dataclass(frozen=True)
class Setting:
    """A backend setting of the certified classifier (:mod:`harness.engine.precision`): its
    precision, layout, cuDNN mode and the forward options that are on
    (:data:`~harness.foundation.protocol.FORWARD_OPTIONS`)."""

    precision: str
    channels_last: bool
    cudnn: str
    forward: tuple[str, ...] = ()

    def __str__(self) -> str:
        from harness.foundation.protocol import FORWARD_NAMES

        cl = "+channels-last" if self.channels_last else ""
        options = "".join(f"+{FORWARD_NAMES[o]}" for o in self.forward)
        return f"{self.precision}{cl}{options} cudnn-{self.cudnn}"


def setting_of(protocol: Any) -> Setting:
    """The protocol's backend setting (precision, channels-last, cuDNN mode, forward options)."""
    from harness.foundation.protocol import FORWARD_OPTIONS

    forward = tuple(o for o in FORWARD_OPTIONS if getattr(protocol, o, False))
    return Setting(protocol.precision, protocol.channels_last, protocol.cudnn, forward)


def model_in_setting(model: torch.nn.Module, protocol: Any, setting: Setting) -> torch.nn.Module:
    """``model`` as the engine queries it in ``setting`` (:func:`~harness.engine.precision.
    prepare_model`)."""
    from harness.engine.precision import prepare_model
    from harness.foundation.protocol import FORWARD_OPTIONS

    options = {o: o in setting.forward for o in FORWARD_OPTIONS}
    return prepare_model(model, replace(protocol, precision=setting.precision,
                                        channels_last=setting.channels_last,
                                        cudnn=setting.cudnn, **options))  # fmt: skip


def torch_default_setting(device: torch.device, cudnn: str) -> Setting:
    """PyTorch's default arithmetic on ``device`` (:func:`~harness.engine.precision.
    default_precision`: tf32-conv on CUDA, fp32 elsewhere) on the plain model (no
    channels-last), in the cuDNN mode ``cudnn``: what code that keeps PyTorch's defaults,
    Cohen et al.'s, runs."""
    from harness.engine.precision import default_precision

    return Setting(default_precision(device), False, cudnn)  # (no forward option)


def limit_settings(
    own: Setting, scope: str, device: torch.device, convolutional: bool = True
) -> list[Setting]:
    """The settings whose raw rates bound the engine's at ``own`` (its own first) for a
    ``scope`` of :data:`harness.cli.bench.LIMIT_SCOPES`. On a CPU, cuDNN and TF32 do not
    exist: only channels-last and the precision vary; without convolutions, neither
    channels-last nor cuDNN changes anything."""
    precisions = [own.precision] if scope != "all" else list(dict.fromkeys([own.precision,
                                                                          "fp32", "tf32", "bf16"]))  # fmt: skip
    if device.type != "cuda":
        precisions = [p for p in precisions if not p.startswith("tf32")] or [own.precision]
    same = scope == "setting" or not convolutional
    layouts = [own.channels_last] if same else [own.channels_last, not own.channels_last]
    modes = [own.cudnn] if same or device.type != "cuda" else [own.cudnn, *(
        m for m in ("heuristic", "benchmark") if m != own.cudnn)]  # fmt: skip
    out = [replace(own, precision=p, channels_last=c, cudnn=m)
           for p in precisions for c in layouts for m in modes]  # fmt: skip
    return list(dict.fromkeys(out))


def synchronizer(device: torch.device) -> Callable[[], None]:
    """A function that waits for ``device`` to finish its queued work (none on a CPU)."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def timed_rate(step: Callable[[], Any], batch: int, seconds: float, sync) -> float:
    """Samples per second of ``step`` (one batch of ``batch``), after one warm-up step:
    repeated until 3 steps and ``seconds``, or one step of over max(``seconds``, 1 s)."""
    step()
    sync()
    done, start = 0, time.perf_counter()
    while True:
        step()
        done += 1
        if done == 1 or done >= 3:
            sync()
            elapsed = time.perf_counter() - start
            if (done >= 3 and elapsed >= seconds) or elapsed >= max(seconds, 1.0):
                return done * batch / elapsed


def batch_sweep(
    model: torch.nn.Module, shape: tuple[int, ...], device: torch.device, first: int,
    last: int, seconds: float,
) -> dict[int, float]:  # fmt: skip
    """Raw rate (forward + argmax, inputs in memory) per batch size (see the module)."""
    sync = synchronizer(device)
    rates: dict[int, float] = {}
    best, stalled, batch = 0.0, 0, first
    with torch.no_grad():
        while batch <= last:
            try:
                fixed = torch.rand((batch, *shape), device=device)
                rate = timed_rate(lambda f=fixed: model(f).argmax(1), batch, seconds, sync)
            except torch.cuda.OutOfMemoryError:
                break
            finally:
                fixed = None
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            rates[batch] = rate
            stalled = 0 if rate >= best * CUDA_MIN_GAIN else stalled + 1
            best = max(best, rate)
            if stalled >= 2 or batch / rate > 1.0:
                break
            batch *= 2
    return rates


def timed_reference(
    model, x, sigma: float, protocol: Any, batch: int, num_classes: int, sync
) -> tuple[float, list[tuple[int, float]]]:
    """Wall seconds of :func:`reference_certify` on every input of ``x`` with the
    ``protocol``'s n0, n and α, and its certificates, after a warm-up input that meets
    every batch shape of the loop (kernels compiled, cuDNN's algorithms chosen or timed)."""
    warm = min(protocol.n, batch + protocol.n % batch)
    reference_certify(model, x[:1], sigma, protocol.n0, warm, protocol.alpha, batch,
                      num_classes)  # fmt: skip
    sync()
    start = time.perf_counter()
    found = reference_certify(model, x, sigma, protocol.n0, protocol.n, protocol.alpha, batch,
                              num_classes)  # fmt: skip
    sync()
    return time.perf_counter() - start, found


def reference_certify(
    model, x, sigma: float, n0: int, n: int, alpha: float, batch: int, num_classes: int
) -> list[tuple[int, float]]:
    """(prediction, radius) per input, one input at a time, as Cohen et al.'s
    ``Smooth.certify`` (github.com/locuslab/smoothing, ``code/core.py``) computes them.

    For each input: n0 samples choose ĉ_A (argmax of the counts), n samples count n_A,
    p_A_lower = the one-sided Clopper–Pearson bound at level α; abstain (-1, 0) if
    p_A_lower < 1/2, else (ĉ_A, σ·Φ⁻¹(p_A_lower)). Per batch: ``x.repeat``,
    ``randn_like``·σ, argmax, the predictions moved to the host and tallied with numpy.
    """
    import numpy as np
    from scipy.stats import beta, norm

    def sample_noise(xi, num):
        counts = np.zeros(num_classes, dtype=int)
        remaining = num
        while remaining > 0:
            this_batch = min(batch, remaining)
            remaining -= this_batch
            repeated = xi.repeat((this_batch, *([1] * xi.dim())))
            noise = torch.randn_like(repeated) * sigma
            predictions = model(repeated + noise).argmax(1)
            counts += np.bincount(predictions.cpu().numpy(), minlength=num_classes)
        return counts

    out = []
    with torch.no_grad():
        for xi in x:
            c_hat = int(sample_noise(xi, n0).argmax())
            n_a = int(sample_noise(xi, n)[c_hat])
            p_lower = beta.ppf(alpha, n_a, n - n_a + 1) if n_a > 0 else 0.0
            if p_lower < 0.5 or math.isnan(p_lower):
                out.append((-1, 0.0))
            else:
                out.append((c_hat, float(sigma * norm.ppf(p_lower))))
    return out
