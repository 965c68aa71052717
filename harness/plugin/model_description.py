"""What a base model is, as data: enough for a plugin host to rebuild it.

A σ-provider, certifier or trainer that runs in a plugin host (harness/README.md,
"Plugin host") sees the base model through its build context, so the host rebuilds the
harness's model from a description: the registered architecture that built it (name,
input shape, number of classes, parameters), plain attributes its forward pass reads
(an analytic model's offset or radius), and its state dict, sent as tensors. A TorchScript
model travels as its serialized archive. Models are described where they are built
(:func:`build_model`); the analytic models of the checks describe themselves
(``architecture_description()``).
"""

from __future__ import annotations

import io
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from harness.foundation.errors import ContractError

if TYPE_CHECKING:
    from harness.plugin.registry import Registry

_DESCRIBED: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, Any]] = weakref.WeakKeyDictionary()


def build_model(
    registry: Registry, architecture: str, input_shape: tuple[int, ...], num_classes: int,
    params: Mapping[str, Any],
) -> torch.nn.Module:  # fmt: skip
    """``architecture``'s model (``registry.get("models", architecture).build``), remembered
    with its description."""
    model = registry.get("models", architecture).build(input_shape, num_classes, params)
    _DESCRIBED[model] = {"architecture": architecture, "input_shape": list(input_shape),
                         "num_classes": int(num_classes), "params": dict(params)}  # fmt: skip
    return model


def describe(model: torch.nn.Module) -> dict[str, Any]:
    """The description of ``model`` (without its state); a :class:`ContractError` for a model
    that was not built from a registered architecture."""
    own = getattr(model, "architecture_description", None)
    if callable(own):
        return dict(own())
    if isinstance(model, torch.jit.ScriptModule):
        buffer = io.BytesIO()
        torch.jit.save(model, buffer)
        return {"torchscript": buffer.getvalue()}
    described = _DESCRIBED.get(model)
    if described is None:
        raise ContractError(
            f"the base model ({type(model).__name__}) was not built from a registered "
            "architecture, so a plugin host cannot rebuild it for a third-party method; "
            "build it with a registered architecture (idrs-bench plugins lists them)"
        )
    return dict(described)


def fingerprint(model: torch.nn.Module) -> tuple:
    """Changes whenever the model's weights or described attributes change (in place or
    replaced): when to send its state to a plugin host again."""
    attributes = describe_attributes(model)
    tensors = [*model.parameters(), *model.buffers()]
    return (id(model), tuple((id(t), t._version) for t in tensors),
            tuple(sorted(attributes.items())))  # fmt: skip


def describe_attributes(model: torch.nn.Module) -> dict[str, Any]:
    own = getattr(model, "architecture_description", None)
    return dict(own().get("attributes", {})) if callable(own) else {}


def state_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict to send (CPU tensors); none for a TorchScript model (its archive)."""
    if isinstance(model, torch.jit.ScriptModule):
        return {}
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def rebuild(
    registry: Registry, description: Mapping[str, Any], state: Mapping[str, torch.Tensor]
) -> torch.nn.Module:
    """A model as described, with ``state``, on the CPU in eval mode (in a plugin host)."""
    if "torchscript" in description:
        return torch.jit.load(io.BytesIO(description["torchscript"]), map_location="cpu").eval()
    model = build_model(registry, description["architecture"], tuple(description["input_shape"]),
                        int(description["num_classes"]), description.get("params", {}))  # fmt: skip
    update(model, description, state)
    return model.eval()


def update(
    model: torch.nn.Module, description: Mapping[str, Any], state: Mapping[str, torch.Tensor]
) -> None:
    """Give ``model`` the described attributes and ``state``, in place (references to it,
    e.g. a σ-provider's, see the change)."""
    for name, value in description.get("attributes", {}).items():
        setattr(model, name, value)
    if state:
        with torch.no_grad():
            model.load_state_dict(state)
