"""``idrs-bench bench --api``: ``harness.api.certify`` against the reference CERTIFY loop
(Cohen et al.'s ``Smooth.certify``, :func:`harness.cli.throughput.reference_certify`) on
the same weights and inputs, in the same backend setting and in PyTorch's default
arithmetic (what their code runs: :func:`harness.cli.throughput.torch_default_setting`), in
seconds per input; in a precision other than fp32, or with a forward option that is on
(``--fold-batchnorm``, ``--compile``, ``--cuda-graphs``), how many argmax decisions on
noisy inputs differ from the plain fp32 model's (the price of the speed, on up to 10,000
samples per input, at the engine's batch shape). With
sequential sampling, ``api.certify(..., sampling="sequential", n_max=n)`` is timed too, and
each of the three says how many inputs it certifies at each radius of the default grid
(equal counts: the same certified accuracy on the grid). What is timed is
:func:`harness.running.held_model.certify_held_model`, all of ``api.certify`` but its
table (the CLI sits below ``harness.api``).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class ApiResult:
    model: str
    device: str
    setting: str
    inputs: int
    n: int
    batch_size: int
    reference_batch: int
    api_s_per_input: float
    reference_s_per_input: float
    api_speedup: float
    reference_default_setting: str  # PyTorch's default arithmetic
    reference_default_s_per_input: float
    api_speedup_vs_default: float
    api_certified: int
    reference_certified: int
    decisions_checked: int | None
    decisions_differ_from_fp32: int | None
    grid: list[float] | None = None  # the radii certified counts are given at
    api_on_grid: list[int] | None = None  # inputs certified at each radius, api.certify
    reference_on_grid: list[int] | None = None
    sequential_s_per_input: float | None = None  # api.certify(sampling="sequential")
    sequential_speedup_vs_default: float | None = None
    sequential_on_grid: list[int] | None = None
    sequential_samples: float | None = None  # mean estimation samples per input


def bench_api(
    name: str, built: tuple[Any, tuple[int, ...]], classes: int, protocol: Any, device: Any,
    inputs: int, sigma: float, reference_batch: int = 1000, sampling: str = "fixed",
) -> ApiResult:  # fmt: skip
    """``harness.api.certify`` against the reference loop on one model with ``classes``
    outputs, in seconds per input (see the module docstring)."""
    import torch

    from harness.cli.throughput import (
        Setting,
        model_in_setting,
        setting_of,
        synchronizer,
        timed_reference,
        torch_default_setting,
    )
    from harness.engine.precision import PrecisionModel
    from harness.engine.sampling import SamplingEngine
    from harness.mathematics.accuracy import RADII
    from harness.reports.precision_report import JointDecisions
    from harness.running.held_model import certify_held_model

    model, shape = built
    model = model.to(device)
    own = setting_of(protocol)
    certified = model_in_setting(model, protocol, own)
    x = torch.rand((inputs, *shape), generator=torch.Generator().manual_seed(2))
    y = torch.zeros(inputs, dtype=torch.long)
    sync = synchronizer(device)

    forward = {o: True for o in own.forward}

    def certify(count: int, n: int, how: str = "fixed"):  # api.certify(model, x, y, ...)
        return certify_held_model(model, x[:count], y[:count], "cohen", sigma, {}, protocol.n0,
                                  n, protocol.alpha, device, 0, protocol.batch_size, None, None,
                                  own.precision, own.channels_last, own.cudnn, how,
                                  None if how == "fixed" else n, RADII, forward)  # fmt: skip

    certify(1, protocol.n0)  # warm-up (kernels, the batch probe)
    sync()
    start = time.perf_counter()
    rows, attrs = certify(inputs, protocol.n)
    sync()
    api_seconds = (time.perf_counter() - start) / inputs
    xd = x.to(device)
    seconds, reference = timed_reference(certified, xd, sigma, protocol, reference_batch, classes,
                                         sync)  # fmt: skip
    reference_seconds = seconds / inputs
    default = torch_default_setting(device, own.cudnn)
    default_seconds = reference_seconds
    if default != own:
        loop = model_in_setting(model, protocol, default)
        seconds, _ = timed_reference(loop, xd, sigma, protocol, reference_batch, classes, sync)
        default_seconds = seconds / inputs
    extra: dict[str, Any] = {}
    if sampling == "sequential":
        certify(1, protocol.n0, sampling)
        sync()
        start = time.perf_counter()
        rounds, _ = certify(inputs, protocol.n, sampling)
        sync()
        seconds = (time.perf_counter() - start) / inputs
        extra = {"grid": list(RADII), "api_on_grid": _on_grid(rows, RADII),
                 "reference_on_grid": _on_grid([{"prediction": c, "radius": r}
                                                for c, r in reference], RADII),
                 "sequential_s_per_input": seconds,
                 "sequential_speedup_vs_default": default_seconds / seconds,
                 "sequential_on_grid": _on_grid(rounds, RADII),
                 "sequential_samples": sum(r["draws"]["base"]["n"] for r in rounds) / inputs}  # fmt: skip
    checked = differ = None
    plain = Setting("fp32", own.channels_last, own.cudnn)
    if own != plain:  # argmax decisions on noisy inputs that differ from plain fp32
        fp32 = model_in_setting(model, protocol, plain)
        batch = int(attrs["batch_size"])
        if isinstance(certified, PrecisionModel):  # at the engine's shape, as certified
            certified.serve(batch)
        joint = SamplingEngine(JointDecisions(fp32, certified, classes), classes**2,
                               device, batch, seed=0, pad_batches=True)  # fmt: skip
        m = min(protocol.n, 10_000)
        counts = joint.counts(xd, [sigma] * inputs, list(range(inputs)), m, stream=1)
        counts = counts.reshape(inputs, classes, classes)
        checked, differ = inputs * m, int(counts.sum() - counts.trace(axis1=1, axis2=2).sum())
    return ApiResult(
        model=name, device=str(device), setting=str(own), inputs=inputs, n=protocol.n,
        batch_size=int(attrs["batch_size"]), reference_batch=reference_batch,
        api_s_per_input=api_seconds, reference_s_per_input=reference_seconds,
        api_speedup=reference_seconds / api_seconds, reference_default_setting=str(default),
        reference_default_s_per_input=default_seconds,
        api_speedup_vs_default=default_seconds / api_seconds,
        api_certified=sum(row["prediction"] >= 0 for row in rows),
        reference_certified=sum(c >= 0 for c, _ in reference),
        decisions_checked=checked, decisions_differ_from_fp32=differ, **extra,
    )  # fmt: skip


def _on_grid(rows: list[dict[str, Any]], grid: tuple[float, ...]) -> list[int]:
    """How many of ``rows`` certify (a prediction, radius at least r) at each r of ``grid``."""
    return [sum(row["prediction"] >= 0 and row["radius"] >= r for row in rows) for r in grid]


def print_api(results: list[ApiResult]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="harness.api.certify vs the reference loop (seconds per input)")
    for column in ("model", "setting", "api batch", "api", "reference", "speed-up",
                   "reference (PyTorch default)", "speed-up", "certified (api, reference)",
                   "noisy decisions differing from fp32"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("model", "setting") else "right")
    for r in results:
        differ = "–" if r.decisions_checked is None else (
            f"{r.decisions_differ_from_fp32:,} of {r.decisions_checked:,}")  # fmt: skip
        table.add_row(
            r.model, r.setting, f"{r.batch_size:,}", f"{r.api_s_per_input:.3g} s",
            f"{r.reference_s_per_input:.3g} s", f"{r.api_speedup:.2f}",
            f"{r.reference_default_s_per_input:.3g} s", f"{r.api_speedup_vs_default:.2f}",
            f"{r.api_certified}, {r.reference_certified} of {r.inputs}", differ,
        )  # fmt: skip
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    for r in results:
        if r.sequential_s_per_input is not None:
            print(f"{r.model}: api.certify sequential {r.sequential_s_per_input:.3g} s/input "
                  f"({r.sequential_samples:,.0f} estimation samples of n = {r.n:,}), "
                  f"{r.sequential_speedup_vs_default:.2f}x the reference in PyTorch's default; "
                  f"certified at radii {r.grid}: sequential {r.sequential_on_grid}, fixed "
                  f"{r.api_on_grid}, reference {r.reference_on_grid}")  # fmt: skip
