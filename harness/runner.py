"""Runs a benchmark: one shared base model, every method and setting, resumably.

The unit of work is (run, method, setting, shard of test inputs): a finished shard is
never redone, and inside an unfinished one only the inputs without a stored
certificate are certified. A method that fails is recorded and reported; the other
methods go on. Processes that run the same benchmark on the same database share the
shards through leases in it (:mod:`harness.leases`).
"""

from __future__ import annotations

import platform
import subprocess
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

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
from harness.store import LeaseAnswer, ResultStore, check_database

if TYPE_CHECKING:
    from harness.leases import LeaseKeeper


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
    # the device type, not its index: processes on cuda:0 and cuda:1 certify the same run
    run_id = content_hash({"spec": spec.to_dict(), "device": device.type, "model": model_hash})
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
    in a sampling engine whose forward passes all have ``batch_size`` rows."""
    if certified is None:
        certified = prepare_model(model, spec.protocol)
    # every forward pass has batch_size rows, so each sample's logits are those of any
    # other batch it could share (the replay check re-draws a few inputs alone)
    engine = SamplingEngine(
        certified, dataset.num_classes, device, batch_size, spec.seed, noise=spec.protocol.noise,
        pad_batches=True,
    )  # fmt: skip
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
    check_database(options.db)  # a damaged database is refused before any work
    prepared = prepare(spec, options, progress, manager)
    run_id, context, spec = prepared.run_id, prepared.context, prepared.spec
    store = ResultStore(options.db, verify=False)
    try:
        if not store.begin_run(
            run_id, spec.name, spec.to_dict(), library_versions(), git_commit(),
            context.device.type, spec.seed, prepared.model_hash,
            weights_digest=prepared.weights_digest,
        ):  # fmt: skip
            _check_weights(store.run(run_id), prepared)
            progress.log(f"resuming run {run_id[:12]}")
        test_ids = prepared.dataset.test_subset(
            spec.dataset.test_every, spec.dataset.test_count
        ).tolist()
        store.set_run_data(
            run_id, len(test_ids), prepared.dataset.files, prepared.dataset.class_names
        )
        executor = executor or LocalExecutor()
        from harness.arithmetic import fingerprint

        where = "local" if isinstance(executor, LocalExecutor) else type(executor).__name__
        store.record_arithmetic(
            run_id, fingerprint(context.device, spec.protocol, prepared.batch_size, where)
        )
        if spec.model.checkpoint is not None:
            _check_checkpoint(prepared, test_ids)
        work = pending_work(store, run_id, spec, test_ids)
        executor.certify(prepared, store, work, options)
        from harness.runfiles import record_run_files

        record_run_files(store, prepared, options.cache_dir)
        store.finish_run(run_id)
    finally:
        store.close()
    return run_id


def _check_weights(run: dict[str, Any], prepared: Prepared) -> None:
    """A run resumed (or shared by another process) must certify the weights it began with."""
    recorded = run.get("weights_digest")
    if recorded and prepared.weights_digest and recorded != prepared.weights_digest:
        raise IdrsError(
            f"run {prepared.run_id[:12]} was certified on base-model weights {recorded[:12]}, "
            f"this process has {prepared.weights_digest[:12]} (the model was trained again and "
            "came out different); certify the run's weights with --set model.checkpoint=FILE "
            "--set model.format=state_dict, or pass another --db"
        )


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
    """Every setting in turn, its shards in order, in this process.

    Shards are leased in the results database (:mod:`harness.leases`): a shard another
    process holds is left to it, and this process waits at the end until every shard is
    finished, taking over those whose lease expires (their process died).
    """

    def __init__(self, poll: float = 1.0) -> None:
        self.poll = poll  # seconds between looks at shards other processes hold

    def certify(
        self, prepared: Prepared, store: ResultStore, work: list[SettingWork], options: RunOptions
    ) -> None:
        if not work:
            return
        from harness.leases import LeaseKeeper

        progress = prepared.context.progress
        with LeaseKeeper(store.path, progress.note) as leases:
            leases.join(prepared.run_id)
            built: dict[tuple[str, str], tuple] = {}
            pending, told = list(work), False
            while pending:
                waiting = [
                    setting
                    for setting in pending
                    if _certify_setting(store, prepared, setting, leases, built) == _WAITING
                ]
                if waiting and not told:
                    left = sum(len(w.unfinished()) for w in waiting)
                    progress.note(
                        f"waiting for {left} shard(s) that other processes are certifying "
                        f"(taken over if a process stops for {leases.seconds:g} s)"
                    )
                    told = True
                if waiting:
                    time.sleep(min(self.poll, leases.seconds / 4))
                leases.others(prepared.run_id)  # (says which processes joined meanwhile)
                pending = waiting


_DONE, _WAITING, _FAILED = "done", "waiting", "failed"


def _certify_setting(
    store: ResultStore,
    prepared: Prepared,
    work: SettingWork,
    leases: LeaseKeeper,
    built: dict[tuple[str, str], tuple],
) -> str:
    """Certify the shards of ``work`` that no other process holds; ``_DONE`` when every
    shard is finished, ``_WAITING`` when other processes hold some, ``_FAILED``."""
    from harness.store import WHOLE_SETTING

    run_id, context, key = prepared.run_id, prepared.context, work.key
    work.finished |= store.finished_shards(run_id, work.method, key)
    if not work.unfinished():
        return _DONE
    if _held_elsewhere(store, leases, run_id, work):
        return _WAITING  # (not built for nothing)
    whole = None
    try:
        method = prepared.registry.get("methods", work.method)
        provider, certifier, state, context = _built_method(store, prepared, work, built)
        if certifier.order_dependent:  # its shards in order, with its state: one process
            answer = leases.acquire(run_id, work.method, key, WHOLE_SETTING)
            if not answer.acquired:
                return _WAITING
            whole = (run_id, work.method, key, WHOLE_SETTING)
            _took_over(context, answer, work, "its shards")
            work.finished |= store.finished_shards(run_id, work.method, key)
            if store.state_records(run_id, work.method, key) != state.committed:
                built.pop((work.method, key), None)  # another process went on: restore its state
                provider, certifier, state, context = _built_method(store, prepared, work, built)
        labels = context.dataset.test_y
        waiting = False
        with context.progress.task(  # counts what this process certifies
            f"{work.method} {key}", total=work.remaining, unit="inputs"
        ) as advance:
            for shard in work.unfinished():
                lease = (run_id, work.method, key, shard)
                if whole is None:
                    answer = leases.acquire(*lease)
                    if not answer.acquired:
                        waiting = True
                        continue
                    _took_over(context, answer, work, f"shard {shard}")
                try:
                    if shard in store.finished_shards(run_id, work.method, key):
                        work.finished.add(shard)  # by another process, meanwhile
                        continue
                    work.stored |= store.stored_inputs(run_id, work.method, key, shard)
                    todo = work.todo(shard)
                    lost = False
                    if todo:
                        certificates = certify_shard(
                            context, method, provider, certifier, work.shards[shard], todo
                        )
                        for cert in certificates:
                            store.add_certificate(
                                run_id, work.method, key, shard, int(labels[cert.input_id]),
                                cert, state=state.take(),
                            )  # fmt: skip
                            work.stored.add(cert.input_id)
                            advance(1)
                            if leases.lost(whole or lease):
                                lost = True
                                break
                    if lost:  # it stalled past its lease; the new holder finishes it
                        context.progress.warn(
                            f"{work.method} ({key}): another process took over shard "
                            f"{shard} after this one stalled past its lease; leaving it"
                        )
                        built.pop((work.method, key), None)
                        return _WAITING
                    store.finish_shard(run_id, work.method, key, shard)
                    work.finished.add(shard)
                    leases.others(run_id)  # (says which processes joined meanwhile)
                finally:
                    if whole is None:
                        leases.release(*lease)
        return _WAITING if waiting else _DONE
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # a failing plugin is reported; the benchmark goes on
        message = failure_message(exc)
        store.record_failure(run_id, work.method, key, message)
        context.progress.warn(f"method {work.method} ({key}) failed: {message.splitlines()[0]}")
        return _FAILED
    finally:
        if whole is not None:
            leases.release(*whole)


def _held_elsewhere(
    store: ResultStore, leases: LeaseKeeper, run_id: str, work: SettingWork
) -> bool:
    """Whether other processes' live leases cover every unfinished shard of ``work``."""
    from harness.store import WHOLE_SETTING

    held = set()
    for lease in store.live_leases(run_id):
        mine = lease["owner"] == leases.owner
        if (lease["method"], lease["setting"]) == (work.method, work.key) and not mine:
            leases.meet(lease["owner"])
            held.add(lease["shard"])
    return WHOLE_SETTING in held or set(work.unfinished()) <= held


def _built_method(
    store: ResultStore, prepared: Prepared, work: SettingWork, built: dict[tuple[str, str], tuple]
) -> tuple[SigmaProvider, Certifier, RunState, BuildContext]:
    """The σ-provider, certifier, run state and build context of ``work``, built once per
    process (the state restored from the records committed in the store)."""
    name = (work.method, work.key)
    if name not in built:
        state = RunState(store.state_records(prepared.run_id, work.method, work.key))
        context = replace(prepared.context, method=work.method, setting=work.key, state=state)
        provider, certifier = build_method(prepared.registry, work.method, work.setting, context)
        from harness.runfiles import record_sigma_model

        record_sigma_model(store, prepared.run_id, work.method, work.key, provider)
        built[name] = (provider, certifier, state, context)
    return built[name]


def _took_over(context: BuildContext, answer: LeaseAnswer, work: SettingWork, what: str) -> None:
    if answer.expired is not None:
        from harness.leases import display

        context.progress.note(
            f"{work.method} {work.key}: taking over {what} from process "
            f"{display(answer.expired)}, whose lease expired"
        )
