"""idrs-bench: a benchmark harness for input-dependent randomized smoothing.

This package's namespace is the **plugin API**: a plugin (built-in or third-party)
imports what it needs from ``harness`` and nothing from its submodules, which are
internal and may change. Every name below is stable; each is loaded on first use
(``import harness`` imports neither torch nor scipy). A plugin is a module with
``@hookimpl`` functions (the hooks are listed in :mod:`harness.plugin.hookspecs`), declared
as an entry point of the group ``idrs_bench``; see the README's section on writing a
plugin.

Registering components
    ``hookimpl``: marks a hook implementation, e.g.
    ``@hookimpl def idrs_register_methods(register): register(MethodSpec(...))``.
    ``SigmaProviderSpec``, ``CertifierSpec``, ``MethodSpec``, ``TrainerSpec``,
    ``DatasetSpec``, ``ModelSpec``, ``CheckSpec``: what ``register`` accepts; each
    names a component and the callable that builds it.
    ``BuildContext``: what a σ-provider or certifier factory receives (dataset, base
    model, device, seed, protocol, engine, progress, registry, run id, ...);
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
    draws every sample (README, "Writing a plugin"). ``SigmaSmoothing``: a σ-provider
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
    (``SoftStats``), with reproducible noise (``noise_seed``; ``STREAM_SELECTION`` and
    ``STREAM_ESTIMATION`` are CERTIFY's streams). ``prepare_model``: the base model in
    the protocol's certified arithmetic. ``CertificationProtocol``, ``check_sigma``,
    ``check_alpha``. ``clopper_pearson_lower``, ``clopper_pearson_upper``,
    ``hoeffding_lower``, ``hoeffding_upper``: confidence bounds.

Data, training, state
    ``Dataset``; ``train_with_gaussian_augmentation`` (Cohen et al. 2019);
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
from typing import TYPE_CHECKING, Any

from harness.foundation.version import __version__

_EXPORTS: dict[str, str] = {
    "hookimpl": "harness.plugin.hookspecs",
    # components and contexts
    "BuildContext": "harness.plugin.components",
    "CertifierSpec": "harness.plugin.components",
    "Certifier": "harness.plugin.components",
    "CheckSpec": "harness.plugin.components",
    "DatasetSpec": "harness.plugin.components",
    "MethodSpec": "harness.plugin.components",
    "ModelSpec": "harness.plugin.components",
    "OrderDependentCertifier": "harness.plugin.components",
    "Registry": "harness.plugin.components",
    "SigmaProvider": "harness.plugin.components",
    "SigmaProviderSpec": "harness.plugin.components",
    "TrainContext": "harness.plugin.components",
    "TrainerSpec": "harness.plugin.components",
    # declarations, certificates, radii
    "Constant": "harness.foundation.regularity",
    "Lipschitz": "harness.foundation.regularity",
    "Regularity": "harness.foundation.regularity",
    "SemiElastic": "harness.foundation.regularity",
    "Unregularized": "harness.foundation.regularity",
    "ABSTAIN": "harness.foundation.certificate",
    "Certificate": "harness.foundation.certificate",
    "Claim": "harness.engine.draws",
    "Draws": "harness.engine.draws",
    "Evidence": "harness.engine.draws",
    "SigmaSmoothing": "harness.engine.draws",
    "HardSmoothingCertifier": "harness.certification.certify",
    "COHEN": "harness.mathematics.radius",
    "SUKENIK": "harness.mathematics.radius",
    "RadiusFormula": "harness.mathematics.radius",
    "Recomputed": "harness.mathematics.radius",
    "semi_elastic_rate": "harness.mathematics.radius",
    "certified_radius": "harness.mathematics.worstcase",
    "cohen_radius": "harness.mathematics.worstcase",
    "is_certified": "harness.mathematics.worstcase",
    "xi": "harness.mathematics.worstcase",
    "xi_greater": "harness.mathematics.worstcase",
    "xi_less": "harness.mathematics.worstcase",
    # sampling, protocol, statistics
    "STREAM_ESTIMATION": "harness.engine.sampling",
    "STREAM_SELECTION": "harness.engine.sampling",
    "SamplingEngine": "harness.engine.sampling",
    "SoftStats": "harness.engine.sampling",
    "noise_seed": "harness.engine.sampling",
    "prepare_model": "harness.engine.precision",
    "CertificationProtocol": "harness.foundation.protocol",
    "check_alpha": "harness.foundation.protocol",
    "check_sigma": "harness.foundation.protocol",
    "clopper_pearson_lower": "harness.mathematics.stats",
    "clopper_pearson_upper": "harness.mathematics.stats",
    "hoeffding_lower": "harness.mathematics.stats",
    "hoeffding_upper": "harness.mathematics.stats",
    # data, training, state
    "Dataset": "harness.foundation.data",
    "train_with_gaussian_augmentation": "harness.running.training",
    "SigmaCache": "harness.foundation.sigmacache",
    "RunState": "harness.foundation.runstate",
    "StateRecord": "harness.foundation.runstate",
    "file_digest": "harness.foundation.artifacts",
    "load_artifact": "harness.foundation.artifacts",
    "save_artifact": "harness.foundation.artifacts",
    "Progress": "harness.foundation.progress",
    # errors
    "ContractError": "harness.foundation.errors",
    "DatasetMissingError": "harness.foundation.errors",
    "IdrsError": "harness.foundation.errors",
    "ModelOutputError": "harness.foundation.errors",
    "ParameterError": "harness.foundation.errors",
}

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


if TYPE_CHECKING:
    from harness.certification.certify import HardSmoothingCertifier  # noqa: F401
    from harness.engine.draws import Claim, Draws, Evidence, SigmaSmoothing  # noqa: F401
    from harness.engine.precision import prepare_model  # noqa: F401
    from harness.engine.sampling import (  # noqa: F401
        STREAM_ESTIMATION,
        STREAM_SELECTION,
        SamplingEngine,
        SoftStats,
        noise_seed,
    )
    from harness.foundation.artifacts import file_digest, load_artifact, save_artifact  # noqa: F401
    from harness.foundation.certificate import ABSTAIN, Certificate  # noqa: F401
    from harness.foundation.data import Dataset  # noqa: F401
    from harness.foundation.errors import (  # noqa: F401
        ContractError,
        DatasetMissingError,
        IdrsError,
        ModelOutputError,
        ParameterError,
    )
    from harness.foundation.progress import Progress  # noqa: F401
    from harness.foundation.protocol import CertificationProtocol, check_alpha, check_sigma  # noqa: F401
    from harness.foundation.regularity import (  # noqa: F401
        Constant,
        Lipschitz,
        Regularity,
        SemiElastic,
        Unregularized,
    )
    from harness.foundation.runstate import RunState, StateRecord  # noqa: F401
    from harness.foundation.sigmacache import SigmaCache  # noqa: F401
    from harness.mathematics.radius import (  # noqa: F401
        COHEN,
        SUKENIK,
        RadiusFormula,
        Recomputed,
        semi_elastic_rate,
    )
    from harness.mathematics.stats import (  # noqa: F401
        clopper_pearson_lower,
        clopper_pearson_upper,
        hoeffding_lower,
        hoeffding_upper,
    )
    from harness.mathematics.worstcase import (  # noqa: F401
        certified_radius,
        cohen_radius,
        is_certified,
        xi,
        xi_greater,
        xi_less,
    )
    from harness.plugin.components import (  # noqa: F401
        BuildContext,
        Certifier,
        CertifierSpec,
        CheckSpec,
        DatasetSpec,
        MethodSpec,
        ModelSpec,
        OrderDependentCertifier,
        Registry,
        SigmaProvider,
        SigmaProviderSpec,
        TrainContext,
        TrainerSpec,
    )
    from harness.plugin.hookspecs import hookimpl  # noqa: F401
    from harness.running.training import train_with_gaussian_augmentation  # noqa: F401
