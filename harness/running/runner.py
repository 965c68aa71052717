"""Runs a benchmark: one shared base model, every method and setting, resumably.

The unit of work is (run, method, setting, shard of test inputs): a finished shard is
never redone, and inside an unfinished one only the inputs without a stored
certificate are certified. A method that fails is recorded and reported; the other
methods go on. Processes that run the same benchmark on the same database share the
shards through leases in it (:mod:`harness.store.leases`).
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path
from typing import Any, Protocol

import torch

from harness.engine.arithmetic import (
    ROWS_DEPENDENT,
    computing_with,
    fingerprint,
    rows_independent,
    run_threads,
)
from harness.engine.determinism import deterministic_kernels
from harness.foundation.data import WITHHELD
from harness.foundation.errors import IdrsError
from harness.foundation.progress import Progress
from harness.foundation.version import __version__
from harness.plugin.manager import PluginManager, managed
from harness.plugin.registry import Registry
from harness.running.benchmark import Benchmark
from harness.running.local_executor import LocalExecutor
from harness.running.preparation import Prepared, RunOptions, prepare
from harness.running.work import SettingWork, pending_work
from harness.store.integrity import check_database
from harness.store.store import ResultStore


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
    benchmark: Benchmark,
    options: RunOptions,
    progress: Progress,
    manager: PluginManager | None = None,
    executor: Executor | None = None,
) -> str:
    """Run (or resume) ``benchmark`` with ``executor`` (default: in this process); returns the
    run id. Without a ``manager``, the one made here ends its plugin hosts on return."""
    check_database(options.db)  # a damaged database is refused before any work
    with managed(manager) as manager:
        return _run_prepared(prepare(benchmark, options, progress, manager), options, progress,
                             executor)  # fmt: skip


def _run_prepared(
    prepared: Prepared, options: RunOptions, progress: Progress, executor: Executor | None
) -> str:
    """:func:`run_benchmark` once its benchmark is prepared."""
    run_id, context, benchmark = prepared.run_id, prepared.context, prepared.benchmark
    store = ResultStore(options.db, verify=False)
    try:
        if not store.begin_run(
            run_id, benchmark.name, benchmark.to_dict(), library_versions(), git_commit(),
            context.device.type, benchmark.seed, prepared.recipe_hash,
            weights_digest=prepared.weights_digest, test_split=WITHHELD,
        ):  # fmt: skip
            stored = store.run(run_id)
            _check_weights(stored, prepared)
            progress.log(f"resuming run {run_id[:12]}")
            if stored.get("test_split") is None:
                progress.note(
                    f"run {run_id[:12]} began before runs recorded that no plugin had the "
                    "test split, so it stays without that record (its board states none); "
                    "with another --db it begins again, recorded"
                )
        test_ids = prepared.dataset.test_subset(
            benchmark.dataset.test_every, benchmark.dataset.test_count
        ).tolist()
        store.set_run_data(
            run_id, len(test_ids), prepared.dataset.files, prepared.dataset.class_names
        )
        components = run_components(benchmark, prepared.registry)
        store.record_components(run_id, components)
        store.record_plugin_hosts(run_id, prepared.plugin_hosts)
        executor = executor or LocalExecutor()
        if benchmark.model.checkpoint is not None:
            _check_checkpoint(prepared, test_ids)
        work = pending_work(store, run_id, benchmark, test_ids)
        threads = None  # a finished run keeps its record: this process certifies nothing
        with deterministic_kernels(context.device):
            if work:
                threads = _record_arithmetic(store, prepared, executor, options.threads)
            with computing_with(threads):
                executor.certify(prepared, store, work, options)
        from harness.running.runfiles import record_run_files

        providers = {p["plugin"] for kind in components.values() for p in kind.values()}
        record_run_files(store, prepared, options.cache_dir, providers)
        store.finish_run(run_id)
    finally:
        store.close()
    return run_id


def run_components(benchmark: Benchmark, registry: Registry) -> dict[str, dict[str, Any]]:
    """Which plugin, installed package (distribution) and version provide each component
    the benchmark names (its methods with their σ-providers and certifiers, its dataset,
    architecture and trainer) and each check, by kind and name
    (:meth:`~harness.plugin.registry.Registry.provenance`): recorded with the run, so that a
    reader of its board who lacks a plugin is told which package to install."""
    names: dict[str, set[str]] = {
        "datasets": {benchmark.dataset.name},
        "models": {benchmark.model.architecture},
        "trainers": {benchmark.model.trainer},
        "checks": set(registry.names("checks")),
    }
    for method in benchmark.methods:
        spec = registry.get("methods", method.name)
        names.setdefault("methods", set()).add(method.name)
        names.setdefault("sigma_providers", set()).add(spec.sigma_provider)
        names.setdefault("certifiers", set()).add(spec.certifier)
    return {kind: {name: registry.provenance(kind, name) for name in sorted(n for n in found if n)}
            for kind, found in names.items()}  # fmt: skip


def _record_arithmetic(
    store: ResultStore, prepared: Prepared, executor: Executor, requested: int | None
) -> int | None:
    """The thread count this process certifies with (None on CUDA), and its arithmetic
    recorded with the run: on CPU with the thread count the run began with (every process
    of one run rounds alike, so its counts replay bit for bit), unless the user asked for
    another (the run is then ``varied``); with whether a row's logits depend on the other
    rows of a batch, measured when the run begins (:func:`~harness.engine.arithmetic.
    rows_independent`; a run recorded before this was measured keeps its record)."""
    where = "local" if isinstance(executor, LocalExecutor) else type(executor).__name__
    context, progress = prepared.context, prepared.context.progress
    protocol = prepared.benchmark.protocol
    measured: dict[int | None, str] = {}

    def rows(threads: int | None) -> str:
        if threads not in measured:
            examples = prepared.dataset.test_x[:4].to(context.device, torch.float32)
            with computing_with(threads):
                alone = rows_independent(context.engine.model, examples, prepared.batch_size)
            measured[threads] = "independent" if alone else ROWS_DEPENDENT
        return measured[threads]

    def choose(recorded: dict[str, Any] | None) -> dict[str, Any]:
        threads = run_threads(recorded, requested)
        here = fingerprint(context.device, protocol, prepared.batch_size, where, threads)
        if recorded is None or "rows" in recorded:
            here["rows"] = rows(threads)
        return here

    before = store.run(prepared.run_id).get("arithmetic")
    if before is None or "rows" in before:  # measured here, not in the transaction below
        rows(run_threads(before, requested))
    recorded, here = store.record_arithmetic(prepared.run_id, choose)
    if here.get("rows") == ROWS_DEPENDENT and not (recorded or {}).get("rows"):
        progress.note(
            f"run {prepared.run_id[:12]}: at {prepared.batch_size} rows a row's logits depend on "
            "the other rows of the batch on this arithmetic, so its inputs are not re-drawn "
            'bit for bit: its replays are statistical (harness/README.md, "Replay")'
        )
    if requested is None and here["threads"] not in (None, torch.get_num_threads()):
        progress.note(
            f"run {prepared.run_id[:12]} certifies with {here['threads']} threads, as it began "
            f"(this process has {torch.get_num_threads()}): its counts replay bit for bit"
        )
    elif requested is not None and recorded and recorded.get("threads") not in (None, requested):
        progress.warn(
            f"run {prepared.run_id[:12]} began with {recorded.get('threads')} threads, this "
            f"process certifies with {here['threads']} (asked for): the run is marked varied "
            "and its counts replay statistically only; leave --threads out to keep its count"
        )
    return here["threads"]


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
    names the likely cause and the fix when it is near chance (:mod:`harness.running.checkpoint_sanity`)."""
    from harness.running.checkpoint_sanity import check_base_model

    context, data = prepared.context, prepared.dataset
    ids = torch.tensor(test_ids)
    report = check_base_model(context.model, data.test_x[ids], data.test_y[ids],
                              data.num_classes, context.device)  # fmt: skip
    context.progress.log(
        f"base model: clean accuracy {report.accuracy:.1%} on the {report.inputs} test inputs"
    )
    warning = report.warning(str(prepared.benchmark.model.checkpoint))
    if warning is not None:
        from rich.markup import escape

        context.progress.warn(escape(warning))
