"""A base model per training σ and per training seed: a benchmark expanded into runs.

The seed papers train one base model per noise level and certify each σ on its own model
(Cohen et al. 2019, §4: "we trained ... with σ ∈ {0.12, 0.25, 0.5, 1.00}" and certify each
at its σ; Alfarra et al. 2022, Table 1; Súkeník et al. 2022, §5). A benchmark says so in
its ``[model]`` table:

- ``per_sigma = true``: each setting with a ``sigma`` (its σ_b) certifies a model trained
  at ``training_sigma`` of that σ_b, by default σ_b itself; a setting without one (e.g.
  the Lipschitz σ-network, Dual RS) certifies the model of ``trainer_params.sigma``;
- ``training_sigma = { "0.5" = 0.25 }``: the training σ of a σ_b, where it is not σ_b;
- ``seeds = [0, 1, 2]``: one model per (training σ, seed), every setting certified on
  each, in place of ``[model] seed`` (the spread over seeds is what a board compares against: arXiv 2601.13303).

:func:`model_variants` turns such a benchmark into one benchmark per base model, each a
plain one-model run (its own run id, model, certificates and checks), in order of
training σ, then seed. A benchmark without these keys is its own only variant, so its run
id is what it always was. A board puts the runs of one benchmark in one table, with the
model of each row beside it; rows are paired only with rows of their own model
(:mod:`harness.reports.leaderboard.paired_differences`), and compared across seeds by
:mod:`harness.reports.leaderboard.seeds`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.foundation.errors import SpecError

KEYS = ("per_sigma", "training_sigma", "seeds")
"""The ``[model]`` keys of this module."""


@dataclass(frozen=True)
class ModelAxes:
    """``[model] per_sigma``, ``training_sigma`` and ``seeds`` (module docstring)."""

    per_sigma: bool = False
    training_sigma: dict[float, float] = field(default_factory=dict)  # σ_b -> training σ
    seeds: tuple[int, ...] = ()  # training seeds (empty: ``[model] seed`` alone)


def model_axes(model: Mapping[str, Any], methods: Sequence[Any]) -> ModelAxes | None:
    """The axes a benchmark's ``[model]`` table declares (None: one base model), checked:
    ``per_sigma`` a boolean that needs ``trainer_params.sigma``, ``training_sigma`` a table
    of σ_b (as in the settings) to training σ >= 0, ``seeds`` distinct integers; neither
    with a checkpoint, which is one model."""
    if not any(key in model for key in KEYS):
        return None
    if model.get("checkpoint") is not None:
        raise SpecError(f"[model] {', '.join(k for k in KEYS if k in model)} trains models; a "
                        "checkpoint is one model: leave out the checkpoint or these keys")  # fmt: skip
    per_sigma = model.get("per_sigma", False)
    if not isinstance(per_sigma, bool):
        raise SpecError(f"model.per_sigma must be true or false, got {per_sigma!r}")
    trainer_params = model.get("trainer_params", {})
    if per_sigma and not _number(trainer_params.get("sigma"), 0.0):
        raise SpecError("model.per_sigma needs model.trainer_params.sigma: the training σ of the "
                        "settings without a sigma (and a trainer that takes one)")  # fmt: skip
    overrides = model.get("training_sigma", {})
    if not isinstance(overrides, dict):
        raise SpecError('model.training_sigma must be a table of σ_b to training σ, e.g. '
                        '{ "0.5" = 0.25 }')  # fmt: skip
    if overrides and not per_sigma:
        raise SpecError("model.training_sigma applies with model.per_sigma = true; add it")
    table = {}
    sigmas = {float(s["sigma"]) for m in methods for s in m.settings if _number(s.get("sigma"))}
    for key, value in overrides.items():
        try:
            sigma_b = float(key)
        except ValueError:
            raise SpecError(f"model.training_sigma: {key!r} is not a σ_b (a number)") from None
        if not _number(value, 0.0):
            raise SpecError(f"model.training_sigma: the training σ of {key} must be a number "
                            f">= 0, got {value!r}")  # fmt: skip
        if sigma_b not in sigmas:
            raise SpecError(f"model.training_sigma names σ_b = {key}, but no setting has "
                            f"sigma = {key}; the settings' σ_b: {sorted(sigmas)}")  # fmt: skip
        table[sigma_b] = float(value)
    seeds = model.get("seeds", [])
    if (not isinstance(seeds, list) or not seeds or len(set(seeds)) != len(seeds)
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):  # fmt: skip
        if "seeds" in model:
            raise SpecError(f"model.seeds must be a list of distinct integers, got {seeds!r}")
        seeds = []
    return ModelAxes(per_sigma, table, tuple(seeds))


def _number(value: Any, low: float | None = None) -> bool:
    """Whether ``value`` is a finite number (and >= ``low``)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return ok and (low is None or value >= low)


def training_sigma(axes: ModelAxes, params: Mapping[str, Any], default: float) -> float:
    """The training σ of the model a setting certifies (module docstring)."""
    sigma_b = params.get("sigma")
    if not axes.per_sigma or not _number(sigma_b):
        return default
    return axes.training_sigma.get(float(sigma_b), float(sigma_b))


def model_variants(benchmark: Any) -> list[Any]:
    """One benchmark per base model of ``benchmark`` (a
    :class:`~harness.running.benchmark.Benchmark`), each with the settings that certify
    it and no axes: in order of training σ, then seed; ``[benchmark]`` without axes."""
    axes: ModelAxes | None = benchmark.model_axes
    if axes is None:
        return [benchmark]
    params = benchmark.model.trainer_params
    default = params.get("sigma")
    groups: dict[float | None, dict[str, list[dict[str, Any]]]] = {}
    for method in benchmark.methods:
        for setting in method.settings:
            sigma = training_sigma(axes, setting, default)
            groups.setdefault(sigma, {}).setdefault(method.name, []).append(setting)
    method_type = type(benchmark.methods[0])
    variants = []
    for sigma in sorted(groups, key=lambda s: -1.0 if s is None else s):
        methods = [method_type(name, settings) for name, settings in groups[sigma].items()]
        trained = params if not axes.per_sigma else {**params, "sigma": sigma}
        for seed in axes.seeds or (benchmark.model.seed,):
            model = dataclasses.replace(benchmark.model, seed=seed, trainer_params=trained)
            variants.append(dataclasses.replace(benchmark, model=model, methods=methods,
                                                model_axes=None))  # fmt: skip
    return variants


def model_label(config: Mapping[str, Any]) -> str:
    """A run's base model in a few characters, from its stored spec: ``σ 0.25 · seed 0``
    (the training σ when its trainer has one)."""
    model = config.get("model") or {}
    sigma = (model.get("trainer_params") or {}).get("sigma")
    seed = f"seed {model.get('seed', 0)}"
    return seed if sigma is None else f"σ {sigma:g} · {seed}"
