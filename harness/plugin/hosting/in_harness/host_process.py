"""A plugin host as the harness holds it: started, confined, told, asked within a limit, ended.

:class:`PluginHost` starts ``python -m harness.plugin.hosting.in_host.host``
(:mod:`harness.plugin.hosting.in_host.host`; its process:
:mod:`harness.plugin.hosting.in_harness.running_host`) for one third-party distribution (or
the built-ins, with ``IDRS_BENCH_ISOLATE=all``), with a folder of its own
(:mod:`harness.plugin.hosting.in_harness.host_folder`): ``sent/``, where this process
writes what the host reads (large dataset arrays, as ``.npy`` files: the host may not write
there, so nothing it does can redirect the harness's writes), and a scratch folder per host
process, its ``$TMPDIR``, ``$HOME`` and caches, the only place besides its plugins' artifact
folders that a confined host writes (:mod:`harness.plugin.hosting.shared.policy`), removed
when it ends. The build context travels as data: the dataset's arrays (large ones once), the
base model's description and state (:mod:`harness.plugin.model_description`; sent
again when the model changes in place, as the checks' analytic models do between trials),
the protocol and the engine's settings, and where its plugins keep artifacts; of the dataset
only its training split and description (the test split stays here, and so do the paths
of the data files, which name the test split's: a host's ``dataset.files`` is empty). An
answer that says a request failed becomes the harness's error of the same kind
(:func:`plugin_error`). Its requests are those of
:mod:`harness.plugin.hosting.shared.host_protocol`, a typed method each
(:class:`~harness.plugin.hosting.in_harness.host_client.HostClient`).

Every request has a time limit
(:func:`~harness.plugin.hosting.in_harness.limits.plugin_timeout`): a host past it, a host
that died (its keeper says how) and a host that wrote something other than an answer are
ended with every process they started, and the request fails with an :class:`IdrsError`
saying which host, which request and what happened; the next request starts another host
(whose components are built anew: :class:`HostStopped`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.engine.exact import ExactSampling
from harness.foundation import errors
from harness.foundation.errors import ContractError, IdrsError
from harness.foundation.threads import child_environment
from harness.plugin import model_description
from harness.plugin.components import BuildContext, RunMemo
from harness.plugin.entry_points import artifact_grants
from harness.plugin.hosting.in_harness.exchange import HostEnded, PastDeadline
from harness.plugin.hosting.in_harness.host_client import HostClient, Updates
from harness.plugin.hosting.in_harness.host_folder import (
    HostFolder,
    scratch_environment,
    sweep_abandoned,
)
from harness.plugin.hosting.in_harness.limits import (
    START_SECONDS,
    answer_limit,
    past_limit,
    past_size,
    plugin_timeout,
)
from harness.plugin.hosting.in_harness.running_host import RunningHost
from harness.plugin.hosting.shared import host_protocol, messages, wire
from harness.plugin.hosting.shared.policy import LAYERS, HostPaths, gpu_devices

HOST_MODULE = "harness.plugin.hosting.in_host.host"
"""The plugin host's entry point (``python -m``)."""
INLINE_BYTES = 1 << 20
"""Arrays of a dataset up to this size travel in the message; larger ones as files."""
_LIVE: weakref.WeakSet[PluginHost] = weakref.WeakSet()
_SWEPT: list[bool] = []


class HostStopped(IdrsError):
    """A request about what a plugin host built before it stopped (its handles are gone)."""


def running_hosts() -> list[PluginHost]:
    """The plugin hosts of this process whose host process is running."""
    return [host for host in list(_LIVE) if host.running]


class _Held:
    """What a :class:`PluginHost` holds that outlives it until collected: its folder and
    its running process (ended by :meth:`close`, also as the host's finalizer)."""

    def __init__(self) -> None:
        self.folder = HostFolder()
        self.running: RunningHost | None = None

    def stop(self) -> None:
        running, self.running = self.running, None
        if running is not None:
            running.end()

    def close(self) -> None:
        self.stop()
        self.folder.remove()


