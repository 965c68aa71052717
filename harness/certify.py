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
        """Certificates of a shard, one per input, in order.

        The estimation counts of the whole shard are gathered first and the radii are
        computed in one vectorized call (:meth:`radius` takes arrays): an expensive radius
        such as Súkeník et al.'s Thm 3.2 costs far less per input batched.
        """
        sigma_values = torch.as_tensor(sigma).double().cpu().numpy()
        start = time.perf_counter()
        selection = self.engine.counts(
            x, sigma_values, input_ids, self.protocol.n0, STREAM_SELECTION
        )
        share = (time.perf_counter() - start) / max(len(input_ids), 1)
        last = time.perf_counter()
        estimation = np.zeros_like(selection)
        seconds = np.full(len(input_ids), share)
        runs = self.engine.run(x, sigma_values, input_ids, self.protocol.n, STREAM_ESTIMATION)
        for index, counts in runs:
            estimation[index] = counts
            now = time.perf_counter()
            seconds[index] += now - last
            last = now
        certificates = self.certificates_from_counts(input_ids, sigma_values, selection, estimation)
        seconds += (time.perf_counter() - last) / max(len(input_ids), 1)
        for certificate, spent in zip(certificates, seconds, strict=True):
            certificate.seconds = float(spent)
            yield certificate

    def certificates_from_counts(
        self,
        input_ids: Sequence[int],
        sigma: np.ndarray,
        selection: np.ndarray,
        estimation: np.ndarray,
    ) -> list[Certificate]:
        """The certificates implied by stored class counts [B, C] (no sampling).

        p_A_lower and the radius are computed for all B inputs at once.
        """
        alpha = self.protocol.alpha
        selection = np.asarray(selection, dtype=np.int64).reshape(len(input_ids), -1)
        estimation = np.asarray(estimation, dtype=np.int64).reshape(len(input_ids), -1)
        sigma = np.asarray(sigma, dtype=np.float64).reshape(len(input_ids))
        if len(input_ids) == 0:
            return []
        top = np.argmax(selection, axis=1)
        n = estimation.sum(axis=1)
        p_lower = clopper_pearson_lower_array(estimation[np.arange(len(top)), top], n, alpha)
        certified = p_lower > 0.5
        radii = np.zeros(len(input_ids))
        if certified.any():
            radii[certified] = self.radius(p_lower[certified], sigma[certified])
        return [
            Certificate(
                input_id=int(input_id),
                prediction=int(top[i]) if certified[i] else ABSTAIN,
                radius=float(radii[i]) if certified[i] else 0.0,
                p_lower=float(p_lower[i]),
                sigma=float(sigma[i]),
                alpha=alpha,
                predict=predict_from_counts(estimation[i], alpha),
                counts_selection=[int(c) for c in selection[i]],
                counts_estimation=[int(c) for c in estimation[i]],
            )
            for i, input_id in enumerate(input_ids)
        ]

    def from_counts(
        self, input_id: int, sigma: float, selection: np.ndarray, estimation: np.ndarray
    ) -> Certificate:
        """The certificate implied by stored class counts of one input (no sampling)."""
        return self.certificates_from_counts(
            [input_id], np.array([sigma]), np.asarray(selection)[None], np.asarray(estimation)[None]
        )[0]


def predict_from_counts(counts: np.ndarray, alpha: float) -> int:
    """PREDICT: the top class if the binomial test of n_A vs n_B rejects p = 1/2 at alpha."""
    order = np.argsort(counts)[::-1]
    n_a, n_b = int(counts[order[0]]), int(counts[order[1]]) if len(counts) > 1 else 0
    return int(order[0]) if binomial_pvalue(n_a, n_a + n_b) <= alpha else ABSTAIN
