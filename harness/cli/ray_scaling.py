"""How the Ray executor scales: 1 vs 2 (or more) workers on a small CNN benchmark.

``python3 -m harness.cli.ray_scaling [--workers 1 2] [--set KEY=VALUE ...]`` trains (or
loads) the benchmark's base model once, starts a local Ray cluster with as many CPUs
(or GPUs, on CUDA) as the most workers asked for, then certifies the same benchmark
into a fresh database with the local executor and with each number of Ray workers,
all in one run so that the ratios share the machine's load. It prints, per executor,
the certification wall time (worker start included, and without it), inputs per
second and the speed-up over one worker, and what limits scaling: the driver's
SQLite inserts per second and the object-store bytes per shard and per certificate.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import tomllib
from pathlib import Path

CNN_BENCHMARK = """
name = "ray-scaling-cnn"
seed = 0
shard_size = 4

[dataset]
name = "fashion-mnist"
test_every = 100
test_count = 16

[model]
architecture = "cnn"
trainer = "gaussian-augmentation"
seed = 0
trainer_params = { sigma = 0.25, epochs = 1 }

[certification]
n0 = 100
n = 1000
alpha = 0.001
batch_size = 1000

[[methods]]
name = "cohen"
settings = [{ sigma = 0.25 }, { sigma = 0.5 }]
"""
"""Fashion-MNIST with the two-layer CNN (``cnn``), 16 inputs × 2 settings, n = 1,000."""


class _Timed:
    """An executor whose ``certify`` is timed."""

    def __init__(self, executor) -> None:
        self.executor, self.seconds = executor, 0.0

    def certify(self, prepared, store, work, options) -> None:
        start = time.perf_counter()
        self.executor.certify(prepared, store, work, options)
        self.seconds = time.perf_counter() - start


def measure(workers: list[int], overrides: list[str], device: str | None) -> dict:
    """Certify the CNN benchmark locally and with each worker count; the figures."""
    import ray

    from harness.foundation.progress import Progress
    from harness.running.benchmark import apply_overrides, parse_benchmark
    from harness.running.local_executor import LocalExecutor
    from harness.running.preparation import RunOptions, prepare
    from harness.running.ray_executor import RayExecutor
    from harness.running.runner import run_benchmark

    spec = parse_benchmark(apply_overrides(tomllib.loads(CNN_BENCHMARK), overrides))
    scratch = Path(tempfile.mkdtemp(prefix="idrs-scaling-"))
    quiet = Progress(enabled=False)
    options = RunOptions(db=scratch / "model.sqlite", device=device)
    prepared = prepare(spec, options, Progress())  # the base model, trained once
    cuda = prepared.context.device.type == "cuda"
    inputs = spec.dataset.test_count * sum(len(m.settings) for m in spec.methods)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", include_dashboard=False, _temp_dir=str(scratch / "ray"),
             num_cpus=0 if cuda else max(workers), num_gpus=max(workers) if cuda else 0,
             log_to_driver=False)  # fmt: skip
    rows = []
    try:
        timed = _Timed(LocalExecutor())
        run_benchmark(spec, RunOptions(db=scratch / "local.sqlite", device=device), quiet,
                      executor=timed)  # fmt: skip
        rows.append({"executor": "local", "workers": 1, "seconds": timed.seconds,
                     "certify_seconds": timed.seconds})  # fmt: skip
        for k in workers:
            executor = RayExecutor(workers=k)
            timed = _Timed(executor)
            run_benchmark(spec, RunOptions(db=scratch / f"ray{k}.sqlite", device=device), quiet,
                          executor=timed)  # fmt: skip
            s = executor.stats
            rows.append({
                "executor": "ray", "workers": k, "seconds": timed.seconds,
                "certify_seconds": s.wall_seconds - s.startup_seconds,
                "startup_seconds": s.startup_seconds,
                "inserts_per_second": s.inserts_per_second,
                "bytes_per_shard": (s.bytes_received + s.bytes_sent) / max(s.shards, 1),
                "bytes_per_certificate": s.bytes_received / max(s.certificates, 1),
                "shards": s.shards,
            })  # fmt: skip
    finally:
        ray.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)
    model_bytes = sum(
        v.numel() * v.element_size() for v in prepared.context.model.state_dict().values()
    )
    for row in rows:
        row["inputs_per_second"] = inputs / row["certify_seconds"]
    return {"inputs": inputs, "device": str(prepared.context.device),
            "model_bytes": model_bytes, "cpus": os.cpu_count(), "rows": rows}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m harness.cli.ray_scaling", description=__doc__)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    result = measure(sorted(set(args.workers)), args.set, args.device)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{result['inputs']} certificates on {result['device']}, {result['cpus']} CPUs; "
          f"model state dict {result['model_bytes'] / 1e6:.2f} MB (shipped once per worker)")  # fmt: skip
    base = next(r for r in result["rows"] if r["executor"] == "ray")
    for r in result["rows"]:
        line = (f"{r['executor']:>5} × {r['workers']}: {r['seconds']:7.1f} s "
                f"({r['certify_seconds']:6.1f} s certifying, {r['inputs_per_second']:6.2f} inputs/s)")  # fmt: skip
        if r["executor"] == "ray":
            line += (f"; speed-up over 1 worker {base['certify_seconds'] / r['certify_seconds']:.2f}"
                     f" (with startup {base['seconds'] / r['seconds']:.2f}); driver "
                     f"{r['inserts_per_second']:,.0f} inserts/s; {r['bytes_per_shard']:,.0f} "
                     f"object-store bytes per shard, {r['bytes_per_certificate']:,.0f} per "
                     "certificate")  # fmt: skip
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
