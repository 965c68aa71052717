"""The analytic components, a built-in plugin of their own (``analytic``): the base
classifiers whose smoothed classifier is known exactly (``linear-N``, ``ball-N``,
:mod:`harness.audit.analytic`), the matching ``ball-N`` dataset, and the trainer
``none`` for models that need no training. The checks build their analytic models
directly; these registrations let a benchmark name them."""

from __future__ import annotations

from harness.plugin.components import DatasetSpec, ModelSpec, TrainerSpec
from harness.plugin.hookspecs import hookimpl

IDRS_BENCH_CONTRACT = 4
"""The plugin contract this plugin is written against (docs/plugins.md)."""


def _build_linear(input_shape, num_classes, params):
    from harness.audit.analytic import build_linear

    return build_linear(input_shape, num_classes, params)


def _build_ball(input_shape, num_classes, params):
    from harness.audit.analytic import build_ball

    return build_ball(input_shape, num_classes, params)


def _load_ball(data_root=None, download=False, seed=0, dim=2, **_):
    from harness.audit.analytic import load_ball_dataset

    return load_ball_dataset(dim, seed)


def _no_training(model, dataset, params, context) -> None:
    """Analytic models are exact; there is nothing to train."""


@hookimpl
def idrs_register_models(register) -> None:
    register(
        ModelSpec(
            "linear-N", _build_linear, {"offset": 0.0}, "f(x) = [x_1 > offset], exact smoothing"
        )
    )
    register(
        ModelSpec("ball-N", _build_ball, {"radius": 1.0}, "f(x) = [‖x‖ <= radius], exact smoothing")
    )


@hookimpl
def idrs_register_datasets(register) -> None:
    register(DatasetSpec("ball-N", _load_ball, "points inside/outside the unit ball, N dimensions"))


@hookimpl
def idrs_register_trainers(register) -> None:
    register(TrainerSpec("none", _no_training, {}, "no training (analytic models)"))
