"""Components of plugins that run in a plugin host, as the harness holds them.

A third-party plugin (and, with ``IDRS_BENCH_ISOLATE=all``, a built-in one) is imported only
by a plugin host (:mod:`harness.plugin.hosting.in_host.host`), a process of its own. The
harness's registry holds, for each of its components, a spec whose factory asks the host to
build it, and the built objects here are proxies with the declared attributes the harness
and the checks read (harness/README.md, "Plugin host"):

- :class:`RemoteSigmaProvider`: ``regularity`` (and ``weights``), σ of a batch in one
  round trip (with each row's gradient when the caller differentiates; a σ-provider's σ of
  one row depends on that row only, as the replay check verifies); a declared
  :class:`~harness.engine.draws.SigmaSmoothing` is rebuilt here from its built-in
  architecture and state dict, since the harness draws it itself;
- :class:`RemoteCertifier`: ``smoothing``, ``order_dependent``, ``radius_formula``
  (resolved here when it is a function of idrs-bench, else a :class:`RemoteFormula`),
  ``certify(evidence)`` (the harness's draws go out, claims come back, checked), and a
  memory's ``ball_sigmas``/``order_replays`` and staged run state;
- trainers (the model's state goes out, the trained state comes back), datasets, and a
  method's parameter check.

Each asks the host it was built in
(:class:`harness.plugin.hosting.in_harness.host_process.PluginHost`), by the typed method of
its request (:class:`~harness.plugin.hosting.in_harness.host_client.HostClient`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from harness.engine.draws import Evidence, SigmaSmoothing
from harness.foundation.certificate import unlabelled
from harness.foundation.errors import ContractError, IdrsError
from harness.mathematics.radius import RadiusFormula, Recomputed, formula_from_record
from harness.plugin import model_description
from harness.plugin.components import BuildContext
from harness.plugin.hosting.in_harness.host_client import HostClient
from harness.plugin.hosting.shared import messages

if TYPE_CHECKING:
    from harness.plugin.hosting.in_harness.host_process import PluginHost


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
    builtin: bool = False

    def ask(self, request: Callable[..., dict[str, Any]], **fields: Any) -> dict[str, Any]:
        """``request`` (a :class:`HostClient` method of a request about a built component)
        of this component, with ``fields``."""
        from harness.plugin.hosting.in_harness.host_process import HostStopped

        try:
            return request(self.host, self.handle, self.token, **fields,
                           generation=self.generation,
                           updates=self.host.updates(self.context))  # fmt: skip
        except HostStopped:
            raise IdrsError(f"{self.who} was built in a plugin host that has since stopped; "
                            "build the method again") from None  # fmt: skip


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
        if declaration.get("centred") is True:  # a noise centre (harness.engine.centre)
            self.centre = self._centre

    def _centre(self, x: torch.Tensor) -> Any:
        """μ(x) as the host answers it (checked by the harness, :func:`harness.engine.centre.
        checked_centre`)."""
        answer = self._bound.ask(HostClient.centre, x=x.detach(), device=str(x.device))
        centre = answer.get("centre")
        return centre.to(x.device) if isinstance(centre, torch.Tensor) else centre

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gradient = x.requires_grad and torch.is_grad_enabled()
        answer = self._bound.ask(HostClient.sigma, x=x.detach(), device=str(x.device),
                                 gradient=gradient)  # fmt: skip
        sigma = messages.sigma_from(answer.get("sigma"), len(x), self._bound.who,
                                    tuple(x.shape[1:])).to(x.device)  # fmt: skip
        rows = answer.get("gradient")
        if (
            gradient
            and sigma.dim() == 1
            and isinstance(rows, torch.Tensor)
            and rows.shape == x.shape
        ):
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
        self.diagonal_scale = declaration.get("diagonal_scale") is True
        self.centred = declaration.get("centred") is True
        self.radius_formula = resolve_formula(declaration["radius_formula"], bound.host,
                                              declaration.get("impure") or [])  # fmt: skip

    def certify(self, evidence: Evidence) -> list[Any]:
        answer = self._bound.ask(HostClient.certify,
                                 evidence=messages.evidence_message(evidence))  # fmt: skip
        state = self._bound.context.state
        for record in messages.records_from(answer.get("staged"), self._bound.who):
            if state is not None:
                state.stage(record.record, record.data)
        return messages.claims_from(answer.get("claims"), self._bound.who)

    def ball_sigmas(self, rows: Sequence[Mapping[str, Any]]) -> dict[int, float]:
        answer = self._bound.ask(HostClient.ball_sigmas, rows=list(rows))
        return {int(i): float(s) for i, s in zip(answer["ids"], answer["sigmas"], strict=True)}

    def order_replays(self, certificates, inputs, orders: int, seed: int) -> dict[str, Any]:
        ids = list(inputs)
        stacked = torch.stack([inputs[i] for i in ids]) if ids else torch.zeros(0)
        return self._bound.ask(HostClient.order_replays, certificates=unlabelled(certificates),
                               ids=ids, x=stacked, orders=orders, seed=seed)["replays"]  # fmt: skip


@dataclass(frozen=True)
class RemoteFormula(RadiusFormula):
    """A radius formula of a third-party plugin: re-derived by the plugin host (a claim,
    which S1 holds to exact smoothed classifiers); ``recorded`` is how it is named. It has
    no ``threshold`` the harness could compute, so its method certifies fixed-n only."""

    recorded: Mapping[str, Any] = field(default_factory=dict, compare=False)
    host: Any = field(default=None, compare=False, repr=False)
    impure: tuple[str, ...] = ()

    def derive(self, rows, inputs, protocol, regularity) -> Recomputed:
        answer = self.host.recompute(
            formula=dict(self.recorded), rows=unlabelled(rows),
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
