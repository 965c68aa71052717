"""The arithmetic a run certified with: what must match for its counts to replay bit for bit.

A stored class count is a function of the run's noise keys (harness/README.md, "Noise
contract") *and* of the floating-point arithmetic that computed the base model's
logits: the device and its kernels (torch version, CPU instruction set, GPU model), the
number of threads, the precision backend, cuDNN's algorithm choice and its version, the
noise scheme and what draws it on CUDA (the fused Triton kernel or torch ops, which
round differently), the forward options (folded BatchNorms, compiled kernels, CUDA
graphs: :mod:`harness.engine.forward`), and the batch shape (the
engine pads every forward pass to ``batch_size`` rows, :class:`~harness.engine.sampling.
SamplingEngine`, because a BLAS may round a row differently for another number of rows,
and may for another position: measured, :func:`rows_independent`). :func:`fingerprint` records these with
the run (the ``runs.arithmetic`` column); the replay check (:mod:`harness.audit.
replay`) demands bit-for-bit equal counts where the fingerprints agree and uses a
statistical replication test with fresh noise where they differ (:func:`differences`).

On CPU the thread count is part of it (measured: the built-in MLP's logits at 8 threads
and the ``cnn``'s at 2 differ from 1 thread's in their last bits), so every process that
computes a run's stored quantities computes with the run's count (:func:`run_threads`,
:func:`computing_with`): a process joining or resuming the run, the audit's σ
recomputation and the replay process (:mod:`harness.foundation.threads`).

cuDNN's ``benchmark`` mode (the protocol's ``cudnn``) times convolution algorithms in each
process, so two processes on the same arithmetic may run different algorithms: such a
run never matches any arithmetic, and its replay is the replication test, never a
false bit-for-bit alarm. The default ``heuristic`` mode picks the same algorithm for the
same shapes, cuDNN version and GPU model, all recorded.

Padding every pass to ``batch_size`` rows makes a sample's logits those of any batch it
could share only if, at that shape, a row's outputs depend on the row alone. Not every
BLAS promises it (seen: the CPU of a GPU machine, torch 2.11, rounded a row of the
784-200-10 MLP otherwise at another position of the same 64-row batch), so a run measures
it when it begins (:func:`rows_independent`, recorded as ``rows``): a run whose rows were
``dependent`` matches no arithmetic either, and its replays are statistical. The
measurement is of the forward pass: a backward pass may still round a row by its position
where the forward does not (MKL's AVX-512 kernels, the input gradient of a small MLP's
odd rows: measured on an AMD EPYC), so a σ computed through gradients is the same in any
batch up to rounding only, which is what the replay check holds σ to.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from harness.foundation.protocol import FORWARD_OPTIONS

KEYS = (
    "device_type", "device_name", "torch", "cuda", "threads", "cpu_capability", "precision",
    "channels_last", "noise", "batch_size", "executor", "cudnn", "noise_kernel",
    *FORWARD_OPTIONS,
)  # fmt: skip
"""What a fingerprint holds; two runs replay each other bit for bit only if all agree (the
forward options only when on, so earlier records still match)."""


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else :func:`platform.processor`)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def fingerprint(
    device: torch.device | str, protocol: Any, batch_size: int, executor: str = "local",
    threads: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The arithmetic of certifying under ``protocol`` on ``device`` in this process, with
    ``threads`` (default: this process's count; not recorded on CUDA).

    ``batch_size`` is the resolved number of rows of every forward pass; ``executor``
    names where the shards ran (a Ray worker may use another thread count or machine,
    so only ``local`` runs can be matched bit for bit).
    """
    from harness.engine.noise import noise_kernel
    from harness.engine.precision import resolve_precision

    device = torch.device(device)
    cuda = device.type == "cuda"
    noise = getattr(protocol, "noise", None)
    cudnn = f"{getattr(protocol, 'cudnn', 'heuristic')} {torch.backends.cudnn.version()}"
    # folded BatchNorms and compiled kernels round otherwise; CUDA graphs replay the eager
    # kernels, recorded all the same (on CUDA only: on a CPU the option does nothing)
    forward = {option: True for option in FORWARD_OPTIONS
               if getattr(protocol, option, False) and (cuda or option != "cuda_graphs")}  # fmt: skip
    return {
        "device_type": device.type,
        "device_name": torch.cuda.get_device_name(device) if cuda else cpu_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "threads": None if cuda else int(threads or torch.get_num_threads()),
        "cpu_capability": None if cuda else torch.backends.cpu.get_cpu_capability(),
        "precision": resolve_precision(getattr(protocol, "precision", "fp32"), device),
        "channels_last": bool(getattr(protocol, "channels_last", False)),
        "noise": noise,
        "batch_size": int(batch_size),
        "executor": executor,
        # None on a CPU (no cuDNN; noise always by torch ops): CPU runs recorded before
        # these keys existed still match
        "cudnn": cudnn if cuda else None,
        "noise_kernel": noise_kernel(device) if cuda and noise == "philox-v1" else None,
        **forward,
    }


