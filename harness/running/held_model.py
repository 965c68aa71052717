"""Certifying a model the caller holds, outside a benchmark file: what
:func:`harness.api.certify` does below its table (and what ``idrs-bench bench --api``
times against the reference loop).

The model, inputs and labels make a :class:`~harness.foundation.data.Dataset` of their
own; the method is built from the registry with its parameters checked, the engine in
the protocol's arithmetic draws every sample (docs/architecture.md, "Certifier contract"),
and each certificate carries the same evidence as one from ``idrs-bench run``.
"""

from __future__ import annotations

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
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One row per input (method, setting, label and the certificate's fields) and the
    run's attributes (weights digest, resolved batch size); the arguments are
    :func:`harness.api.certify`'s (``params``: the method's other parameters)."""
    from harness.certification.certify import certify_inputs
    from harness.certification.method import build_method
    from harness.engine.precision import prepare_model
    from harness.engine.sampling import SamplingEngine, resolve_device
    from harness.foundation.data import Dataset
    from harness.foundation.identity import setting_key
    from harness.foundation.progress import Progress
    from harness.foundation.protocol import CertificationProtocol
    from harness.plugin.components import BuildContext
    from harness.plugin.manager import PluginManager
    from harness.running.benchmark import _check_keys
    from harness.running.weights import weights_digest

    registry = PluginManager().registry
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
    device = resolve_device(device or "auto")
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
    protocol = CertificationProtocol(n0=n0, n=n, alpha=alpha, batch_size=batch_size,
                                     precision=precision, channels_last=channels_last,
                                     cudnn=cudnn)  # fmt: skip
    certified = prepare_model(model, protocol)
    if batch_size == "auto":
        from harness.engine.batchsize import auto_batch_size

        batch_size = auto_batch_size(certified, tuple(inputs.shape[1:]), device)
    engine = SamplingEngine(certified, num_classes, device, batch_size, seed)
    digest = weights_digest(model)
    key = setting_key(setting)
    context = BuildContext(
        dataset=dataset, model=model, device=device, seed=seed, protocol=protocol,
        engine=engine, progress=Progress(enabled=False), registry=registry, recipe_hash=digest,
        run_id=f"api-{digest[:12]}", method=method, setting=key,
    )  # fmt: skip
    provider, certifier = build_method(registry, method, full, context)
    ids = list(range(len(inputs)))
    rows = [
        {"method": method, "setting": key, "label": int(labels[cert.input_id]), **vars(cert)}
        for cert in certify_inputs(context, spec, provider, certifier, inputs.to(device), ids)
    ]
    return rows, {"weights_digest": digest, "batch_size": batch_size}
