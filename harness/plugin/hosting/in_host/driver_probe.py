"""What a device driver does to the OS while it initializes, tried in a plugin host.

The part of the confinement probe that runs in the host (request ``probe``:
:func:`probe`; the harness's side, one host per confinement layer, is
:mod:`harness.plugin.hosting.in_harness.confinement_probe`): what the CUDA driver does to
the OS while it initializes, then CUDA initialized and a computation:

- **thread names**: a thread started after confinement is named from another thread
  (``pthread_setname_np(3)``, which writes ``/proc/self/task/<tid>/comm``: the driver names
  the threads it starts in ``cuInit``), and named again by writing that file;
- **memfd**: an anonymous memory file (``memfd_create(2)``, which the driver makes);
- **devices**: each NVIDIA device file opened (read and write where its mode lets the host),
  each folder of them listed;
- **cpu**: a small float64 computation (an elementwise sum, a matrix product, a
  convolution), its first two checked against closed forms;
- **cuInit**: ``cuInit(0)`` of the driver's library (``libcuda.so.1``), its error by name;
- **torch.cuda** (``--device cuda``): torch's CUDA initialization and the same computation
  on the GPU (cuBLAS, cuDNN), against the CPU's;

and, in the host confined by all layers, what must stay refused (:data:`REFUSED`; each
only opened and closed, nothing written): ``/proc/sysrq-trigger`` and
``/proc/sys/vm/drop_caches`` for writing, the harness's main thread's name for writing,
the harness's memory for reading.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
from collections.abc import Callable, Sequence

THREAD_NAME = "idrs-probe"


class _Unavailable(Exception):
    """A part the machine lacks (no CUDA driver, no device file): said, not failed."""


def _name_a_new_thread() -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    done = threading.Event()
    thread = threading.Thread(target=done.wait, daemon=True)
    thread.start()
    try:
        path = f"/proc/self/task/{thread.native_id}/comm"
        code = libc.pthread_setname_np(ctypes.c_ulong(thread.ident), THREAD_NAME.encode())
        if code:
            raise OSError(code, f"pthread_setname_np: {os.strerror(code)} ({path})")
        with open(path, "w") as comm:  # (as "w": truncated, then written)
            comm.write(THREAD_NAME[::-1])
        with open(path) as comm:
            name = comm.read().strip()
        if name != THREAD_NAME[::-1]:
            raise OSError(f"{path} reads {name!r} after it was written")
        return "ok"
    finally:
        done.set()
        thread.join()


def _memfd() -> str:
    fd = os.memfd_create("idrs-probe", os.MFD_CLOEXEC)
    try:
        os.write(fd, b"probe")
    finally:
        os.close(fd)
    return "ok"


def _devices(paths: Sequence[str]) -> str:
    if not paths:
        raise _Unavailable("no NVIDIA device file")
    opened = 0
    for path in paths:
        files = ([os.path.join(path, f) for f in sorted(os.listdir(path))]
                 if os.path.isdir(path) else [path])  # fmt: skip
        for file in files:
            writable = os.access(file, os.R_OK | os.W_OK)  # (the mode; Landlock is not asked)
            os.close(os.open(file, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC))
            opened += 1
    return f"ok ({opened} opened)"


def _arrays():
    import torch

    generator = torch.Generator().manual_seed(0)
    return (torch.rand(64, 64, generator=generator, dtype=torch.float64),
            torch.rand(2, 3, 16, 16, generator=generator, dtype=torch.float64),
            torch.rand(4, 3, 3, 3, generator=generator, dtype=torch.float64))  # fmt: skip


def computation(device: str) -> list[float]:
    """Σ a², Σ a·a and Σ conv2d(image, kernel) of fixed float64 arrays, computed on ``device``."""
    import torch

    a, image, kernel = (t.to(device) for t in _arrays())
    convolved = torch.nn.functional.conv2d(image, kernel, padding=1)
    return [float(v) for v in torch.stack([(a * a).sum(), (a @ a).sum(), convolved.sum()]).cpu()]


def _cpu() -> str:
    squares, product, _ = computation("cpu")
    a = _arrays()[0]
    rows, columns = a.sum(1).tolist(), a.sum(0).tolist()  # Σ_ij (a·a)_ij = Σ_k c_k r_k
    expected = (math.fsum(v * v for v in a.flatten().tolist()),
                math.fsum(c * r for c, r in zip(columns, rows, strict=True)))  # fmt: skip
    got = (squares, product)
    if not all(math.isclose(g, e, rel_tol=1e-12) for g, e in zip(got, expected, strict=True)):
        raise ArithmeticError(f"computed {got}, expected {expected}")
    return "ok"


def _cuinit() -> str:
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        raise _Unavailable("no CUDA driver (libcuda.so.1)") from None
    code = driver.cuInit(0)
    if code != 0:
        name = ctypes.c_char_p()
        driver.cuGetErrorName(code, ctypes.byref(name))
        raise OSError(f"cuInit: {(name.value or b'?').decode()} ({code})")
    count = ctypes.c_int()
    driver.cuDeviceGetCount(ctypes.byref(count))
    return f"ok ({count.value} device(s))"


def _torch_cuda() -> str:
    import torch

    torch.cuda.init()
    got, expected = computation("cuda"), computation("cpu")
    if not all(math.isclose(g, e, rel_tol=1e-9) for g, e in zip(got, expected, strict=True)):
        raise ArithmeticError(f"cuda computed {got}, the CPU {expected}")
    return f"ok ({torch.cuda.get_device_name()}, the computation agrees with the CPU's)"


REFUSED = {
    "/proc/sysrq-trigger": ("/proc/sysrq-trigger", os.O_WRONLY),
    "/proc/sys/vm/drop_caches": ("/proc/sys/vm/drop_caches", os.O_WRONLY),
    "the harness's thread name": ("/proc/{parent}/task/{parent}/comm", os.O_WRONLY),
    "the harness's memory": ("/proc/{parent}/mem", os.O_RDONLY),
}
"""What a confined host must not open, and how (never written: each is closed at once):
two files of ``/proc`` that root writes without any capability (a reboot; dropping the
caches), and the harness's entries."""


