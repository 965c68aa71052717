"""How to reproduce a stored run: its benchmark spec as TOML, and the command to run it.

The stored config is :meth:`harness.running.benchmark.Benchmark.to_dict`; turned back into a
benchmark file (``protocol`` is the ``[certification]`` table, unset values are
dropped) it parses to the same spec, so ``idrs-bench run`` on it, on the same device
kind and at the same commit, recreates the run under the same run id. Under sequential
sampling the protocol's ``grid`` (the benchmark's ``radii``, which the file states) is
left out, and a run stored before the protocol named its rule gets
``rule = "mixture-cs-v2"``, the rule it ran (a file without it would run today's default).
"""

from __future__ import annotations

from typing import Any


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


def spec_toml(config: dict[str, Any]) -> str:
    """The benchmark file of a stored config."""
    import tomli_w

    from harness.foundation.protocol import LEGACY_SEQUENTIAL_RULE

    raw = {("certification" if k == "protocol" else k): v for k, v in config.items()}
    protocol = dict(raw.get("certification") or {})
    if protocol.get("sampling") == "sequential":
        protocol.pop("grid", None)
        protocol.setdefault("rule", LEGACY_SEQUENTIAL_RULE)
        raw["certification"] = protocol
    return tomli_w.dumps(_without_none(raw))


def device_flag(device: str) -> str:
    """``cuda`` for any CUDA device (``cuda:0``), else the device as stored (``cpu``)."""
    return "cuda" if device.startswith("cuda") else device


def spec_filename(stem: str, run_id: str) -> str:
    """The file name of a run's spec beside the board ``stem``.md."""
    return f"{stem}.spec-{run_id[:12]}.toml"


def run_command(spec_path: str, device: str) -> str:
    return f"idrs-bench run {spec_path} --device {device_flag(device)}"
