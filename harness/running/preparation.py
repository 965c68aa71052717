"""What a benchmark's workers share: its dataset, base model, engine and build context.

:func:`prepare` turns a validated benchmark into a :class:`Prepared`: the dataset loaded,
the base model trained or read and put in the protocol's precision, the batch size
resolved, the engine and the :class:`~harness.plugin.components.BuildContext` built.
The runner, every executor and the replay process prepare through it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from harness.engine.precision import prepare_model, resolve_precision
from harness.engine.sampling import SamplingEngine, default_noise, resolve_device
from harness.foundation.data import Dataset
from harness.foundation.errors import DatasetMissingError
from harness.foundation.identity import content_hash
from harness.foundation.progress import Progress
from harness.plugin.components import BuildContext
from harness.plugin.manager import PluginManager
from harness.plugin.registry import Registry
from harness.running.benchmark import Benchmark, CheckedBenchmark, check_data_root, validate
from harness.running.modelcache import obtain_model


@dataclass
class RunOptions:
    db: Path
    device: str | None = None
    data_root: str | None = None
    download: bool = False
    cache_dir: Path | None = None
    threads: int | None = None  # asked for by the user; None: the run's (foundation/threads.py)


def load_dataset(benchmark: Benchmark, registry: Registry, options: RunOptions) -> Dataset:
    """The benchmark's dataset; an explicit ``--data-root`` is used or refused, never ignored."""
    check_data_root(options.data_root, benchmark.dataset.name)
    dataset_spec = registry.get("datasets", benchmark.dataset.name)
    family = registry.family_args("datasets", benchmark.dataset.name)
    dataset = dataset_spec.load(
        data_root=options.data_root, download=options.download, seed=benchmark.seed, **family
    )
    if options.data_root is not None and not dataset.files:
        raise DatasetMissingError(
            f"dataset {benchmark.dataset.name!r} reads no files (it is generated), so --data-root "
            f"{options.data_root!r} would be ignored; leave it out"
        )
    return dataset


@dataclass
class Prepared:
    """A benchmark ready to certify: its dataset, shared base model and build context."""

    benchmark: Benchmark
    dataset: Dataset
    recipe_hash: str
    context: BuildContext
    registry: Registry
    run_id: str
    weights_digest: str | None = None  # SHA-256 of the base model's weights
    batch_size: int | None = None  # the protocol's batch size, resolved
    plugin_hosts: dict | None = None  # how third-party plugins run (PluginManager.hosting)


def prepare(
    benchmark: Benchmark,
    options: RunOptions,
    progress: Progress,
    manager: PluginManager | None = None,
) -> Prepared:
    """Check the benchmark (unless :func:`~harness.running.benchmark.validate` did), load the
    dataset, train or load the base model, build the engine."""
    manager = manager or PluginManager()
    registry = manager.registry
    if not isinstance(benchmark, CheckedBenchmark):
        benchmark = validate(benchmark, registry)
    device = resolve_device(options.device or benchmark.device)
    dataset = load_dataset(benchmark, registry, options)
    if benchmark.model.checkpoint is not None:  # a published file names its architecture
        from harness.running.checkpoint import resolve_architecture

        benchmark = replace(
            benchmark, model=resolve_architecture(benchmark.model, dataset.name, registry)
        )
    model, recipe_hash = obtain_model(
        benchmark.model, dataset, registry, device, progress, options.cache_dir
    )
    benchmark = resolved(benchmark, device)
    model_in_precision = prepare_model(model, benchmark.protocol)
    batch_size = benchmark.protocol.batch_size
    if batch_size == "auto":
        from harness.engine.batchsize import auto_batch_size

        batch_size = auto_batch_size(
            model_in_precision, tuple(dataset.test_x.shape[1:]), device, options.cache_dir
        )
    run_id = run_identity(benchmark, device, recipe_hash)
    context = build_context(
        benchmark,
        dataset,
        model,
        recipe_hash,
        device,
        batch_size,
        progress,
        registry,
        run_id,
        model_in_precision,
    )
    from harness.running.weights import weights_digest

    return Prepared(
        benchmark, dataset, recipe_hash, context, registry, run_id, weights_digest(model),
        batch_size, manager.hosting(),
    )  # fmt: skip


def resolved(benchmark: Benchmark, device: torch.device) -> Benchmark:
    """``benchmark`` with its ``auto`` noise scheme and precision resolved for ``device``,
    as the run records them (its spec states its noise and its arithmetic). On a CPU
    ``auto`` is block-v1 and fp32, so a CPU run's spec, and its id, are what they were
    before the precision was ``auto``."""
    protocol = benchmark.protocol
    noise = default_noise(device) if protocol.noise == "auto" else protocol.noise
    precision = resolve_precision(protocol.precision, device)
    return replace(benchmark, protocol=replace(protocol, precision=precision, noise=noise))


def run_identity(benchmark: Benchmark, device: torch.device, recipe_hash: str) -> str:
    """A run's id: the content hash of the resolved benchmark, the device type (not its
    index: processes on cuda:0 and cuda:1 certify the same run) and the model's recipe hash."""
    return content_hash({"spec": benchmark.to_dict(), "device": device.type, "model": recipe_hash})


def build_context(
    benchmark: Benchmark,
    dataset: Dataset,
    model: torch.nn.Module,
    recipe_hash: str,
    device: torch.device,
    batch_size: int,
    progress: Progress,
    registry: Registry,
    run_id: str | None,
    model_in_precision: torch.nn.Module | None = None,
) -> BuildContext:
    """The build context of run ``run_id``, whose noise and batch size are resolved: the
    base model behind the protocol's precision switch (``model_in_precision``, made here when
    None), in a sampling engine whose forward passes all have ``batch_size`` rows. The
    driver, every Ray worker and a board's re-check build it the same way."""
    if model_in_precision is None:
        model_in_precision = prepare_model(model, benchmark.protocol)
    # every forward pass has batch_size rows, so each sample's logits are those of any
    # other batch it could share (the replay check re-draws a few inputs alone)
    engine = SamplingEngine(
        model_in_precision, dataset.num_classes, device, batch_size, benchmark.seed, noise=benchmark.protocol.noise,
        pad_batches=True,
    )  # fmt: skip
    return BuildContext(
        dataset=dataset,
        model=model,
        device=device,
        seed=benchmark.seed,
        protocol=benchmark.protocol,
        engine=engine,
        progress=progress,
        registry=registry,
        recipe_hash=recipe_hash,
        run_id=run_id,
    )
