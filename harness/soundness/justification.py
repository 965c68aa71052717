"""S3: does a valid proof cover each claimed radius? (DESIGN §8; Súkeník et al. 2022, §2–3)

For a hard-smoothing certificate (x0, R, σ0 = σ(x0), p_A_lower), every x1 in B(x0, R)
is smoothed with σ(x1) — the σ the method itself would use there. By Thm 2.2–2.3, the
worst case over base classifiers with P(f(x0 + σ0ε) = A) >= p_A_lower gives class B
probability ξ(‖x1 − x0‖, σ0, σ(x1)) at x1, which grows with the distance and with
|log σ(x1) − log σ0| (Thm 3.1). We search B(x0, R) for the smallest and largest σ(x1)
(random points, then projected gradient on σ when σ is differentiable) and evaluate
ξ at distance R for both extremes: if either reaches 1/2, no proof covers R and the
certificate is ``unjustified``. (For σ obeying the semi-elastic bound used by Thm 3.2,
ξ at R is below 1/2 by construction, so sound methods are not flagged.)

Certificates that are not hard-smoothing ones are audited through the certifier's
``hypotheses()`` (a mapping from each hypothesis of its theorem to whether it holds);
memory certificates use a piecewise-constant σ inside their balls (Alfarra et al.,
App. C), to which this search does not apply.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from harness.certificate import ABSTAIN
from harness.soundness.audit import Audit
from harness.soundness.verdict import CheckResult, Verdict
from harness.worstcase import xi

NAME = "worst-case-justification"
TOLERANCE = 1e-9  # ξ = 1/2 exactly at Cohen's radius; allow rounding, never more


def sigma_extremes(
    provider, x0: torch.Tensor, radius: torch.Tensor, steps: int, gen: torch.Generator
):
    """Smallest and largest σ(x1) found in each ball B(x0_i, R_i), with their distances."""
    flat = x0.flatten(1)
    dim = flat.shape[1]
    lo = provider(x0).detach().double()
    hi = lo.clone()
    for fraction in (1.0, 0.5, 0.25):
        for _ in range(4):
            d = torch.randn(flat.shape, generator=gen).to(flat.device)
            d *= (fraction * radius / d.norm(dim=1))[:, None]
            with torch.no_grad():
                s = provider((flat + d).view_as(x0)).double()
            lo, hi = torch.minimum(lo, s), torch.maximum(hi, s)
    for sign in (1.0, -1.0):
        x1 = (
            flat + 1e-3 * torch.randn(flat.shape, generator=gen).to(flat.device) / math.sqrt(dim)
        ).view_as(x0)
        for _ in range(steps):
            x1 = x1.detach().requires_grad_(True)
            with torch.enable_grad():
                s = provider(x1).double()
                if not s.requires_grad:
                    break
                (grad,) = torch.autograd.grad(torch.log(s).sum(), x1)
            with torch.no_grad():
                lo, hi = torch.minimum(lo, s.detach()), torch.maximum(hi, s.detach())
                g = grad.flatten(1)
                g = g / g.norm(dim=1, keepdim=True).clamp_min(1e-12)
                moved = x1.flatten(1) + sign * (radius / 4)[:, None] * g
                delta = moved - flat
                delta *= (radius / delta.norm(dim=1).clamp_min(1e-12)).clamp(max=1.0)[:, None]
                x1 = (flat + delta).view_as(x0)
        with torch.no_grad():
            s = provider(x1.detach()).double()
        lo, hi = torch.minimum(lo, s), torch.maximum(hi, s)
    return lo.cpu().numpy(), hi.cpu().numpy()


def check_justification(audit: Audit) -> CheckResult:
    certifier = audit.certifier
    if getattr(certifier, "order_dependent", False):
        return CheckResult(NAME, Verdict.NOT_APPLICABLE,
                           "memory certificates: σ is constant inside each certified ball (Alfarra et al., App. C)")  # fmt: skip
    if hasattr(certifier, "hypotheses"):
        hypotheses = dict(certifier.hypotheses())
        failed = [name for name, holds in hypotheses.items() if not holds]
        verdict = Verdict.UNJUSTIFIED if failed else Verdict.SOUND
        summary = (
            f"hypotheses not met: {', '.join(failed)}"
            if failed
            else "all hypotheses of the theorem hold"
        )
        return CheckResult(NAME, verdict, summary, {"hypotheses": hypotheses})
    certs = audit.certificates
    chosen = [k for k, c in enumerate(certs) if c["prediction"] != ABSTAIN and c["radius"] > 0]
    chosen = chosen[: audit.budget.audited_inputs]
    if not chosen:
        return CheckResult(NAME, Verdict.SOUND, "no certified radius to justify")
    x0 = audit.inputs[torch.tensor(chosen)].to(audit.context.device, torch.float32)
    radius = np.array([certs[k]["radius"] for k in chosen])
    sigma0 = np.array([certs[k]["sigma"] for k in chosen])
    p_lower = np.array([certs[k]["p_lower"] for k in chosen])
    gen = torch.Generator().manual_seed(audit.context.seed + 3)
    lo, hi = sigma_extremes(audit.sigma_provider, x0, torch.tensor(radius, dtype=torch.float32).to(x0.device),
                            audit.budget.ascent_steps, gen)  # fmt: skip
    lo, hi = np.minimum(lo, sigma0), np.maximum(hi, sigma0)
    dim = int(x0[0].numel())
    xi_lo = np.asarray(xi(radius, sigma0, lo, p_lower, dim))
    xi_hi = np.asarray(xi(radius, sigma0, hi, p_lower, dim))
    worst = np.fmax(xi_lo, xi_hi)
    bad = np.nonzero(~(worst < 0.5 + TOLERANCE))[0]
    k = int(np.nanargmax(worst)) if np.any(np.isfinite(worst)) else 0
    example = {"input_id": certs[chosen[k]]["input_id"], "radius": float(radius[k]), "sigma0": float(sigma0[k]),
               "sigma1_min": float(lo[k]), "sigma1_max": float(hi[k]), "p_lower": float(p_lower[k]),
               "xi_at_min": float(xi_lo[k]), "xi_at_max": float(xi_hi[k])}  # fmt: skip
    evidence = {"audited": len(chosen), "unjustified": len(bad), "worst": example, "dim": dim}
    if len(bad):
        return CheckResult(
            NAME, Verdict.UNJUSTIFIED,
            f"{len(bad)}/{len(chosen)} radii have no valid proof, e.g. input {example['input_id']}: "
            f"R = {example['radius']:.4g}, σ0 = {example['sigma0']:.4g}, σ(x1) in "
            f"[{example['sigma1_min']:.4g}, {example['sigma1_max']:.4g}] inside the ball gives "
            f"ξ = {max(example['xi_at_min'], example['xi_at_max']):.4g} >= 1/2", evidence,
        )  # fmt: skip
    return CheckResult(NAME, Verdict.SOUND,
                       f"all {len(chosen)} audited radii covered (worst ξ = {float(worst[k]):.6f} < 1/2)", evidence)  # fmt: skip
