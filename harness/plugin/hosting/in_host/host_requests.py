"""What a plugin host answers: the harness's requests, served by the plugins it loaded.

A plugin host (:mod:`harness.plugin.hosting.in_host.host`, confined before it gets here)
serves the σ-providers, certifiers, radius formulas, trainers, method checks and datasets
of its plugins, answering the harness's typed requests
(:mod:`harness.plugin.hosting.shared.host_protocol`, each by the method
:attr:`Host.ANSWERS` names; their values :mod:`harness.plugin.hosting.shared.messages`,
framed by :mod:`harness.plugin.hosting.shared.wire`): describe the plugins; build a σ-provider or
certifier in a build context the harness describes (the dataset's training split and
description, base model rebuilt from its description and state, device, seed, protocol,
run, method, setting, run state); σ of a batch of points (with each row's gradient when
asked); a claim per input from the harness's evidence; a re-derivation by a formula; a
trained model's state. Every answer is a claim the harness audits. The host sees what it
is asked about, no more: the samples of a certificate when the certifier is asked for its
claim, a point when its σ is asked; never the rest of the test split, a test label, the
audit's entropy or the harness's own engines. The registry a build context gives its
plugins here lists every dataset, but none loads (:func:`withholding_datasets`): a loader
returns a test split, and the dataset a plugin sees is ``context.dataset``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from harness.engine.determinism import enable_deterministic_kernels
from harness.engine.exact import ExactSampling
from harness.engine.precision import prepare_model
from harness.engine.sampling import SamplingEngine
from harness.foundation.data import PORTING, TrainingSplit
from harness.foundation.errors import ContractError, IdrsError
from harness.foundation.progress import Progress
from harness.foundation.protocol import FORWARD_OPTIONS
from harness.foundation.runstate import RunState
from harness.mathematics.radius import (
    formula_from_record,
    formula_record,
    is_pure,
    trusted_packages,
)
from harness.plugin import model_description
from harness.plugin.components import BuildContext, RunMemo, TrainContext
from harness.plugin.hosting.shared import host_protocol as protocol
from harness.plugin.hosting.shared import messages
from harness.plugin.hosting.shared.host_protocol import Request
from harness.plugin.loader import PluginLoader
from harness.plugin.registry import COMPONENT_KINDS, Registry


class _Missing:
    """Stands for a training split the harness does not have (e.g. ``harness.api.certify``
    without ``train_inputs``); any use says so."""

    def _fail(self, *_: Any, **__: Any):
        raise IdrsError("this method needs the training inputs, which the harness does not have "
                        "here: pass certify(..., train_inputs=X_train, train_labels=y_train)")  # fmt: skip

    __len__ = __getitem__ = __iter__ = _fail

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        self._fail()


class _AbsentModel(torch.nn.Module):
    """Stands for a base model the harness could not describe (not of a registered
    architecture); a plugin that queries it is told why."""

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise IdrsError(f"the plugin host has no copy of the base model: {self.reason}")


class Host:
    """The objects a plugin host keeps: built components by handle, contexts, base models,
    datasets' arrays and run memos (each named by the harness). It loads the built-in
    plugins and those of ``distribution`` (None: the built-ins only), in this process;
    ``abi`` is the Landlock ABI it is confined with (0: unconfined)."""

    def __init__(self, distribution: str | None, abi: int = 0,
                 plugins: list[str] | None = None) -> None:  # fmt: skip
        """``plugins``: those of ``distribution`` the harness accepted (None: all)."""
        self.manager = PluginLoader(third_party=distribution is not None,
                                    distribution=distribution, plugins=plugins)  # fmt: skip
        self.abi = abi
        self.registry = self.manager.registry
        self.given = withholding_datasets(self.registry)
        """What a build context's ``registry`` is here: the registry less its loaders."""
        self.objects: dict[int, Any] = {}
        self.contexts: dict[str, BuildContext] = {}
        self.models: dict[str, torch.nn.Module] = {}
        self.arrays: dict[str, torch.Tensor] = {}
        self.memos: dict[str, RunMemo] = {}
        self.engines: dict[tuple, SamplingEngine] = {}
        self.handles = 0

    def serve(self, message: dict[str, Any]) -> dict[str, Any]:
        """The answer to ``message``: its envelope applied first (the thread count, the
        models' updates, the handles released and contexts forgotten), then its request
        answered by the method :attr:`ANSWERS` names."""
        threads = message.get("threads")
        if isinstance(threads, int) and threads >= 1 and threads != torch.get_num_threads():
            torch.set_num_threads(threads)  # the harness's count (a run's own, on CPU)
        for update in message.get("updates", ()):
            model_description.update(self.models[update["key"]], update["description"],
                                     update["state"])  # fmt: skip
        for handle in message.get("release", ()):
            self.objects.pop(handle, None)
        for token in message.get("forget", ()):
            self.contexts.pop(token, None)
        request = protocol.read(message)
        return self.ANSWERS[request.op](self, request) or {}

    def _keep(self, obj: Any) -> int:
        self.handles += 1
        self.objects[self.handles] = obj
        return self.handles

    # --- the plugins ------------------------------------------------------------------

    def describe(self, request: protocol.Describe) -> dict[str, Any]:
        """Every plugin loaded here and what it registered (names, defaults, compositions)."""
        plugins = self.manager.describe()
        components = []
        for kind in ("sigma_providers", "certifiers", "trainers", "methods", "datasets",
                     "models", "checks"):  # fmt: skip
            for name in self.registry.names(kind):
                spec = self.registry.get(kind, name)
                item = {"kind": kind, "name": name, "plugin": self.registry.provider(kind, name),
                        "description": getattr(spec, "description", "")}  # fmt: skip
                if hasattr(spec, "defaults"):
                    item["defaults"] = dict(spec.defaults)
                if kind == "methods":
                    item |= {"sigma_provider": spec.sigma_provider, "certifier": spec.certifier,
                             "check": spec.check is not None}  # fmt: skip
                if kind == "datasets":
                    item["class_names"] = list(spec.class_names)
                components.append(item)
        failures = [
            {"plugin": f.plugin, "error": f.error, "stage": f.stage,
             "distribution": f.distribution, "version": f.version,
             "provides": None if f.provides is None else {k: list(v) for k, v in f.provides.items()}}
            for f in self.manager.failures
        ]  # fmt: skip
        return {"plugins": plugins, "components": components, "failures": failures,
                "builtin": sorted(self.manager.builtin_plugins()), "abi": self.abi}  # fmt: skip

    def probe(self, request: protocol.Probe) -> dict[str, Any]:
        """What a device driver does to the OS while it initializes, tried here
        (:func:`harness.plugin.hosting.in_host.driver_probe.probe`)."""
        from harness.plugin.hosting.in_host.driver_probe import probe

        return {"parts": probe(str(request.device), [str(d) for d in request.devices],
                               int(request.parent), bool(request.refusals))}  # fmt: skip

    def check_params(self, request: protocol.CheckParams) -> None:
        check = self.registry.get("methods", request.method).check
        if check is not None:
            check(request.params)

    def load_dataset(self, request: protocol.LoadDataset) -> dict[str, Any]:
        spec = self.registry.get("datasets", request.name)
        data = spec.load(data_root=request.data_root, download=bool(request.download),
                         seed=int(request.seed), **request.family)  # fmt: skip
        return {"dataset": {"name": data.name, "train_x": data.train_x, "train_y": data.train_y,
                            "test_x": data.test_x, "test_y": data.test_y,
                            "num_classes": data.num_classes, "class_names": list(data.class_names),
                            "files": dict(data.files)}}  # fmt: skip

    def train(self, request: protocol.Train) -> dict[str, Any]:
        model = model_description.rebuild(self.registry, request.model["description"],
                                          request.model["state"])  # fmt: skip
        device = torch.device(request.device)
        context = TrainContext(device=device, seed=int(request.seed),
                               progress=Progress(enabled=not request.quiet))  # fmt: skip
        trainer = self.registry.get("trainers", request.trainer)
        trainer.train(model.to(device), self._dataset(request.dataset), request.params,
                      context)  # fmt: skip
        return {"state": model_description.state_of(model)}

    # --- build contexts and components --------------------------------------------------

    def context(self, request: protocol.Context) -> None:
        """A build context the harness describes, kept under its token."""
        described = request.context
        device = torch.device(described["device"])
        enable_deterministic_kernels(device)  # σ and fits computed here are a run's, as there
        model = self._model(described["model"], device)
        protocol = messages.protocol_from(described["protocol"])
        engine = described["engine"]
        key = (described["model"]["key"], protocol.precision, protocol.channels_last,
               *(getattr(protocol, o) for o in FORWARD_OPTIONS),
               *(engine.get(k) for k in ("num_classes", "batch_size", "seed", "noise",
                                         "pad_batches", "exact")))  # fmt: skip
        if key not in self.engines:  # shared by the contexts of one engine, as in the harness
            settings = (int(engine["num_classes"]), device, int(engine["batch_size"]),
                        int(engine["seed"]))  # fmt: skip
            if engine.get("exact"):  # an analytic model of the checks (harness.engine.exact)
                self.engines[key] = ExactSampling(
                    prepare_model(model, protocol), model.class_probabilities, *settings,
                    engine["noise"], bool(engine["pad_batches"]), bool(model.one_hot))  # fmt: skip
            else:
                self.engines[key] = SamplingEngine(
                    prepare_model(model, protocol), *settings, noise=engine["noise"],
                    pad_batches=bool(engine["pad_batches"]))  # fmt: skip
        sampling = self.engines[key]
        records = described.get("state")
        state = None if records is None else RunState(messages.records_from(records, "harness"))
        root = _artifact_root(described.get("artifact_root"), described.get("granted", True))
        self.contexts[described["token"]] = BuildContext(
            dataset=self._dataset(described["dataset"]), model=model, device=device,
            seed=int(described["seed"]), protocol=protocol, engine=sampling,
            progress=Progress(enabled=not described.get("quiet", False)), registry=self.given,
            recipe_hash=described.get("recipe_hash"), run_id=described.get("run_id"),
            method=described.get("method"), setting=described.get("setting"), state=state,
            artifact_root=root,
            memos=self._memo(described["memo"], described.get("inputs_memo")),
        )  # fmt: skip

    def _memo(self, token: str, inputs: str | None) -> RunMemo:
        """The run memo the harness names ``token``, sharing its inputs-only values with the
        memo it names ``inputs`` (itself when they are one)."""
        if token not in self.memos:
            shared = self.memos.get(inputs) if inputs not in (None, token) else None
            if inputs not in (None, token) and shared is None:
                shared = self.memos[inputs] = RunMemo()
            self.memos[token] = RunMemo(shared)
        return self.memos[token]

    def _model(self, described: dict[str, Any], device: torch.device) -> torch.nn.Module:
        key = described["key"]
        if "absent" in described:
            self.models[key] = _AbsentModel(described["absent"])
        elif "description" in described:
            model = model_description.rebuild(self.registry, described["description"],
                                              described["state"])  # fmt: skip
            self.models[key] = model.to(device)
        return self.models[key]

    def _dataset(self, described: dict[str, Any]) -> TrainingSplit:
        def array(value: Any) -> Any:
            if isinstance(value, dict) and "file" in value:
                path = value["file"]
                if path not in self.arrays:
                    self.arrays[path] = torch.from_numpy(np.load(path, allow_pickle=False))
                return self.arrays[path]
            return _Missing() if value is None else value

        return TrainingSplit(described["name"], array(described["train_x"]),
                             array(described["train_y"]), int(described["num_classes"]),
                             tuple(int(d) for d in described["input_shape"]),
                             tuple(described.get("class_names", ())),
                             dict(described.get("files", {})))  # fmt: skip

    def build_sigma_provider(self, request: protocol.BuildSigmaProvider) -> dict[str, Any]:
        context = self.contexts[request.context]
        spec = self.registry.get("sigma_providers", request.name)
        provider = spec.build(context, request.params)
        declaration: dict[str, Any] = {
            "regularity": messages.regularity_message(provider.regularity),
            "weights": getattr(provider, "weights", None),
            "centred": callable(getattr(provider, "centre", None)),
        }
        smoothing = getattr(provider, "smoothing", None)
        if smoothing is not None:
            declaration["smoothing"] = {
                "noise": smoothing.noise, "levels": list(smoothing.levels),
                "alpha": smoothing.alpha, "architecture": smoothing.architecture,
                "architecture_params": dict(smoothing.architecture_params or {}),
                "state": model_description.state_of(smoothing.model),
            }  # fmt: skip
        return {"handle": self._keep(provider), "declaration": declaration}

    def build_certifier(self, request: protocol.BuildCertifier) -> dict[str, Any]:
        context = self.contexts[request.context]
        params = request.params
        provider = request.provider
        if "handle" in provider:
            sigma_provider = self.objects[provider["handle"]]
        else:  # the harness built it itself (a built-in one); the certifier gets its own copy
            sigma_provider = self.registry.get("sigma_providers", provider["name"]).build(context,
                                                                                          params)  # fmt: skip
        certifier = self.registry.get("certifiers", request.name).build(context, params,
                                                                         sigma_provider)  # fmt: skip
        formula = certifier.radius_formula
        return {"handle": self._keep(certifier), "declaration": {
            "smoothing": certifier.smoothing, "order_dependent": bool(certifier.order_dependent),
            "radius_formula": formula_record(formula), "impure": formula.impure_parts(),
            "diagonal_scale": getattr(certifier, "diagonal_scale", False) is True,
            "centred": getattr(certifier, "centred", False) is True,
        }}  # fmt: skip

    # --- what a built component answers -------------------------------------------------

    def sigma(self, request: protocol.Sigma) -> dict[str, Any]:
        provider = self.objects[request.handle]
        x = request.x.to(request.device)
        if not request.gradient:
            with torch.no_grad():
                return {"sigma": provider(x), "gradient": None}
        x.requires_grad_(True)
        with torch.enable_grad():
            sigma = provider(x)
            gradient = None
            if isinstance(sigma, torch.Tensor) and sigma.requires_grad:
                (gradient,) = torch.autograd.grad(sigma.sum(), x, allow_unused=True)
        return {"sigma": sigma.detach() if isinstance(sigma, torch.Tensor) else sigma,
                "gradient": gradient}  # fmt: skip

    def centre(self, request: protocol.Centre) -> dict[str, Any]:
        with torch.no_grad():
            centre = self.objects[request.handle].centre(request.x.to(request.device))
        return {"centre": centre.detach() if isinstance(centre, torch.Tensor) else centre}

    def certify(self, request: protocol.Certify) -> dict[str, Any]:
        certifier = self.objects[request.handle]
        context = self.contexts[request.context]
        evidence = messages.evidence_from(request.evidence, context.device)
        claims = [messages.claim_message(c) for c in certifier.certify(evidence)]
        staged = [] if context.state is None else context.state.take()
        return {"claims": claims, "staged": messages.records_message(staged)}

    def ball_sigmas(self, request: protocol.BallSigmas) -> dict[str, Any]:
        sigmas = self.objects[request.handle].ball_sigmas(request.rows)
        return {"ids": [int(k) for k in sigmas], "sigmas": [float(v) for v in sigmas.values()]}

    def order_replays(self, request: protocol.OrderReplays) -> dict[str, Any]:
        inputs = dict(zip(request.ids, request.x, strict=True))
        certifier = self.objects[request.handle]
        if not hasattr(certifier, "order_replays"):
            raise ContractError("this order-dependent certifier has no order_replays: contract 4 "
                                f"replaced order_spread (which saw the labels) by it; {PORTING}")  # fmt: skip
        return {"replays": certifier.order_replays(request.certificates, inputs,
                                                   int(request.orders), int(request.seed))}  # fmt: skip

    def recompute(self, request: protocol.Recompute) -> dict[str, Any]:
        formula = formula_from_record(request.formula, trusted_packages())
        recomputed = formula.derive(request.rows, request.inputs,
                                    messages.protocol_from(request.protocol),
                                    messages.regularity_from(request.regularity, "harness"))  # fmt: skip
        return {"recomputed": messages.recomputed_message(recomputed),
                "pure": is_pure(formula.recompute)}  # fmt: skip

    ANSWERS: ClassVar[dict[Request, Callable[[Host, Any], dict[str, Any] | None]]] = {
        Request.DESCRIBE: describe,
        Request.PROBE: probe,
        Request.CHECK_PARAMS: check_params,
        Request.LOAD_DATASET: load_dataset,
        Request.TRAIN: train,
        Request.CONTEXT: context,
        Request.BUILD_SIGMA_PROVIDER: build_sigma_provider,
        Request.BUILD_CERTIFIER: build_certifier,
        Request.SIGMA: sigma,
        Request.CENTRE: centre,
        Request.CERTIFY: certify,
        Request.BALL_SIGMAS: ball_sigmas,
        Request.ORDER_REPLAYS: order_replays,
        Request.RECOMPUTE: recompute,
    }
    """The method that answers each request of the protocol."""


