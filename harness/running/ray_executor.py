"""Certifying on a Ray cluster: the same certificates as in one process, nothing lost.

The driver (the ``idrs-bench run`` process) prepares the benchmark as the local
executor does (dataset, base model trained or loaded, run recorded), then starts one
:class:`CertifyWorker` actor per GPU (``num_gpus=1``) or per CPU slot. Every worker
loads the dataset and the base model once: the driver puts the model's state dict in
Ray's object store and each worker rebuilds the architecture and checks that its
weights have the driver's SHA-256 (:func:`harness.running.weights.weights_digest`), so no
shared file system is needed for the model (a user checkpoint is read from its path
on each machine; the dataset files too).

The unit of work is (method, setting, shard). Shards of all methods and settings wait
in one queue and go to workers as they free up; a worker builds each method it meets
with :func:`harness.certification.method.build_method` once and streams every certificate back as
it is produced (a Ray streaming generator). The driver is the only process that
writes the results database: it stores each certificate as it arrives, so a killed
driver loses only the inputs in flight, and ``idrs-bench run`` (either executor)
resumes. A worker that dies mid-shard is restarted by Ray; the driver puts the rest of
its shard (the inputs not yet stored) back in the queue for the next free worker,
and stored rows are never written twice (the store's keys are (run, method, setting,
input)). Certificates do not depend on which worker made them: noise depends only on
(seed, stream, input, sample index), and σ is computed on the whole shard as in the
local executor.

A certifier whose certificates depend on input order (``order_dependent``, the
memory certifier of Alfarra et al. 2022, Alg. 3) has its shards run one after
another, on the worker that ran the previous one while it lives; its run state
(:mod:`harness.foundation.runstate`) flows through the driver, which writes each staged record
with its certificate and hands the committed records to the worker of the next shard.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from harness.foundation.errors import IdrsError
from harness.foundation.runstate import StateRecord
from harness.running.preparation import Prepared, RunOptions
from harness.running.ray_worker import CertifyWorker, ShardFailure, WorkerSetup, import_ray
from harness.running.work import SettingWork
from harness.store.store import ResultStore

MAX_SHARD_ATTEMPTS = 3
"""A shard whose worker dies this many times fails its method (a crash, not bad luck)."""


@dataclass
class ExecutorStats:
    """What the driver measured: inserts and object-store traffic."""

    certificates: int = 0
    insert_seconds: float = 0.0
    shards: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0
    worker_deaths: int = 0
    startup_seconds: float = 0.0  # starting the workers (dataset and model loaded)
    wall_seconds: float = 0.0  # all of it, startup included

    @property
    def inserts_per_second(self) -> float:
        return self.certificates / self.insert_seconds if self.insert_seconds else 0.0


@dataclass
class _Job:
    """A describe call or one shard of a setting, waiting or in flight."""

    work: SettingWork
    shard: int | None = None  # None: describe the setting (build it, ask order_dependent)
    attempts: int = 0


@dataclass
class _Setting:
    work: SettingWork
    records: list[StateRecord]
    order_dependent: bool | None = None
    failed: bool = False
    home: Any = None  # the worker running an order-dependent setting's shards
    busy: bool = False  # an order-dependent shard is in flight
    shards: deque = field(default_factory=deque)


class RayExecutor:
    """Certify on Ray: ``address`` of a running cluster (None: start one here, with
    this machine's CPUs and GPUs), ``workers`` actors (None: one per GPU when the run's
    device is CUDA, else one per CPU of the cluster)."""

    def __init__(self, address: str | None = None, workers: int | None = None) -> None:
        if workers is not None and workers < 1:
            raise IdrsError(f"--workers must be at least 1, got {workers}")
        self.address = address
        self.workers = workers
        self.stats = ExecutorStats()
        self._weights: list | None = None  # the model in the object store, kept alive

    def certify(
        self, prepared: Prepared, store: ResultStore, work: list[SettingWork], options: RunOptions
    ) -> None:
        if not work:
            return
        ray = import_ray()
        temp_dir = self._connect(ray)
        try:
            self._certify(ray, prepared, store, work, options)
        finally:
            if temp_dir is not None:
                ray.shutdown()
                shutil.rmtree(temp_dir, ignore_errors=True)

    def _connect(self, ray) -> str | None:
        """Join the cluster (or start a local one); the temp dir of one started here."""
        if ray.is_initialized():
            return None
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if self.address is not None:
            try:
                ray.init(address=self.address, log_to_driver=True)
            except Exception as exc:
                raise IdrsError(
                    f"cannot connect to the Ray cluster at {self.address!r}: {exc}. Start one "
                    "with `ray start --head`, and on a cluster with token authentication copy "
                    "its ~/.ray/auth_token here (or set RAY_AUTH_TOKEN)"
                ) from None
            return None
        temp_dir = tempfile.mkdtemp(prefix="idrs-ray-")
        ray.init(address="local", include_dashboard=False, _temp_dir=temp_dir, log_to_driver=True)
        return temp_dir

    def _certify(self, ray, prepared, store, work, options) -> None:
        started = time.perf_counter()
        cuda = prepared.context.device.type == "cuda"
        workers = self._start_workers(ray, prepared, options, cuda)
        self.stats.startup_seconds = time.perf_counter() - started
        try:
            self._schedule(ray, prepared, store, work, workers)
        finally:
            for worker in workers:
                ray.kill(worker)
        self.stats.wall_seconds = time.perf_counter() - started

    def _schedule(self, ray, prepared, store, work, workers) -> None:
        """Hand out describes and shards as workers free up; store what streams back."""
        run_id, progress = prepared.run_id, prepared.context.progress
        settings = {
            (w.method, w.key): _Setting(w, store.state_records(run_id, w.method, w.key))
            for w in work
        }
        queue: deque[_Job] = deque(_Job(w) for w in work)
        idle = list(workers)
        inflight: dict[Any, tuple[_Job, Any]] = {}
        probing: dict[Any, Any] = {}  # pid call -> a worker that died, until it is back
        labels = prepared.dataset.test_y
        total = sum(w.remaining for w in work)
        description = f"certifying on {len(workers)} Ray worker(s)"
        with progress.task(description, total=total, unit="inputs") as advance:
            while queue or inflight or any(s.shards for s in settings.values()):
                for worker in list(idle):
                    job = self._next_job(queue, settings, worker)
                    while (
                        job is not None and job.shard is not None and not job.work.todo(job.shard)
                    ):
                        # every input stored already (by a worker that died after them)
                        self._shard_done(store, run_id, settings[(job.work.method, job.work.key)],
                                         job.shard)  # fmt: skip
                        job = self._next_job(queue, settings, worker)
                    if job is None:
                        continue
                    idle.remove(worker)
                    inflight[self._start(ray, worker, job, settings)] = (job, worker)
                if not inflight and not probing:
                    if not idle:
                        raise IdrsError("every Ray worker died; see the Ray logs")
                    break  # nothing runnable: every remaining shard belongs to failed settings
                ready, _ = ray.wait([*inflight, *probing], num_returns=1, timeout=1.0)
                for handle in ready:
                    if handle in probing:
                        self._probed(ray, probing, probing.pop(handle), handle, idle, progress)
                        continue
                    job, worker = inflight.pop(handle)
                    setting = settings[(job.work.method, job.work.key)]
                    try:
                        if job.shard is None:
                            answer = ray.get(handle)
                            self._described(answer, setting, worker, queue, store, run_id, progress)
                            idle.append(worker)
                            continue
                        item = ray.get(next(handle))
                    except StopIteration:
                        self._shard_done(store, run_id, setting, job.shard)
                        idle.append(worker)
                        continue
                    except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as exc:
                        self._worker_died(job, setting, queue, store, run_id, progress, exc)
                        probing[worker.pid.remote()] = worker  # Ray restarts it
                        continue
                    if setting.failed:  # a failed setting stores nothing more
                        inflight[handle] = (job, worker)
                        continue
                    if isinstance(item, ShardFailure):
                        self._fail(store, run_id, setting, item.message, progress, job.shard)
                        setting.busy = False
                        idle.append(worker)
                        continue
                    if self._store(store, run_id, setting, job.shard, item, labels, progress):
                        advance(1)
                    inflight[handle] = (job, worker)

    @staticmethod
    def _probed(ray, probing: dict, worker, handle, idle: list, progress) -> None:
        """A restarted worker answering joins the idle ones; one restarting is asked
        again; one dead for good (its restarts spent) leaves the pool."""
        try:
            ray.get(handle)
        except ray.exceptions.ActorDiedError:
            progress.warn("a Ray worker died for good (its restarts are spent)")
            return
        except ray.exceptions.RayActorError:
            probing[worker.pid.remote()] = worker
            return
        idle.append(worker)

    def _start_workers(self, ray, prepared: Prepared, options: RunOptions, cuda: bool) -> list:
        resources = ray.cluster_resources()
        kind, available = (
            ("GPU", resources.get("GPU", 0)) if cuda else ("CPU", resources.get("CPU", 0))
        )
        count = self.workers or int(available)
        if count < 1 or count > available:
            raise IdrsError(
                f"{count} Ray worker(s) need {count} {kind}(s), the cluster has {available:g}; "
                "pass a smaller --workers or add machines"
            )
        setup = WorkerSetup(
            prepared.benchmark, options.data_root, options.cache_dir, str(prepared.context.device),
            int(prepared.batch_size), prepared.recipe_hash, prepared.weights_digest or "",
            prepared.run_id,
        )  # fmt: skip
        weights = None
        if prepared.benchmark.model.checkpoint is None:
            state = {k: v.detach().cpu() for k, v in prepared.context.model.state_dict().items()}
            # once in the object store, read by every worker (and by a restarted one: the
            # driver keeps the reference)
            self._weights = weights = [ray.put(state)]
        actor = ray.remote(CertifyWorker).options(
            num_gpus=1 if cuda else 0, num_cpus=0 if cuda else 1,
            max_restarts=MAX_SHARD_ATTEMPTS, max_task_retries=0,
        )  # fmt: skip
        workers = [actor.remote(setup, weights) for _ in range(count)]
        try:
            ray.get([w.pid.remote() for w in workers])  # up, with dataset and model loaded
        except ray.exceptions.RayActorError as exc:
            raise IdrsError(f"a Ray worker failed to start: {exc}") from None
        return workers

    @staticmethod
    def _next_job(queue: deque, settings: dict, worker) -> _Job | None:
        """The first job this worker may run: describes and shards in order, except that
        an order-dependent setting runs one shard at a time on its home worker."""
        for s in settings.values():
            if s.shards and not s.busy and not s.failed and s.home in (None, worker):
                s.busy, s.home = True, worker
                return s.shards.popleft()
        while queue:
            job = queue.popleft()
            if not settings[(job.work.method, job.work.key)].failed:
                return job
        return None

    def _start(self, ray, worker, job: _Job, settings: dict):
        w = job.work
        if job.shard is None:
            records = settings[(w.method, w.key)].records
            self.stats.bytes_sent += _size(records)
            return worker.describe.remote(w.method, w.params, w.key, records)
        setting = settings[(w.method, w.key)]
        records = list(setting.records) if setting.order_dependent else None
        self.stats.bytes_sent += _size(records)
        return worker.certify.options(num_returns="streaming").remote(
            w.method, w.params, w.key, w.shards[job.shard], w.todo(job.shard), records
        )

    def _described(self, answer, setting: _Setting, worker, queue, store, run_id, progress):
        if isinstance(answer, ShardFailure):
            self._fail(store, run_id, setting, answer.message, progress, None)
            return
        setting.order_dependent = answer
        jobs = [_Job(setting.work, s) for s in setting.work.unfinished()]
        if answer:  # in order, on the worker that built it while it lives
            setting.home = worker
            setting.shards.extend(jobs)
        else:
            queue.extend(jobs)

    def _store(self, store, run_id, setting: _Setting, shard, item, labels, progress) -> bool:
        """Store one certificate with its staged state; False if that fails the setting."""
        cert, staged = item
        w = setting.work
        self.stats.bytes_received += _size(item)
        if staged and not setting.order_dependent:
            message = (
                f"IdrsError: method {w.method!r} stages run state but its certifier does not "
                "declare order_dependent = True; its certificates would depend on the worker"
            )
            self._fail(store, run_id, setting, message, progress, shard)
            return False
        start = time.perf_counter()
        store.add_certificate(run_id, w.method, w.key, shard, int(labels[cert.input_id]), cert,
                              state=staged)  # fmt: skip
        self.stats.insert_seconds += time.perf_counter() - start
        self.stats.certificates += 1
        setting.records.extend(staged)
        w.stored.add(cert.input_id)
        return True

    def _shard_done(self, store, run_id, setting: _Setting, shard: int) -> None:
        w = setting.work
        if not setting.failed:
            store.add_shard(run_id, w.method, w.key, shard, [])
            w.finished.add(shard)
        self.stats.shards += 1
        setting.busy = False

    def _worker_died(self, job, setting: _Setting, queue, store, run_id, progress, exc) -> None:
        """Put the rest of the shard back in the queue (a describe: describe again)."""
        self.stats.worker_deaths += 1
        job.attempts += 1
        where = f"shard {job.shard}" if job.shard is not None else "building it"
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if job.attempts >= MAX_SHARD_ATTEMPTS:
            self._fail(store, run_id, setting, f"Ray worker died {job.attempts} times "
                       f"({reason})", progress, job.shard)  # fmt: skip
            return
        progress.warn(
            f"a Ray worker died in method {setting.work.method} ({setting.work.key}), "
            f"{where}; retrying it on the next free worker"
        )
        setting.home, setting.busy = None, False
        if setting.order_dependent:
            setting.shards.appendleft(job)
        else:
            queue.appendleft(job)

    def _fail(self, store, run_id, setting: _Setting, message: str, progress, shard) -> None:
        w = setting.work
        setting.failed = True
        setting.shards.clear()
        store.record_failure(run_id, w.method, w.key, message)
        where = f", shard {shard}" if shard is not None else ""
        progress.warn(f"method {w.method} ({w.key}{where}) failed: {message.splitlines()[0]}")


def _size(value: Any) -> int:
    """Bytes of ``value`` pickled: what it costs to move through Ray."""
    return len(pickle.dumps(value, protocol=5)) if value is not None else 0
