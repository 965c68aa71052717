"""PREDICT (Cohen et al. 2019, §3.1): the smoothed classifier's answer at x, or abstain.

The top class of the estimation counts if the two-sided binomial test of its count
against the runner-up's rejects p = 1/2 at level α; under the grid-place rule the
e-process test at the stopping time (:func:`harness.mathematics.gridplace.
anytime_predictions`). Answered by the harness beside every claim.
"""

from __future__ import annotations

import numpy as np

from harness.engine.draws import Draws
from harness.foundation.certificate import ABSTAIN
from harness.mathematics.stats import binomial_pvalues


def draws_predictions(draws: Draws, alpha: float) -> np.ndarray:
    """PREDICT of each input of hard ``draws``: the binomial test of its top two
    estimation counts (fixed n, and the ``mixture-cs-v2`` runs that recorded it so), or,
    drawn by the grid-place rule, the e-process test of the top class against the
    runner-up, valid at the data-dependent stopping time
    (:func:`harness.mathematics.gridplace.anytime_predictions`)."""
    from harness.mathematics.gridplace import GridPlaceRule, anytime_predictions

    if isinstance(draws.rule, GridPlaceRule):
        return anytime_predictions(draws.estimation, alpha)
    return predictions_from_counts(draws.estimation, alpha)


def predict_from_counts(counts: np.ndarray, alpha: float) -> int:
    """PREDICT: the top class if the binomial test of n_A vs n_B rejects p = 1/2 at alpha."""
    return int(predictions_from_counts(np.asarray(counts)[None], alpha)[0])


def predictions_from_counts(counts: np.ndarray, alpha: float) -> np.ndarray:
    """:func:`predict_from_counts` of every row of ``counts`` [B, C], in one pass."""
    counts = np.asarray(counts)
    if counts.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(counts, axis=1)[:, ::-1]
    rows = np.arange(len(counts))
    n_a = counts[rows, order[:, 0]].astype(np.int64)
    n_b = counts[rows, order[:, 1]].astype(np.int64) if counts.shape[1] > 1 else 0 * n_a
    return np.where(binomial_pvalues(n_a, n_a + n_b) <= alpha, order[:, 0], ABSTAIN)
