"""Components of plugins that run in a plugin host, as the harness holds them.

A third-party plugin (and, with ``IDRS_BENCH_ISOLATE=all``, a built-in one) is imported
only by a plugin host (:mod:`harness.plugin.host`), a process of its own. The harness's
registry holds, for each of its components, a spec whose factory asks the host to build
it, and the built objects here are proxies with the declared attributes the harness and
the checks read (harness/README.md, "Plugin host"):

- :class:`RemoteSigmaProvider`: ``regularity`` (and ``weights``), σ of a batch in one
  round trip (with each row's gradient when the caller differentiates; a σ-provider's σ of
  one row depends on that row only, as the replay check verifies); a declared
  :class:`~harness.engine.draws.SigmaSmoothing` is rebuilt here from its built-in
  architecture and state dict, since the harness draws it itself;
- :class:`RemoteCertifier`: ``smoothing``, ``order_dependent``, ``radius_formula``
  (resolved here when it is a function of idrs-bench, else a :class:`RemoteFormula`),
  ``certify(evidence)`` (the harness's draws go out, claims come back, checked), and a
  memory's ``ball_sigmas``/``order_spread`` and staged run state;
- trainers (the model's state goes out, the trained state comes back), datasets, and a
  method's parameter check.

The build context travels as data: the dataset's arrays (large ones once, as ``.npy``
files in a temporary folder), the base model's description and state
(:mod:`harness.plugin.model_description`; sent again when the model changes in place, as
the checks' analytic models do between trials), the protocol and the engine's settings.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.engine.draws import Evidence, SigmaSmoothing
from harness.engine.exact import ExactSampling
from harness.foundation import errors
from harness.foundation.errors import ContractError, IdrsError
from harness.foundation.threads import child_environment, stop_child
from harness.mathematics.radius import RadiusFormula, Recomputed, formula_from_record
from harness.plugin import messages, model_description, wire
from harness.plugin.components import BuildContext, RunMemo

INLINE_BYTES = 1 << 20
"""Arrays of a dataset up to this size travel in the message; larger ones as files."""


class PluginHost:
    """A ``python -m harness.plugin.host`` process, started on first use, and what it was
    told so far (contexts, models, arrays). Its stderr (the plugins' output) is echoed to
    this process's stderr; it ends when this object is closed or collected. Each request
    carries this process's thread count, which the host then computes with (the two take
    turns: harness/README.md, "Threads"), so that σ rounds as the run's own."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._lock = threading.RLock()
        self._tail: deque[str] = deque(maxlen=20)
        self._folder = tempfile.TemporaryDirectory(prefix="idrs-plugin-host-")
        self.generation = 0
        self.requests = 0
        """Requests answered so far (one per σ batch, per certify chunk, ...)."""
        self._reset()

    def _reset(self) -> None:
        self._contexts: dict[int, tuple[weakref.ref, str]] = {}
        self._models: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._arrays: dict[int, tuple[weakref.ref, int, dict[str, str]]] = {}  # by id
        self._memos: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._release: list[int] = []
        self._forget: list[str] = []
        self._count = 0

    def _start(self) -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, "-m", "harness.plugin.host", str(os.getpid())], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_environment(),
        )  # fmt: skip
        threading.Thread(target=self._echo, args=(process.stderr,), daemon=True).start()
        weakref.finalize(self, stop_child, process)
        self.generation += 1
        self._reset()
        return process

    def _echo(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace")
            self._tail.append(line.rstrip())
            with contextlib.suppress(OSError, ValueError):  # a closed stderr: keep the tail
                sys.stderr.write(line)

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request; its answer, or the plugin's error as an :class:`IdrsError`."""
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._process = self._start()
            process = self._process
            self.requests += 1
            message = {
                "op": op,
                **fields,
                "release": self._release,
                "forget": self._forget,
                "threads": torch.get_num_threads(),
            }  # (the run's count, as here)
            self._release, self._forget = [], []
            try:
                wire.write_message(process.stdin, message)
                answer = wire.read_message(process.stdout)
            except (BrokenPipeError, OSError, EOFError, wire.WireError) as exc:
                process.kill()
                process.wait()
                tail = " | ".join(list(self._tail)[-5:]) or "no output"
                raise IdrsError(f"the plugin host (python -m harness.plugin.host) failed "
                                f"({type(exc).__name__}, exit {process.returncode}): {tail}") from None  # fmt: skip
        if not isinstance(answer, dict) or not answer.get("ok"):
            raise _plugin_error(answer)
        return answer

    def close(self) -> None:
        with self._lock:
            if self._process is not None:
                stop_child(self._process)
                self._process = None
        self._folder.cleanup()

    # --- build contexts as data --------------------------------------------------------

    def context(self, context: BuildContext) -> str:
        """The token of ``context`` in the host, described to it the first time."""
        with self._lock:
            known = self._contexts.get(id(context))
            if known is not None and known[0]() is context:
                return known[1]
            self._count += 1
            token = f"c{self._count}"
            self.request("context", context=self._described(context, token))
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
            "artifact_root": None if context.artifact_root is None else str(context.artifact_root),
            "memo": self._memo(context.memos), "inputs_memo": self._memo(context.memos.inputs),
            "quiet": not context.progress.enabled,
        }  # fmt: skip

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
                path = Path(self._folder.name) / f"array-{self._count}.npy"
                np.save(path, value.detach().cpu().numpy(), allow_pickle=False)
                key = id(value)
                gone = weakref.ref(value, lambda _, key=key: self._arrays.pop(key, None))
                sent = self._arrays[key] = (gone, value._version, {"file": str(path)})
            return sent[2]

        return {"name": dataset.name, "train_x": array(dataset.train_x),
                "train_y": array(dataset.train_y), "test_x": array(dataset.test_x),
                "test_y": array(dataset.test_y), "num_classes": int(dataset.num_classes),
                "class_names": list(dataset.class_names), "files": dict(dataset.files)}  # fmt: skip


