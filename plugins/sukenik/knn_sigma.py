"""The semi-elastic σ(x) of Súkeník et al. (2022), eq. (1) and Thm 4.1.

    σ(x) = σ_b · exp(r · ((1/k) Σ_{x_i ∈ N_k(x)} ‖x − x_i‖ − m))

over the training set {x_i}. The mean distance to the k nearest neighbours is
1-Lipschitz in x, so log σ is r-Lipschitz: σ is r-semi-elastic (Thm 4.1). The proof
needs exact distances, so neighbours are ranked and distances computed in float64
(after a float32 screen whose error is bounded, :func:`nearest_exact`), chunked over the
training set so that 60,000 × 784 points and large query batches fit.
"""

from __future__ import annotations

import math

import torch

from harness import ParameterError, SemiElastic

TRAIN_CHUNK = 8192
SCREEN_EXTRA = 32
"""Candidates beyond the k nearest that the float32 screen keeps per query
(:func:`nearest_exact`)."""
FLOAT32_UNIT = 2.0**-24
"""Unit roundoff of float32."""


def _scan(q: torch.Tensor, t: torch.Tensor, t_sq: torch.Tensor | None, take: int):
    """The ``take`` smallest squared distances ‖q − t_i‖² = ‖q‖² + ‖t_i‖² − 2 q·t_i of each
    query and their indices, in ``q``'s dtype, over chunks of the training set (``t`` may
    be stored in a narrower dtype: each chunk is converted exactly; ``t_sq``: its squared
    row norms, else computed per chunk in ``q``'s dtype)."""
    q_sq = (q * q).sum(1, keepdim=True)
    best_d = torch.full((len(q), take), math.inf, dtype=q.dtype, device=q.device)
    best_i = torch.zeros((len(q), take), dtype=torch.long, device=q.device)
    for start in range(0, len(t), TRAIN_CHUNK):
        chunk = t[start : start + TRAIN_CHUNK].to(q.dtype)
        chunk_sq = (
            (chunk * chunk).sum(1)
            if t_sq is None
            else t_sq[start : start + TRAIN_CHUNK].to(q.dtype)
        )
        d2 = (q_sq + chunk_sq[None] - 2.0 * q @ chunk.T).clamp_min_(0)
        index = torch.arange(start, start + len(chunk), device=q.device).expand(len(q), -1)
        best_d, pos = torch.topk(torch.cat([best_d, d2], dim=1), take, dim=1, largest=False)
        best_i = torch.gather(torch.cat([best_i, index], dim=1), 1, pos)
    return best_d, best_i


def nearest_exact(q: torch.Tensor, t: torch.Tensor, t_sq: torch.Tensor, take: int) -> torch.Tensor:
    """Indices [B, take] of the ``take`` nearest training points of each float64 query,
    ranked by float64 squared distances (as a float64 scan of the whole set ranks them).

    ``t`` is the training set in float32 (its values exactly representable: converting
    it to float64 is exact) and ``t_sq`` its squared row norms in float64. A float32 scan
    keeps ``take`` + :data:`SCREEN_EXTRA` candidates; the float32 squared distance of any
    point is within E = 2(d + 6)·u·(‖q‖ + max‖t_i‖)² of the exact one (u = 2⁻²⁴, d the
    dimension: the standard bound γ_d·Σ|q_j t_ij| on a float32 dot product in any summation
    order, the norms and the rounding of q to float32 included, doubled), so when the
    last candidate's screened distance exceeds the take-th one's by more than 2E, every
    true neighbour is a candidate, and the candidates are ranked in float64. Queries
    where the margin fails (near-ties at the screen's resolution) are scanned in float64.
    """
    if take + SCREEN_EXTRA >= len(t):
        return _scan(q, t, t_sq, take)[1]
    keep = take + SCREEN_EXTRA
    screened, candidates = _scan(q.float(), t, t_sq, keep)
    reach = q.norm(dim=1) + t_sq.max().sqrt()
    error = 2.0 * (q.shape[1] + 6) * FLOAT32_UNIT * reach * reach
    enough = (screened[:, -1].double() - screened[:, take - 1].double()) > 2.0 * error
    rows = t[candidates].to(q.dtype)  # [B, keep, d], exact
    d2 = (q * q).sum(1, keepdim=True) + t_sq[candidates] - 2.0 * (rows @ q[:, :, None])[..., 0]
    pos = torch.topk(d2.clamp_min(0), take, dim=1, largest=False).indices
    best = torch.gather(candidates, 1, pos)
    if not bool(enough.all()):
        again = torch.nonzero(~enough)[:, 0]
        best[again] = _scan(q[again], t, t_sq, take)[1]
    return best


def knn_mean_distance(
    queries: torch.Tensor,
    train: torch.Tensor,
    k: int,
    exclude_self: bool = False,
    dtype: torch.dtype = torch.float64,
    train_sq: torch.Tensor | None = None,
) -> torch.Tensor:
    """(1/k) Σ ‖q − x_i‖ over the k nearest training points x_i of each query (exact).

    Neighbours are found without gradients in ``dtype`` (float64: by
    :func:`nearest_exact` when ``train`` is stored in float32, the float32 values of a
    dataset, with its float64 squared row norms ``train_sq``; else a float64 scan); the
    distances to them are then recomputed with autograd, so the result is differentiable
    in ``queries``. ``exclude_self`` skips one neighbour at distance 0 (a training point
    queried against its own set). ``dtype=torch.float32`` is for uses that need no
    certificate (training augmentation, choosing m). :class:`KnnSigma` keeps ``train``
    flattened on the queries' device and ``train_sq`` between calls.
    """
    q = queries.flatten(1).to(dtype)
    t = train.flatten(1).to(q.device)
    take = k + int(exclude_self)
    if take > len(t):
        raise ParameterError(f"k = {k} needs at least {take} training points, got {len(t)}")
    with torch.no_grad():
        if dtype == torch.float64 and t.dtype == torch.float32:
            if train_sq is None:
                wide = t.to(torch.float64)
                train_sq = (wide * wide).sum(1)
            best_i = nearest_exact(q.detach(), t, train_sq, take)
        else:
            best_i = _scan(q.detach(), t.to(dtype), train_sq, take)[1]
        if exclude_self:
            best_i = best_i[:, 1:]
    neighbours = t[best_i].to(dtype)  # [B, k, d]
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
        self._flat: tuple[torch.Tensor, torch.Tensor] | None = None

    def _flat_train(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The training set flattened on ``device`` (float32: exact in float64) and its
        squared row norms in float64, made once (converting 60,000 × 784 points per call
        dominated σ's cost)."""
        if self._flat is None or self._flat[0].device != device:
            t = self.train.flatten(1).to(device)
            narrow = t.to(torch.float32)
            t = narrow if torch.equal(narrow.to(t.dtype), t) else t.to(torch.float64)
            wide = t.to(torch.float64)
            self._flat = (t, (wide * wide).sum(1))
        return self._flat

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        train, train_sq = self._flat_train(x.device)
        log_sigma = math.log(self.sigma_b) + self.rate * (
            knn_mean_distance(x, train, self.k, train_sq=train_sq) - self.m
        )
        if self.max_ratio:
            log_sigma = torch.clamp(log_sigma, max=math.log(self.max_ratio * self.sigma_b))
        return torch.exp(log_sigma)
