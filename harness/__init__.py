"""idrs-bench: a benchmark harness for input-dependent randomized smoothing.

This package's namespace is the **plugin API**: a plugin (built-in or third-party)
imports what it needs from ``harness`` and nothing from its submodules, which are
internal and may change. Every name below is stable; each is loaded on first use
(``import harness`` imports neither torch nor scipy). A plugin is a module with
``@hookimpl`` functions (the hooks are listed in :mod:`harness.plugin.hookspecs`), declared
as an entry point of the group ``idrs_bench``; see docs/plugins.md.

Registering components
    ``hookimpl``: marks a hook implementation, e.g.
    ``@hookimpl def idrs_register_methods(register): register(MethodSpec(...))``.
    ``SigmaProviderSpec``, ``CertifierSpec``, ``MethodSpec``, ``TrainerSpec``,
    ``DatasetSpec``, ``ModelSpec``, ``CheckSpec``: what ``register`` accepts; each
    names a component and the callable that builds it.
    ``BuildContext``: what a σ-provider or certifier factory receives (the dataset's
    training split and description, base model, device, seed, protocol, engine, progress,
    registry, run id, ...);
    ``BuildContext.artifact_dir(plugin)`` is the directory for anything a plugin
    persists about the base model, and ``BuildContext.memo(plugin, key, build)``
    computes something once per run and base model. ``TrainContext``: what a
    trainer receives. ``Registry``: components by kind and name (``context.registry``).

What a plugin builds
    ``SigmaProvider``, ``Certifier``, ``OrderDependentCertifier``: the protocols the
    built objects satisfy (the attributes the soundness checks read).
    ``Regularity`` = ``Constant`` | ``SemiElastic`` | ``Lipschitz`` |
    ``Unregularized``: what a σ-provider declares about σ(x).
    ``Evidence`` (what a certifier receives: the inputs, σ(x), the α its bound holds at
    and the harness's ``Draws``) and ``Claim`` (what it answers per input); the harness
    draws every sample (docs/plugins.md). ``SigmaSmoothing``: a σ-provider
    whose σ(x) is a smoothed choice among noise levels, drawn by the harness too.
    ``Certificate`` (one stored certified input: the claim and the harness's draws) and
    ``ABSTAIN``. ``HardSmoothingCertifier``: the shared base of CERTIFY certifiers (Cohen
    et al. 2019); a subclass supplies ``radius(p_lower, sigma)`` and its ``radius_formula``.
    ``RadiusFormula``, ``Recomputed``: how a stored certificate is re-derived from its
    evidence (``COHEN``, ``SUKENIK`` are the built-in ones); ``semi_elastic_rate``.

Radii and worst-case probabilities
    ``cohen_radius``: σ Φ⁻¹(p_A) (Cohen et al. 2019, Thm 1). ``certified_radius``:
    the semi-elastic radius of Súkeník et al. (2022), Thm 3.2; ``is_certified``,
    ``xi``, ``xi_greater``, ``xi_less``: the worst-case probabilities ξ of §2–§3.

Sampling and statistics
    ``SamplingEngine``: noisy forward passes of the base model, counted or averaged
    (``SoftStats``), with reproducible noise (``noise_seed``; ``noise_seeds``: of many
    inputs at once; ``STREAM_SELECTION`` and ``STREAM_ESTIMATION`` are CERTIFY's
    streams). ``prepare_model``: the base model in the protocol's certified arithmetic.
    ``padded_chunks``: a batch in chunks of one shape, so that a σ computed through them
    is the same bit for bit in any batch.
    ``outputs_for_inputs``: the base model at points drawn for several inputs, naming the
    input each stands for (a σ that reads the model asked this way lets check S1 ask it
    of many exact classifiers in one call). ``CertificationProtocol``, ``check_sigma``,
    ``check_alpha``. ``clopper_pearson_lower``, ``clopper_pearson_upper``,
    ``hoeffding_lower``, ``hoeffding_upper``: confidence bounds.

Data, training, state
    ``Dataset`` (what a dataset plugin loads: both splits); ``TrainingSplit`` (what
    σ-providers, certifiers and trainers see of it: the training split and the dataset's
    description, the test split withheld); ``train_with_gaussian_augmentation`` (Cohen et
    al. 2019);
    ``SigmaCache`` (σ(x) memoized by input); ``RunState``, ``StateRecord`` (a
    certifier's per-run state in the run's database, ``context.state``);
    ``save_artifact``, ``load_artifact`` (files with a checked SHA-256 that heal when
    damaged), ``file_digest``; ``Progress`` (progress bars and log lines).

Errors a plugin raises
    ``IdrsError`` (the base; the CLI prints its message), ``ParameterError`` (a bad
    parameter value), ``ContractError`` (a component broke the plugin contract), ``DatasetMissingError`` (data not on disk, with how to get it),
    ``ModelOutputError`` (the base model returned non-finite outputs).

Driving the harness (not for plugins)
    :mod:`harness.api` (``certify``, ``run``) is the public API for notebooks and
    scripts, such as a paper's reproduction script shipped beside a plugin. It sits
    above the runner and the checks, so this namespace does not re-export it.

``harness.audit`` is a built-in plugin but part of the core: it audits every
plugin and uses the harness's internals directly.
"""

