"""How the checks ask a method's σ: the points of a search gathered, asked in few calls.

A σ-provider may be costly per call (a scan of the training set, a gradient ascent per
point, a Monte Carlo search; on a GPU each call is many small launches), so the checks
gather the points a search needs before asking (S1's trial inputs and flip rays, S2's
pairs, S3's random points and ascent starts, the iterates of the searches of every
audited input in lock-step) and ask them in calls of at most ``batch`` points, the run's
batch size (:func:`calls_of`): a call holds what the run's forward passes hold, so a
σ-provider whose memory grows with its batch (a distance matrix to the training set)
fits as it did when it certified.

σ(x) of a point depends on that point alone (what the replay check holds a provider
to), so the values do not depend on which points are asked together, up to the
rounding of a batched product (a σ-network's matrix product, which the run's
certificates do not depend on: they store the σ certification computed). A σ-provider's
noise centre (:mod:`harness.engine.centre`) is asked the same way (:func:`centre_asker`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

Provider = Callable[[torch.Tensor], torch.Tensor]


def calls_of(audit) -> int:
    """Points per σ call: the run's batch size (its engine's, ``auto`` resolved)."""
    return int(audit.context.engine.batch_size)


def sigma_in_calls(provider: Provider, x: torch.Tensor, batch: int) -> torch.Tensor:
    """σ [P] at the points ``x`` [P, ...], asked in calls of at most ``batch`` points
    (with whatever autograd mode the caller set)."""
    parts = [provider(x[start : start + batch]) for start in range(0, len(x), max(1, batch))]
    if not parts:
        return torch.zeros(0, dtype=torch.float64, device=x.device)
    return torch.cat(parts)


def centre_in_calls(provider, x: torch.Tensor, batch: int, name: str, where: str) -> np.ndarray:
    """The centre μ [P, d] (float64) of σ-provider ``name`` at the points ``x`` [P, ...],
    asked in calls of at most ``batch`` points and checked (a bad centre is the
    σ-provider's fault; ``where`` says where it was asked, :mod:`harness.engine.centre`)."""
    from harness.engine.centre import centre_of

    parts = [centre_of(provider, x[k : k + batch], name, where)
             for k in range(0, len(x), max(1, batch))]  # fmt: skip
    return np.concatenate(parts).astype(np.float64) if parts else np.zeros((0, x[0].numel()))


def centre_asker(audit, where: str) -> Callable[[torch.Tensor], np.ndarray] | None:
    """The audited σ-provider's centre at points [P, ...] (any shape holding P inputs) as
    float64 [P, d] (:func:`centre_in_calls`); None for a provider without one (its noise
    is centred at x)."""
    provider = audit.sigma_provider
    if getattr(provider, "centre", None) is None:
        return None
    batch, shape = calls_of(audit), tuple(audit.inputs.shape[1:])

    def centre(points: torch.Tensor) -> np.ndarray:
        x = points.detach().float().reshape(-1, *shape)
        return centre_in_calls(provider, x, batch, audit.method.sigma_provider, where)

    return centre


def sigma_with_graph(
    provider: Provider, x: torch.Tensor, batch: int
) -> tuple[torch.Tensor, torch.Tensor, bool]:  # fmt: skip
    """σ at the points ``x`` asked with autograd on: (the leaf the points were asked as, σ
    [P] with its graph when σ carries a gradient in x, whether it does). One query tells
    both, so a search skips its gradient steps for a σ that has none without asking
    again; a σ that cannot be differentiated (computed by a search in no-grad mode,
    raising when asked with autograd on) is asked again without it."""
    leaf = x.detach().requires_grad_(True)
    try:
        with torch.enable_grad():
            sigma = sigma_in_calls(provider, leaf, batch)
    except RuntimeError:  # σ not differentiable (e.g. computed by a search in no-grad mode)
        with torch.no_grad():
            return leaf, sigma_in_calls(provider, x.detach(), batch).double(), False
    return leaf, sigma, bool(sigma.requires_grad)


def sigma_with_differentiability(
    provider: Provider, x: torch.Tensor, batch: int
) -> tuple[torch.Tensor, bool]:  # fmt: skip
    """σ(x) [P] (float64, detached) and whether σ carries a gradient in x
    (:func:`sigma_with_graph`)."""
    _, sigma, differentiable = sigma_with_graph(provider, x, batch)
    return sigma.detach().double(), differentiable


def sigma_and_gradients(
    provider: Provider, x: torch.Tensor, batch: int
) -> tuple[torch.Tensor, list[torch.Tensor | None]]:  # fmt: skip
    """σ at the points ``x`` [P, ...] (detached) and each point's ∇σ (flattened, float64,
    on the CPU), in one evaluation; a point's gradient is None where σ is not
    differentiable, or its gradient is not finite or zero."""
    leaf, sigma, differentiable = sigma_with_graph(provider, x.float(), batch)
    if not differentiable:
        return sigma.detach(), [None] * len(x)
    (grad,) = torch.autograd.grad(sigma.sum(), leaf, allow_unused=True)
    if grad is None:  # σ carries a gradient, but not in x (e.g. of a network's weights)
        return sigma.detach(), [None] * len(x)
    grad = grad.flatten(1).double().cpu()
    ok = torch.isfinite(grad).all(dim=1) & (grad.norm(dim=1) > 0)
    return sigma.detach(), [g if good else None for g, good in zip(grad, ok.tolist(), strict=True)]