ROWS_DEPENDENT = "dependent"
"""The ``rows`` of a fingerprint whose logits depended on the other rows of a batch."""


def rows_independent(
    model: torch.nn.Module, examples: torch.Tensor, batch_size: int, trials: int = 2
) -> bool:
    """Whether ``model``'s outputs at ``batch_size`` rows are, bit for bit, a function of
    each row alone: a batch of noisy copies of ``examples`` (on the model's device), then
    the same rows at other positions (``trials`` random permutations, the second with half
    of the other rows replaced), compared bit for bit. A batch of one row is trivially so."""
    if batch_size < 2:
        return True
    generator = torch.Generator().manual_seed(0)
    shape = examples.shape[1:]
    picks = torch.arange(batch_size) % len(examples)
    noise = torch.randn((batch_size, *shape), generator=generator)
    base = (examples.cpu()[picks] + 0.25 * noise).to(examples.device)
    with torch.no_grad():
        reference = _bits(model(base))
        for trial in range(trials):
            order = torch.randperm(batch_size, generator=generator)
            mixed = base[order.to(examples.device)]
            if trial:  # other rows' contents too: fresh noise in half of them
                other = order[batch_size // 2 :]
                fresh = torch.randn((len(other), *shape), generator=generator)
                mixed[batch_size // 2 :] = (examples.cpu()[picks[other]] + 0.25 * fresh).to(
                    mixed.device
                )
                order = order[: batch_size // 2]
            got = _bits(model(mixed))[: len(order)]
            if not torch.equal(got, reference[order.to(reference.device)]):
                return False
    return True


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A float tensor's bits as integers (NaN equals NaN, −0 differs from +0)."""
    kinds = {2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.detach().contiguous().view(kinds[t.element_size()])


def differences(recorded: Mapping[str, Any] | None, here: Mapping[str, Any]) -> list[str]:
    """The keys on which ``here`` differs from a run's ``recorded`` fingerprint, as
    ``key: recorded → here``; every key when none was recorded (a run made before
    fingerprints, or one whose arithmetic changed on resume). A run that timed cuDNN's
    algorithms, or whose rows were ``dependent``, differs from every arithmetic."""
    if not recorded or "varied" in recorded:
        why = "not recorded" if not recorded else "the run changed arithmetic when resumed"
        return [f"arithmetic {why}"]
    timed = [
        f"cudnn: {recorded['cudnn']!r}: cuDNN timed its algorithms, another process may "
        "choose others"
    ] if str(recorded.get("cudnn")).startswith("benchmark") else []  # fmt: skip
    if recorded.get("rows") == ROWS_DEPENDENT:
        timed.append("rows: a row's logits depended on the other rows of its batch when the "
                     "run began (measured), so no input is re-drawn bit for bit")  # fmt: skip
    return timed + [
        f"{key}: {recorded.get(key)!r} → {here.get(key)!r}"
        for key in KEYS
        if recorded.get(key) != here.get(key)
    ]


def combined(recorded: Mapping[str, Any] | None, here: Mapping[str, Any]) -> dict[str, Any]:
    """The fingerprint to record when a run (re)starts: ``here`` for a new run or the
    same arithmetic; else a marker ``{"varied": [...]}`` that matches no arithmetic, so
    the counts of a run resumed elsewhere are only ever replicated statistically."""
    if not recorded or dict(recorded) == dict(here):
        return dict(here)
    earlier = recorded["varied"] if "varied" in recorded else [dict(recorded)]
    return {"varied": [*earlier, dict(here)]}


def run_threads(recorded: Mapping[str, Any] | None, requested: int | None = None) -> int | None:
    """The thread count to compute a run with, whose ``recorded`` fingerprint is given: the
    ``requested`` one (the user's choice: another count than the run's makes it
    ``varied``), else the count a CPU run recorded, else None (this process's own)."""
    if requested is not None:
        return int(requested)
    if recorded and "varied" not in recorded and recorded.get("device_type") == "cpu":
        return int(recorded["threads"]) if recorded.get("threads") else None
    return None


@contextmanager
def computing_with(threads: int | None) -> Iterator[None]:
    """torch computes with ``threads`` intra-op threads inside the block (None: this
    process's count); the count before is restored after."""
    before = torch.get_num_threads()
    if threads is not None and threads != before:
        torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def padded_chunks(
    x: torch.Tensor, rows: int, pad: bool = True
) -> Iterator[tuple[torch.Tensor, int]]:
    """``x`` in chunks of ``rows`` rows, the last padded with zero rows (``pad``), each with
    how many of its rows are ``x``'s: a computation that passes every chunk through its
    products gives each row of ``x`` the same result in any batch up to a BLAS's rounding
    of a row by its position (none in a forward pass where :func:`rows_independent` says
    so; seen in a backward pass: the module docstring), as the engine's padded passes do
    for the base model."""
    for start in range(0, len(x), rows):
        chunk = x[start : start + rows]
        real = len(chunk)
        if pad and real < rows:
            chunk = torch.cat([chunk, chunk.new_zeros((rows - real, *chunk.shape[1:]))])
        yield chunk, real
