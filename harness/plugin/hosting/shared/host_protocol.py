"""The requests the harness sends a plugin host, each declared once: its name and its fields.

One request per message (:mod:`harness.plugin.hosting.shared.wire`), named by
:class:`Request` and carrying the fields of its dataclass (:data:`REQUESTS`), plus what
every request carries (:data:`ENVELOPE`): the handles the harness released and the context
tokens it forgot since its last request, its thread count, and the changes of the base
models the host was sent (``updates``: the checks' analytic models move between trials).
The harness's side sends them by a typed method each
(:class:`harness.plugin.hosting.in_harness.host_client.HostClient`), and the host answers
each by the method its table names
(:class:`harness.plugin.hosting.in_host.host_requests.Host`); the largest answer the
harness reads to each is :func:`harness.plugin.hosting.in_harness.limits.answer_limit`'s.
What each request sends and answers is in harness/README.md ("Plugin host").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, ClassVar

from harness.foundation.errors import IdrsError


class Request(StrEnum):
    """Every request a plugin host answers, by the name it travels under."""

    DESCRIBE = "describe"
    PROBE = "probe"
    CHECK_PARAMS = "check_params"
    LOAD_DATASET = "load_dataset"
    TRAIN = "train"
    CONTEXT = "context"
    BUILD_SIGMA_PROVIDER = "build_sigma_provider"
    BUILD_CERTIFIER = "build_certifier"
    SIGMA = "sigma"
    CENTRE = "centre"
    CERTIFY = "certify"
    BALL_SIGMAS = "ball_sigmas"
    ORDER_REPLAYS = "order_replays"
    RECOMPUTE = "recompute"


ENVELOPE = ("op", "release", "forget", "threads", "updates")
"""What every request's message carries besides its fields: its name (``op``), the handles
released and the context tokens forgotten since the last request, the harness's thread
count (the host computes with it), and the base models' changes (``{"key",
"description", "state"}`` each), applied before the request is answered."""


@dataclass(frozen=True)
class HostRequest:
    """A request's fields; ``op``, its name."""

    op: ClassVar[Request]

    def fields(self) -> dict[str, Any]:
        """Its fields by name, as they travel (not copied: tensors stay the caller's)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


# --- the plugins ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Describe(HostRequest):
    """Every plugin loaded in the host and what it registered (names, defaults,
    compositions), its failures, the built-ins, its Landlock ABI."""

    op: ClassVar[Request] = Request.DESCRIBE


@dataclass(frozen=True)
class Probe(HostRequest):
    """What a device driver does to the OS while it initializes, tried in the host
    (:func:`harness.plugin.hosting.in_host.driver_probe.probe`): on ``device``, with the
    device files ``devices``; ``parent``, the harness's pid; ``refusals``: try what must
    stay refused too."""

    op: ClassVar[Request] = Request.PROBE
    device: str
    devices: list[str]
    parent: int
    refusals: bool


@dataclass(frozen=True)
class CheckParams(HostRequest):
    """The ``method``'s parameter check on ``params`` (a parameter error, or none)."""

    op: ClassVar[Request] = Request.CHECK_PARAMS
    method: str
    params: dict[str, Any]


@dataclass(frozen=True)
class LoadDataset(HostRequest):
    """The dataset ``name`` loaded (both splits: the harness keeps the test split)."""

    op: ClassVar[Request] = Request.LOAD_DATASET
    name: str
    data_root: str | None = None
    download: bool = False
    seed: int = 0
    family: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Train(HostRequest):
    """``trainer`` trains the ``model`` (``{"description", "state"}``) on ``dataset`` (a
    training split as data); answered with the trained state."""

    op: ClassVar[Request] = Request.TRAIN
    trainer: str
    model: dict[str, Any]
    dataset: dict[str, Any]
    params: dict[str, Any]
    seed: int
    device: str
    quiet: bool = False


# --- build contexts and components ----------------------------------------------------------


