"""The parameters of the Insta-RS search (Súkeník et al. 2022, App. C.3, Alg. 2) and their checks.

Kept free of heavy imports so that the plugin registers quickly. See
:mod:`plugins.chen.search` for the algorithm and the choices behind each parameter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness import ParameterError

STEP_STRIDE = 1 << 20
"""Noise streams reserved per start (bounds ``max_steps``); see :mod:`plugins.chen.search`."""

START_SAMPLINGS = ("uniform", "stratified")

SEARCH_DEFAULTS: dict[str, Any] = {
    "sigma": 0.25,  # σ0: σ² = l·σ0² (named like every method's base σ)
    "num_starts": 4,  # K
    "num_samples": 500,  # M (App. C.3: "M = 500")
    "max_level": 16.0,  # T: every accepted l stays in [1, T]
    "start_level_min": 1.0,  # l_k drawn in [start_level_min, start_level_max] (App. C.3: [1, 16])
    "start_level_max": 16.0,
    "max_step_size": 1.0,  # |s_k| < max_step_size (App. C.3: s in (−1, 1))
    "start_sampling": "uniform",  # or "stratified"
    "max_steps": 32,  # cap on hill-climbing steps per start (its measured effect: search.py)
}
"""Parameters of the σ-provider and method ``chen-fgss`` with their defaults."""


@dataclass(frozen=True)
class SearchConfig:
    """The parameters of Alg. 2 (names as in :data:`SEARCH_DEFAULTS`)."""

    sigma0: float
    num_starts: int
    num_samples: int
    max_level: float
    start_level_min: float
    start_level_max: float
    max_step_size: float
    start_sampling: str
    max_steps: int

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> SearchConfig:
        """Check and convert the search parameters; raise ParameterError naming the fix."""
        p = {k: params.get(k, v) for k, v in SEARCH_DEFAULTS.items()}
        for key in ("sigma", "max_level", "start_level_min", "start_level_max", "max_step_size"):
            value = p[key]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ParameterError(f"{key} must be a number, got {value!r}")
            if not 0.0 < value < float("inf"):
                raise ParameterError(f"{key} must be positive and finite, got {value!r}")
        for key in ("num_starts", "num_samples"):
            if isinstance(p[key], bool) or not isinstance(p[key], int) or p[key] < 1:
                raise ParameterError(f"{key} must be an integer >= 1, got {p[key]!r}")
        steps = p["max_steps"]
        if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps < STEP_STRIDE:
            raise ParameterError(
                f"max_steps must be an integer in [0, {STEP_STRIDE}), got {steps!r}"
            )
        if not 1.0 <= p["start_level_min"] <= p["start_level_max"] <= p["max_level"]:
            raise ParameterError(
                "need 1 <= start_level_min <= start_level_max <= max_level (l ranges over "
                f"[1, T]); got {p['start_level_min']}, {p['start_level_max']}, {p['max_level']}"
            )
        if p["start_sampling"] not in START_SAMPLINGS:
            raise ParameterError(
                f"start_sampling must be one of {list(START_SAMPLINGS)}, got {p['start_sampling']!r}"
            )
        return cls(
            sigma0=float(p["sigma"]),
            num_starts=int(p["num_starts"]),
            num_samples=int(p["num_samples"]),
            max_level=float(p["max_level"]),
            start_level_min=float(p["start_level_min"]),
            start_level_max=float(p["start_level_max"]),
            max_step_size=float(p["max_step_size"]),
            start_sampling=str(p["start_sampling"]),
            max_steps=int(steps),
        )


TRAINER_DEFAULTS: dict[str, Any] = {
    **SEARCH_DEFAULTS,
    # the search during training is unspecified; M = 500 is the paper's test-time value, and
    # a refresh costs ~K·3·M forward passes per training example, so training uses fewer
    "num_samples": 64,
    "epochs": 10,
    "batch_size": 128,
    "lr": 1e-3,
    "warmup_epochs": 1,  # constant σ0 before the first search
    "refresh_every": 2,  # E: epochs between refreshes of an example's σ
    "search_batch_size": 1024,  # noisy samples per forward pass of the search
}
"""Parameters of the trainer ``chen-instance`` (see :mod:`plugins.chen.training`)."""
