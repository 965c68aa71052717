"""Runs a benchmark: one shared base model, every method and setting, resumably.

The unit of work is (run, method, setting, shard of test inputs): a finished shard is
never redone, and inside an unfinished one only the inputs without a stored
certificate are certified. A method that fails is recorded and reported; the other
methods go on.
"""

from __future__ import annotations

import platform
import subprocess
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from harness import __version__
from harness.certificate import Certificate
from harness.certify import certifier_label, certify_drawn, sigma_of
from harness.components import BuildContext, Certifier, MethodSpec, Registry, SigmaProvider
from harness.data import Dataset
from harness.errors import DatasetMissingError, IdrsError
from harness.method import build_method
from harness.modelcache import obtain_model
from harness.plugins import PluginManager, get_plugin_manager
from harness.precision import prepare_model
from harness.progress import Progress
from harness.runstate import RunState
from harness.sampling import SamplingEngine, default_noise, resolve_device
from harness.spec import BenchmarkSpec, check_data_root, content_hash, setting_key, validate
from harness.store import ResultStore


@dataclass
class RunOptions:
    db: Path
    device: str | None = None
    data_root: str | None = None
    download: bool = False
    cache_dir: Path | None = None


def library_versions() -> dict[str, str]:
    import numpy
    import scipy

    return {
        "idrs-bench": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
    }


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def load_dataset(spec: BenchmarkSpec, registry: Registry, options: RunOptions) -> Dataset:
    """The spec's dataset; an explicit ``--data-root`` is used or refused, never ignored."""
    check_data_root(options.data_root, spec.dataset.name)
    dataset_spec = registry.get("datasets", spec.dataset.name)
    family = registry.family_args("datasets", spec.dataset.name)
    dataset = dataset_spec.load(
        data_root=options.data_root, download=options.download, seed=spec.seed, **family
    )
    if options.data_root is not None and not dataset.files:
        raise DatasetMissingError(
            f"dataset {spec.dataset.name!r} reads no files (it is generated), so --data-root "
            f"{options.data_root!r} would be ignored; leave it out"
        )
    return dataset


@dataclass
class Prepared:
    """A benchmark ready to certify: its dataset, shared base model and build context."""

    spec: BenchmarkSpec
    dataset: Dataset
    model_hash: str
    context: BuildContext
    registry: Registry
    run_id: str
    weights_digest: str | None = None  # SHA-256 of the base model's weights
    batch_size: int | None = None  # the protocol's batch size, resolved


def prepare(
    spec: BenchmarkSpec,
    options: RunOptions,
    progress: Progress,
    manager: PluginManager | None = None,
) -> Prepared:
    """Check the spec, load the dataset, train or load the base model, build the engine."""
    registry = (manager or get_plugin_manager()).registry
    validate(spec, registry)
    device = resolve_device(options.device or spec.device)
    dataset = load_dataset(spec, registry, options)
    if spec.model.checkpoint is not None:  # a published file names its architecture
        from harness.checkpoint import resolve_architecture

        spec = replace(spec, model=resolve_architecture(spec.model, dataset.name, registry))
    model, model_hash = obtain_model(
        spec.model, dataset, registry, device, progress, options.cache_dir
    )
    if spec.protocol.noise == "auto":  # recorded resolved: the run states its noise
        spec = replace(spec, protocol=replace(spec.protocol, noise=default_noise(device)))
    certified = prepare_model(model, spec.protocol)
    batch_size = spec.protocol.batch_size
    if batch_size == "auto":
        from harness.batchsize import auto_batch_size

        batch_size = auto_batch_size(
            certified, tuple(dataset.test_x.shape[1:]), device, options.cache_dir
        )
    context = build_context(
        spec, dataset, model, model_hash, device, batch_size, progress, registry, certified
    )
    run_id = content_hash({"spec": spec.to_dict(), "device": str(device), "model": model_hash})
    context.run_id = run_id
    from harness.weights import weights_digest

    return Prepared(
        spec, dataset, model_hash, context, registry, run_id, weights_digest(model), batch_size
    )


