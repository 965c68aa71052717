"""``idrs-bench bench``: how close certification runs to the hardware's limit.

For each model (random weights, random inputs: no dataset needed), in one process, on one
device, at one batch size B (``auto`` by default, :mod:`harness.engine.batchsize`), four rates in
noisy samples per second:

- **raw**: forward pass + argmax of a batch of B inputs already in memory (the limit);
- **ideal**: the loop a certifier cannot beat: per batch one ``randn`` call, x + σ·ε,
  forward, argmax;
- **engine**: Cohen et al.'s CERTIFY through :class:`~harness.engine.sampling.SamplingEngine`
  (n0 = 100 selection and ``--n`` estimation samples per input, counted as n0 + n);
- **reference**: the same CERTIFY one input at a time, as in Cohen et al.'s reference
  code (``Smooth.certify`` of github.com/locuslab/smoothing, re-implemented here: per
  input, batches of ``x.repeat`` + ``randn_like``·σ, argmax, counts moved to the host
  and tallied with numpy per batch, Clopper–Pearson bound, σ·Φ⁻¹(p_A_lower)).

and their ratios. With ``--sampling sequential`` the engine certifies the same inputs a
second time under sequential sampling (n_max = ``--n``, the default radius grid,
:mod:`harness.mathematics.sequential`), back to back with the fixed-n certification, and
the table adds the estimation samples it drew per input, the share of the n it saved and
its wall time relative to the fixed one (random weights and inputs: how much is saved
depends on how confident the model is, so a benchmark's own ``run --timings`` is the
figure to quote). Models are built through the model registry: ``mlp`` and ``cnn`` on
1×28×28 inputs, ``resnet110`` the registered ``cifar-resnet`` with depth 110 on 3×32×32
(Cohen et al.'s CIFAR-10 ResNet-110); all with 10 classes.

Defaults: on CUDA n = 100,000 and 8 inputs; on CPU n = 2,000 and 2 inputs with
1 second per raw/ideal measurement (the whole default command then finishes in a few
minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from harness.foundation.errors import IdrsError

BENCH_MODELS = {
    # name: (registered architecture, params, input shape)
    "mlp": ("mlp", {}, (1, 28, 28)),
    "cnn": ("cnn", {}, (1, 28, 28)),
    "resnet110": ("cifar-resnet", {"depth": 110}, (3, 32, 32)),
}
NUM_CLASSES = 10
N0 = 100


@dataclass
class BenchResult:
    model: str
    device: str
    batch_size: int
    raw_per_s: float
    ideal_per_s: float
    engine_per_s: float
    reference_per_s: float
    engine_vs_ideal: float
    engine_vs_raw: float
    engine_vs_reference: float
    n: int
    inputs: int
    noise: str
    precision: str
    sampling: str = "fixed"
    sequential_samples: float | None = None  # mean estimation samples per input
    samples_saved: float | None = None  # 1 − sequential_samples / n
    sequential_vs_fixed_time: float | None = None  # wall time ratio, same inputs


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "bench",
        help="throughput of the sampling engine vs the raw forward pass and the reference loop",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "--models",
        default=None,
        metavar="NAME,...",
        help=f"comma-separated, from {', '.join(BENCH_MODELS)} (default: every one whose "
        "architecture is registered)",
    )
    parser.add_argument(
        "--device", default="auto", metavar="auto|cpu|cuda", help="cpu, cuda or auto (default)"
    )
    parser.add_argument(
        "--n",
        type=int,
        default=None,
        help="estimation samples per input (default 100000 on cuda, 50000 on cpu)",
    )
    parser.add_argument(
        "--inputs",
        type=int,
        default=None,
        help="inputs certified per model (default 8 on cuda, 4 on cpu)",
    )
    parser.add_argument(
        "--batch-size", default="auto", metavar="B|auto", help="samples per forward pass or auto"
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="seconds per raw / ideal measurement (default 2 on cuda, 5 on cpu: shorter windows measure noise)",
    )
    parser.add_argument("--sigma", type=float, default=0.25, metavar="S")
    parser.add_argument(
        "--precision", default="fp32", metavar="fp32|tf32|bf16|fp16", help="the arithmetic"
    )
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument(
        "--noise", default="auto", metavar="auto|philox-v1|block-v1", help="the noise scheme"
    )
    parser.add_argument(
        "--sampling", default="fixed", choices=("fixed", "sequential"), metavar="fixed|sequential",
        help="sequential: also certify sequentially (n_max = --n) and report the samples saved",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=bench_command)  # fmt: skip


def bench_command(args: argparse.Namespace) -> int:
    from harness.engine.sampling import resolve_device
    from harness.foundation.protocol import CertificationProtocol

    registry = _registry()
    if args.models is None:
        names = [m for m in BENCH_MODELS if BENCH_MODELS[m][0] in registry.names("models")]
        for m in BENCH_MODELS:
            if m not in names:
                print(f"{m}: skipped, architecture {BENCH_MODELS[m][0]!r} is not registered",
                      file=sys.stderr)  # fmt: skip
    else:
        names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in BENCH_MODELS]
    if unknown or not names:
        raise IdrsError(f"unknown bench model(s) {unknown}; choose from {', '.join(BENCH_MODELS)}")
    device = resolve_device(args.device)
    if device.type == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise IdrsError("--device cuda, but no CUDA device is available; use --device cpu")
    gpu = device.type == "cuda"
    n = args.n or (100_000 if gpu else 50_000)
    inputs = args.inputs or (8 if gpu else 4)
    seconds = args.seconds or (2.0 if gpu else 5.0)
    batch: int | str = args.batch_size if args.batch_size == "auto" else int(args.batch_size)
    protocol = CertificationProtocol(
        n0=N0, n=n, alpha=0.001, batch_size=batch, precision=args.precision,
        channels_last=args.channels_last, noise=args.noise,
    )  # fmt: skip
    models = {name: _build(registry, name) for name in names}  # unregistered: fail before work
    results = []
    for name, model in models.items():
        results.append(bench_model(name, model, protocol, device, inputs, args.sigma, seconds,
                                   args.sampling))  # fmt: skip
        if not args.json:
            print(f"{name}: done", file=sys.stderr)
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
    else:
        _print_table(results)
    return 0


def _registry():
    from harness.plugin.manager import PluginManager

    return PluginManager().registry


def _build(registry, name: str):
    import torch

    architecture, params, shape = BENCH_MODELS[name]
    try:
        spec = registry.get("models", architecture)
    except IdrsError:
        available = registry.names("models")
        raise IdrsError(
            f"bench model {name!r} needs the registered architecture {architecture!r} "
            f"(Cohen et al.'s CIFAR ResNet-110), which no loaded plugin provides; "
            f"registered architectures: {', '.join(available)}. Leave it out with "
            f"--models {','.join(m for m in BENCH_MODELS if m != name)}"
        ) from None
    torch.manual_seed(0)
    return spec.build(shape, NUM_CLASSES, {**spec.defaults, **params}).eval(), shape


def bench_model(
    name: str,
    built: tuple[Any, tuple[int, ...]],
    protocol: Any,
    device: Any,
    inputs: int,
    sigma: float,
    seconds: float,
    sampling: str = "fixed",
) -> BenchResult:
    """The four rates of one model (see the module docstring)."""
    import numpy as np
    import torch

    from harness.certification.certify import HardSmoothingCertifier, certify_drawn
    from harness.engine.batchsize import auto_batch_size
    from harness.engine.precision import prepare_model
    from harness.engine.sampling import SamplingEngine, default_noise
    from harness.mathematics.radius import COHEN
    from harness.mathematics.worstcase import cohen_radius

    model, shape = built
    model = prepare_model(model.to(device), protocol)
    batch = protocol.batch_size
    if batch == "auto":
        batch = auto_batch_size(model, shape, device)
    noise = default_noise(device) if protocol.noise == "auto" else protocol.noise
    generator = torch.Generator().manual_seed(1)
    x = torch.rand((inputs, *shape), generator=generator).to(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    with torch.no_grad():
        fixed = torch.rand((batch, *shape), device=device)
        raw = _rate(lambda: model(fixed).argmax(1), batch, seconds, sync)
        one = x[:1]

        def ideal_step():
            noisy = one + sigma * torch.randn((batch, *shape), device=device)
            return model(noisy).argmax(1)

        ideal = _rate(ideal_step, batch, seconds, sync)
    engine = SamplingEngine(model, NUM_CLASSES, device, batch, seed=0, noise=noise)
    sigmas = np.full(inputs, sigma)

    class Cohen(HardSmoothingCertifier):  # Cohen et al. (2019), Thm 1, as the built-in plugin
        radius_formula = COHEN

        def radius(self, p_lower: np.ndarray, sigma: np.ndarray) -> np.ndarray:
            return np.asarray(cohen_radius(p_lower, sigma))

    def certify(count: int, how=protocol) -> list:  # the harness's draws and Cohen's claims
        ids = list(range(count))
        return list(certify_drawn(engine, how, Cohen(), x[:count], ids, sigmas[:count]))

    certify(1)  # warm-up (buffers, kernels)
    sync()
    start = time.perf_counter()
    certify(inputs)
    sync()
    fixed_seconds = time.perf_counter() - start
    total = inputs * (protocol.n0 + protocol.n)
    engine_rate = total / fixed_seconds
    extra: dict[str, Any] = {}
    if sampling == "sequential":
        from dataclasses import replace

        from harness.mathematics.accuracy import RADII

        rounds = replace(protocol, sampling="sequential", n_max=protocol.n, grid=RADII)
        start = time.perf_counter()
        drawn = [c.draws["base"]["n"] for c in certify(inputs, rounds)]
        sync()
        mean = sum(drawn) / len(drawn)
        extra = {"sampling": "sequential", "sequential_samples": mean,
                 "samples_saved": 1 - mean / protocol.n,
                 "sequential_vs_fixed_time": (time.perf_counter() - start) / fixed_seconds}  # fmt: skip
    reference_certify(model, x[:1], sigma, protocol.n0, protocol.n, protocol.alpha, batch)
    sync()
    start = time.perf_counter()
    reference_certify(model, x, sigma, protocol.n0, protocol.n, protocol.alpha, batch)
    sync()
    reference = total / (time.perf_counter() - start)
    return BenchResult(
        model=name, device=str(device), batch_size=int(batch), raw_per_s=raw,
        ideal_per_s=ideal, engine_per_s=engine_rate, reference_per_s=reference,
        engine_vs_ideal=engine_rate / ideal, engine_vs_raw=engine_rate / raw,
        engine_vs_reference=engine_rate / reference, n=protocol.n, inputs=inputs,
        noise=noise, precision=protocol.precision, **extra,
    )  # fmt: skip


def _rate(step, batch: int, seconds: float, sync) -> float:
    """Samples per second of ``step`` (one batch), after one warm-up step."""
    step()
    sync()
    done, start = 0, time.perf_counter()
    while True:
        step()
        done += batch
        if done >= 3 * batch:
            sync()
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return done / elapsed


def reference_certify(
    model, x, sigma: float, n0: int, n: int, alpha: float, batch: int
) -> list[tuple[int, float]]:
    """(prediction, radius) per input, one input at a time, as Cohen et al.'s
    ``Smooth.certify`` (github.com/locuslab/smoothing, ``code/core.py``) computes them.

    For each input: n0 samples choose ĉ_A (argmax of the counts), n samples count n_A,
    p_A_lower = the one-sided Clopper–Pearson bound at level α; abstain (-1, 0) if
    p_A_lower < 1/2, else (ĉ_A, σ·Φ⁻¹(p_A_lower)).
    """
    import numpy as np
    import torch
    from scipy.stats import beta, norm

    def sample_noise(xi, num):
        counts = np.zeros(NUM_CLASSES, dtype=int)
        remaining = num
        while remaining > 0:
            this_batch = min(batch, remaining)
            remaining -= this_batch
            repeated = xi.repeat((this_batch, *([1] * xi.dim())))
            noise = torch.randn_like(repeated) * sigma
            predictions = model(repeated + noise).argmax(1)
            counts += np.bincount(predictions.cpu().numpy(), minlength=NUM_CLASSES)
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


def _print_table(results: list[BenchResult]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="noisy samples per second (higher is better)")
    for column in ("model", "device", "batch", "raw", "ideal", "engine", "reference",
                   "engine/ideal", "engine/raw", "engine/reference"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("model", "device") else "right")
    for r in results:
        table.add_row(
            r.model, r.device, f"{r.batch_size:,}", _si(r.raw_per_s), _si(r.ideal_per_s),
            _si(r.engine_per_s), _si(r.reference_per_s), f"{r.engine_vs_ideal:.2f}",
            f"{r.engine_vs_raw:.2f}", f"{r.engine_vs_reference:.2f}",
        )  # fmt: skip
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    if results:
        r = results[0]
        print(
            f"n0 = {N0}, n = {r.n}, {r.inputs} inputs per model, noise {r.noise}, "
            f"precision {r.precision}"
        )
    for r in results:
        if r.sampling == "sequential":
            print(f"{r.model}: sequential sampling drew {r.sequential_samples:,.0f} estimation "
                  f"samples per input of n = {r.n:,} ({r.samples_saved:.1%} saved), in "
                  f"{r.sequential_vs_fixed_time:.2f}x the fixed-n wall time")  # fmt: skip


def _si(rate: float) -> str:
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if rate >= scale:
            return f"{rate / scale:.3g} {unit}/s"
    return f"{rate:.3g} /s"
