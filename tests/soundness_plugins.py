"""Third-party plugins written against the declared contract, for the soundness tests.

A pytest fixture module (loaded through ``pytest_plugins`` in ``tests/conftest.py``):
the fixture :func:`soundness_plugins` is this module, which a test registers in-process
(``manager.register(soundness_plugins, name=...)``); the tests assert the verdict the
audit must reach on each plugin.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy.special import ndtri

from harness import hookimpl
from harness.engine.draws import Claim, Evidence
from harness.foundation.certificate import ABSTAIN, Certificate
from harness.foundation.regularity import Constant, Lipschitz, SemiElastic
from harness.mathematics.radius import COHEN, RadiusFormula, Recomputed, hard_bounds
from harness.mathematics.stats import clopper_pearson_lower_array
from harness.plugin.components import CertifierSpec, MethodSpec, SigmaProviderSpec
from plugins.cohen.certifier import CohenCertifier
from plugins.lipschitz import METHOD_DEFAULTS

LIPSCHITZ_DEFAULTS = {**METHOD_DEFAULTS, "sigma_min": 0.3}


class HiddenAlpha(CohenCertifier):
    """Computes p_A's bound at α = 0.01 whatever the run's α (the harness stores the run's)."""

    def certify(self, evidence: Evidence) -> list[Claim]:
        return super().certify(replace(evidence, alpha=0.01))


class LaunderedAlpha(HiddenAlpha):
    """The same, and says so in its claims' evidence: the contract reserves α to the harness."""

    def certify(self, evidence: Evidence) -> list[Claim]:
        return [replace(c, evidence={"alpha": 0.01}) for c in super().certify(evidence)]


class OwnCounts(CohenCertifier):
    """Returns certificates with its own class counts, as certifiers did before the harness
    drew the evidence itself."""

    def certify(self, evidence: Evidence) -> list[Certificate]:
        claims = super().certify(evidence)
        rows = zip(evidence.input_ids, evidence.sigma, claims, strict=True)
        return [
            Certificate(i, c.prediction, c.radius, c.p_lower, float(s), evidence.alpha, c.predict)
            for i, s, c in rows
        ]


class Inflated(CohenCertifier):
    """Cohen's radius × 1.02."""

    def radius(self, p_lower, sigma):
        return 1.02 * super().radius(p_lower, sigma)


def minimal_recompute(rows, inputs, protocol, regularity) -> Recomputed:
    """σ Φ⁻¹(p_A_lower) on Clopper–Pearson bounds, written here (a third party's formula)."""
    n0, n, top, bound = hard_bounds(rows, protocol.alpha)
    sigma = np.array([float(r["sigma"]) for r in rows])
    ok = bound > 0.5
    radius = np.where(ok, sigma * ndtri(np.where(ok, bound, 0.75)), 0.0)
    return Recomputed(n0, n, bound, np.where(ok, top, ABSTAIN), radius)


class Minimal:
    """A certifier with exactly the attributes of ``harness.plugin.components.Certifier``."""

    smoothing = "hard"
    order_dependent = False
    radius_formula = RadiusFormula("minimal-cohen", minimal_recompute)

    def certify(self, evidence: Evidence) -> list[Claim]:
        claims = []
        for k in range(len(evidence)):
            selection, estimation = evidence.base.selection[k], evidence.base.estimation[k]
            top = int(np.argmax(selection))
            p = float(clopper_pearson_lower_array(estimation[top], int(estimation.sum()),
                                                  evidence.alpha))  # fmt: skip
            ok = p > 0.5
            claims.append(Claim(top if ok else ABSTAIN,
                                float(evidence.sigma[k] * ndtri(p)) if ok else 0.0, p, top))  # fmt: skip
        return claims


def impure_recompute_factory():
    scale = 1.0

    def recompute(rows, inputs, protocol, regularity):
        out = COHEN.recompute(rows, inputs, protocol, regularity)
        return Recomputed(out.n0, out.n, out.bound, out.prediction, scale * out.radius)

    return recompute


class Impure(CohenCertifier):
    """Declares a formula that is a closure (it could hide state): not re-derivable."""

    radius_formula = RadiusFormula("closure", impure_recompute_factory())


ARMED = {"raise": False, "sigma": None}
"""Test switches of the ``switchable`` σ-provider (set after the run, before the checks)."""


class Switchable:
    """σ(x) = sigma; raises when ``ARMED["raise"]``, returns ``ARMED["sigma"]`` when set."""

    def __init__(self, sigma: float) -> None:
        self.sigma = sigma
        self.regularity = Constant(sigma)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if ARMED["raise"]:
            raise RuntimeError(f"this σ-provider cannot handle inputs of shape {tuple(x.shape)}")
        value = self.sigma if ARMED["sigma"] is None else ARMED["sigma"]
        return torch.full((len(x),), value, device=x.device, dtype=torch.float64)


CERTIFIERS = {
    "laundered-alpha": LaunderedAlpha,
    "own-counts": OwnCounts,
    "hidden-alpha": HiddenAlpha,
    "inflated": Inflated,
    "minimal": Minimal,
    "impure": Impure,
}


@hookimpl
def idrs_register_sigma_providers(register) -> None:
    register(SigmaProviderSpec("switchable", lambda context, params: Switchable(params["sigma"])))
    register(SigmaProviderSpec("fast-sigma", lambda context, params: FastSigma()))
    register(SigmaProviderSpec("lying-lipschitz", lambda context, params: LyingLipschitz(
        context.dataset.dim, params["sigma_min"])))  # fmt: skip


@hookimpl
def idrs_register_certifiers(register) -> None:
    for name, cls in CERTIFIERS.items():
        register(CertifierSpec(name, lambda c, p, s, cls=cls: cls()))


@hookimpl
def idrs_register_methods(register) -> None:
    for name in CERTIFIERS:
        register(MethodSpec(name, "constant", name, {"sigma": 0.5}))
    register(MethodSpec("switchable", "switchable", "cohen", {"sigma": 0.5}))
    register(MethodSpec("lying-rate", "fast-sigma", "sukenik", {"sigma": 0.25}))
    register(MethodSpec("lying-lipschitz", "lying-lipschitz", "lipschitz", LIPSCHITZ_DEFAULTS))


class FastSigma:
    """σ(x) = 0.25·exp(1.5·tanh(x_1)) (semi-elasticity up to 1.5), declared 0.01-semi-elastic."""

    regularity = SemiElastic(0.01)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return 0.25 * torch.exp(1.5 * torch.tanh(x.flatten(1)[:, 0].double()))


class LyingLipschitz:
    """σ = ReLU(W2·ReLU(W1·x)) + σ_min with ‖W1‖‖W2‖ = 2, declared Lipschitz(0.1, σ_min)."""

    def __init__(self, dim: int, sigma_min: float) -> None:
        self.w1 = torch.zeros(4, dim, dtype=torch.float64)
        self.w1[0, 0] = 2.0
        self.w2 = torch.zeros(1, 4, dtype=torch.float64)
        self.w2[0, 0] = 1.0
        self.sigma_min = sigma_min
        self.regularity = Lipschitz(0.1, sigma_min)

    @property
    def weights(self):
        return self.w1, self.w2

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        w1, w2 = self.w1.to(x.device), self.w2.to(x.device)
        hidden = torch.relu(x.flatten(1).double() @ w1.T)
        return torch.relu(hidden @ w2.T)[:, 0] + self.sigma_min


@pytest.fixture
def soundness_plugins():
    """This module (a plugin object to register), its switches :data:`ARMED` off before
    and after the test."""
    ARMED.update({"raise": False, "sigma": None})
    yield sys.modules[__name__]
    ARMED.update({"raise": False, "sigma": None})