def build_context(
    spec: BenchmarkSpec,
    dataset: Dataset,
    model: torch.nn.Module,
    model_hash: str,
    device: torch.device,
    batch_size: int,
    progress: Progress,
    registry: Registry,
    certified: torch.nn.Module | None = None,
) -> BuildContext:
    """The build context of a benchmark whose noise and batch size are resolved: the base
    model behind the protocol's precision switch (``certified``, made here when None),
    in a sampling engine."""
    if certified is None:
        certified = prepare_model(model, spec.protocol)
    engine = SamplingEngine(
        certified, dataset.num_classes, device, batch_size, spec.seed, noise=spec.protocol.noise
    )
    return BuildContext(
        dataset=dataset,
        model=model,
        device=device,
        seed=spec.seed,
        protocol=spec.protocol,
        engine=engine,
        progress=progress,
        registry=registry,
        model_hash=model_hash,
    )


@dataclass
class SettingWork:
    """What is left of one (method, setting): its shards of test ids, the shards already
    finished and the inputs already stored (a shard is certified only for the rest)."""

    method: str
    setting: dict[str, Any]
    key: str
    shards: list[list[int]]
    finished: set[int]
    stored: set[int]

    def todo(self, shard: int) -> list[int]:
        """The ids of ``shard`` without a stored certificate."""
        return [i for i in self.shards[shard] if i not in self.stored]

    def unfinished(self) -> list[int]:
        """The unfinished shards, in order."""
        return [s for s in range(len(self.shards)) if s not in self.finished]

    @property
    def remaining(self) -> int:
        """Inputs still to certify."""
        return sum(len(self.todo(s)) for s in self.unfinished())


class Executor(Protocol):
    """Certifies the unfinished shards of a prepared benchmark into its store.

    The store is written by the caller's process only; a certificate is stored as soon
    as it exists (with the certifier's staged state), a shard is marked finished once
    all its inputs are stored, and a failing method is recorded with
    :meth:`ResultStore.record_failure` while the others go on.
    """

    def certify(
        self, prepared: Prepared, store: ResultStore, work: list[SettingWork], options: RunOptions
    ) -> None: ...


def run_benchmark(
    spec: BenchmarkSpec,
    options: RunOptions,
    progress: Progress,
    manager: PluginManager | None = None,
    executor: Executor | None = None,
) -> str:
    """Run (or resume) ``spec`` with ``executor`` (default: in this process); returns the
    run id."""
    prepared = prepare(spec, options, progress, manager)
    run_id, context, spec = prepared.run_id, prepared.context, prepared.spec
    store = ResultStore(options.db)
    try:
        if not store.begin_run(
            run_id, spec.name, spec.to_dict(), library_versions(), git_commit(),
            str(context.device), spec.seed, prepared.model_hash,
            weights_digest=prepared.weights_digest,
        ):  # fmt: skip
            progress.log(f"resuming run {run_id[:12]}")
        test_ids = prepared.dataset.test_subset(
            spec.dataset.test_every, spec.dataset.test_count
        ).tolist()
        store.set_run_data(run_id, len(test_ids), prepared.dataset.files)
        if spec.model.checkpoint is not None:
            _check_checkpoint(prepared, test_ids)
        work = pending_work(store, run_id, spec, test_ids)
        (executor or LocalExecutor()).certify(prepared, store, work, options)
        store.finish_run(run_id)
    finally:
        store.close()
    return run_id


def _check_checkpoint(prepared: Prepared, test_ids: list[int]) -> None:
    """A user's base model, tried on the test subset before it is certified; a warning
    names the likely cause and the fix when it is near chance (:mod:`harness.checkpoint_sanity`)."""
    from harness.checkpoint_sanity import check_base_model

    context, data = prepared.context, prepared.dataset
    ids = torch.tensor(test_ids)
    report = check_base_model(context.model, data.test_x[ids], data.test_y[ids],
                              data.num_classes, context.device)  # fmt: skip
    context.progress.log(
        f"base model: clean accuracy {report.accuracy:.1%} on the {report.inputs} test inputs"
    )
    warning = report.warning(str(prepared.spec.model.checkpoint))
    if warning is not None:
        from rich.markup import escape

        context.progress.warn(escape(warning))