def refused_outcomes(parent: int) -> dict[str, str]:
    """Each of :data:`REFUSED` opened and closed: ``refused``, ``opened`` or ``absent``
    (``/proc/sysrq-trigger`` on a kernel without magic SysRq)."""
    out = {}
    for what, (path, flags) in REFUSED.items():
        try:
            os.close(os.open(path.format(parent=parent), flags | os.O_CLOEXEC))
            out[what] = "opened"
        except PermissionError:
            out[what] = "refused"
        except FileNotFoundError:
            out[what] = "absent"
    return out


def _refused(parent: int) -> str:
    seen = refused_outcomes(parent)
    opened = [what for what, outcome in seen.items() if outcome == "opened"]
    if opened:
        raise PermissionError(f"opened {', '.join(opened)}")
    absent = [what for what, outcome in seen.items() if outcome == "absent"]
    return "ok" + (f" ({', '.join(absent)} absent)" if absent else "")


def probe(device: str, devices: Sequence[str], parent: int, refusals: bool) -> list[list[str]]:
    """Run in a plugin host (request ``probe``): each part of the module docstring as
    ``[part, outcome, said]``, outcome ``ok``, ``failed`` or ``unavailable``; torch's CUDA
    only when ``device`` is cuda, the refusals only with ``refusals`` (``parent``: the
    harness's pid)."""
    parts: list[tuple[str, Callable[[], str]]] = [
        ("thread names", _name_a_new_thread), ("memfd", _memfd),
        ("devices", lambda: _devices(devices)), ("cpu", _cpu), ("cuInit", _cuinit),
    ]  # fmt: skip
    if device == "cuda":
        parts.append(("torch.cuda", _torch_cuda))
    if refusals:
        parts.append(("refused", lambda: _refused(parent)))
    out = []
    for name, part in parts:
        try:
            out.append([name, "ok", part()])
        except _Unavailable as exc:
            out.append([name, "unavailable", str(exc)])
        except Exception as exc:
            out.append([name, "failed", f"{type(exc).__name__}: {exc}".splitlines()[0]])
    return out