class PluginHost(HostClient):
    """A ``python -m harness.plugin.hosting.in_host.host`` process, started on first use, and
    what it was told so far (contexts, models, arrays). Its output (the plugins' prints) is echoed
    to this process's stderr; it ends when this object is closed or collected. Each request
    carries this process's thread count, which the host then computes with (the two take
    turns: harness/README.md, "Threads"), so that σ rounds as the run's own.

    It loads the built-ins and the plugins ``plugins`` of ``distribution`` (None: the built-ins
    only), installed in ``prefix`` when ``idrs-bench plugins install`` put them there.
    ``confined``: the host confines itself (its policy:
    :func:`harness.plugin.hosting.shared.policy.host_policy`) to reading its Python, its
    distribution's files, what this process sends it (a folder of its own) and the data roots
    its datasets are asked to load from (:meth:`grant_read`), and to writing its scratch
    directory (its ``$TMPDIR``, ``$HOME`` and caches, removed with it) and its plugins' artifact
    folders under the cache root it started with. ``layers``: the confinement's layers
    (:data:`~harness.plugin.hosting.shared.policy.LAYERS`, all of them; fewer only for
    :mod:`harness.plugin.hosting.in_harness.confinement_probe`)."""

    def __init__(self, distribution: str | None = None, plugins: Sequence[str] = (),
                 prefix: Path | None = None, confined: bool = False,
                 builtins: Sequence[str] = (),
                 layers: Sequence[str] = LAYERS) -> None:  # fmt: skip
        self.distribution, self.plugins, self.prefix = distribution, tuple(plugins), prefix
        self.confined, self.layers = confined, tuple(layers)
        self.builtins = tuple(builtins)
        """The built-in plugins, whose artifact folders the host reads (a built-in
        σ-provider built there by name finds what the harness's own copy fitted); a host
        whose plugins are named like one of them is never started
        (:func:`~harness.plugin.entry_points.artifact_grants`)."""
        self._lock = threading.RLock()
        if not _SWEPT:  # the folders of hosts whose harness was killed, once per process
            _SWEPT.append(True)
            sweep_abandoned()
        self._held = _Held()
        weakref.finalize(self, self._held.close)
        _LIVE.add(self)
        self._sent = self._held.folder.sent  # what this process writes, the host reads
        self._readable: list[Path] = []
        self._artifact_root: Path | None = None
        self.generation = 0
        self.abi = 0
        """The Landlock ABI the host is confined with (0: unconfined or not started)."""
        self.requests = 0
        """Requests answered so far (one per σ batch, per certify chunk, ...)."""
        self.ended: list[str] = []
        """How each host process that failed a request ended, in words."""
        self._reset()

    def _reset(self) -> None:
        self._contexts: dict[int, tuple[weakref.ref, str]] = {}
        self._models: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._arrays: dict[int, tuple[weakref.ref, int, dict[str, str]]] = {}  # by id
        self._memos: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._release: list[int] = []
        self._forget: list[str] = []
        self._count = 0

    @property
    def running(self) -> bool:
        """Whether a host process is running now."""
        running = self._held.running
        return running is not None and running.alive()

    @property
    def process(self) -> RunningHost | None:
        """The running host process (its keeper and the host), if one was started."""
        return self._held.running

    def start(self) -> None:
        """Start the host process now (it imports its plugins meanwhile), unless running."""
        with self._lock:
            if not self.running:
                self._start()

    def _start(self) -> RunningHost:
        """Start a host process; a :class:`~harness.plugin.entry_points.PluginNameError`
        (nothing started) when a confined host's artifact folders cannot be granted."""
        from harness.foundation.artifacts import cache_root

        artifact_root = cache_root().resolve()
        if self.confined:  # (checked first: a refused folder starts nothing)
            own, shared = artifact_grants(artifact_root, self.plugins, self.builtins)
        self._held.stop()  # (one that has ended: its keeper's report is read)
        self.generation += 1
        scratch = self._held.folder.scratch(self.generation)
        environment = child_environment()
        environment.update(scratch_environment(scratch))
        self._artifact_root = artifact_root
        start = {"distribution": self.distribution, "grants": None,
                 "prefix": None if self.prefix is None else str(self.prefix),
                 "scratch": str(scratch), "folder": str(self._held.folder.path)}  # fmt: skip
        if self.distribution is not None:  # the host loads these of its distribution only
            start["plugins"] = list(self.plugins)
        if self.confined:  # (what each is granted: the policy's, host_policy)
            start["grants"] = HostPaths(
                sent=str(self._sent), data_roots=tuple(str(p) for p in self._readable),
                builtin_artifacts=tuple(str(p) for p in shared), scratch=str(scratch),
                artifacts=tuple(str(p) for p in own), gpu=tuple(gpu_devices()),
            ).to_message()  # fmt: skip
            if self.layers != LAYERS:
                start["layers"] = list(self.layers)
        root = Path(__file__).resolve().parents[4]  # the folder holding this harness
        if root == Path.cwd().resolve():  # found through the working directory, which -P
            # keeps off the host's path (else the host would read all of it)
            environment["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(root), environment.get("PYTHONPATH")) if p
            )
        self._held.running = RunningHost(
            [sys.executable, "-P", "-m", HOST_MODULE], start, environment, self.name,
        )  # fmt: skip
        self._reset()
        return self._held.running

    def grant_read(self, path: str | Path) -> None:
        """Let the host read beneath ``path`` (a dataset's data root): a running confined
        host that may not is stopped, and the next request starts one that may."""
        path = Path(path).resolve()
        if any(path.is_relative_to(p) for p in self._readable):
            return
        self._readable.append(path)
        if self.confined:
            self.stop()

    @property
    def name(self) -> str:
        """The host as errors name it: by the distribution whose plugins it loads."""
        of = "the built-in plugins" if self.distribution is None else self.distribution
        return f"the plugin host of {of}"

    def stop(self) -> None:
        """End the host process, and every process it started (the next request starts
        another: built components are lost, and say so when used); one that does not end
        within the grace period is killed."""
        with self._lock:
            self._held.stop()

    def close(self) -> None:
        """End the host process and remove the host's folder."""
        with self._lock:
            self._held.close()

    def send(self, request: host_protocol.HostRequest, generation: int | None = None,
             updates: Updates = ()) -> dict[str, Any]:  # fmt: skip
        """Send one request (with the base models' ``updates``); its answer, or the plugin's
        error as an :class:`IdrsError`. ``generation``: the host's generation the request's
        handles and tokens belong to (:class:`HostStopped` when the host has since been
        started again). A request not answered within the limit, whose answer claims more
        bytes than the request can need
        (:func:`~harness.plugin.hosting.in_harness.limits.answer_limit`, checked before
        anything is allocated for it), or whose host ends or breaks the wire, ends the host
        and raises an :class:`IdrsError` that says so (see the module docstring)."""
        op = request.op.value
        with self._lock:
            running = self._running()
            if generation is not None and generation != self.generation:
                raise HostStopped("built in a plugin host that has since stopped")
            self.requests += 1
            message = host_protocol.message(  # (the run's thread count, as here)
                request, release=self._release, forget=self._forget,
                threads=torch.get_num_threads(), updates=list(updates),
            )  # fmt: skip
            self._release, self._forget = [], []
            limit = plugin_timeout()
            size = answer_limit(request)
            frame = wire.encode(message)
            starting = START_SECONDS if running.answered == 0 else 0.0  # (its imports)
            try:
                answer = running.ask(frame, time.monotonic() + limit + starting, size)
            except PastDeadline:
                self._failed(running)
                raise IdrsError(past_limit(self.name, op, limit)) from None
            except wire.PastLimit as exc:
                self._failed(running)
                raise IdrsError(past_size(self.name, op, exc)) from None
            except (HostEnded, wire.WireError) as exc:
                doing = f"while answering the request {op!r}"
                if isinstance(exc, wire.WireError):
                    doing = f"after it wrote something other than an answer to {op!r} ({exc})"
                words = self._failed(running, doing, isinstance(exc, HostEnded))
                raise IdrsError(f"{self.name} (python -m {HOST_MODULE}) {words}; its last "
                                f"output: {running.output.tail()}") from None  # fmt: skip
            except BaseException:  # (Ctrl-C, SIGTERM: the host is mid-request)
                self._failed(running)
                raise
        if not isinstance(answer, dict) or not answer.get("ok"):
            raise plugin_error(answer, self.name)
        return answer

    def _running(self) -> RunningHost:
        """The running host process, started when there is none (a host that ended between
        two requests, e.g. killed by the kernel, is started again before anything is
        described to it: it knows nothing of what the one before was told)."""
        running = self._held.running
        if running is None or not running.alive():
            running = self._start()
        return running

    def _failed(self, running: RunningHost, doing: str = "", ended: bool = False) -> str:
        """End the host of a request that failed, now (``ended``: it has ended); how it
        ended, in words (``doing``: what it was doing)."""
        running.kill(ended)
        self._held.running = None
        self._reset()  # (the next host is told everything again)
        self.ended.append(running.ending(doing))
        return self.ended[-1]

    # --- build contexts as data --------------------------------------------------------

    def token(self, context: BuildContext) -> str:
        """The token of ``context`` in the host, described to it the first time."""
        with self._lock:
            self._running()
            known = self._contexts.get(id(context))
            if known is not None and known[0]() is context:
                return known[1]
            self._count += 1
            token = f"c{self._count}"
            described = self._described(context, token)
            try:
                self.context(described)
            except IdrsError:  # the host may not have kept the model this request described:
                if set(described["model"]) != {"key"}:  # describe it again next time, so the
                    self._models.pop(context.model, None)  # next build fails as this one did
                raise
            self._contexts[id(context)] = (weakref.ref(context, self._forgotten(token)), token)
            return token

    def _forgotten(self, token: str):
        generation = self.generation

        def forget(_ref) -> None:
            if generation == self.generation:
                self._forget.append(token)

        return forget

    def release(self, handle: int, generation: int) -> None:
        if generation == self.generation:
            self._release.append(handle)

    def _described(self, context: BuildContext, token: str) -> dict[str, Any]:
        engine = context.engine
        state = None if context.state is None else messages.records_message(context.state.records())
        return {
            "token": token, "dataset": self._dataset(context.dataset),
            "model": self._model(context.model), "device": str(context.device),
            "seed": int(context.seed), "protocol": messages.protocol_message(context.protocol),
            "engine": {"num_classes": engine.num_classes, "batch_size": engine.batch_size,
                       "seed": int(engine.seed), "noise": engine.noise,
                       "pad_batches": bool(engine.pad_batches),
                       "exact": isinstance(engine, ExactSampling)},
            "recipe_hash": context.recipe_hash, "run_id": context.run_id,
            "method": context.method, "setting": context.setting, "state": state,
            **self._artifacts(context.artifact_root),
            "memo": self._memo(context.memos), "inputs_memo": self._memo(context.memos.inputs),
            "quiet": not context.progress.enabled,
        }  # fmt: skip

    def _artifacts(self, root: Path | None) -> dict[str, Any]:
        """Where a context's plugins keep artifacts: ``root`` (None: the cache root), which
        a confined host writes when it is the cache root the host started with (else it
        keeps them in its scratch directory: an audit's temporary root)."""
        from harness.foundation.artifacts import cache_root

        root = (cache_root() if root is None else Path(root)).resolve()
        return {"artifact_root": str(root),
                "granted": not self.confined or root == self._artifact_root}  # fmt: skip

    def _memo(self, memos: RunMemo) -> str:
        if memos not in self._memos:
            self._count += 1
            self._memos[memos] = f"m{self._count}"
        return self._memos[memos]

    def _model(self, model: torch.nn.Module) -> dict[str, Any]:
        known = self._models.get(model)
        if known is not None:
            return {"key": known[0]}
        self._count += 1
        key = f"model{self._count}"
        try:
            described = {"description": model_description.describe(model),
                         "state": model_description.state_of(model)}  # fmt: skip
        except ContractError as exc:  # the host's plugins get a stand-in that says why
            self._models[model] = [key, None]
            return {"key": key, "absent": str(exc)}
        self._models[model] = [key, model_description.fingerprint(model)]
        return {"key": key, **described}

    def updates(self, context: BuildContext) -> list[dict[str, Any]]:
        """The change of ``context``'s base model since the host last saw it (none or one)."""
        model = context.model
        known = self._models.get(model)
        if known is None or known[1] is None:  # not sent, or absent there
            return []
        now = model_description.fingerprint(model)
        if now == known[1]:
            return []
        known[1] = now
        return [{"key": known[0], "description": model_description.describe(model),
                 "state": model_description.state_of(model)}]  # fmt: skip

    def _dataset(self, dataset: Any) -> dict[str, Any]:
        def array(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return None  # absent (e.g. no training split): using it there raises
            if value.numel() * value.element_size() <= INLINE_BYTES:
                return value
            sent = self._arrays.get(id(value))  # (tensors compare by value: keyed by id)
            if sent is None or sent[0]() is not value or sent[1] != value._version:
                self._count += 1
                path = self._sent / f"array-{self._count}.npy"
                np.save(path, value.detach().cpu().numpy(), allow_pickle=False)
                key = id(value)
                gone = weakref.ref(value, lambda _, key=key: self._arrays.pop(key, None))
                sent = self._arrays[key] = (gone, value._version, {"file": str(path)})
            return sent[2]

        # a TrainingSplit: the test split is never sent (docs/plugins.md), nor where the data
        # files are (they name the test split's files too): ``files`` is left empty
        return {"name": dataset.name, "train_x": array(dataset.train_x),
                "train_y": array(dataset.train_y), "num_classes": int(dataset.num_classes),
                "input_shape": list(dataset.input_shape), "class_names": list(dataset.class_names),
                "files": {}}  # fmt: skip


def plugin_error(answer: Any, host: str = "the plugin host") -> IdrsError:
    """The error a plugin raised in ``host`` (:attr:`PluginHost.name`), as the harness's
    error of the same kind, saying where it was raised (one that is not the harness's, with
    the last lines of its traceback)."""
    if not isinstance(answer, dict):
        return IdrsError(f"{host} answered {type(answer).__name__}, not an answer")
    kind = {name: getattr(errors, name) for name in ("ParameterError", "ContractError",
            "DatasetMissingError", "ModelOutputError", "UnknownNameError", "SpecError")}  # fmt: skip
    cls = kind.get(str(answer.get("error_type")), IdrsError)
    message = str(answer.get("error", "no message"))
    if cls is errors.UnknownNameError:
        cls = IdrsError
    if answer.get("error_type") == "error":
        tail = str(answer.get("traceback", "")).strip().splitlines()[-3:]
        message += f" (in {host}: " + " | ".join(t.strip() for t in tail) + ")"
    elif host not in message:  # (e.g. an answer the host could not send: a complex σ)
        message += f" (in {host})"
    return cls(message)
