"""The σ-provider of dual randomized smoothing: a σ-estimator smoothed by the harness.

The σ-estimator h maps an input to logits over K noise levels σ_1 … σ_K. Dual RS
(Sun et al. 2026) uses the *smoothed* estimator

    k(x) = argmax_j P(h(x + σ_v ε) = j),  ε ~ N(0, I),   σ(x) = σ_{k(x)},

so that, by Cohen et al. (2019), Thm 1 applied to h, the choice k(x) is constant on the
ball of radius R_σ = σ_v Φ⁻¹(p_σ) around x (p_σ a lower bound on the top level's
probability, p_σ > 1/2). That local constancy is the hypothesis under which the paper
shows that smoothing the base model at σ(x) certifies as at a constant σ.

The provider declares this to the harness as a :class:`harness.SigmaSmoothing`
(``smoothing``); the harness draws the estimator's samples itself (its streams 4 and 5),
stores them with every certificate, spends α_σ on them and caps each certificate at
R_σ (docs/plugins.md, "The contract a certifier and a σ-provider declare"). Nothing asks this
object for σ: calling it raises, so a check that would take σ from the method instead
of drawing it fails loudly rather than auditing the wrong σ.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from harness import ContractError, SigmaSmoothing, Unregularized


class SmoothedSigmaChoice:
    """σ(x) = levels[argmax of the σ-estimator's smoothed class], drawn by the harness.

    ``network`` maps inputs to logits over ``len(levels)`` classes; ``noise`` is σ_v;
    ``alpha`` the share of the run's α its bound spends; ``architecture`` and
    ``architecture_params`` name the registered model ``network`` is (so that the replay
    check rebuilds it from its state dict without this plugin). ``regularity`` is
    ``Unregularized``: σ is only *locally* constant, within the R_σ the harness derives
    for each input from its own draws; no global regularity is claimed.
    """

    regularity = Unregularized()

    def __init__(
        self, network: torch.nn.Module, levels: Sequence[float], noise: float, alpha: float,
        architecture: str | None = None, architecture_params: Mapping[str, Any] | None = None,
    ) -> None:  # fmt: skip
        self.network = network.eval()
        self.levels = tuple(float(v) for v in levels)
        self.smoothing = SigmaSmoothing(self.network, float(noise), self.levels, float(alpha),
                                        architecture, architecture_params)  # fmt: skip

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        raise ContractError(
            "the dual-rs σ-provider declares a σ-smoothing: σ(x) is drawn by the harness "
            "from its σ-estimator (harness.certification.certify.sigma_of), never computed by calling the "
            "provider"
        )
