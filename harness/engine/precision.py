"""The base classifier in the arithmetic a protocol names: fp32, tf32, tf32-conv, bf16 or fp16.

A certificate is a statement about one classifier f; f computed in bf16 is a different
function from f in fp32 (argmax decisions near ties flip), so the precision is part of
the protocol, and every query of the base model (certification, and the soundness checks
that audit it) goes through :func:`prepare_model`, so that they see the same f.

The run prepares the model once: ``context.engine.model`` (:class:`~harness.plugin.components.
BuildContext`) is f as certified, and σ-providers, certifiers and checks query that;
``context.model`` is the fp32 model as trained (for training and fitting, e.g. a σ
network, and for the closed forms of the analytic models).

- ``fp32``: strict fp32 (TF32 off for matmuls and cuDNN convolutions).
- ``tf32-conv``: PyTorch's default arithmetic on CUDA, named: cuDNN convolutions on TF32
  tensor cores (``torch.backends.cudnn.allow_tf32`` is True by default), matmuls in fp32
  (``torch.backends.cuda.matmul.allow_tf32`` is False). What code that keeps PyTorch's
  defaults certifies, Cohen et al.'s ``Smooth.certify`` among it; the default on CUDA
  (``precision = "auto"``, :func:`default_precision`), so that the harness certifies the
  classifier researchers' own code certifies, as fast. A model without convolutions
  computes as in fp32.
- ``tf32``: matmuls and convolutions on TF32 tensor cores.
- ``bf16`` / ``fp16``: a copy of the model cast to that dtype; the noisy input x + σ·ε is
  formed in fp32 and rounded to the dtype; the argmax is taken of the logits in it.
- ``channels_last``: 4-d inputs and the model's conv weights in channels-last memory
  format (faster convolutions on tensor cores; the same arithmetic up to summation order).
- ``fold_batchnorm``, ``compile``, ``cuda_graphs``: the same classifier's forward pass
  made faster (:mod:`harness.engine.folding`, :mod:`harness.engine.forward`); folding and
  compiling round differently, so each is part of the arithmetic like the precision.
- ``cudnn``: ``heuristic`` (cuDNN's heuristics choose each convolution's algorithm, the
  same choice in every process on the same arithmetic) or ``benchmark`` (algorithms timed
  on first use of each shape: often faster, but another process may time another
  algorithm, which rounds differently). Set around every forward pass, whatever a plugin
  set globally.

A CPU has no TF32: there tf32 and tf32-conv compute as fp32, and ``auto`` is fp32, so CPU
runs are what they were. The resolved precision is in the run's protocol (its id and its
board's header) and in its arithmetic fingerprint (:mod:`harness.engine.arithmetic`).
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Any

import torch

from harness.engine.folding import batchnorms, fold_batchnorm
from harness.engine.forward import CPU_GRAPHS, FixedShapeForward, warn_once
from harness.foundation.errors import IdrsError
from harness.foundation.protocol import CUDNN_MODES, FORWARD_OPTIONS, PRECISIONS

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "tf32-conv": torch.float32,
          "bf16": torch.bfloat16, "fp16": torch.float16}  # fmt: skip
TF32 = {"tf32": (True, True), "tf32-conv": (False, True)}
"""Per precision, whether matmuls and whether cuDNN convolutions run on TF32 tensor cores
(every other precision: neither)."""


def default_precision(device: torch.device | str) -> str:
    """What ``precision = "auto"`` resolves to: PyTorch's default arithmetic, tf32-conv, on
    CUDA; fp32 elsewhere (a CPU has no TF32)."""
    return "tf32-conv" if torch.device(device).type == "cuda" else "fp32"


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """``precision``, with ``auto`` resolved for ``device`` (:func:`default_precision`)."""
    return default_precision(device) if precision == "auto" else precision


@contextmanager
def backend_settings(matmul_tf32: bool, conv_tf32: bool, cudnn_benchmark: bool):
    """TF32 for matmuls and for cuDNN convolutions, and cuDNN's benchmark mode, as given,
    restored after."""
    cuda, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = cuda.allow_tf32, cudnn.allow_tf32, cudnn.benchmark
    cuda.allow_tf32, cudnn.allow_tf32 = matmul_tf32, conv_tf32
    cudnn.benchmark = cudnn_benchmark
    try:
        yield
    finally:
        cuda.allow_tf32, cudnn.allow_tf32, cudnn.benchmark = saved


class PrecisionModel(torch.nn.Module):
    """``model`` evaluated in ``precision`` (and channels-last memory format if asked),
    with cuDNN in ``cudnn`` mode, its BatchNorms folded (``fold_batchnorm``), compiled
    and/or replayed from CUDA graphs at the batch sizes it serves (``compile``,
    ``cuda_graphs``: :class:`~harness.engine.forward.FixedShapeForward`).

    :param model: the base classifier (logits), in fp32; it is not modified (a cast or
        folded copy is kept for bf16, fp16, channels-last and folding).
    """

    def __init__(
        self, model: torch.nn.Module, precision: str, channels_last: bool,
        cudnn: str = "heuristic", fold_batchnorm: bool = False, compile: bool = False,
        cuda_graphs: bool = False,
    ) -> None:  # fmt: skip
        super().__init__()
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; choose one of {PRECISIONS}")
        if cudnn not in CUDNN_MODES:
            raise ValueError(f"unknown cudnn mode {cudnn!r}; choose one of {CUDNN_MODES}")
        self.precision, self.channels_last, self.cudnn = precision, channels_last, cudnn
        self.options = {"fold_batchnorm": fold_batchnorm, "compile": compile,
                        "cuda_graphs": cuda_graphs}  # fmt: skip
        self.dtype = DTYPES[precision]
        copied = False
        if fold_batchnorm and batchnorms(model):  # (a model without any stays itself)
            model, _ = _folded(model)
            copied = True
        if self.dtype != torch.float32 or channels_last:
            model = (model if copied else copy.deepcopy(model)).to(self.dtype)
            if channels_last:
                model = model.to(memory_format=torch.channels_last)
        self.model = model
        self.fixed = (
            FixedShapeForward(model, compile, cuda_graphs) if compile or cuda_graphs else None
        )

    def extra_repr(self) -> str:  # part of the auto batch size's cache key
        on = "".join(f", {k}=True" for k, v in self.options.items() if v)
        return (f"precision={self.precision}, channels_last={self.channels_last}, "
                f"cudnn={self.cudnn}{on}")  # fmt: skip

    def serve(self, batch_size: int) -> None:
        """An engine's batch size: calls with that many rows run compiled or from CUDA
        graphs where the options say so (:mod:`harness.engine.forward`)."""
        if self.fixed is not None:
            self.fixed.serve(batch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._cast(x)
        with self._backend():
            if self.fixed is not None and self.fixed.serves(x):
                return self.fixed(x)
            return self.model(x)

    def outputs_for(
        self, points: torch.Tensor, inputs: torch.Tensor, owner: torch.Tensor
    ) -> torch.Tensor:  # fmt: skip
        """:func:`~harness.engine.outputs.outputs_for_inputs` of the model, in this arithmetic
        (a model without a classifier per input: this model's forward pass)."""
        if getattr(self.model, "outputs_for", None) is None:
            return self(points)
        with self._backend():
            return self.model.outputs_for(self._cast(points), inputs, owner)

    def _cast(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.dtype)
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x

    def _backend(self):
        matmul, conv = TF32.get(self.precision, (False, False))
        return backend_settings(matmul, conv, self.cudnn == "benchmark")


def _folded(model: torch.nn.Module) -> tuple[torch.nn.Module, int]:
    """:func:`~harness.engine.folding.fold_batchnorm` of ``model``, which must fold every
    BatchNorm it holds (one left would be computed unfolded, unnoticed)."""
    folded, count = fold_batchnorm(model)
    left = batchnorms(folded)
    if left:
        raise IdrsError(
            f"fold_batchnorm: {left} of the base model's {left + count} BatchNorm layers do not "
            "directly follow a convolution whose output only they read (or keep no running "
            "statistics), so they cannot be folded; certify it with fold_batchnorm = false"
        )
    return folded, count


def prepare_model(model: torch.nn.Module, protocol: Any) -> torch.nn.Module:
    """The base classifier as the ``protocol`` certifies it (its ``precision``, ``auto``
    resolved for the model's device, ``channels_last``, ``cudnn`` mode and forward options
    :data:`~harness.foundation.protocol.FORWARD_OPTIONS`); ``model`` itself for plain fp32
    on a CPU. Use it for every query of the base model whose answers must match the
    certificates."""
    channels_last = bool(getattr(protocol, "channels_last", False))
    cudnn = getattr(protocol, "cudnn", "heuristic")
    on_cpu = all(t.device.type == "cpu" for t in (*model.parameters(), *model.buffers()))
    precision = resolve_precision(getattr(protocol, "precision", "fp32"),
                                  "cpu" if on_cpu else "cuda")  # fmt: skip
    options = {o: bool(getattr(protocol, o, False)) for o in FORWARD_OPTIONS}
    if options["cuda_graphs"] and on_cpu:
        warn_once("cpu-graphs", CPU_GRAPHS)
        options["cuda_graphs"] = False
    if precision == "fp32" and not channels_last and on_cpu and not any(options.values()):
        return model  # no TF32 to switch off and no cuDNN on a CPU
    return PrecisionModel(model, precision, channels_last, cudnn, **options).eval()
