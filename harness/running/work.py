"""The units of work of a run: (method, setting, shard), what is left of each, and how
one shard is certified (the harness draws, the certifier claims)."""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from harness.certification.certify import certifier_label, certify_drawn, sigma_of
from harness.engine.centre import centre_of
from harness.engine.draws import Draws
from harness.foundation.certificate import Certificate
from harness.foundation.errors import IdrsError
from harness.foundation.identity import setting_key
from harness.foundation.protocol import CertificationProtocol
from harness.foundation.threads import load_per_core
from harness.plugin.components import BuildContext, Certifier, MethodSpec, SigmaProvider
from harness.running.benchmark import Benchmark
from harness.store.store import ResultStore


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
    produced (:func:`certify_shards` of one shard)."""
    yield from certify_shards(context, test_x, method, provider, certifier, [ids], [todo])


def certify_shards(
    context: BuildContext,
    test_x: torch.Tensor,
    method: MethodSpec,
    provider: SigmaProvider,
    certifier: Certifier,
    shards: list[list[int]],
    todos: list[list[int]],
) -> Iterator[Certificate]:
    """Certificates of the inputs ``todos[k]`` of each shard ``shards[k]`` (indices of
    ``test_x``), as each is produced, in order (:func:`harness.certification.certify.
    certify_drawn`: the harness draws, the certifier claims); the inputs of every shard are
    drawn together, in the same engine calls.

    σ is computed shard by shard on the whole shard, as in an uninterrupted run: a σ whose
    last bits depend on the batch is then the same when a shard is resumed, retried or
    drawn beside others. The samples of an input are keyed by its id (harness/README.md,
    "Noise contract") and each row's logits depend on the row alone at the engine's
    padded shape (measured when the run begins), so its counts are those it gets alone.
    """
    xs, ids, sigmas, centres, drawn, seconds = [], [], [], [], [], []
    for shard, todo in zip(shards, todos, strict=True):
        if not todo:
            continue
        start = time.perf_counter()
        x = test_x[shard].to(context.device)
        sigma, sigma_draws = sigma_of(context, provider, x, shard, method.sigma_provider)
        centre = centre_of(provider, x, method.sigma_provider)
        keep = np.array([shard.index(i) for i in todo])
        xs.append(x[keep])
        ids += todo
        sigmas.append(sigma[keep])
        centres.append(None if centre is None else centre[keep])
        drawn.append(None if sigma_draws is None else sigma_draws.rows(keep))
        # σ(x) is part of a certificate's cost
        seconds.append(np.full(len(todo), (time.perf_counter() - start) / len(shard)))
    if not ids:
        return
    joined = None if drawn[0] is None else Draws.joined(drawn)
    centre = None if centres[0] is None else np.concatenate(centres)
    for certificate in certify_drawn(context.engine, context.protocol, certifier, torch.cat(xs),
                                     ids, np.concatenate(sigmas), joined, np.concatenate(seconds),
                                     certifier_label(context, method), provider.regularity,
                                     centre):  # fmt: skip
        certificate.load = load_per_core()  # the load its seconds were measured under
        yield certificate


MAX_INPUTS_PER_CALL = 4096
"""The most inputs :func:`shards_per_call` draws together (those in flight when a run is
killed)."""


def shards_per_call(protocol: CertificationProtocol, batch_size: int, shard_size: int) -> int:
    """How many shards are drawn together: enough that the smallest engine call (each
    input's n0 selection samples, or under sequential sampling the smallest round of the
    rule, :mod:`harness.mathematics.sequential`) of their inputs fills a batch,
    ⌈batch / (shard_size · m)⌉, at most :data:`MAX_INPUTS_PER_CALL` inputs."""
    smallest = protocol.n0
    if protocol.sampling == "sequential":
        from harness.certification.rounds import sequential_rule

        looks = sequential_rule(protocol).looks
        smallest = min(smallest, int(np.diff(looks, prepend=0).min()))
    wanted = -(-int(batch_size) // (shard_size * max(smallest, 1)))
    return max(1, min(wanted, MAX_INPUTS_PER_CALL // shard_size))
