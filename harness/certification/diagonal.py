"""What certification requires of a method whose σ-provider answers a diagonal scale or a
centre.

A σ-provider may return σ(x) per input dimension (:mod:`harness.engine.scale`); the
harness then draws x + σ_i(x)·ε_i and the certificate's σ is the smallest axis. Not every
certifier's claim holds for anisotropic noise (a radius formula for an input-dependent
scalar σ, a soft smoothing's Lipschitz bound), so a certifier is given such evidence
only when it declares ``diagonal_scale = True``. Sequential sampling places its grid at
the smallest axis, where the certificate's ℓ2 ball lies (the radius formula's thresholds
at σ_min). A claim's ``ellipsoid`` (κ of the region
{δ : ‖Σ^{-1/2}δ‖₂ <= κ}) is held to the contract here and recorded by the harness with
the harness's own scale (:func:`region_of`).

A σ-provider may also answer a centre μ(x) (:mod:`harness.engine.centre`): the samples of x
are then drawn at x + μ(x). A claim is made for x all the same, so a certifier is given
such evidence only when it declares ``centred = True``: its radius is then a claim about
the smoothed classifier whose noise moves with μ, which S3 judges with the shift
δ + μ(x + δ) − μ(x).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.engine.scale import ellipsoid_region
from harness.foundation.certificate import ABSTAIN
from harness.foundation.errors import ContractError

if TYPE_CHECKING:
    from harness.engine.draws import Claim, Evidence
    from harness.plugin.components import Certifier


def check_diagonal(certifier: Certifier, label: str) -> None:
    """Raise unless ``certifier`` may certify evidence drawn at a diagonal scale: it
    declares ``diagonal_scale = True``."""
    if getattr(certifier, "diagonal_scale", False) is not True:
        raise ContractError(
            f"the σ-provider answered a diagonal scale (one σ per input dimension) but {label} "
            "does not declare `diagonal_scale = True`: its claims are derived for one σ per "
            "input; certify with a certifier for anisotropic noise (e.g. 'anisotropic', "
            'docs/plugins.md, "A diagonal scale")'
        )


def check_centred(certifier: Certifier, label: str, scaled: bool) -> None:
    """Raise unless evidence drawn around a centre μ(x) may be certified: it is drawn at a
    diagonal scale (``scaled``; the checks audit a centre with the scale's) and
    ``certifier`` declares ``centred = True``."""
    if not scaled:
        raise ContractError(
            "the σ-provider answered a centre μ(x) with one σ per input; a centre is drawn with "
            "a diagonal scale: answer σ as a tensor of the inputs' shape (σ in every dimension "
            'draws the samples of that σ, docs/plugins.md, "A noise centre")'
        )
    if getattr(certifier, "centred", False) is not True:
        raise ContractError(
            f"the σ-provider answered a centre μ(x) (the noise is drawn at x + μ(x)) but {label} "
            "does not declare `centred = True`: certify with a certifier whose claims are for "
            "noise around a centre (e.g. 'anisotropic', docs/plugins.md, \"A noise centre\")"
        )


def ellipsoid_problem(claim: Claim, scaled: bool) -> str | None:
    """What is wrong with a claim's ``ellipsoid`` (None: nothing): it is None, or a finite
    real >= 0 on evidence drawn at a diagonal scale, and 0 or None when abstaining."""
    value = claim.ellipsoid
    if value is None:
        return None
    if not scaled:
        return ("claimed an ellipsoid on evidence drawn at one σ per input; an ellipsoid is "
                "certified only at a diagonal scale")  # fmt: skip
    real = isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)
    if not (real and math.isfinite(value) and value >= 0) or (
        claim.prediction == ABSTAIN and value
    ):
        return (f"claimed ellipsoid {value!r:.40} with class {claim.prediction}; κ is finite, "
                ">= 0, and 0 when abstaining")  # fmt: skip
    return None


def region_of(evidence: Evidence, k: int, claim: Claim) -> dict[str, Any] | None:
    """The region input ``k``'s certificate records: the ellipsoid of the claim's κ with
    semi-axes over the harness's own scale (None: no region claimed, or κ = 0)."""
    if not claim.ellipsoid or evidence.scale is None:
        return None
    return ellipsoid_region(evidence.scale[k], float(claim.ellipsoid))
