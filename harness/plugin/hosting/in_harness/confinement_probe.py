"""Does a device driver initialize in a confined plugin host? One host per confinement layer.

``python -m harness.plugin.hosting.in_harness.confinement_probe [--device cuda|cpu]``
starts plugin hosts (:class:`~harness.plugin.hosting.in_harness.host_process.PluginHost`,
the built-ins only): one unconfined, one confined by each layer of
:data:`~harness.plugin.hosting.shared.policy.LAYERS` alone, and one by all of them, as a
third-party plugin's host is. It asks each (request ``probe``, answered in the host by
:func:`harness.plugin.hosting.in_host.driver_probe.probe`, whose docstring lists the
parts) to do what the CUDA driver does to the OS while it initializes (thread names,
memfd, devices), then to initialize CUDA and compute (cpu, cuInit, torch.cuda with
``--device cuda``), and, in the host confined by all layers, to try what must stay
refused (:data:`~harness.plugin.hosting.in_host.driver_probe.REFUSED`): the four below.

It prints one line per host as each answers: ``ok`` or ``FAILED``, then each part's
outcome. A part the device lacks (no CUDA driver on a CPU machine, no NVIDIA device file)
says so and fails nothing with ``--device cpu``; with ``--device cuda`` every part must
work, and the host confined by all layers must refuse the four. The exit status is 1 when
a host failed. tools/gpu-check runs it as its ``confinement`` step (docs/gpu.md): if a
confined host cannot initialize CUDA, the layer alone that fails names what to grant.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed

from harness.foundation.errors import IdrsError
from harness.plugin.hosting.shared import landlock
from harness.plugin.hosting.shared.policy import LAYERS, MINIMUM_ABI, gpu_devices, refusal

VARIANTS: dict[str, tuple[str, ...] | None] = {
    "unconfined": None,
    **{layer: (layer,) for layer in LAYERS},
    "all": LAYERS,
}
"""Each host of the probe: the layers it is confined by (None: unconfined)."""
PROG = "python -m harness.plugin.hosting.in_harness.confinement_probe"


def judge(parts: Sequence[Sequence[str]], device: str) -> bool:
    """Whether a host's answer passes: no part failed, and with ``device`` cuda none
    unavailable either."""
    return all(o == "ok" or (o == "unavailable" and device != "cuda") for _, o, _ in parts)


def line(variant: str, parts: Sequence[Sequence[str]], device: str) -> str:
    """One host's line: the variant, ``ok`` or ``FAILED``, each part's outcome."""
    said = "; ".join(f"{name}: {s if o != 'unavailable' else 'unavailable, ' + s}"
                     for name, o, s in parts)  # fmt: skip
    return f"{variant:13} {'ok' if judge(parts, device) else 'FAILED':6} {said}"


def _skipped(layers: tuple[str, ...] | None, abi: int) -> str | None:
    """Why a variant cannot run on this kernel (None: it can)."""
    if layers is None or not any(layer.startswith("landlock") for layer in layers):
        return None
    if refusal(abi) is not None:
        return f"Landlock ABI {abi}; a plugin host is confined from ABI {MINIMUM_ABI}"
    if layers == ("landlock-net",) and abi < 4:
        return f"Landlock ABI {abi} has no TCP rules (ABI 4) nor scoping (ABI 6)"
    return None


def _variant(variant: str, device: str, devices: list[str], abi: int) -> tuple[str, bool]:
    from harness.plugin.hosting.in_harness.host_process import PluginHost

    layers = VARIANTS[variant]
    why = _skipped(layers, abi)
    if why is not None:
        return f"{variant:13} {'skip':6} {why}", device != "cuda" or variant != "all"
    host = PluginHost(None, confined=layers is not None, layers=layers or LAYERS)
    try:
        answer = host.probe(device, devices, os.getpid(), refusals=variant == "all")
    except IdrsError as exc:
        return f"{variant:13} {'FAILED':6} {str(exc).splitlines()[0]}", False
    finally:
        host.close()
    return line(variant, answer["parts"], device), judge(answer["parts"], device)


def run(device: str, out=sys.stdout) -> int:
    """Probe every variant side by side, one line each as it answers; 0 when all passed."""
    import torch

    abi = landlock.landlock_abi()
    devices = gpu_devices()
    print(f"confinement probe on {device}: Linux {platform.release()}, Landlock ABI {abi}, "
          f"Python {platform.python_version()}, torch {torch.__version__}; NVIDIA device files: "
          f"{', '.join(devices) or 'none'}", file=out, flush=True)  # fmt: skip
    passed = True
    with ThreadPoolExecutor(len(VARIANTS)) as pool:
        futures = [pool.submit(_variant, v, device, devices, abi) for v in VARIANTS]
        for future in as_completed(futures):
            said, ok = future.result()
            passed &= ok
            print(said, file=out, flush=True)
    return 0 if passed else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="cuda: every part must work (default when CUDA is available)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return run(args.device)


if __name__ == "__main__":
    sys.exit(main())
