"""The typed components a plugin registers, the interfaces they build, and their registry.

Each ``idrs_register_*`` hook receives a ``register`` callback and calls it with one
of the ``*Spec`` dataclasses below. A spec is cheap to create (no torch work); its
callable builds the actual object when a benchmark needs it, from a
:class:`BuildContext` (σ-providers, certifiers) or a :class:`TrainContext` (trainers).
The :class:`~harness.plugin.registry.Registry` holds the specs by kind and name with the plugin that provided
each; a context carries it, so a factory can resolve other components by name.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from harness.foundation.data import Dataset, TrainingSplit

if TYPE_CHECKING:
    import torch

    from harness.engine.draws import Claim, Evidence
    from harness.engine.sampling import SamplingEngine
    from harness.foundation.progress import Progress
    from harness.foundation.protocol import CertificationProtocol
    from harness.foundation.regularity import Regularity
    from harness.foundation.runstate import RunState
    from harness.plugin.registry import Registry

T = TypeVar("T")


@runtime_checkable
class SigmaProvider(Protocol):
    """σ(x) > 0 for a batch, plus the regularity every certificate built on it relies on.

    Attributes the soundness checks read (and nothing else):

    - ``regularity``: the declared :data:`~harness.foundation.regularity.Regularity` of σ(x)
      (``Constant``, ``SemiElastic(rate)``, ``Lipschitz(lip, sigma_min)`` or
      ``Unregularized``). The certifier receives this provider and computes its radii
      from this declaration (e.g. Súkeník et al. 2022, Thm 3.2 uses ``rate``); S2
      measures σ against it and S3 checks the theorem's hypotheses with it.
    - ``weights`` (optional, Lipschitz providers): the weight matrices of a
      feed-forward network with 1-Lipschitz activations whose output plus a constant is
      σ(x); the harness then bounds Lip(σ) by the product of their spectral norms
      (Bergstrom et al., Thm 2) instead of trusting ``regularity.lip``.
    - ``smoothing`` (optional): a :class:`~harness.engine.draws.SigmaSmoothing`, for a σ(x)
      that is a smoothed classifier's choice among noise levels (Sun et al. 2026). The
      harness then draws that smoothing itself and sets σ(x) from its counts
      (:func:`harness.certification.certify.sigma_of`); the provider is not called for σ.

    A provider may answer a *diagonal scale* instead, one σ per input dimension: shape
    [B, *input_shape] or [B, d] (:mod:`harness.engine.scale`). The harness then draws
    x + σ_i(x)·ε_i, records the scale with the draws and the smallest axis as the
    certificate's σ, and certifies only with a certifier that declares
    ``diagonal_scale = True`` (:mod:`harness.certification.diagonal`).

    Beside a diagonal scale a provider may answer a noise centre through a method
    ``centre(x)`` (shape [B, *input_shape] or [B, d]; UCAN's μ(x)): the harness then draws
    the samples of x at x + μ(x), records μ with the draws and certifies only with a
    certifier that declares ``centred = True`` (:mod:`harness.engine.centre`).
    """

    regularity: Regularity

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Map inputs of shape [B, *input_shape] to σ of shape [B] (same device), or to a
        diagonal scale of shape [B, *input_shape] or [B, d]."""
        ...


@runtime_checkable
class Certifier(Protocol):
    """Claims certificates from the samples the harness drew (harness/README.md,
    "Certifier contract").

    Built by :meth:`CertifierSpec.build` with the σ-provider it certifies. The harness
    draws, for every input, n0 selection and n estimation samples of the base model at
    σ(x) and passes them as :class:`~harness.engine.draws.Evidence`; ``certify`` answers one
    :class:`~harness.engine.draws.Claim` per input (never samples, counts or n: the harness
    records those itself). Attributes the harness and the checks read (and nothing else):

    - ``smoothing``: ``"hard"`` (the smoothed classifier is the majority class of
      f(x + σε); the harness draws class counts) or ``"soft"`` (the argmax of
      E[softmax f(x + σε)]; the harness draws mean outputs).
    - ``order_dependent``: True when a claim depends on the inputs certified before it
      (a memory, Alfarra et al. 2022, App. C); such certifiers must also satisfy
      :class:`OrderDependentCertifier`.
    - ``radius_formula``: the :class:`~harness.mathematics.radius.RadiusFormula` that derives every
      stored certificate (bound on p_A, prediction, radius) from the harness's draws, the
      run's protocol and the provider's declared regularity; S0 re-derives each one.
    - ``diagonal_scale`` (optional, default False): True when its claims hold for evidence
      drawn at a diagonal scale (``Evidence.scale``; ``Evidence.sigma`` its smallest axis),
      where it may also claim an ellipsoid (``Claim.ellipsoid``); a σ-provider's diagonal
      scale is certified by no other certifier.
    - ``centred`` (optional, default False): True when its claims hold for evidence drawn
      around a σ-provider's noise centre (``Evidence.centre``, :mod:`harness.engine.centre`).
    """

    smoothing: str
    order_dependent: bool
    radius_formula: Any

    def certify(self, evidence: Evidence) -> Sequence[Claim]:
        """One claim per input of ``evidence``, in its order."""
        ...


@runtime_checkable
class OrderDependentCertifier(Certifier, Protocol):
    """A certifier whose certificates depend on the order of inputs (``order_dependent``).

    - ``ball_sigmas(rows)``: the σ that is constant inside each certified ball, by input id
      (S1 and S4 judge each ball against the smoothed classifier at that σ).
    - ``order_replays(certificates, inputs, orders, seed)``: the certificates (without
      their labels) replayed over ``orders`` random input orders (Súkeník et al. 2022,
      App. C.2): ``{"input_id": [...], "orders": [{"prediction": [...], "radius": [...]},
      ...], "recorded": {...} or None}`` (the run's own order), as
      :func:`plugins.alfarra.order.replay_orders` returns them; the harness scores each
      order with the labels (:func:`harness.audit.order.order_spread`).
    """

    def ball_sigmas(self, rows: Sequence[Mapping[str, Any]]) -> dict[int, float]: ...

    def order_replays(
        self, certificates: Sequence[Mapping[str, Any]], inputs: Mapping[int, torch.Tensor],
        orders: int, seed: int,
    ) -> dict[str, Any]: ...  # fmt: skip


def declared_members(protocol: type) -> tuple[str, ...]:
    """The members a protocol of the contract declares, in order: what the class bodies of
    ``protocol`` and the protocols it extends annotate (attributes) or define (methods,
    properties, and special methods such as ``__call__``), not what ``typing`` and ``abc``
    add to every protocol class (its private names and the special methods it sets)."""
    names: dict[str, None] = {}
    for cls in reversed(protocol.__mro__):
        if cls in (object, Protocol) or cls.__module__ == "typing":
            continue
        for name in inspect.get_annotations(cls):
            names[name] = None
        for name, value in vars(cls).items():
            special = name.startswith("__") and name.endswith("__")
            written = inspect.isfunction(value) and value.__qualname__.startswith(
                f"{cls.__qualname__}.")  # fmt: skip
            if (special and written) or not name.startswith("_"):
                names[name] = None
    return tuple(names)


def missing_members(obj: Any, protocol: type) -> list[str]:
    """The members of :func:`declared_members` that ``obj`` lacks, by ordinary attribute
    lookup (``hasattr``: instance attributes, class attributes, properties, ``__getattr__``),
    a special method in its class or a base, where Python looks it up (``obj(x)`` calls
    ``type(obj).__call__``). A component is accepted when this is empty, however it provides
    its members and on every Python (``isinstance`` on a runtime-checkable protocol looks
    members up statically since Python 3.12, missing those a ``__getattr__`` serves)."""
    missing = []
    for name in declared_members(protocol):
        if name.startswith("__") and name.endswith("__"):
            found = any(name in vars(cls) for cls in type(obj).__mro__)
        else:
            found = hasattr(obj, name)
        if not found:
            missing.append(name)
    return missing


@dataclass
class BuildContext:
    """Everything a σ-provider or certifier factory may use for one benchmark.

    ``run_id``, ``method`` and ``setting`` (the setting's canonical key, e.g. ``sigma=0.25``;
    a factory receives its parameters as ``params``) name the work the components are built for
    (set by the runner); ``state`` is that setting's :class:`~harness.foundation.runstate.RunState`
    in the run's database (a certifier with per-run state, such as a memory, restores
    from it and stages new records; None outside a run), and
    ``registry`` resolves components by name (e.g. a wrapped certifier); ``recipe_hash``
    is the base model's recipe hash (the content hash of what made it, its cache key; a key
    for anything fitted to it; the SHA-256 of its weights is another digest), and
    ``artifact_root`` where :meth:`artifact_dir` keeps files (None: the cache root; the
    soundness checks give a rebuilt method a temporary one).

    ``dataset`` is the benchmark's :class:`~harness.foundation.data.TrainingSplit`: the
    training split and the dataset's description, never the test split (a
    :class:`~harness.foundation.data.Dataset` given here is reduced to it, so every context
    the harness makes, the checks' included, withholds the test split).

    The runner gives each method and setting a copy (``dataclasses.replace``); the
    copies share ``memos``, the run's :class:`RunMemo` behind :meth:`memo`, and
    ``artifact_plugins``, the plugins whose :meth:`artifact_dir` was asked for (whose files
    the run records for a replay). A context on another base model (the checks' analytic
    models) gets a memo of its own.
    """

    dataset: TrainingSplit
    model: torch.nn.Module
    device: torch.device
    seed: int
    protocol: CertificationProtocol
    engine: SamplingEngine
    progress: Progress
    registry: Registry | None = None
    recipe_hash: str | None = None
    run_id: str | None = None
    method: str | None = None
    setting: str | None = None
    state: RunState | None = None
    artifact_root: Path | None = None
    memos: RunMemo = field(default_factory=lambda: RunMemo(), repr=False, compare=False)
    artifact_plugins: set[str] = field(default_factory=set, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.dataset, Dataset):
            self.dataset = self.dataset.training_split()

    @property
    def model_hash(self) -> str | None:
        """The former name of :attr:`recipe_hash` (read-only, deprecated): it never hashed
        the weights, only the recipe that made them."""
        warnings.warn("BuildContext.model_hash is deprecated: it is the base model's recipe "
                      "hash, read it as BuildContext.recipe_hash", DeprecationWarning,
                      stacklevel=2)  # fmt: skip
        return self.recipe_hash

    def artifact_dir(self, plugin: str) -> Path | None:
        """The directory where ``plugin`` keeps what it derives from this base model.

        ``<cache root>/plugins/<plugin>/<recipe hash>/`` (created; the cache root is
        ``$IDRS_BENCH_CACHE``, see :mod:`harness.foundation.artifacts`): the base model's recipe
        hash is what makes such a file valid, and the plugin names each file by
        everything else it depends on (dataset, seed, parameters). Write files with
        :func:`~harness.foundation.artifacts.save_artifact` so that damaged ones heal. None when
        the base model has no recipe hash (a model made in memory, e.g. by the
        soundness checks): nothing derived from it could be found again.
        """
        if self.recipe_hash is None:
            return None
        self.artifact_plugins.add(plugin)
        from harness.foundation.artifacts import cache_root

        root = cache_root() if self.artifact_root is None else self.artifact_root
        path = root / "plugins" / plugin / self.recipe_hash
        path.mkdir(parents=True, exist_ok=True)
        return path

    def memo(
        self, plugin: str, key: Hashable, build: Callable[[], T], inputs_only: bool = False
    ) -> T:
        """``build()``, computed once per (``plugin``, ``key``) in this run and base model.

        Kept in ``memos``, which every copy of this context shares, so building the
        method again (another setting, the soundness checks) reuses the value. With
        ``inputs_only`` the value depends on the dataset's inputs alone (not on its labels
        or the base model, e.g. a statistic of the training inputs): it is then also shared
        by the contexts the checks make on other base models over the same inputs.
        """
        return self.memos.get(plugin, key, build, inputs_only)


class RunMemo:
    """Values plugins compute once per run and base model (:meth:`BuildContext.memo`),
    by (plugin, key). One belongs to each prepared run (and to each context the checks
    make on another base model); nothing is shared between runs.

    ``inputs`` holds the values that depend on the dataset's inputs alone: this memo's own,
    or the run's for a memo the checks make on another base model over the same inputs
    (:meth:`over_same_inputs`)."""

    def __init__(self, inputs: RunMemo | None = None) -> None:
        self._values: dict[tuple[bool, str, Hashable], Any] = {}
        self.inputs: RunMemo = self if inputs is None else inputs

    def over_same_inputs(self) -> RunMemo:
        """A memo for another base model over this memo's inputs (its inputs-only values shared)."""
        return RunMemo(self.inputs)

    def get(
        self, plugin: str, key: Hashable, build: Callable[[], T], inputs_only: bool = False
    ) -> T:
        """The value of (``plugin``, ``key``), built by ``build()`` the first time."""
        values = self.inputs._values if inputs_only else self._values
        entry = (inputs_only, plugin, key)
        if entry not in values:
            values[entry] = build()
        return values[entry]

    def pop(self, plugin: str, key: Hashable) -> Any:
        """Remove the value of (``plugin``, ``key``) and return it (None if none was built)."""
        return self._values.pop((False, plugin, key), None)


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

    ``dataset`` is a :class:`~harness.foundation.data.TrainingSplit` (the training split
    and the dataset's description; the test split is withheld). ``defaults`` lists every
    parameter the trainer accepts with its default value.
    """

    name: str
    train: Callable[[torch.nn.Module, TrainingSplit, Mapping[str, Any], TrainContext], None]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""


@dataclass(frozen=True)
class MethodSpec:
    """A named composition: one σ-provider, one certifier, their default parameters.

    ``defaults`` lists every parameter a benchmark setting may override; both the
    σ-provider and the certifier receive the merged parameters. ``check(params)``,
    if given, raises :class:`~harness.foundation.errors.ParameterError` for invalid values; it
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
    with ``dim=60``. ``class_names``, when the classes are fixed, names them for boards
    of runs that did not record them (a run records its dataset's ``class_names``).
    """

    name: str
    load: Callable[..., Dataset]
    description: str = ""
    class_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelSpec:
    """``build(input_shape, num_classes, params) -> torch.nn.Module`` (logits)."""

    name: str
    build: Callable[[tuple[int, ...], int, Mapping[str, Any]], torch.nn.Module]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""


@dataclass(frozen=True)
class CheckSpec:
    """A soundness check: ``run(audit)`` audits a method's certificates; ``prepare(audit)``,
    if given, is called for every audit before any check runs, to start work the check
    will wait for (e.g. a helper process) while the other checks run. ``diagonal``: the
    check audits rows drawn at a diagonal scale (:mod:`harness.engine.scale`); one that
    does not is not run on such a row, whose verdict is then ``error`` naming it.
    ``centred``: likewise for rows drawn around a noise centre (:mod:`harness.engine.centre`)."""

    name: str
    run: Callable[..., Any]
    description: str = ""
    prepare: Callable[..., None] | None = None
    diagonal: bool = False
    centred: bool = False
