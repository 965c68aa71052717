"""The units of work of a run: (method, setting, shard), what is left of each, and how
one shard is certified (the harness draws, the certifier claims)."""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.certification.certify import certifier_label, certify_drawn, sigma_of
from harness.foundation.certificate import Certificate
from harness.foundation.errors import IdrsError
from harness.foundation.identity import setting_key
from harness.plugin.components import BuildContext, Certifier, MethodSpec, SigmaProvider
from harness.running.benchmark import Benchmark
from harness.store.store import ResultStore

if TYPE_CHECKING:
    import torch


@dataclass
class SettingWork:
    """What is left of one (method, setting): its shards of test ids, the shards already
    finished and the inputs already stored (a shard is certified only for the rest)."""

    method: str
    params: dict[str, Any]  # the setting's parameters; ``key`` is the setting's name
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


def pending_work(
    store: ResultStore, run_id: str, benchmark: Benchmark, test_ids: list[int]
) -> list[SettingWork]:
    """The (method, setting)s of ``benchmark`` with unfinished shards, in benchmark order; their
    earlier failures are cleared (they are tried again)."""
    shards = [
        test_ids[i : i + benchmark.shard_size]
        for i in range(0, len(test_ids), benchmark.shard_size)
    ]
    work = []
    for method in benchmark.methods:
        for params in method.settings:
            key = setting_key(params)
            finished = store.finished_shards(run_id, method.name, key)
            if len(finished) == len(shards):
                continue
            store.clear_failures(run_id, method.name, key)
            stored = store.stored_inputs(run_id, method.name, key)
            work.append(SettingWork(method.name, params, key, shards, finished, stored))
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
    test_x: torch.Tensor,
    method: MethodSpec,
    provider: SigmaProvider,
    certifier: Certifier,
    ids: list[int],
    todo: list[int],
) -> Iterator[Certificate]:
    """Certificates of the inputs ``todo`` of the shard ``ids`` (indices of the test
    inputs ``test_x``, which the harness holds: the context withholds them), as each is
    produced (:func:`harness.certification.certify.certify_drawn`: the harness draws, the
    certifier claims).

    σ is computed on the whole shard, as in an uninterrupted run: a σ whose last bits
    depend on the batch is then the same when a shard is resumed or retried.
    """
    if not todo:
        return
    start = time.perf_counter()
    x = test_x[ids].to(context.device)
    sigma, sigma_draws = sigma_of(context, provider, x, ids, method.sigma_provider)
    keep = np.array([ids.index(i) for i in todo])
    seconds = (time.perf_counter() - start) / len(ids)  # σ(x) is part of a certificate's cost
    drawn = None if sigma_draws is None else sigma_draws.rows(keep)
    yield from certify_drawn(context.engine, context.protocol, certifier, x[keep], todo,
                             sigma[keep], drawn, seconds, certifier_label(context, method),
                             provider.regularity)  # fmt: skip
