"""``idrs-bench bench``: how close certification runs to the hardware's limit.

For each model (random weights, random inputs: no dataset needed), in one process, on one
device, in one backend setting (``--precision``, ``--channels-last``, ``--cudnn``, and the
forward options ``--fold-batchnorm``, ``--compile``, ``--cuda-graphs``:
:mod:`harness.engine.forward`) and at the engine's batch size B (``auto`` by default,
:mod:`harness.engine.batchsize`), rates in noisy samples per second:

- **raw**: forward pass + argmax of a batch of B inputs already in memory;
- **limit**: the best raw rate over batch sizes (:func:`~harness.cli.throughput.batch_sweep`)
  and over the backend settings of ``--limit``: ``setting`` (the engine's own), ``precision``
  (also channels-last and the cuDNN mode at its precision; the CUDA default) or ``all``
  (also fp32, tf32 and bf16): the hardware's limit, which the engine cannot beat (the
  sweep's forward passes run eagerly: with ``--compile`` or ``--cuda-graphs`` the raw rate
  at B and the engine may exceed it, by what the option gains);
- **ideal**: per batch one ``randn`` call, x + σ·ε, forward, argmax;
- **engine**: Cohen et al.'s CERTIFY through :class:`~harness.engine.sampling.SamplingEngine`
  as a run makes it (padded batches, deterministic kernels on CUDA; n0 = 100 selection and
  ``--n`` estimation samples per input, counted as n0 + n);
- **reference**: the same CERTIFY one input at a time, as in Cohen et al.'s reference
  code (:func:`~harness.cli.throughput.reference_certify`), in the same backend setting, at
  ``--reference-batch`` (their default, 1,000);
- **reference, PyTorch's default**: the reference loop as their code runs it, on the plain
  model in PyTorch's default arithmetic (:func:`~harness.engine.precision.default_precision`:
  tf32-conv on CUDA, fp32 on a CPU, where it is the reference itself), with the engine's
  cuDNN mode;

and their ratios. ``--api`` adds, per model, ``harness.api.certify`` (method ``cohen``)
against the reference loop (in the engine's arithmetic and in PyTorch's default) on the
same weights and inputs, in seconds per input, and in a precision other than fp32 how
many argmax decisions on noisy inputs differ from fp32 (on up to 10,000 samples per
input). With ``--sampling sequential`` and ``--diagonal`` the engine certifies the same
inputs again, under sequential sampling and at a diagonal scale
(:mod:`harness.cli.bench_variants`), and the table adds each one's wall time against the
fixed-n, scalar-σ certification (random weights and inputs: how much sequential sampling
saves depends on how confident the model is, so a benchmark's own ``run --timings`` is
the figure to quote for it). Models are built through the model registry:
``mlp`` and ``cnn`` on 1×28×28 inputs, ``resnet110`` the registered ``cifar-resnet`` with
depth 110 on 3×32×32 (Cohen et al.'s CIFAR-10 ResNet-110); all with 10 classes.

Defaults: on CUDA n = 100,000 and 8 inputs, precision ``auto`` (tf32-conv, PyTorch's
default arithmetic, as in a run); on CPU n = 50,000 and 4 inputs, fp32, the limit over
the engine's own setting.
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
LIMIT_SCOPES = ("setting", "precision", "all")
"""Over which settings the limit is taken (:func:`harness.cli.throughput.limit_settings`):
the engine's own; also channels-last and the cuDNN mode at its precision; also the
precisions fp32, tf32 and bf16."""


@dataclass
class BenchResult:
    model: str
    device: str
    setting: str
    batch_size: int
    raw_per_s: float
    best_raw_per_s: float
    best_raw_batch: int
    limit_per_s: float
    limit_setting: str
    limit_batch: int
    ideal_per_s: float
    engine_per_s: float
    reference_per_s: float
    reference_default_per_s: float  # the reference loop in PyTorch's default arithmetic
    reference_default_setting: str
    reference_batch: int
    engine_vs_ideal: float
    engine_vs_raw: float
    engine_vs_best_raw: float
    engine_vs_limit: float
    engine_vs_reference: float
    engine_vs_reference_default: float
    n: int
    inputs: int
    noise: str
    noise_kernel: str | None
    precision: str
    limit_scope: str
    sampling: str = "fixed"
    sequential_samples: float | None = None  # mean estimation samples per input
    samples_saved: float | None = None  # 1 − sequential_samples / n
    sequential_vs_fixed_time: float | None = None  # wall time ratio, same inputs
    diagonal_vs_scalar_time: float | None = None  # wall time ratio, same inputs


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "bench",
        help="throughput of the sampling engine vs the hardware's limit and the reference loop",
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
        help="seconds per raw / ideal measurement, a quarter of it per batch size of the "
        "limit's sweep (default 2 on cuda, 5 on cpu: shorter windows measure noise)",
    )
    parser.add_argument("--sigma", type=float, default=0.25, metavar="S")
    parser.add_argument(
        "--precision", default="auto", metavar="auto|fp32|tf32|tf32-conv|bf16|fp16",
        help="the arithmetic (auto: PyTorch's default, tf32-conv, on cuda; fp32 on cpu)",
    )  # fmt: skip
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument(
        "--cudnn", default="heuristic", metavar="heuristic|benchmark",
        help="how cuDNN picks convolution algorithms (CUDA)",
    )  # fmt: skip
    parser.add_argument(
        "--noise", default="auto", metavar="auto|philox-v1|block-v1", help="the noise scheme"
    )
    for flag, what in (("--fold-batchnorm", "fold eval-mode BatchNorm into the convolution "
                        "before it (another arithmetic)"),
                       ("--compile", "torch.compile the model at the engine's batch shape "
                        "(another arithmetic)"),
                       ("--cuda-graphs", "replay the forward pass at the engine's batch shape "
                        "from CUDA graphs (CUDA only)")):  # fmt: skip
        parser.add_argument(flag, action="store_true", help=what)
    parser.add_argument(
        "--limit", default=None, choices=LIMIT_SCOPES, metavar="setting|precision|all",
        help="settings the raw limit is taken over (default: precision on cuda, setting on cpu)",
    )  # fmt: skip
    parser.add_argument(
        "--reference-batch", type=int, default=1000, metavar="B",
        help="batch of the reference loop (default 1000, Cohen et al.'s)",
    )  # fmt: skip
    parser.add_argument(
        "--api", action="store_true",
        help="also time harness.api.certify against the reference loop, per input",
    )  # fmt: skip
    parser.add_argument(
        "--sampling", default="fixed", choices=("fixed", "sequential"), metavar="fixed|sequential",
        help="sequential: also certify sequentially (n_max = --n) and report the samples saved "
        "(with --api: api.certify sequentially too, against the reference)",
    )  # fmt: skip
    parser.add_argument(
        "--diagonal", action="store_true",
        help="also certify at a diagonal scale (σ … 2σ over the input's dimensions) and "
        "report its wall time against one σ per input",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=bench_command)


def bench_command(args: argparse.Namespace) -> int:
    from harness.plugin.manager import PluginManager

    with PluginManager() as manager:  # (a hosted model's host ends with the bench)
        return _bench(args, manager.registry)


def _bench(args: argparse.Namespace, registry) -> int:
    from harness.engine.precision import resolve_precision
    from harness.engine.sampling import resolve_device
    from harness.foundation.protocol import CertificationProtocol

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
    if args.cuda_graphs and not gpu:
        raise IdrsError("--cuda-graphs needs --device cuda: CUDA graphs exist only on CUDA")
    n = args.n or (100_000 if gpu else 50_000)
    inputs = args.inputs or (8 if gpu else 4)
    seconds = args.seconds or (2.0 if gpu else 5.0)
    batch: int | str = args.batch_size if args.batch_size == "auto" else int(args.batch_size)
    protocol = CertificationProtocol(
        n0=N0, n=n, alpha=0.001, batch_size=batch,
        precision=resolve_precision(args.precision, device),
        channels_last=args.channels_last, noise=args.noise, cudnn=args.cudnn,
        fold_batchnorm=args.fold_batchnorm, compile=args.compile, cuda_graphs=args.cuda_graphs,
    )  # fmt: skip
    scope = args.limit or ("precision" if gpu else "setting")
    models = {name: _build(registry, name) for name in names}  # unregistered: fail before work
    results, api = [], []
    for name, model in models.items():
        results.append(bench_model(name, model, protocol, device, inputs, args.sigma, seconds,
                                   scope, args.reference_batch, args.sampling,
                                   args.diagonal))  # fmt: skip
        if args.api:
            from harness.cli.api_vs_reference import bench_api

            api.append(bench_api(name, model, NUM_CLASSES, protocol, device, inputs, args.sigma,
                                 args.reference_batch, args.sampling))  # fmt: skip
        if not args.json:
            print(f"{name}: done", file=sys.stderr)
    if args.json:
        print(json.dumps({"engine": [asdict(r) for r in results],
                          "api": [asdict(r) for r in api]}, indent=2))  # fmt: skip
    else:
        _print_table(results)
        if api:
            from harness.cli.api_vs_reference import print_api

            print_api(api)
    return 0


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
    name: str, built: tuple[Any, tuple[int, ...]], protocol: Any, device: Any, inputs: int,
    sigma: float, seconds: float, scope: str = "setting", reference_batch: int = 1000,
    sampling: str = "fixed", diagonal: bool = False,
) -> BenchResult:  # fmt: skip
    """The rates of one model (see the module docstring)."""
    import numpy as np
    import torch

    from harness.certification.certify import certify_drawn
    from harness.cli.bench_variants import cohen_certifier, diagonal_variant, sequential_variant
    from harness.cli.throughput import (
        batch_sweep,
        limit_settings,
        model_in_setting,
        setting_of,
        synchronizer,
        timed_rate,
        timed_reference,
        torch_default_setting,
    )
    from harness.engine.batchsize import MAX_BATCH, MAX_CPU_BATCH, auto_batch_size
    from harness.engine.determinism import deterministic_kernels
    from harness.engine.noise import noise_kernel
    from harness.engine.precision import PrecisionModel
    from harness.engine.sampling import SamplingEngine, default_noise

    model, shape = built
    model = model.to(device)
    own = setting_of(protocol)
    certified = model_in_setting(model, protocol, own)
    batch = protocol.batch_size
    if batch == "auto":
        batch = auto_batch_size(certified, shape, device)
    if isinstance(certified, PrecisionModel):  # compiled / captured at the engine's batch
        certified.serve(batch)
    noise = default_noise(device) if protocol.noise == "auto" else protocol.noise
    x = torch.rand((inputs, *shape), generator=torch.Generator().manual_seed(1)).to(device)
    sync = synchronizer(device)
    with torch.no_grad():
        fixed = torch.rand((batch, *shape), device=device)
        raw = timed_rate(lambda: certified(fixed).argmax(1), batch, seconds, sync)
        one = x[:1]

        def ideal_step():
            noisy = one + sigma * torch.randn((batch, *shape), device=device)
            return certified(noisy).argmax(1)

        ideal = timed_rate(ideal_step, batch, seconds, sync)
    first, last = (256, MAX_BATCH) if device.type == "cuda" else (64, MAX_CPU_BATCH)
    convolutional = any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())
    sweeps = {
        s: batch_sweep(
            model_in_setting(model, protocol, s), shape, device, first, last, seconds / 4
        )
        for s in limit_settings(own, scope, device, convolutional)
    }
    own_batch, own_best = max(sweeps[own].items(), key=lambda kv: kv[1])
    if raw > own_best:  # the engine's batch measured longer: the better estimate
        own_batch, own_best = batch, raw
    limit_setting, (limit_batch, limit) = max(
        ((s, max(r.items(), key=lambda kv: kv[1])) for s, r in sweeps.items()),
        key=lambda item: item[1][1],
    )
    if own_best >= limit:
        limit_setting, limit_batch, limit = own, own_batch, own_best
    engine = SamplingEngine(certified, NUM_CLASSES, device, batch, seed=0, noise=noise,
                            pad_batches=True)  # as a run makes it  # fmt: skip
    sigmas = np.full(inputs, sigma)
    cohen = cohen_certifier()

    def certify(count: int, how=protocol, scale=sigmas) -> list:  # the harness's draws, claims
        ids = list(range(count))
        with deterministic_kernels(device):  # as a run computes (harness.engine.determinism)
            return list(certify_drawn(engine, how, cohen, x[:count], ids, scale[:count]))

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
        extra |= sequential_variant(certify, protocol, sigmas, inputs, fixed_seconds, sync)
    if diagonal:
        extra |= diagonal_variant(certify, protocol, sigma, inputs, math.prod(shape),
                                  fixed_seconds, sync)  # fmt: skip

    def reference_rate(loop) -> float:  # the loop on every input, after one warm-up
        seconds, _ = timed_reference(loop, x, sigma, protocol, reference_batch, NUM_CLASSES, sync)
        return total / seconds

    reference = reference_rate(certified)
    default = torch_default_setting(device, own.cudnn)
    reference_default = (
        reference if default == own else reference_rate(model_in_setting(model, protocol, default))
    )
    return BenchResult(
        model=name, device=str(device), setting=str(own), batch_size=int(batch),
        raw_per_s=raw, best_raw_per_s=own_best, best_raw_batch=int(own_batch),
        limit_per_s=limit, limit_setting=str(limit_setting), limit_batch=int(limit_batch),
        ideal_per_s=ideal, engine_per_s=engine_rate, reference_per_s=reference,
        reference_default_per_s=reference_default, reference_default_setting=str(default),
        reference_batch=reference_batch, engine_vs_ideal=engine_rate / ideal,
        engine_vs_raw=engine_rate / raw, engine_vs_best_raw=engine_rate / own_best,
        engine_vs_limit=engine_rate / limit, engine_vs_reference=engine_rate / reference,
        engine_vs_reference_default=engine_rate / reference_default,
        n=protocol.n, inputs=inputs, noise=noise,
        noise_kernel=noise_kernel(device) if noise == "philox-v1" else None,
        precision=protocol.precision, limit_scope=scope, **extra,
    )  # fmt: skip


def _print_table(results: list[BenchResult]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="noisy samples per second (higher is better)")
    for column in ("model", "batch", "raw", "limit (batch, setting)", "ideal", "engine",
                   "reference", "engine/limit", "engine/best raw", "engine/raw",
                   "engine/reference", "engine/reference (PyTorch default)"):  # fmt: skip
        table.add_column(column, justify="left" if column == "model" else "right")
    for r in results:
        table.add_row(
            r.model, f"{r.batch_size:,}", _si(r.raw_per_s),
            f"{_si(r.limit_per_s)} ({r.limit_batch:,}, {r.limit_setting})", _si(r.ideal_per_s),
            _si(r.engine_per_s), _si(r.reference_per_s), f"{r.engine_vs_limit:.2f}",
            f"{r.engine_vs_best_raw:.2f}", f"{r.engine_vs_raw:.2f}",
            f"{r.engine_vs_reference:.2f}", f"{r.engine_vs_reference_default:.2f}",
        )  # fmt: skip
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    if results:
        r = results[0]
        print(
            f"{r.device}, {r.setting}, n0 = {N0}, n = {r.n}, {r.inputs} inputs per model, noise "
            f"{r.noise}{f' ({r.noise_kernel})' if r.noise_kernel else ''}; limit over "
            f"{r.limit_scope}; best raw: over batch sizes in the engine's setting; reference "
            f"at batch {r.reference_batch:,}, in the engine's setting and in PyTorch's default "
            f"arithmetic ({r.reference_default_setting})"
        )
    for r in results:
        if r.sampling == "sequential":
            print(f"{r.model}: sequential sampling drew {r.sequential_samples:,.0f} estimation "
                  f"samples per input of n = {r.n:,} ({r.samples_saved:.1%} saved), in "
                  f"{r.sequential_vs_fixed_time:.2f}x the fixed-n wall time")  # fmt: skip
        if r.diagonal_vs_scalar_time is not None:
            print(
                f"{r.model}: at a diagonal scale (σ … 2σ) in "
                f"{r.diagonal_vs_scalar_time:.2f}x the wall time at one σ per input"
            )


def _si(rate: float) -> str:
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if rate >= scale:
            return f"{rate / scale:.3g} {unit}/s"
    return f"{rate:.3g} /s"
