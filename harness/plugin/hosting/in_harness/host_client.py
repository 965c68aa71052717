"""The harness's side of the request protocol: a typed method per request a plugin host answers.

Each method makes its request of :mod:`harness.plugin.hosting.shared.host_protocol` and
sends it (:meth:`HostClient.send`:
:class:`~harness.plugin.hosting.in_harness.host_process.PluginHost`'s, within the request's
time and size limits); what it answers is a plain mapping, read into
the harness's types by its caller (:mod:`~harness.plugin.hosting.in_harness.remote`,
:mod:`~harness.plugin.hosting.in_harness.hosted_components`). A request about what the
host built (a build in a context, a built component) names the host's ``generation`` it
belongs to (a host started again since has lost it) and carries the ``updates`` of the
context's base model the host has not seen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.plugin.hosting.shared.host_protocol import (
    BallSigmas,
    BuildCertifier,
    BuildSigmaProvider,
    Centre,
    Certify,
    CheckParams,
    Context,
    Describe,
    HostRequest,
    LoadDataset,
    OrderReplays,
    Probe,
    Recompute,
    Sigma,
    Train,
)

Updates = Sequence[Mapping[str, Any]]


class HostClient:
    """The requests to one plugin host, a method each; :meth:`send` sends them."""

    def send(self, request: HostRequest, generation: int | None = None,
             updates: Updates = ()) -> dict[str, Any]:  # fmt: skip
        """Send ``request`` (with the base models' ``updates``); its answer. ``generation``:
        the host's generation the request's handles and tokens belong to."""
        raise NotImplementedError

    # --- the plugins --------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        return self.send(Describe())

    def probe(self, device: str, devices: Sequence[str], parent: int,
              refusals: bool) -> dict[str, Any]:  # fmt: skip
        return self.send(Probe(device, list(devices), parent, refusals))

    def check_params(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        return self.send(CheckParams(method, dict(params)))

    def load_dataset(self, name: str, data_root: str | None, download: bool, seed: int,
                     family: Mapping[str, Any]) -> dict[str, Any]:  # fmt: skip
        return self.send(LoadDataset(name, data_root, download, seed, dict(family)))

    def train(self, trainer: str, model: Mapping[str, Any], dataset: Mapping[str, Any],
              params: Mapping[str, Any], seed: int, device: str,
              quiet: bool) -> dict[str, Any]:  # fmt: skip
        return self.send(Train(trainer, dict(model), dict(dataset), dict(params), seed, device,
                               quiet))  # fmt: skip

    # --- build contexts and components --------------------------------------------------

    def context(self, described: Mapping[str, Any]) -> dict[str, Any]:
        return self.send(Context(dict(described)))

    def build_sigma_provider(self, context: str, name: str, params: Mapping[str, Any], *,
                             generation: int, updates: Updates = ()) -> dict[str, Any]:  # fmt: skip
        return self.send(BuildSigmaProvider(context, name, dict(params)), generation, updates)

    def build_certifier(self, context: str, name: str, params: Mapping[str, Any],
                        provider: Mapping[str, Any], *, generation: int,
                        updates: Updates = ()) -> dict[str, Any]:  # fmt: skip
        return self.send(BuildCertifier(context, name, dict(params), dict(provider)), generation,
                         updates)  # fmt: skip

    # --- what a built component answers -------------------------------------------------

    def sigma(self, handle: int, context: str, x: Any, device: str, gradient: bool, *,
              generation: int, updates: Updates = ()) -> dict[str, Any]:  # fmt: skip
        return self.send(Sigma(handle, context, x, device, gradient), generation, updates)

    def centre(self, handle: int, context: str, x: Any, device: str, *, generation: int,
               updates: Updates = ()) -> dict[str, Any]:  # fmt: skip
        return self.send(Centre(handle, context, x, device), generation, updates)

    def certify(self, handle: int, context: str, evidence: Mapping[str, Any], *,
                generation: int, updates: Updates = ()) -> dict[str, Any]:  # fmt: skip
        return self.send(Certify(handle, context, dict(evidence)), generation, updates)

    def ball_sigmas(self, handle: int, context: str, rows: Sequence[Any], *, generation: int,
                    updates: Updates = ()) -> dict[str, Any]:  # fmt: skip
        return self.send(BallSigmas(handle, context, list(rows)), generation, updates)

    def order_replays(self, handle: int, context: str, certificates: Sequence[Any],
                      ids: Sequence[Any], x: Any, orders: int, seed: int, *, generation: int,
                      updates: Updates = ()) -> dict[str, Any]:  # fmt: skip
        return self.send(OrderReplays(handle, context, list(certificates), list(ids), x, orders,
                                      seed), generation, updates)  # fmt: skip

    def recompute(
        self,
        formula: Mapping[str, Any],
        rows: Sequence[Any],
        inputs: Any,
        protocol: Mapping[str, Any],
        regularity: Mapping[str, Any],
    ) -> dict[str, Any]:
        return self.send(Recompute(dict(formula), list(rows), inputs, dict(protocol),
                                   dict(regularity)))  # fmt: skip
