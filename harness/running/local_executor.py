"""The local executor: every setting in turn, its shards in order, in this process,
leased in the results database so that several processes can share a run."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from harness.certification.method import build_setting
from harness.foundation.runstate import RunState
from harness.plugin.components import BuildContext, Certifier, MethodSpec, SigmaProvider
from harness.running.preparation import Prepared, RunOptions
from harness.running.work import SettingWork, certify_shards, failure_message
from harness.running.work import shards_per_call as _shards_per_call
from harness.store.lease_records import LeaseAnswer
from harness.store.store import ResultStore

if TYPE_CHECKING:
    from harness.store.leases import LeaseKeeper


class LocalExecutor:
    """Every setting in turn, its shards in order, in this process.

    Shards are leased in the results database (:mod:`harness.store.leases`): a shard another
    process holds is left to it, and this process waits at the end until every shard is
    finished, taking over those whose lease expires (their process died). Consecutive
    shards are drawn together, as many as :func:`~harness.running.work.shards_per_call`
    says (or ``shards_per_call``), and each is stored in one transaction once all its
    inputs are certified.
    """

    def __init__(self, poll: float = 1.0, shards_per_call: int | None = None) -> None:
        self.poll = poll  # seconds between looks at shards other processes hold
        self.shards_per_call = shards_per_call

    def certify(
        self, prepared: Prepared, store: ResultStore, work: list[SettingWork], options: RunOptions
    ) -> None:
        if not work:
            return
        from harness.store.leases import LeaseKeeper

        progress = prepared.context.progress
        with LeaseKeeper(store.path, progress.note) as leases:
            leases.join(prepared.run_id)
            built: dict[tuple[str, str], tuple] = {}
            pending, told = list(work), False
            while pending:
                waiting = []
                for setting in pending:
                    outcome = _certify_setting(store, prepared, setting, leases, built,
                                               self.shards_per_call)  # fmt: skip
                    if outcome == _WAITING:
                        waiting.append(setting)
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
    shards_per_call: int | None = None,
) -> str:
    """Certify the shards of ``work`` that no other process holds, ``shards_per_call`` at
    a time (None: :func:`~harness.running.work.shards_per_call`); ``_DONE`` when every
    shard is finished, ``_WAITING`` when other processes hold some, ``_FAILED``."""
    from harness.store.schema import WHOLE_SETTING

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
        size = shards_per_call if shards_per_call is not None else _shards_per_call(
            context.protocol, context.engine.batch_size, prepared.benchmark.shard_size)  # fmt: skip
        waiting = False
        with context.progress.task(  # counts what this process certifies
            f"{work.method} {key}", total=work.remaining, unit="inputs"
        ) as advance:
            pending = work.unfinished()
            while pending:
                group, pending = pending[:size], pending[size:]
                held: list[tuple] = []
                try:
                    mine = []
                    for shard in group:
                        if whole is None:
                            lease = (run_id, work.method, key, shard)
                            answer = leases.acquire(*lease)
                            if not answer.acquired:
                                waiting = True
                                continue
                            held.append(lease)
                            _took_over(context, answer, work, f"shard {shard}")
                        if shard in store.finished_shards(run_id, work.method, key):
                            work.finished.add(shard)  # by another process, meanwhile
                            continue
                        work.stored |= store.stored_inputs(run_id, work.method, key, shard)
                        mine.append(shard)
                    lost = _certify_group(store, prepared, work, mine,
                                          (method, provider, certifier, state), leases, whole,
                                          advance)  # fmt: skip
                    if lost is not None:  # it stalled past its lease; the new holder finishes it
                        context.progress.warn(
                            f"{work.method} ({key}): another process took over shard "
                            f"{lost} after this one stalled past its lease; leaving it"
                        )
                        built.pop((work.method, key), None)
                        return _WAITING
                finally:
                    for lease in held:
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


def _certify_group(
    store: ResultStore, prepared: Prepared, work: SettingWork, shards: list[int],
    built: tuple[MethodSpec, SigmaProvider, Certifier, RunState], leases: LeaseKeeper,
    whole: tuple | None, advance,
) -> int | None:  # fmt: skip
    """Certify the unstored inputs of ``shards`` (leased, or the setting's ``whole`` lease)
    together (:func:`~harness.running.work.certify_shards`), and store each shard, its
    certificates and the certifier's staged state, in one transaction once all its inputs
    are certified; the shard whose lease another process took over meanwhile (None)."""
    run_id, context, key = prepared.run_id, prepared.context, work.key
    method, provider, certifier, state = built
    test_x, labels = prepared.dataset.test_x, prepared.dataset.test_y
    todos = {shard: work.todo(shard) for shard in shards}
    where = {i: shard for shard, todo in todos.items() for i in todo}
    ready: dict[int, list] = {shard: [] for shard in shards}

    def stored(shard: int) -> int | None:
        if leases.lost(whole or (run_id, work.method, key, shard)):
            return shard
        store.add_shard(run_id, work.method, key, shard, ready.pop(shard))
        work.stored |= set(todos[shard])
        work.finished.add(shard)
        leases.others(run_id)  # (says which processes joined meanwhile)
        return None

    for shard in [s for s in shards if not todos[s]]:  # every input stored before
        if stored(shard) is not None:
            return shard
    made = certify_shards(context, test_x, method, provider, certifier,
                          [work.shards[s] for s in shards if todos[s]],
                          [todos[s] for s in shards if todos[s]])  # fmt: skip
    for cert in made:
        shard = where[cert.input_id]
        ready[shard].append((int(labels[cert.input_id]), cert, state.take()))
        advance(1)
        if len(ready[shard]) == len(todos[shard]) and stored(shard) is not None:
            return shard
    return None


def _held_elsewhere(
    store: ResultStore, leases: LeaseKeeper, run_id: str, work: SettingWork
) -> bool:
    """Whether other processes' live leases cover every unfinished shard of ``work``."""
    from harness.store.leases import owner_gone
    from harness.store.schema import WHOLE_SETTING

    held = set()
    for lease in store.live_leases(run_id):
        elsewhere = lease["owner"] != leases.owner and not owner_gone(lease["owner"])
        if (lease["method"], lease["setting"]) == (work.method, work.key) and elsewhere:
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
        records = store.state_records(prepared.run_id, work.method, work.key)
        b = build_setting(prepared.context, work.method, work.params, work.key, records)
        from harness.running.runfiles import record_sigma_model

        record_sigma_model(store, prepared.run_id, work.method, work.key, b.provider)
        built[name] = (b.provider, b.certifier, b.state, b.context)
    return built[name]


def _took_over(context: BuildContext, answer: LeaseAnswer, work: SettingWork, what: str) -> None:
    if answer.expired is not None:
        from harness.store.leases import display

        context.progress.note(
            f"{work.method} {work.key}: taking over {what} from process "
            f"{display(answer.expired)}, whose lease expired"
        )
