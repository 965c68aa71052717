"""S2: is σ(x) as regular as its provider declares? (Súkeník et al. 2022, Def. 3.1)

Random pairs around the audited inputs (``budget.audited_inputs`` of the run's, drawn at
random from the audit's entropy, as are the pairs), then projected gradient ascent from the worst
pair on the quotient the certificate relies on:

- semi-elasticity |log σ(x1) − log σ(x0)| / ‖x1 − x0‖ (Súkeník et al. 2022, Def. 3.1)
  for ``Constant`` (declared 0), ``SemiElastic(r)`` and ``Unregularized`` providers;
- Lipschitz quotient |σ(x1) − σ(x0)| / ‖x1 − x0‖ and the floor σ >= σ_min for
  ``Lipschitz(lip, σ_min)`` (Bergstrom et al., Thm 2).

A declared regularity that a pair contradicts makes the certificates ``unjustified``.

A σ-provider that answers a diagonal scale σ_1(x) … σ_d(x) (:mod:`harness.engine.scale`)
declares its regularity of every axis: ``Constant``, the whole scale is the same at every x;
``SemiElastic(r)``, |log σ_i(x1) − log σ_i(x0)| <= r·‖x1 − x0‖₂ for every axis i;
``Lipschitz(lip, σ_min)``, |σ_i(x1) − σ_i(x0)| <= lip·‖x1 − x0‖₂ and σ_i(x) >= σ_min for
every axis. Each makes the smallest axis, the certificate's σ, as regular (a minimum of
r-semi-elastic or lip-Lipschitz functions is one too). The quotient is then the largest
over the axes, searched as above on the scales the σ-provider returns ([B, d], or
[B, *input_shape] read as [B, d]).

A σ-provider that declares a σ-smoothing (dual RS, Sun et al. 2026) is held to what the
smoothing certifies instead: its level constant on every B(x, R_σ(x))
(:func:`harness.audit.sigma_smoothing.check_regularity`).

Applicability: the σ-provider declares a regularity (``Constant``, ``SemiElastic`` or
``Lipschitz``) or a σ-smoothing; for ``Unregularized`` without one there is nothing to
hold σ against, so the check is ``not-applicable`` and the worst semi-elasticity found
is information only.
"""

from __future__ import annotations

import torch

from harness.audit import sigma_smoothing as smoothed
from harness.audit.audit import Audit
from harness.audit.sigma_calls import calls_of, sigma_with_graph
from harness.certification.certify import sigma_smoothing
from harness.foundation.regularity import Constant, Lipschitz, SemiElastic, Unregularized
from harness.foundation.verdict import CheckResult, Verdict

NAME = "sigma-regularity"
SCALES = (0.01, 0.1, 0.5, 1.0)
RELATIVE_SLACK = 1e-3  # float32 σ evaluations: quotients are accurate to ~1e-5 at ‖δ‖ = 0.01
ABSOLUTE_SLACK = 1e-5


def _quotient(
    lipschitz: bool, s0: torch.Tensor, s1: torch.Tensor, dist: torch.Tensor
) -> torch.Tensor:
    """The quotient of each pair [P]; of a diagonal scale [P, d], the largest over its axes."""
    s0, s1 = _flat(s0), _flat(s1)
    diff = ((s1 - s0) if lipschitz else (torch.log(s1) - torch.log(s0))).abs()
    return (diff.amax(dim=1) if diff.dim() == 2 else diff) / dist


def _flat(sigma: torch.Tensor) -> torch.Tensor:
    """σ [P], or a diagonal scale as [P, d] whether answered so or as [P, *input_shape]."""
    return sigma.reshape(len(sigma), -1) if sigma.dim() > 1 else sigma


