"""The typed components a plugin registers, and the interfaces they build.

Each ``idrs_register_*`` hook receives a ``register`` callback and calls it with one
of the ``*Spec`` dataclasses below. A spec is cheap to create (no torch work); its
callable builds the actual object when a benchmark needs it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from harness.certificate import Certificate
    from harness.data import Dataset
    from harness.plugins import Registry
    from harness.progress import Progress
    from harness.protocol import CertificationProtocol
    from harness.regularity import Regularity
    from harness.runstate import RunState
    from harness.sampling import SamplingEngine


@runtime_checkable
class SigmaProvider(Protocol):
    """σ(x) > 0 for a batch, plus the regularity every certificate built on it relies on.

    Attributes the soundness checks read (and nothing else):

    - ``regularity``: the declared :data:`~harness.regularity.Regularity` of σ(x)
      (``Constant``, ``SemiElastic(rate)``, ``Lipschitz(lip, sigma_min)`` or
      ``Unregularized``). The certifier receives this provider and computes its radii
      from this declaration (e.g. Súkeník et al. 2022, Thm 3.2 uses ``rate``); S2
      measures σ against it and S3 checks the theorem's hypotheses with it.
    - ``weights`` (optional, Lipschitz providers): the weight matrices of a
      feed-forward network with 1-Lipschitz activations whose output plus a constant is
      σ(x); the harness then bounds Lip(σ) by the product of their spectral norms
      (Bergstrom et al., Thm 2) instead of trusting ``regularity.lip``.
    """

    regularity: Regularity

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Map inputs of shape [B, *input_shape] to σ of shape [B] (same device)."""
        ...


@runtime_checkable
class Certifier(Protocol):
    """Certifies a batch of inputs whose σ(x) the runner has already computed.

    Built by :meth:`CertifierSpec.build` with the σ-provider it certifies. Attributes the
    soundness checks read (and nothing else):

    - ``smoothing``: ``"hard"`` (the smoothed classifier is the majority class of
      f(x + σε); evidence: class counts) or ``"soft"`` (the argmax of E[g(x + σε)] for
      outputs g in [0, 1]; evidence: mean outputs).
    - ``order_dependent``: True when a certificate depends on the inputs certified
      before it (a memory, Alfarra et al. 2022, App. C); such certifiers must also
      satisfy :class:`OrderDependentCertifier`.
    - ``radius_formula``: the :class:`~harness.radius.RadiusFormula` that derives every
      stored certificate (bound on p_A, prediction, radius) from its stored evidence, the
      run's protocol and the provider's declared regularity; S0 re-derives each one.
    - ``engine``: the :class:`~harness.sampling.SamplingEngine` whose base model the
      certificates smooth (S4 attacks and re-samples that model).
    """

    smoothing: str
    order_dependent: bool
    radius_formula: Any
    engine: SamplingEngine

    def certify(
        self, x: torch.Tensor, sigma: torch.Tensor, input_ids: Sequence[int]
    ) -> Iterator[Certificate]:
        """Yield one certificate per input, in any order, as soon as each is final."""
        ...


@runtime_checkable
class OrderDependentCertifier(Certifier, Protocol):
    """A certifier whose certificates depend on the order of inputs (``order_dependent``).

    - ``ball_sigmas(rows)``: the σ that is constant inside each certified ball, by input id
      (S1 and S4 judge each ball against the smoothed classifier at that σ).
    - ``order_spread(certificates, inputs, orders, radii, seed)``: the certificates
      replayed over ``orders`` random input orders (Súkeník et al. 2022, App. C.2), as
      :func:`plugins.alfarra.order.replay_orders` returns them.
    """

    def ball_sigmas(self, rows: Sequence[Mapping[str, Any]]) -> dict[int, float]: ...

    def order_spread(
        self, certificates: Sequence[Mapping[str, Any]], inputs: Mapping[int, torch.Tensor],
        orders: int, radii: Sequence[float], seed: int,
    ) -> dict[str, Any]: ...  # fmt: skip


@dataclass
class BuildContext:
    """Everything a σ-provider or certifier factory may use for one benchmark.

    ``run_id``, ``method`` and ``setting`` name the work the components are built for
    (set by the runner); ``state`` is that setting's :class:`~harness.runstate.RunState`
    in the run's database (a certifier with per-run state, such as a memory, restores
    from it and stages new records; None outside a run), and
    ``registry`` resolves components by name (e.g. a wrapped certifier); ``model_hash``
    is the base model's content hash (a key for anything fitted to it).
    """

    dataset: Dataset
    model: torch.nn.Module
    device: torch.device
    seed: int
    protocol: CertificationProtocol
    engine: SamplingEngine
    progress: Progress
    registry: Registry | None = None
    model_hash: str | None = None
    run_id: str | None = None
    method: str | None = None
    setting: str | None = None
    state: RunState | None = None


@dataclass
class TrainContext:
    """What a trainer may use: where to train, the seed, and a progress reporter."""

    device: torch.device
    seed: int
    progress: Progress


@dataclass(frozen=True)
class SigmaProviderSpec:
    """``build(context, params) -> SigmaProvider``."""

    name: str
    build: Callable[[BuildContext, Mapping[str, Any]], SigmaProvider]
    description: str = ""


@dataclass(frozen=True)
class CertifierSpec:
    """``build(context, params, sigma_provider) -> Certifier``.

    The certifier is built with the σ-provider whose σ(x) it certifies and takes every
    property of σ it relies on from ``sigma_provider.regularity``, never from ``params``.
    """

    name: str
    build: Callable[[BuildContext, Mapping[str, Any], SigmaProvider], Certifier]
    description: str = ""


@dataclass(frozen=True)
class TrainerSpec:
    """``train(model, dataset, params, context)`` trains ``model`` in place.

    ``defaults`` lists every parameter the trainer accepts with its default value.
    """

    name: str
    train: Callable[[torch.nn.Module, Dataset, Mapping[str, Any], TrainContext], None]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""


@dataclass(frozen=True)
class MethodSpec:
    """A named composition: one σ-provider, one certifier, their default parameters.

    ``defaults`` lists every parameter a benchmark setting may override; both the
    σ-provider and the certifier receive the merged parameters. ``check(params)``,
    if given, raises :class:`~harness.errors.ParameterError` for invalid values; it
    runs before any work starts.
    """

    name: str
    sigma_provider: str
    certifier: str
    defaults: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""
    check: Callable[[Mapping[str, Any]], None] | None = None


@dataclass(frozen=True)
class DatasetSpec:
    """``load(data_root, **family_args) -> Dataset``.

    A name ending in ``-N`` (e.g. ``cone-N``) declares a family: ``cone-60`` loads
    with ``dim=60``.
    """

    name: str
    load: Callable[..., Dataset]
    description: str = ""


@dataclass(frozen=True)
class ModelSpec:
    """``build(input_shape, num_classes, params) -> torch.nn.Module`` (logits)."""

    name: str
    build: Callable[[tuple[int, ...], int, Mapping[str, Any]], torch.nn.Module]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""


@dataclass(frozen=True)
class CheckSpec:
    """A soundness check: ``run(...)`` audits a method's certificates."""

    name: str
    run: Callable[..., Any]
    description: str = ""


COMPONENT_KINDS: dict[str, type] = {
    "sigma_providers": SigmaProviderSpec,
    "trainers": TrainerSpec,
    "certifiers": CertifierSpec,
    "methods": MethodSpec,
    "datasets": DatasetSpec,
    "models": ModelSpec,
    "checks": CheckSpec,
}