def withholding_datasets(registry: Registry) -> Registry:
    """``registry`` with every dataset's ``load`` refused: what a plugin's build context holds
    in a plugin host. A loader returns the test split (a built-in reads Fashion-MNIST's
    files, or draws a synthetic set from its seed), and a plugin sees the run's dataset as
    ``context.dataset``, its training split; the names, descriptions and class names stay."""
    out = Registry()
    for kind in COMPONENT_KINDS:
        for name in registry.names(kind):
            spec = registry.get(kind, name)
            if kind == "datasets":
                spec = replace(spec, load=_refused_loader(name))
            out.add(kind, spec, registry.provider(kind, name))
    registry.copy_origins(out)
    out.set_failures(registry.failures)
    return out


def _refused_loader(name: str):
    def load(*_: Any, **__: Any) -> Any:
        raise ContractError(
            f"dataset {name!r} is not loaded in a plugin host: a dataset's loader returns its "
            "test split, which is withheld from plugins. A σ-provider, certifier or trainer "
            "sees the run's dataset as context.dataset (its training split and description); "
            "docs/plugins.md, 'What a plugin sees of the dataset'"
        )

    return load


def _artifact_root(root: str | None, granted: bool) -> Path | None:
    """Where a context's plugins keep artifacts: the harness's cache root when this host may
    write its plugins' folders there (``granted``), else a folder of the host's scratch
    directory (its ``$TMPDIR``) for that root (an audit's temporary root, which lives no
    longer than the audit)."""
    if root is None or granted:
        return None if root is None else Path(root)
    import tempfile

    return (
        Path(tempfile.gettempdir())
        / "artifact-roots"
        / hashlib.sha256(root.encode()).hexdigest()[:16]
    )
