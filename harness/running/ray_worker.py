"""A Ray worker (:class:`CertifyWorker`): the dataset, the base model and the engine
loaded once, then each method built once and its shards certified, certificates streamed
back to the driver (:mod:`harness.running.ray_executor`), which alone writes the store."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.foundation.errors import IdrsError, pip_command
from harness.foundation.runstate import RunState, StateRecord
from harness.running.benchmark import Benchmark
from harness.running.preparation import RunOptions


def import_ray() -> Any:
    """The ``ray`` module, or a clear error saying how to install it."""
    try:
        import ray
    except ImportError:
        install = pip_command('install "idrs-bench[ray]"')
        raise IdrsError(
            f"the Ray executor needs Ray: {install} (or use the default --executor local)"
        ) from None
    return ray


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker needs to rebuild the driver's build context exactly."""

    benchmark: Benchmark  # resolved (noise) as recorded in the run
    data_root: str | None
    cache_dir: Path | None
    device: str
    batch_size: int
    recipe_hash: str
    weights_digest: str
    run_id: str


@dataclass(frozen=True)
class ShardFailure:
    """A method failed on a worker (building it or certifying a shard)."""

    message: str


class CertifyWorker:
    """One Ray actor: the dataset, the base model and the engine, loaded once."""

    def __init__(self, setup: WorkerSetup, weights: list | None) -> None:
        """``weights``: None (a user checkpoint) or [ObjectRef of the model's state dict]."""
        import ray

        from harness.engine.determinism import enable_deterministic_kernels
        from harness.foundation.progress import Progress
        from harness.plugin.manager import PluginManager
        from harness.running.preparation import build_context, load_dataset

        self.setup = setup
        self.registry = PluginManager().registry  # this worker's own
        options = RunOptions(db=Path(os.devnull), data_root=setup.data_root)
        dataset = load_dataset(setup.benchmark, self.registry, options)
        device = torch.device(setup.device)
        enable_deterministic_kernels(device)  # this process computes the run's quantities
        state = ray.get(weights[0]) if weights is not None else None
        model = _worker_model(setup, dataset, self.registry, state, device)
        self.test_x = dataset.test_x  # the harness's: the context withholds the test split
        self.context = build_context(
            setup.benchmark, dataset, model, setup.recipe_hash, device, setup.batch_size,
            Progress(enabled=False), self.registry, setup.run_id,
        )  # fmt: skip
        self.built: dict[tuple[str, str], tuple[Any, Any, Any, RunState]] = {}

    def pid(self) -> int:
        return os.getpid()

    def _method(self, name: str, params: dict, key: str, records: list[StateRecord] | None):
        """(method spec, σ-provider, certifier, run state), built once per setting; rebuilt
        from ``records`` when the committed state differs from the one held here."""
        from harness.certification.method import build_setting

        held = self.built.get((name, key))
        if held is not None and (records is None or held[3].committed == records):
            return held
        b = build_setting(self.context, name, params, key, records or [])
        held = (b.method, b.provider, b.certifier, b.state)
        self.built[(name, key)] = held
        return held

    def describe(self, name: str, params: dict, key: str, records: list[StateRecord]):
        """Build the method; whether its certifier is order-dependent, or a failure."""
        from harness.running.work import failure_message

        try:
            return bool(self._method(name, params, key, records)[2].order_dependent)
        except Exception as exc:
            return ShardFailure(failure_message(exc))

    def certify(
        self, name: str, params: dict, key: str, ids: list[int], todo: list[int],
        records: list[StateRecord] | None,
    ):  # fmt: skip
        """Yield (certificate, staged state records) per input of ``todo``, or a failure."""
        from harness.running.work import certify_shard, failure_message

        try:
            method, provider, certifier, state = self._method(name, params, key, records)
            shard = certify_shard(self.context, self.test_x, method, provider, certifier, ids, todo)
            for cert in shard:
                yield cert, state.take()
        except Exception as exc:
            yield ShardFailure(failure_message(exc))


def _worker_model(setup, dataset, registry, weights, device) -> torch.nn.Module:
    """The driver's base model, rebuilt here and checked bit for bit by its digest."""
    from harness.foundation.progress import Progress
    from harness.running.modelcache import build_architecture, obtain_model
    from harness.running.weights import weights_digest

    config = setup.benchmark.model
    if weights is None:  # a user checkpoint: read from its path on this machine
        model, _ = obtain_model(config, dataset, registry, device, Progress(enabled=False))
    else:
        model = build_architecture(config, dataset, registry)  # as the driver's cache does
        model.load_state_dict(weights)
        model = model.to(device).eval()
    digest = weights_digest(model)
    if digest != setup.weights_digest:
        raise IdrsError(
            f"a Ray worker's base model has weights {digest[:12]}, the driver's "
            f"{setup.weights_digest[:12]}: the checkpoint differs between machines"
        )
    return model
