"""Eval-mode batch normalization folded into the convolution before it.

In eval mode a BatchNorm is a fixed affine map per channel c (Ioffe & Szegedy 2015, §3.1,
the inference network): BN(z)_c = γ_c (z_c − μ_c) / √(v_c + ε) + β_c with the running mean
μ and variance v. Applied to a convolution's output z = W ∗ x + b it folds into the
convolution (Jacob et al. 2018, §3.2):

    W'_c = s_c · W_c,   b'_c = (b_c − μ_c) · s_c + β_c,   s_c = γ_c / √(v_c + ε),

so one convolution computes what two layers did, without the memory-bound pass of the
BatchNorm over every activation (ResNet-110 runs one after each of its convolutions).
W' and b' are computed in float64 from the stored weights and rounded once to the
weights' dtype, on the CPU, so they are the same on every device. The folded classifier
is the same function in exact arithmetic but rounds differently: it is another
arithmetic of f, recorded with a run like its precision (:mod:`harness.engine.arithmetic`,
:mod:`harness.engine.precision`), and ``idrs-bench bench --api --fold-batchnorm`` counts
the argmax decisions on noisy inputs on which it differs from the unfolded model.

A pair is folded where the BatchNorm (with running statistics) reads the convolution's
output and nothing else does (the model's graph, traced by :mod:`torch.fx`); a model
torch.fx cannot trace (e.g. a TorchScript checkpoint, or Python control flow on tensor
values) is refused with the reason, since folding it would be guesswork.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from harness.foundation.errors import IdrsError

PAIRS = ((nn.Conv1d, nn.BatchNorm1d), (nn.Conv2d, nn.BatchNorm2d), (nn.Conv3d, nn.BatchNorm3d))
"""The (convolution, BatchNorm) module types folded, one per spatial dimension."""


def folded_convolution(conv: nn.Module, bn: nn.Module) -> nn.Module:
    """A copy of ``conv`` computing ``bn(conv(x))`` of eval mode (module docstring)."""
    dtype, channels = conv.weight.dtype, bn.num_features
    with torch.no_grad():
        var, mean = _float64(bn.running_var, channels, 0), _float64(bn.running_mean, channels, 0)
        gamma, beta = _float64(bn.weight, channels, 1), _float64(bn.bias, channels, 0)
        bias = _float64(conv.bias, channels, 0)
        scale = gamma / torch.sqrt(var + bn.eps)
        weight = _float64(conv.weight, channels, 0)
        weight = weight * scale.reshape(-1, *([1] * (weight.dim() - 1)))
        fused = copy.deepcopy(conv)
        device = conv.weight.device
        fused.weight = nn.Parameter(weight.to(device, dtype), requires_grad=False)
        fused.bias = nn.Parameter(((bias - mean) * scale + beta).to(device, dtype),
                                  requires_grad=False)  # fmt: skip
    return fused


def _float64(tensor: torch.Tensor | None, channels: int, absent: float) -> torch.Tensor:
    """``tensor`` in float64 on the CPU; ``absent`` per channel where there is none (no
    bias, or a BatchNorm without affine parameters)."""
    if tensor is None:
        return torch.full((channels,), float(absent), dtype=torch.float64)
    return tensor.detach().to("cpu", torch.float64)


def _foldable(conv: nn.Module, bn: nn.Module) -> bool:
    return (
        any(isinstance(conv, c) and type(bn) is b for c, b in PAIRS)
        and bn.running_mean is not None
        and bn.running_var is not None
        and conv.out_channels == bn.num_features
    )


def fold_batchnorm(model: nn.Module) -> tuple[nn.Module, int]:
    """``model`` in eval mode with every BatchNorm that only normalizes a convolution's
    output folded into it, and the number of BatchNorms folded; ``model`` itself is not
    modified. A model without such a pair comes back as an eval-mode copy of itself."""
    import torch.fx

    try:
        traced = torch.fx.symbolic_trace(copy.deepcopy(model).eval())
    except Exception as exc:
        raise IdrsError(
            f"fold_batchnorm: torch.fx cannot trace the base model ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}), so which BatchNorm follows which "
            "convolution is unknown; certify it with fold_batchnorm = false (a TorchScript "
            "checkpoint is never traced: load its weights into a registered architecture)"
        ) from None
    modules = dict(traced.named_modules())
    folded = 0
    for node in list(traced.graph.nodes):
        if node.op != "call_module" or len(node.args) != 1:
            continue
        source = node.args[0]
        if not isinstance(source, torch.fx.Node) or source.op != "call_module":
            continue
        bn, conv = modules[node.target], modules[source.target]
        if not _foldable(conv, bn) or len(source.users) != 1 or node.kwargs:
            continue
        _replace_module(traced, source.target, folded_convolution(conv, bn))
        modules[source.target] = traced.get_submodule(source.target)
        node.replace_all_uses_with(source)
        traced.graph.erase_node(node)
        folded += 1
    traced.graph.eliminate_dead_code()
    traced.delete_all_unused_submodules()
    traced.recompile()
    return traced.eval(), folded


def _replace_module(root: nn.Module, target: str, module: nn.Module) -> None:
    parent, _, name = target.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, module)


def batchnorms(model: nn.Module) -> int:
    """How many BatchNorm modules ``model`` holds."""
    return sum(isinstance(m, tuple(b for _, b in PAIRS)) for m in model.modules())