def _plugin_error(answer: Any) -> IdrsError:
    """The error a plugin raised in the host, as the harness's error of the same kind."""
    if not isinstance(answer, dict):
        return IdrsError(f"the plugin host answered {type(answer).__name__}, not an answer")
    kind = {name: getattr(errors, name) for name in ("ParameterError", "ContractError",
            "DatasetMissingError", "ModelOutputError", "UnknownNameError", "SpecError")}  # fmt: skip
    cls = kind.get(str(answer.get("error_type")), IdrsError)
    message = str(answer.get("error", "no message"))
    if cls is errors.UnknownNameError:
        cls = IdrsError
    if answer.get("error_type") == "error":
        tail = str(answer.get("traceback", "")).strip().splitlines()[-3:]
        message += " (in the plugin host: " + " | ".join(t.strip() for t in tail) + ")"
    return cls(message)


# --- proxies ------------------------------------------------------------------------------


@dataclass
class _Bound:
    """A component built in the host: its handle, the host's generation it lives in, and
    the context (here and its token there) it was built in."""

    host: PluginHost
    handle: int
    generation: int
    context: BuildContext
    token: str
    who: str

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        if self.generation != self.host.generation:
            raise IdrsError(f"{self.who} was built in a plugin host that has since stopped; "
                            "build the method again")  # fmt: skip
        return self.host.request(op, handle=self.handle, context=self.token,
                                 updates=self.host.updates(self.context), **fields)  # fmt: skip


class _RowGradient(torch.autograd.Function):
    """σ computed elsewhere, with each row's gradient ∂σ_i/∂x_i: the backward pass."""

    @staticmethod
    def forward(ctx, x, sigma, gradient):
        ctx.save_for_backward(gradient)
        return sigma.clone()

    @staticmethod
    def backward(ctx, grad_out):
        (gradient,) = ctx.saved_tensors
        return grad_out.reshape(-1, *([1] * (gradient.dim() - 1))) * gradient, None, None


class RemoteSigmaProvider:
    """A σ-provider built in a plugin host (see the module docstring)."""

    def __init__(self, bound: _Bound, declaration: Mapping[str, Any], registry) -> None:
        self._bound = bound
        weakref.finalize(self, bound.host.release, bound.handle, bound.generation)
        self.regularity = messages.regularity_from(declaration["regularity"], bound.who)
        device = bound.context.device
        if declaration.get("weights") is not None:
            self.weights = [torch.as_tensor(w).to(device) for w in declaration["weights"]]
        if declaration.get("smoothing") is not None:
            self.smoothing = _smoothing(declaration["smoothing"], bound, registry)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gradient = x.requires_grad and torch.is_grad_enabled()
        answer = self._bound.request("sigma", x=x.detach(), device=str(x.device),
                                     gradient=gradient)  # fmt: skip
        sigma = answer.get("sigma")
        if not isinstance(sigma, torch.Tensor):
            raise ContractError(f"{self._bound.who} returned {type(sigma).__name__} for σ; a "
                                "σ-provider returns a tensor of shape [B]")  # fmt: skip
        sigma = sigma.to(x.device)
        rows = answer.get("gradient")
        if gradient and isinstance(rows, torch.Tensor) and rows.shape == x.shape:
            return _RowGradient.apply(x, sigma, rows.to(x.device, x.dtype))
        return sigma


