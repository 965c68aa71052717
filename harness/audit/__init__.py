"""Soundness checks S0–S5 (harness/README.md, "Soundness checks"), a built-in plugin.

The analytic models, dataset and trainer the checks rely on are the built-in plugin
``analytic`` (:mod:`harness.audit.analytic_components`). On a row drawn at a diagonal
scale (:mod:`harness.engine.scale`) only the checks registered with ``diagonal=True`` run,
and on a row drawn around a noise centre (:mod:`harness.engine.centre`) only those with
``centred=True``; any other refuses it (:func:`harness.audit.session.unsupported`).
"""

from __future__ import annotations

from harness.plugin.components import CheckSpec
from harness.plugin.hookspecs import hookimpl

IDRS_BENCH_CONTRACT = 4
"""The plugin contract this plugin is written against (docs/plugins.md)."""


def _sigma_regularity(audit):
    from harness.audit.sigma_regularity import check_sigma_regularity

    return check_sigma_regularity(audit)


def _counterexamples(audit):
    from harness.audit.counterexamples import check_counterexamples

    return check_counterexamples(audit)


def _coverage(audit):
    from harness.audit.coverage import check_coverage

    return check_coverage(audit)


def _evidence(audit):
    from harness.audit.evidence import check_evidence

    return check_evidence(audit)


def _order(audit):
    from harness.audit.order import check_order

    return check_order(audit)


def _justification(audit):
    from harness.audit.justification import check_justification

    return check_justification(audit)


def _replay(audit):
    from harness.audit.replay import check_replay

    return check_replay(audit)


def _warm_replay(audit):
    from harness.audit.replay import warm

    warm(audit)


@hookimpl
def idrs_register_checks(register) -> None:
    register(CheckSpec("evidence", _evidence,
                       "S0: every certificate re-derived from its stored evidence, α and declared formula",
                       diagonal=True, centred=True))  # fmt: skip
    register(CheckSpec("memory-order", _order,
                       "S5: memory certificates replayed over input orders (Súkeník App. C.2)",
                       diagonal=True, centred=True))  # fmt: skip
    register(CheckSpec("worst-case-justification", _justification,
                       "S3: the worst σ inside each certified ball still certifies (Súkeník Thm 2.3)",
                       diagonal=True, centred=True))  # fmt: skip
    register(CheckSpec("coverage", _coverage, "S1: failures on exact smoothed classifiers vs α",
                       diagonal=True, centred=True))  # fmt: skip
    register(CheckSpec("sigma-regularity", _sigma_regularity, "S2: σ(x) as regular as declared",
                       diagonal=True, centred=True))  # fmt: skip
    register(CheckSpec("counterexamples", _counterexamples,
                       "S4: concrete violations of certificates", diagonal=True, centred=True))  # fmt: skip
    register(CheckSpec("replay", _replay,
                       "replay: σ and samples of random certificates re-drawn without plugins",
                       _warm_replay, diagonal=True, centred=True))  # fmt: skip
