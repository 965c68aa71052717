"""Soundness checks S0–S5 (harness/README.md, "Soundness checks"), a built-in plugin.

Besides the checks, this plugin registers the analytic base classifiers the checks
rely on (``linear-N``, ``ball-N``), the matching ``ball-N`` dataset, and the trainer
``none`` for models that need no training.
"""

from __future__ import annotations

from harness.components import CheckSpec, DatasetSpec, ModelSpec, TrainerSpec
from harness.hookspecs import hookimpl


def _build_linear(input_shape, num_classes, params):
    from harness.soundness.analytic import build_linear

    return build_linear(input_shape, num_classes, params)


def _build_ball(input_shape, num_classes, params):
    from harness.soundness.analytic import build_ball

    return build_ball(input_shape, num_classes, params)


def _load_ball(data_root=None, download=False, seed=0, dim=2, **_):
    from harness.soundness.analytic import load_ball_dataset

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


def _sigma_regularity(audit):
    from harness.soundness.sigma_regularity import check_sigma_regularity

    return check_sigma_regularity(audit)


def _counterexamples(audit):
    from harness.soundness.counterexamples import check_counterexamples

    return check_counterexamples(audit)


def _coverage(audit):
    from harness.soundness.coverage import check_coverage

    return check_coverage(audit)


def _evidence(audit):
    from harness.soundness.evidence import check_evidence

    return check_evidence(audit)


def _order(audit):
    from harness.soundness.order import check_order

    return check_order(audit)


def _justification(audit):
    from harness.soundness.justification import check_justification

    return check_justification(audit)


def _replay(audit):
    from harness.soundness.replay import check_replay

    return check_replay(audit)


@hookimpl
def idrs_register_checks(register) -> None:
    register(CheckSpec("evidence", _evidence,
                       "S0: every certificate re-derived from its stored evidence, α and declared formula"))  # fmt: skip
    register(CheckSpec("memory-order", _order,
                       "S5: memory certificates replayed over input orders (Súkeník App. C.2)"))  # fmt: skip
    register(CheckSpec("worst-case-justification", _justification,
                       "S3: the worst σ inside each certified ball still certifies (Súkeník Thm 2.3)"))  # fmt: skip
    register(CheckSpec("coverage", _coverage, "S1: failures on exact smoothed classifiers vs α"))
    register(CheckSpec("sigma-regularity", _sigma_regularity, "S2: σ(x) as regular as declared"))
    register(
        CheckSpec("counterexamples", _counterexamples, "S4: concrete violations of certificates")
    )
    register(CheckSpec("replay", _replay,
                       "replay: σ and samples of random certificates re-drawn without plugins"))  # fmt: skip
