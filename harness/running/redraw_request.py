"""What the replay process (:mod:`harness.running.redraw`) is asked: the request to re-draw
some of a run's inputs as their stored draws were drawn."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.foundation.errors import IdrsError
from harness.running.redraw import ReplaySource, fresh_streams


def replay_request(
    source: ReplaySource, device: str, input_ids: Sequence[int],
    bases: Sequence[Mapping[str, Any]], kind: str, sigma_model: str | None = None,
    fresh_seed: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """A request to re-draw ``input_ids`` as their stored base draws ``bases`` were drawn
    (at their σ, their recorded diagonal scales, :mod:`harness.engine.scale`, and centres,
    :mod:`harness.engine.centre`, in their looks when drawn sequentially) for a ``kind``
    (``hard``/``soft``) certifier; ``sigma_model`` names the row's σ-estimator
    (``"<method> <setting>"``) when it declares a σ-smoothing."""
    from harness.engine.centre import recorded_centres
    from harness.engine.scale import recorded_scales

    model = None
    if sigma_model is not None:
        if sigma_model not in source.sigma_models:
            raise IdrsError(
                f"the σ-estimator of {sigma_model} was not saved with the run, so its σ draws "
                "cannot be re-drawn; rerun the benchmark"
            )
        model = dict(source.sigma_models[sigma_model])
    request = {"run": source.header(device), "inputs": [int(i) for i in input_ids],
               "sigma": [float(b["sigma"]) for b in bases], "kind": kind, "sigma_model": model,
               "fresh_streams": list(fresh_streams(fresh_seed)), "looks": look_sizes(bases)}  # fmt: skip
    recorded = {"scale": recorded_scales(list(bases)), "centre": recorded_centres(list(bases))}
    return request | {name: value for name, value in recorded.items() if value is not None}


def look_sizes(bases: Sequence[Mapping[str, Any]]) -> list[list[int]] | None:
    """Per stored base draw, the n of each of its looks (None unless drawn sequentially)."""
    sizes = [[int(look["n"]) for look in base.get("looks") or []] for base in bases]
    return sizes if any(sizes) else None