@dataclass(frozen=True)
class Context(HostRequest):
    """A build context as data (its ``token`` among its fields), kept by the host under
    its token: the dataset's training split and description, the base model's description
    and state, device, seed, protocol, engine settings, run, method, setting, run state,
    artifact folder, memo tokens."""

    op: ClassVar[Request] = Request.CONTEXT
    context: dict[str, Any]


@dataclass(frozen=True)
class BuildSigmaProvider(HostRequest):
    """The σ-provider ``name`` built with ``params`` in the context of token ``context``;
    answered with its handle and declaration."""

    op: ClassVar[Request] = Request.BUILD_SIGMA_PROVIDER
    context: str
    name: str
    params: dict[str, Any]


@dataclass(frozen=True)
class BuildCertifier(HostRequest):
    """The certifier ``name`` built with ``params`` in the context of token ``context``,
    on the σ-provider ``provider`` (``{"handle"}``: one built in the host; ``{"name"}``: a
    built-in the host builds itself); answered with its handle and declaration."""

    op: ClassVar[Request] = Request.BUILD_CERTIFIER
    context: str
    name: str
    params: dict[str, Any]
    provider: dict[str, Any]


# --- what a built component answers ---------------------------------------------------------


@dataclass(frozen=True)
class Bound(HostRequest):
    """A request to the component built under ``handle`` in the context of token
    ``context``."""

    handle: int
    context: str


@dataclass(frozen=True)
class Sigma(Bound):
    """σ of the batch ``x`` on ``device`` (with each row's gradient when ``gradient``)."""

    op: ClassVar[Request] = Request.SIGMA
    x: Any
    device: str
    gradient: bool = False


@dataclass(frozen=True)
class Centre(Bound):
    """The noise centre μ(x) of the batch ``x`` on ``device`` (:mod:`harness.engine.centre`)."""

    op: ClassVar[Request] = Request.CENTRE
    x: Any
    device: str


@dataclass(frozen=True)
class Certify(Bound):
    """A claim per input from the harness's ``evidence`` (and the staged run state)."""

    op: ClassVar[Request] = Request.CERTIFY
    evidence: dict[str, Any]


@dataclass(frozen=True)
class BallSigmas(Bound):
    """A memory's σ of the certified balls of ``rows`` (certificates without labels)."""

    op: ClassVar[Request] = Request.BALL_SIGMAS
    rows: list[Any]


@dataclass(frozen=True)
class OrderReplays(Bound):
    """An order-dependent certifier's ``orders`` replays (from ``seed``) of
    ``certificates`` (without labels) on the inputs ``x`` of ``ids``."""

    op: ClassVar[Request] = Request.ORDER_REPLAYS
    certificates: list[Any]
    ids: list[Any]
    x: Any
    orders: int
    seed: int


@dataclass(frozen=True)
class Recompute(HostRequest):
    """A third-party radius ``formula`` (its record) re-derived on ``rows`` (certificates
    without labels) and ``inputs``, under ``protocol`` and ``regularity``."""

    op: ClassVar[Request] = Request.RECOMPUTE
    formula: dict[str, Any]
    rows: list[Any]
    inputs: Any
    protocol: dict[str, Any]
    regularity: dict[str, Any]


REQUESTS: dict[Request, type[HostRequest]] = {
    cls.op: cls
    for cls in (Describe, Probe, CheckParams, LoadDataset, Train, Context, BuildSigmaProvider,
                BuildCertifier, Sigma, Centre, Certify, BallSigmas, OrderReplays, Recompute)
}  # fmt: skip
"""Each request's fields, by its name."""


def message(request: HostRequest, **envelope: Any) -> dict[str, Any]:
    """The message of ``request`` with the :data:`ENVELOPE`'s ``envelope``."""
    return {"op": request.op.value, **request.fields(), **envelope}


def read(received: Mapping[str, Any]) -> HostRequest:
    """The request a message ``received`` carries (its envelope aside); an
    :class:`IdrsError` when it names no request of :class:`Request`."""
    op = received.get("op")
    cls = REQUESTS.get(op) if isinstance(op, str) else None
    if cls is None:
        raise IdrsError(f"the plugin host has no request {op!r}")
    return cls(**{f.name: received[f.name] for f in fields(cls) if f.name in received})
