"""CERTIFY and PREDICT for hard smoothing (Cohen et al. 2019; Súkeník et al. 2022, Alg. 3).

:class:`HardSmoothingCertifier` samples and bounds; a subclass supplies only the
radius formula, so that constant-σ and input-dependent certificates share the same
statistics and the stored counts can be re-certified without resampling.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from harness.certificate import ABSTAIN, Certificate
from harness.protocol import CertificationProtocol
from harness.radius import RadiusFormula
from harness.sampling import STREAM_ESTIMATION, STREAM_SELECTION, SamplingEngine
from harness.stats import binomial_pvalue, clopper_pearson_lower_array


class HardSmoothingCertifier:
    """CERTIFY: n0 samples pick ĉ_A, n samples give p_A_lower; abstain if p_A_lower <= 1/2.

    PREDICT (the two-sided binomial test of the top two counts at level alpha) is
    evaluated on the same n estimation samples and stored beside the certificate.
    """

    smoothing = "hard"
    order_dependent = False
    radius_formula: RadiusFormula  # set by each subclass: the formula its ``radius`` applies

    def __init__(self, engine: SamplingEngine, protocol: CertificationProtocol) -> None:
        self.engine = engine
        self.protocol = protocol

    def radius(self, p_lower: np.ndarray, sigma: np.ndarray) -> np.ndarray:
        """Certified radius for lower bounds ``p_lower`` > 1/2 at σ(x0) = ``sigma``."""
        raise NotImplementedError

    def certify(
        self, x: torch.Tensor, sigma: torch.Tensor, input_ids: Sequence[int]
    ) -> Iterator[Certificate]:
        sigma_values = torch.as_tensor(sigma).double().cpu().numpy()
        start = time.perf_counter()
        selection = self.engine.counts(
            x, sigma_values, input_ids, self.protocol.n0, STREAM_SELECTION
        )
        share = (time.perf_counter() - start) / max(len(input_ids), 1)
        last = time.perf_counter()
        runs = self.engine.run(x, sigma_values, input_ids, self.protocol.n, STREAM_ESTIMATION)
        for index, counts in runs:
            certificate = self.from_counts(
                input_ids[index], sigma_values[index], selection[index], counts
            )
            now = time.perf_counter()
            certificate.seconds = share + (now - last)
            last = now
            yield certificate

    def from_counts(
        self, input_id: int, sigma: float, selection: np.ndarray, estimation: np.ndarray
    ) -> Certificate:
        """The certificate implied by stored class counts (no sampling)."""
        alpha = self.protocol.alpha
        top = int(np.argmax(selection))
        n = int(estimation.sum())
        p_lower = float(clopper_pearson_lower_array(estimation[top], n, alpha))
        if p_lower > 0.5:
            prediction, radius = top, float(self.radius(np.array([p_lower]), np.array([sigma]))[0])
        else:
            prediction, radius = ABSTAIN, 0.0
        return Certificate(
            input_id=int(input_id),
            prediction=prediction,
            radius=radius,
            p_lower=p_lower,
            sigma=float(sigma),
            alpha=alpha,
            predict=predict_from_counts(estimation, alpha),
            counts_selection=[int(c) for c in selection],
            counts_estimation=[int(c) for c in estimation],
        )


def predict_from_counts(counts: np.ndarray, alpha: float) -> int:
    """PREDICT: the top class if the binomial test of n_A vs n_B rejects p = 1/2 at alpha."""
    order = np.argsort(counts)[::-1]
    n_a, n_b = int(counts[order[0]]), int(counts[order[1]]) if len(counts) > 1 else 0
    return int(order[0]) if binomial_pvalue(n_a, n_a + n_b) <= alpha else ABSTAIN