def check_sigma_regularity(audit: Audit) -> CheckResult:
    if sigma_smoothing(audit.sigma_provider) is not None:  # σ drawn by the harness (dual RS)
        return smoothed.check_regularity(audit, NAME)
    provider, budget = audit.sigma_provider, audit.budget
    declared = provider.regularity
    lipschitz = isinstance(declared, Lipschitz)
    chosen = audit.subset(f"{NAME}/inputs", len(audit.inputs), budget.audited_inputs)
    x0 = audit.inputs[torch.as_tensor(chosen)].to(audit.context.device, torch.float32)
    flat = x0.flatten(1)
    gen = audit.generator(f"{NAME}/pairs")
    per_scale = max(1, budget.pairs // len(SCALES))
    scales = [scale for scale in SCALES for _ in range(per_scale)]
    pairs = []  # every pair's second point, drawn in the order of the scales
    for scale in scales:
        direction = torch.randn(flat.shape, generator=gen).to(flat.device)
        direction *= scale / direction.norm(dim=1, keepdim=True)
        pairs.append((flat + direction).view_as(x0))
    # the inputs and every pair in one query (its graph is the ascent's first step)
    asked, sigma, differentiable = sigma_with_graph(provider, torch.cat([x0, *pairs]),
                                                    calls_of(audit))  # fmt: skip
    values = _flat(sigma.detach().double())
    count = len(x0)
    s0 = values[:count]
    best_q = torch.zeros(count, dtype=torch.float64)
    best_row = torch.arange(count)  # each input's best second point: a row of ``asked``
    min_sigma = float(values.min())
    for m, scale in enumerate(scales):
        rows = torch.arange((m + 1) * count, (m + 2) * count)
        s1 = values[rows.to(values.device)]
        q = _quotient(lipschitz, s0, s1, s0.new_full((count,), scale)).cpu()
        better = q > best_q
        best_q[better] = q[better]
        best_row[better] = rows[better]
    best_x1 = asked.detach()[best_row.to(asked.device)].clone()
    best_s1 = values[best_row.to(values.device)].cpu().clone()  # σ at best_x1
    gradient = (
        _ascend(provider, x0, s0, (asked, sigma, best_row), best_x1, best_q, best_s1, lipschitz,
                budget.ascent_steps)
        if differentiable
        else NOT_DIFFERENTIABLE
    )  # fmt: skip
    worst = int(torch.argmax(best_q))
    found = float(best_q[worst])
    evidence = {
        "declared": declared.describe(),
        "worst_quotient": found,
        "quotient": ("|σ1 − σ0|/‖δ‖" if lipschitz else "|log σ1 − log σ0|/‖δ‖")
        + (", the largest over the axes of the scale" if values.dim() == 2 else ""),
        "input_id": audit.certificates[int(chosen[worst])]["input_id"],
        "audited": [int(audit.certificates[int(k)]["input_id"]) for k in chosen],
        "distance": float((best_x1[worst] - x0[worst]).flatten().norm()),
        **_sigmas(lipschitz, s0[worst].cpu(), best_s1[worst]),
        "pairs": len(x0) * per_scale * len(SCALES),
        "ascent": gradient,
        "min_sigma": min_sigma,
    }
    if isinstance(declared, Unregularized):
        return CheckResult(NAME, Verdict.NOT_APPLICABLE,
                           f"undeclared regularity; worst semi-elasticity found {found:.4g}", evidence)  # fmt: skip
    bound = (
        0.0
        if isinstance(declared, Constant)
        else (declared.rate if isinstance(declared, SemiElastic) else declared.lip)
    )
    ok = found <= bound * (1 + RELATIVE_SLACK) + ABSOLUTE_SLACK
    if lipschitz and min_sigma < declared.sigma_min * (1 - 1e-6):
        return CheckResult(NAME, Verdict.UNJUSTIFIED,
                           f"σ = {min_sigma:.10g} below the declared σ_min {declared.sigma_min:.10g}", evidence)  # fmt: skip
    if ok:
        return CheckResult(
            NAME,
            Verdict.SOUND,
            f"worst quotient {found:.10g} within declared {declared.describe()}",
            evidence,
        )
    return CheckResult(
        NAME, Verdict.UNJUSTIFIED,
        f"input {evidence['input_id']}: quotient {found:.10g} at distance {evidence['distance']:.3g} "
        f"exceeds the declared {declared.describe()}", evidence,
    )  # fmt: skip


def _sigmas(lipschitz: bool, s0: torch.Tensor, s1: torch.Tensor) -> dict:
    """σ at the worst pair's two points; of a diagonal scale, the axis with the largest
    quotient and its σ_i at both points."""
    if s0.dim() == 0:
        return {"sigma0": float(s0), "sigma1": float(s1)}
    diff = (s1 - s0) if lipschitz else (torch.log(s1) - torch.log(s0))
    axis = int(torch.argmax(diff.abs()))
    return {"sigma0": float(s0[axis]), "sigma1": float(s1[axis]), "axis": axis}


NOT_DIFFERENTIABLE = "unavailable (σ-provider not differentiable)"


def _ascend(provider, x0, s0, first, best_x1, best_q, best_s1, lipschitz: bool,
            steps: int) -> str:  # fmt: skip
    """Projected gradient ascent of the quotient from the best random pairs (``best_x1``,
    its quotients ``best_q`` and σ ``best_s1`` updated in place), every audited input in
    lock-step: one σ query per step. The first step's σ and graph are those of the pairs'
    query (``first``: the points asked, σ with its graph, each input's row in them)."""
    x1 = best_x1.clone()
    step = 0.05
    for k in range(steps):
        with torch.enable_grad():
            if k == 0:  # the best pairs' points and σ, with the pairs' query's graph
                leaf, sigma, rows = first
                x1 = leaf[rows.to(leaf.device)]
                s1 = _flat(sigma[rows.to(sigma.device)].double())
            else:
                leaf = x1 = x1.detach().requires_grad_(True)
                try:
                    s1 = _flat(provider(x1).double())
                except RuntimeError:
                    return NOT_DIFFERENTIABLE
                if not s1.requires_grad:
                    return NOT_DIFFERENTIABLE
            dist = (x1 - x0).flatten(1).norm(dim=1).double().clamp_min(1e-4)
            q = _quotient(lipschitz, s0.to(s1.device), s1, dist)
            (grad,) = torch.autograd.grad(q.sum(), leaf)
            if k == 0:
                grad = grad[rows.to(grad.device)]
        with torch.no_grad():
            qc = q.detach().cpu()
            better = qc > best_q
            best_q[better] = qc[better]
            best_x1[better] = x1.detach()[better.to(x1.device)]
            best_s1[better] = s1.detach().cpu()[better]
            g = grad.flatten(1)
            g = g / g.norm(dim=1, keepdim=True).clamp_min(1e-12)
            x1 = x1.detach() + step * g.view_as(x1)
    return f"{steps} steps"