def _smoothing(declared: Mapping[str, Any], bound: _Bound, registry) -> SigmaSmoothing:
    """A declared σ-smoothing with its σ-estimator rebuilt here: the harness draws it."""
    architecture = declared.get("architecture")
    if architecture is None:
        raise ContractError(
            f"{bound.who} declares a σ-smoothing whose σ-estimator names no `architecture`; the "
            "harness draws σ itself, in a process without third-party code, so give "
            "SigmaSmoothing a built-in `architecture` (e.g. 'mlp') and its `architecture_params`"
        )
    levels = tuple(float(v) for v in declared["levels"])
    params = dict(declared.get("architecture_params") or {})
    context = bound.context
    model = model_description.build_model(registry, architecture, context.dataset.input_shape,
                                          len(levels), params)  # fmt: skip
    model.load_state_dict(declared["state"])
    return SigmaSmoothing(model.to(context.device).eval(), float(declared["noise"]), levels,
                          float(declared["alpha"]), architecture, params)  # fmt: skip


class RemoteCertifier:
    """A certifier built in a plugin host (see the module docstring)."""

    def __init__(self, bound: _Bound, declaration: Mapping[str, Any]) -> None:
        self._bound = bound
        weakref.finalize(self, bound.host.release, bound.handle, bound.generation)
        self.smoothing = str(declaration["smoothing"])
        self.order_dependent = bool(declaration["order_dependent"])
        self.radius_formula = resolve_formula(declaration["radius_formula"], bound.host,
                                              declaration.get("impure") or [])  # fmt: skip

    def certify(self, evidence: Evidence) -> list[Any]:
        answer = self._bound.request("certify", evidence=messages.evidence_message(evidence))
        state = self._bound.context.state
        for record in messages.records_from(answer.get("staged"), self._bound.who):
            if state is not None:
                state.stage(record.record, record.data)
        return messages.claims_from(answer.get("claims"), self._bound.who)

    def ball_sigmas(self, rows: Sequence[Mapping[str, Any]]) -> dict[int, float]:
        answer = self._bound.request("ball_sigmas", rows=list(rows))
        return {int(i): float(s) for i, s in zip(answer["ids"], answer["sigmas"], strict=True)}

    def order_spread(self, certificates, inputs, orders: int, radii, seed: int) -> dict[str, Any]:
        ids = list(inputs)
        stacked = torch.stack([inputs[i] for i in ids]) if ids else torch.zeros(0)
        return self._bound.request("order_spread", certificates=list(certificates), ids=ids,
                                   x=stacked, orders=orders, radii=list(radii), seed=seed)["spread"]  # fmt: skip


@dataclass(frozen=True)
class RemoteFormula(RadiusFormula):
    """A radius formula of a third-party plugin: re-derived by the plugin host (a claim,
    which S1 holds to exact smoothed classifiers); ``recorded`` is how it is named. It has
    no ``threshold`` the harness could compute, so its method certifies fixed-n only."""

    recorded: Mapping[str, Any] = field(default_factory=dict, compare=False)
    host: Any = field(default=None, compare=False, repr=False)
    impure: tuple[str, ...] = ()

    def derive(self, rows, inputs, protocol, regularity) -> Recomputed:
        answer = self.host.request(
            "recompute", formula=dict(self.recorded), rows=list(rows),
            inputs=None if inputs is None else torch.as_tensor(inputs).detach().cpu(),
            protocol=messages.protocol_message(protocol),
            regularity=messages.regularity_message(regularity),
        )  # fmt: skip
        who = f"radius formula {self.name!r}"
        if not answer.get("pure", False):
            raise ContractError(f"{who} is not a pure module-level function in its plugin")
        return messages.recomputed_from(answer.get("recomputed"), len(rows), who)

    def impure_parts(self) -> list[str]:
        return list(self.impure)


def _unavailable(*_: Any, **__: Any) -> Any:
    raise IdrsError("a remote radius formula is re-derived by its plugin host")


def resolve_formula(
    record: Mapping[str, Any], host: PluginHost, impure: Sequence[str]
) -> RadiusFormula:
    """The formula a certifier in a plugin host declares: idrs-bench's own function when it
    names one (resolved here, never asked of the host), else a :class:`RemoteFormula`."""
    from harness.mathematics.radius import builtin_packages

    qualified = str(record.get("recompute", ""))
    if qualified.split(".")[0] in builtin_packages() and not impure:
        return formula_from_record(dict(record))
    return RemoteFormula(str(record.get("name", qualified)), _unavailable, recorded=dict(record),
                         host=host, impure=tuple(str(p) for p in impure))  # fmt: skip
