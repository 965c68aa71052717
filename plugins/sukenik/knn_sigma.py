"""The semi-elastic σ(x) of Súkeník et al. (2022), eq. (1) and Thm 4.1.

    σ(x) = σ_b · exp(r · ((1/k) Σ_{x_i ∈ N_k(x)} ‖x − x_i‖ − m))

over the training set {x_i}. The mean distance to the k nearest neighbours is
1-Lipschitz in x, so log σ is r-Lipschitz: σ is r-semi-elastic (Thm 4.1). The proof
needs exact distances, so neighbours and distances are computed exactly (float64),
chunked over the training set so that 60,000 × 784 points and large query batches fit.
"""

from __future__ import annotations

import math

import torch

from harness import ParameterError, SemiElastic

TRAIN_CHUNK = 8192


def knn_mean_distance(
    queries: torch.Tensor,
    train: torch.Tensor,
    k: int,
    exclude_self: bool = False,
    dtype: torch.dtype = torch.float64,
    train_sq: torch.Tensor | None = None,
) -> torch.Tensor:
    """(1/k) Σ ‖q − x_i‖ over the k nearest training points x_i of each query (exact).

    Neighbours are found without gradients in float64 chunks of the training set; the
    distances to them are then recomputed with autograd, so the result is
    differentiable in ``queries``. ``exclude_self`` skips one neighbour at distance 0
    (a training point queried against its own set). ``dtype=torch.float32`` is for
    uses that need no certificate (training augmentation, choosing m). ``train``
    already flattened in ``dtype`` on the queries' device, with its squared row norms
    ``train_sq``, is used as it is (:class:`KnnSigma` keeps both between calls).
    """
    q = queries.flatten(1).to(dtype)
    t = train.flatten(1).to(q.device, dtype)
    take = k + int(exclude_self)
    if take > len(t):
        raise ParameterError(f"k = {k} needs at least {take} training points, got {len(t)}")
    with torch.no_grad():
        q_sq = (q * q).sum(1, keepdim=True)
        best_d = torch.full((len(q), take), math.inf, dtype=dtype, device=q.device)
        best_i = torch.zeros((len(q), take), dtype=torch.long, device=q.device)
        for start in range(0, len(t), TRAIN_CHUNK):
            chunk = t[start : start + TRAIN_CHUNK]
            chunk_sq = (
                (chunk * chunk).sum(1)
                if train_sq is None
                else train_sq[start : start + TRAIN_CHUNK]
            )
            d2 = (q_sq + chunk_sq[None] - 2.0 * q @ chunk.T).clamp_min_(0)
            cand_d = torch.cat([best_d, d2], dim=1)
            cand_i = torch.cat(
                [
                    best_i,
                    torch.arange(start, start + len(chunk), device=q.device).expand(len(q), -1),
                ],
                dim=1,
            )
            best_d, pos = torch.topk(cand_d, take, dim=1, largest=False)
            best_i = torch.gather(cand_i, 1, pos)
        if exclude_self:
            best_i = best_i[:, 1:]
    neighbours = t[best_i]  # [B, k, d]
    return (q[:, None, :] - neighbours).norm(dim=2).mean(dim=1)


def propose_m(train: torch.Tensor, k: int, rule: str = "min", sample: int = 1000) -> float:
    """m from the training set (App. E.1): the ``min`` or ``median`` over a sample of
    training points of their mean distance to their k nearest other training points."""
    if rule not in ("min", "median"):
        raise ParameterError(f"m must be a number, 'min' or 'median'; got {rule!r}")
    index = torch.linspace(0, len(train) - 1, min(sample, len(train))).long()
    distances = knn_mean_distance(train[index], train, k, exclude_self=True, dtype=torch.float32)
    return float(distances.min() if rule == "min" else distances.median())


class KnnSigma:
    """σ(x) of eq. (1), optionally clamped to σ <= max_ratio·σ_b.

    The clamp keeps semi-elasticity: min(σ(x), c) has log equal to min(log σ(x), log c),
    a minimum of an r-Lipschitz function and a constant, which is r-Lipschitz. It only
    tames outliers far from all training data (App. A.5 used σ <= 5σ_b).
    """

    def __init__(
        self,
        train: torch.Tensor,
        sigma_b: float,
        rate: float,
        k: int,
        m: float,
        max_ratio: float = 0.0,
    ) -> None:
        if sigma_b <= 0 or rate < 0 or k < 1 or max_ratio < 0:
            raise ParameterError(
                f"need sigma > 0, rate >= 0, k >= 1 and max_ratio >= 0 (0 = no clamp); got "
                f"{sigma_b}, {rate}, {k}, {max_ratio}"
            )
        self.train, self.sigma_b, self.rate, self.k, self.m = train, sigma_b, rate, k, m
        self.max_ratio = max_ratio
        self.regularity = SemiElastic(rate)
        self._exact: tuple[torch.Tensor, torch.Tensor] | None = None

    def _exact_train(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The training set flattened in float64 on ``device`` and its squared row norms,
        made once (converting 60,000 × 784 points per call dominated σ's cost)."""
        if self._exact is None or self._exact[0].device != device:
            t = self.train.flatten(1).to(device, torch.float64)
            self._exact = (t, (t * t).sum(1))
        return self._exact

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        train, train_sq = self._exact_train(x.device)
        log_sigma = math.log(self.sigma_b) + self.rate * (
            knn_mean_distance(x, train, self.k, train_sq=train_sq) - self.m
        )
        if self.max_ratio:
            log_sigma = torch.clamp(log_sigma, max=math.log(self.max_ratio * self.sigma_b))
        return torch.exp(log_sigma)
