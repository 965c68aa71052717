"""Certifying a model the caller holds, outside a benchmark file: what
:func:`harness.api.certify` does below its table (and what ``idrs-bench bench --api``
times against the reference loop).

The model, inputs and labels make a :class:`~harness.foundation.data.Dataset` of their
own; the protocol is made as a benchmark file's ``[certification]`` table makes it
(:func:`~harness.running.benchmark.certification_protocol`: the same checks and errors,
sequential sampling on the radius grid), the method is built from the registry with its
parameters checked (and refused where sequential sampling cannot certify it), the engine
in the protocol's arithmetic (with deterministic kernels on CUDA,
:mod:`harness.engine.determinism`) draws every sample (harness/README.md, "Certifier
contract"), and each certificate carries the same evidence as one from ``idrs-bench run``:
inputs with the ids of a benchmark's test points get that run's certificates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from harness.foundation.errors import IdrsError


class _NoTrainingData:
    """Stands for absent training inputs; any use names the missing argument."""

    def __init__(self, method: str) -> None:
        self._method = method

    def _fail(self, *_: Any, **__: Any):
        raise IdrsError(
            f"method {self._method!r} needs the training inputs (its σ(x) or fitting uses "
            "them): pass certify(..., train_inputs=X_train, train_labels=y_train)"
        )

    __len__ = __getitem__ = __iter__ = _fail

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        self._fail()


def certify_held_model(
    model: torch.nn.Module,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    method: str,
    sigma: float,
    params: dict[str, Any],
    n0: int,
    n: int,
    alpha: float,
    device: str | torch.device | None,
    seed: int,
    batch_size: int | str,
    train_inputs: torch.Tensor | None,
    train_labels: torch.Tensor | None,
    precision: str,
    channels_last: bool,
    cudnn: str,
    sampling: str = "fixed",
    n_max: int | None = None,
    radii: Sequence[float] | None = None,
    forward: dict[str, bool] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One row per input (method, setting, label and the certificate's fields) and the
    run's attributes (weights digest, resolved batch size and precision); the arguments
    are :func:`harness.api.certify`'s (``params``: the method's other parameters;
    ``forward``: the forward options of :data:`~harness.foundation.protocol.FORWARD_OPTIONS`
    that are given)."""
    from harness.certification.certify import certify_inputs
    from harness.certification.method import build_method, check_sampling
    from harness.engine.determinism import deterministic_kernels
    from harness.engine.precision import prepare_model, resolve_precision
    from harness.engine.sampling import SamplingEngine, resolve_device
    from harness.foundation.data import Dataset
    from harness.foundation.identity import setting_key
    from harness.foundation.progress import Progress
    from harness.mathematics.accuracy import RADII
    from harness.plugin.components import BuildContext
    from harness.plugin.manager import PluginManager
    from harness.running.benchmark import _check_keys, certification_protocol
    from harness.running.weights import weights_digest

    device = resolve_device(device or "auto")
    cert = {"n0": n0, "n": n, "alpha": alpha, "batch_size": batch_size,
            "precision": resolve_precision(precision, device), "channels_last": channels_last,
            "cudnn": cudnn, "sampling": sampling, **(forward or {}),
            **({} if n_max is None else {"n_max": n_max})}  # fmt: skip
    protocol = certification_protocol(cert, RADII if radii is None else radii)
    with PluginManager() as manager:  # (its plugin hosts end on return, also on an error)
        registry = manager.registry
        spec = registry.get("methods", method)
        setting = {"sigma": sigma, **params} if "sigma" in spec.defaults else dict(params)
        _check_keys(setting, spec.defaults, f"method {method!r}")
        full = {**spec.defaults, **setting}
        if spec.check is not None:
            spec.check(full)
        inputs = torch.as_tensor(inputs, dtype=torch.float32)
        labels = torch.as_tensor(labels, dtype=torch.long)
        if len(inputs) != len(labels):
            raise IdrsError(f"{len(inputs)} inputs but {len(labels)} labels")
        model = model.to(device).eval()
        with torch.no_grad():
            num_classes = int(model(inputs[:1].to(device)).shape[-1])
        if train_inputs is None:
            train_x: Any = _NoTrainingData(method)
            train_y: Any = train_x
        else:
            train_x = torch.as_tensor(train_inputs, dtype=torch.float32)
            train_y = torch.as_tensor(
                train_labels if train_labels is not None else torch.zeros(len(train_x)),
                dtype=torch.long,
            )
        dataset = Dataset("api", train_x, train_y, inputs, labels, num_classes)
        certified = prepare_model(model, protocol)
        if batch_size == "auto":
            from harness.engine.batchsize import auto_batch_size

            batch_size = auto_batch_size(certified, tuple(inputs.shape[1:]), device)
        engine = SamplingEngine(certified, num_classes, device, batch_size, seed, pad_batches=True)
        digest = weights_digest(model)
        key = setting_key(setting)
        context = BuildContext(
            dataset=dataset, model=model, device=device, seed=seed, protocol=protocol,
            engine=engine, progress=Progress(enabled=False), registry=registry, recipe_hash=digest,
            run_id=f"api-{digest[:12]}", method=method, setting=key,
        )  # fmt: skip
        ids = list(range(len(inputs)))
        with deterministic_kernels(device):
            provider, certifier = build_method(registry, method, full, context)
            check_sampling(context, method, provider, certifier)
            made = certify_inputs(context, spec, provider, certifier, inputs.to(device), ids)
            rows = [{"method": method, "setting": key, "label": int(labels[c.input_id]), **vars(c)}
                    for c in made]  # fmt: skip
        return rows, {"weights_digest": digest, "batch_size": batch_size,
                      "precision": protocol.precision}  # fmt: skip
