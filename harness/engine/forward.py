"""The base model's forward pass at the engine's fixed batch shape: ``torch.compile`` and
CUDA graphs (the protocol's ``compile`` and ``cuda_graphs``; BatchNorm folding is
:mod:`harness.engine.folding`).

Every forward pass of a run's sampling engine has the same shape: ``batch_size`` rows
(:class:`~harness.engine.sampling.SamplingEngine` pads partial batches). A padded engine
tells the certified classifier its batch size when it is made (:meth:`FixedShapeForward.
serve`), and from then on every call of that classifier with that many rows and without
gradients, whoever makes it (the engine, a σ-provider, a check), runs

- compiled: ``torch.compile(model, dynamic=False)``, specialized to the shape (Inductor
  fuses the elementwise work between the convolutions and matmuls; compiled once per
  process and shape, on the first call). Fused kernels round differently from eager
  ones, so a compiled classifier is another arithmetic of f, recorded with the run
  (:mod:`harness.engine.arithmetic`);
- through a CUDA graph (CUDA only): the forward is captured once per shape (after warm-up
  calls, which also let cuDNN's benchmark mode time its algorithms) and replayed with one
  launch instead of one per kernel; the input is copied into the graph's static buffer
  and the logits copied out. A replay runs the captured kernels, those of an eager call at
  that shape. On a CPU the option does nothing and says so once per process.

Any other shape, and any call that records gradients (σ-providers that differentiate
through the model), runs eagerly, so what a shape computes never depends on what ran
before. Models the audit moves between trials (:mod:`harness.audit.analytic`, whose
engine is :class:`~harness.engine.exact.ExactSampling`) never register a batch.
"""

from __future__ import annotations

import warnings

import torch

from harness.foundation.errors import IdrsError

WARMUP_CALLS = 3
"""Eager (or compiled) calls on a side stream before a shape's CUDA graph is captured."""

_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """A :class:`RuntimeWarning` with ``message``, once per process and ``key``."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


CPU_GRAPHS = (
    "cuda_graphs = true has no effect on a CPU: CUDA graphs exist only on CUDA devices, so "
    "the forward passes run as usual (set cuda_graphs = false to silence this)"
)


class FixedShapeForward:
    """``model`` compiled and/or replayed from CUDA graphs at the batch sizes it serves
    (module docstring); every other call eager. Not a module: ``model`` stays the owner's
    submodule (one state dict), this only calls it."""

    def __init__(self, model: torch.nn.Module, compile: bool, cuda_graphs: bool) -> None:
        self.model = model
        self.compiled = torch.compile(model, dynamic=False) if compile else None
        self.cuda_graphs = cuda_graphs
        self.batches: set[int] = set()
        self.graphs: dict[tuple, CapturedForward] = {}

    def serve(self, batch_size: int) -> None:
        """Calls with ``batch_size`` rows run compiled / from graphs from now on."""
        self.batches.add(int(batch_size))

    def serves(self, x: torch.Tensor) -> bool:
        return x.dim() > 0 and x.shape[0] in self.batches and not torch.is_grad_enabled()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        net = self.model if self.compiled is None else self.compiled
        if not (self.cuda_graphs and x.is_cuda):
            return _compiled_call(net, x) if self.compiled is not None else net(x)
        layout = x.is_contiguous(memory_format=torch.channels_last) and x.dim() == 4
        key = (tuple(x.shape), x.dtype, x.device, layout)
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = CapturedForward(net, x)
        return graph(x)


def _compiled_call(net, x: torch.Tensor) -> torch.Tensor:
    try:
        return net(x)
    except Exception as exc:
        if type(exc).__module__.startswith(("torch._dynamo", "torch._inductor")):
            root = exc
            while root.__cause__ is not None:  # the compiler's own error, not dynamo's wrapper
                root = root.__cause__
            said = next((line for line in str(root).splitlines() if line.strip()), "")
            raise IdrsError(
                f"compile = true: torch.compile could not compile the base model "
                f"({type(root).__name__}: {said}); on a CPU it needs a C++ compiler, on "
                "CUDA Triton; certify with compile = false"
            ) from exc
        raise


class CapturedForward:
    """One shape's forward pass as a CUDA graph: static input, captured kernels, static
    output (PyTorch's documented whole-network capture: warm-up on a side stream, then
    ``torch.cuda.graph``)."""

    def __init__(self, net, example: torch.Tensor) -> None:
        device = example.device
        self.input = torch.empty_like(example).copy_(example)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                net(self.input)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(self.graph):
                self.output = net(self.input)
        except Exception as exc:
            raise IdrsError(
                f"cuda_graphs = true: the base model's forward pass cannot be captured in a "
                f"CUDA graph ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                "); a model that synchronizes with the host (e.g. .item(), data-dependent "
                "shapes) cannot: certify it with cuda_graphs = false"
            ) from None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.input.copy_(x)
        self.graph.replay()
        return self.output.clone()