from __future__ import annotations

import importlib
from typing import Any

from harness.foundation.version import __version__

_MODULES: dict[str, tuple[str, ...]] = {
    "harness.plugin.hookspecs": ("hookimpl",),
    "harness.plugin.components": (
        "BuildContext",
        "CertifierSpec",
        "Certifier",
        "CheckSpec",
        "DatasetSpec",
        "MethodSpec",
        "ModelSpec",
        "OrderDependentCertifier",
        "SigmaProvider",
        "SigmaProviderSpec",
        "TrainContext",
        "TrainerSpec",
    ),
    "harness.plugin.registry": ("Registry",),
    "harness.foundation.regularity": (
        "Constant",
        "Lipschitz",
        "Regularity",
        "SemiElastic",
        "Unregularized",
    ),
    "harness.foundation.certificate": ("ABSTAIN", "Certificate"),
    "harness.engine.draws": ("Claim", "Draws", "Evidence", "SigmaSmoothing"),
    "harness.certification.certify": ("HardSmoothingCertifier",),
    "harness.mathematics.radius": (
        "COHEN",
        "SUKENIK",
        "RadiusFormula",
        "Recomputed",
        "semi_elastic_rate",
    ),
    "harness.mathematics.worstcase": (
        "certified_radius",
        "cohen_radius",
        "is_certified",
        "xi",
        "xi_greater",
        "xi_less",
    ),
    "harness.engine.sampling": ("STREAM_ESTIMATION", "STREAM_SELECTION", "SamplingEngine"),
    "harness.engine.accumulators": ("SoftStats",),
    "harness.engine.noise": ("noise_seed", "noise_seeds"),
    "harness.engine.precision": ("prepare_model",),
    "harness.engine.arithmetic": ("padded_chunks",),
    "harness.engine.outputs": ("outputs_for_inputs",),
    "harness.foundation.protocol": ("CertificationProtocol", "check_alpha", "check_sigma"),
    "harness.mathematics.stats": (
        "clopper_pearson_lower",
        "clopper_pearson_upper",
        "hoeffding_lower",
        "hoeffding_upper",
    ),
    "harness.foundation.data": ("Dataset", "TrainingSplit"),
    "harness.running.training": ("frozen", "train_with_gaussian_augmentation"),
    "harness.foundation.sigmacache": ("SigmaCache",),
    "harness.foundation.runstate": ("RunState", "StateRecord"),
    "harness.foundation.artifacts": ("file_digest", "load_artifact", "save_artifact"),
    "harness.foundation.progress": ("Progress",),
    "harness.foundation.errors": (
        "ContractError",
        "DatasetMissingError",
        "IdrsError",
        "ModelOutputError",
        "ParameterError",
    ),
}
"""Every exported name, by the module that defines it (the one list of the API)."""

_EXPORTS: dict[str, str] = {name: module for module, names in _MODULES.items() for name in names}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    """Load an exported name from its module on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