def pending_work(
    store: ResultStore, run_id: str, spec: BenchmarkSpec, test_ids: list[int]
) -> list[SettingWork]:
    """The (method, setting)s of ``spec`` with unfinished shards, in spec order; their
    earlier failures are cleared (they are tried again)."""
    shards = [test_ids[i : i + spec.shard_size] for i in range(0, len(test_ids), spec.shard_size)]
    work = []
    for method in spec.methods:
        for setting in method.settings:
            key = setting_key(setting)
            finished = store.finished_shards(run_id, method.name, key)
            if len(finished) == len(shards):
                continue
            store.clear_failures(run_id, method.name, key)
            stored = store.stored_inputs(run_id, method.name, key)
            work.append(SettingWork(method.name, setting, key, shards, finished, stored))
    return work


def failure_message(exc: BaseException) -> str:
    """How a failing method is recorded: the error, and the traceback's last frames
    unless it is one of the harness's own errors."""
    message = f"{type(exc).__name__}: {exc}"
    if not isinstance(exc, IdrsError):
        message += "\n" + traceback.format_exc(limit=-3)
    return message


def certify_shard(
    context: BuildContext,
    method: MethodSpec,
    provider: SigmaProvider,
    certifier: Certifier,
    ids: list[int],
    todo: list[int],
) -> Iterator[Certificate]:
    """Certificates of the inputs ``todo`` of the shard ``ids``, as each is produced
    (:func:`harness.certify.certify_drawn`: the harness draws, the certifier claims).

    σ is computed on the whole shard, as in an uninterrupted run: a σ whose last bits
    depend on the batch is then the same when a shard is resumed or retried.
    """
    if not todo:
        return
    start = time.perf_counter()
    x = context.dataset.test_x[ids].to(context.device)
    sigma, sigma_draws = sigma_of(context, provider, x, ids, method.sigma_provider)
    keep = np.array([ids.index(i) for i in todo])
    seconds = (time.perf_counter() - start) / len(ids)  # σ(x) is part of a certificate's cost
    drawn = None if sigma_draws is None else sigma_draws.rows(keep)
    yield from certify_drawn(context.engine, context.protocol, certifier, x[keep], todo,
                             sigma[keep], drawn, seconds, certifier_label(context, method))  # fmt: skip


class LocalExecutor:
    """Every setting in turn, its shards in order, in this process."""

    def certify(
        self, prepared: Prepared, store: ResultStore, work: list[SettingWork], options: RunOptions
    ) -> None:
        for setting in work:
            _certify_setting(store, prepared, setting)


def _certify_setting(store: ResultStore, prepared: Prepared, work: SettingWork) -> None:
    run_id, context, key = prepared.run_id, prepared.context, work.key
    try:
        method = prepared.registry.get("methods", work.method)
        state = RunState(store.state_records(run_id, work.method, key))
        context = replace(context, method=work.method, setting=key, state=state)
        provider, certifier = build_method(prepared.registry, work.method, work.setting, context)
        labels = context.dataset.test_y
        with context.progress.task(
            f"{work.method} {key}", total=work.remaining, unit="inputs"
        ) as advance:
            for shard in work.unfinished():
                todo = work.todo(shard)
                if todo:
                    certificates = certify_shard(
                        context, method, provider, certifier, work.shards[shard], todo
                    )
                    for cert in certificates:
                        store.add_certificate(
                            run_id, work.method, key, shard, int(labels[cert.input_id]), cert,
                            state=state.take(),
                        )  # fmt: skip
                        advance(1)
                store.finish_shard(run_id, work.method, key, shard)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # a failing plugin is reported; the benchmark goes on
        message = failure_message(exc)
        store.record_failure(run_id, work.method, key, message)
        context.progress.warn(f"method {work.method} ({key}) failed: {message.splitlines()[0]}")
