"""S3: does a valid proof cover each claimed radius? (Súkeník et al. 2022, §2–3)

For a hard-smoothing certificate (x0, R, σ0 = σ(x0), p_A_lower) (``budget.audited_inputs``
of the row's certified inputs, drawn at random from the audit's entropy), every x1 in B(x0, R)
is smoothed with σ(x1) — the σ the method itself would use there. By Thm 2.2–2.3, the
worst case over base classifiers with P(f(x0 + σ0ε) = A) >= p_A_lower gives class B
probability ξ(‖x1 − x0‖, σ0, σ(x1)) at x1, which grows with the distance and with
|log σ(x1) − log σ0| (Thm 3.1). We search B(x0, R) for the smallest and largest σ(x1)
(random points, then projected gradient on σ when σ is differentiable) and evaluate
ξ at distance R for both extremes: if either reaches 1/2, no proof covers R and the
certificate is ``unjustified``. (For σ obeying the semi-elastic bound used by Thm 3.2,
ξ at R is below 1/2 by construction, so sound methods are not flagged.)

For a σ-provider that declares ``SemiElastic(r)`` (or ``Constant``, r = 0), the σ found
inside B(x0, R) must also lie in the envelope [σ0 e^(−rR), σ0 e^(rR)] that Thm 3.2
assumes with the *declared* r; a σ outside it makes the certificate ``unjustified``.

Soft-smoothing certificates on a ``Lipschitz(lip, σ_min)`` σ (Bergstrom et al., Thm 2
and 3) are audited by the harness from the objects themselves, never from the
certifier's own report: Lip(σ) <= lip from the provider's ``weights`` (product of their
spectral norms, ``torch.linalg.matrix_norm(ord=2)``) when it exposes them, and from
random pairs around the audited inputs; σ >= σ_min on every certificate and at those
points; every certificate records a floor 0 < p_min < 1/K and declares normalized
outputs, so that the means of g = (1 − K·p_min)·softmax + p_min, which S0 forms from the
harness's mean softmax outputs (:mod:`harness.audit.evidence`), lie in
[p_min, 1 − (K − 1)·p_min] by construction; L and the radius are re-derived by S0.

A row drawn at a diagonal scale (one σ per input dimension) is judged by ANCER's
fixed-Σ worst case at the smallest axis where the scale is fixed, and by the
Neyman–Pearson worst case of the two anisotropic Gaussians, computed with an error bound,
where it varies (:mod:`harness.audit.scale_justification`).

A σ-provider that declares a σ-smoothing (dual RS, Sun et al. 2026) uses a σ meant to be
constant on each certified ball: the ball is searched for a point where the harness's
draws of its σ-estimator confidently choose another level
(:func:`harness.audit.sigma_smoothing.check_justification`).

Applicability: every certifier that is not ``order_dependent`` (memory certificates
keep σ constant inside each certified ball, Alfarra et al., App. C, so there is no σ
variation to justify; S5 handles them).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from harness.audit import sigma_smoothing as smoothed
from harness.audit.audit import Audit
from harness.audit.ball_rounding import inside_radius
from harness.audit.sigma_calls import calls_of, sigma_in_calls, sigma_with_graph
from harness.certification.certify import checked_sigma, sigma_smoothing
from harness.engine.scale import drawn_with_scale
from harness.foundation.certificate import ABSTAIN
from harness.foundation.regularity import Constant, Lipschitz, SemiElastic
from harness.foundation.verdict import CheckResult, Verdict
from harness.mathematics.worstcase import xi

NAME = "worst-case-justification"
TOLERANCE = 1e-9  # ξ = 1/2 exactly at Cohen's radius; allow rounding, never more
_inside = inside_radius  # its name here before S3 at a diagonal scale shared it


def sigma_extremes(
    provider, x0: torch.Tensor, radius: torch.Tensor, steps: int, gen: torch.Generator,
    batch: int = 1024,
):  # fmt: skip
    """Smallest and largest σ(x1) found in each ball B(x0_i, R_i): random points, then (σ
    differentiable, as the first query tells) projected gradient steps on log σ both ways,
    from a start within R/2 of x0. Every point queried lies in the ball after rounding
    (:func:`~harness.audit.ball_rounding.inside_radius`): a σ found outside it would flag a sound certificate (a radius below
    the start's 10⁻³ offset did).

    σ is asked in few calls of at most ``batch`` points
    (:mod:`harness.audit.sigma_calls`): the inputs, all random points and the ascents'
    starts at once (with the gradient the first step takes), then the two ascents of every
    ball in lock-step, one query per later point: ``steps`` queries in all."""
    flat = x0.flatten(1)
    count, dim = flat.shape
    radius = inside_radius(flat, radius)
    points = [x0]
    for fraction in (1.0, 0.5, 0.25):
        for _ in range(4):
            d = torch.randn(flat.shape, generator=gen, dtype=flat.dtype).to(flat.device)
            d *= (fraction * radius / d.norm(dim=1))[:, None]
            points.append((flat + d).view_as(x0))
    starts = []  # of the ascent of log σ, then of − log σ
    for _ in range(2):
        # a start off x0 (where σ's gradient may vanish), inside the ball however small R is
        start = 1e-3 * torch.randn(flat.shape, generator=gen).to(flat.device) / math.sqrt(dim)
        start *= (radius / 2 / start.norm(dim=1).clamp_min(1e-12)).clamp(max=1.0)[:, None]
        starts.append(flat + start)
    points += [start.view_as(x0) for start in starts]
    leaf, sigma, differentiable = sigma_with_graph(provider, torch.cat(points), batch)
    values = sigma.detach().double().view(len(points), count)
    lo, hi = values.min(dim=0).values, values.max(dim=0).values
    if differentiable:
        (grad,) = torch.autograd.grad(torch.log(sigma[-2 * count :].double()).sum(), leaf,
                                      allow_unused=True)  # fmt: skip
        if grad is None:  # σ carries a gradient, but not in x (e.g. of a network's weights)
            return lo.cpu().numpy(), hi.cpu().numpy()
        sign = torch.tensor([1.0, -1.0], device=flat.device).repeat_interleave(count)[:, None]
        found = _ascend_log_sigma(provider, flat.repeat(2, 1), torch.cat(starts),
                                  grad[-2 * count :].flatten(1), radius.repeat(2), sign, steps,
                                  x0.shape[1:], batch)  # fmt: skip
        if len(found):
            found = found.view(-1, 2, count)
            lo = torch.minimum(lo, found.amin(dim=(0, 1)))
            hi = torch.maximum(hi, found.amax(dim=(0, 1)))
    return lo.cpu().numpy(), hi.cpu().numpy()


def _ascend_log_sigma(provider, flat, x1, grad, radius, sign, steps: int, shape, batch: int):
    """σ at the points after ``x1`` of the projected ascents of ``sign``·log σ (steps of
    R/4 along the normalized gradient, projected on the ball of ``radius`` around
    ``flat``), all rows in lock-step, the first along ``grad`` (∇ log σ at ``x1``, whose σ
    is known): a search of ``steps`` points, the start and ``steps − 1`` steps, as S2's
    ascent (:mod:`harness.audit.sigma_regularity`): [steps − 1, rows] (float64; fewer
    when σ stops carrying a gradient)."""
    seen = []
    for step in range(steps - 1):
        if step:
            x1 = x1.detach().requires_grad_(True)
            with torch.enable_grad():
                s = sigma_in_calls(provider, x1.view(-1, *shape), batch).double()
                if not s.requires_grad:
                    break
                (grad,) = torch.autograd.grad(torch.log(s).sum(), x1)
            seen.append(s.detach())
        with torch.no_grad():
            g = grad / grad.norm(dim=1, keepdim=True).clamp_min(1e-12)
            moved = x1.detach() + sign * (radius / 4)[:, None] * g
            delta = moved - flat
            delta *= (radius / delta.norm(dim=1).clamp_min(1e-12)).clamp(max=1.0)[:, None]
            x1 = flat + delta
        if step == steps - 2:  # the end of the search
            with torch.no_grad():
                seen.append(sigma_in_calls(provider, x1.view(-1, *shape), batch).double())
    return torch.stack(seen) if seen else flat.new_zeros((0, len(flat)), dtype=torch.float64)


def check_justification(audit: Audit) -> CheckResult:
    certifier = audit.certifier
    if certifier.order_dependent:
        return CheckResult(NAME, Verdict.NOT_APPLICABLE,
                           "memory certificates: σ is constant inside each certified ball (Alfarra et al., App. C)")  # fmt: skip
    if drawn_with_scale(audit.certificates):  # one σ per input dimension
        from harness.audit.scale_justification import check_scale_justification

        return check_scale_justification(audit, NAME, TOLERANCE)
    if sigma_smoothing(audit.sigma_provider) is not None:  # σ drawn by the harness (dual RS)
        return smoothed.check_justification(audit, NAME)
    declared = audit.sigma_provider.regularity
    if certifier.smoothing == "soft":
        return _soft_hypotheses(audit, declared)
    certs = audit.certificates
    certified = [k for k, c in enumerate(certs) if c["prediction"] != ABSTAIN and c["radius"] > 0]
    picked = audit.subset(f"{NAME}/inputs", len(certified), audit.budget.audited_inputs)
    chosen = [certified[int(i)] for i in picked]
    if not chosen:
        return CheckResult(NAME, Verdict.SOUND, "no certified radius to justify")
    device = audit.context.device
    x0 = audit.inputs[torch.tensor(chosen)].to(device, torch.float32)
    radius = np.array([certs[k]["radius"] for k in chosen])
    sigma0 = np.array([certs[k]["sigma"] for k in chosen])
    p_lower = np.array([certs[k]["p_lower"] for k in chosen])
    gen = audit.generator(f"{NAME}/extremes")
    lo, hi = sigma_extremes(_checked(audit), x0, torch.tensor(radius, dtype=torch.float32, device=device),
                            audit.budget.ascent_steps, gen, calls_of(audit))  # fmt: skip
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
    evidence = {"audited": len(chosen), "unjustified": len(bad), "worst": example, "dim": dim,
                "declared": declared.describe(),
                "inputs": [int(certs[k]["input_id"]) for k in chosen]}  # fmt: skip
    if len(bad):
        return CheckResult(
            NAME, Verdict.UNJUSTIFIED,
            f"{len(bad)}/{len(chosen)} radii have no valid proof, e.g. input {example['input_id']}: "
            f"R = {example['radius']:.10g}, σ0 = {example['sigma0']:.10g}, σ(x1) in "
            f"[{example['sigma1_min']:.10g}, {example['sigma1_max']:.10g}] inside the ball gives "
            f"ξ = {max(example['xi_at_min'], example['xi_at_max']):.10g} >= 1/2", evidence,
        )  # fmt: skip
    envelope = _outside_declared_rate(declared, radius, sigma0, lo, hi)
    if envelope is not None:
        j = envelope
        evidence["envelope"] = {"input_id": certs[chosen[j]]["input_id"], "radius": float(radius[j]),
                                "sigma0": float(sigma0[j]), "sigma1_min": float(lo[j]),
                                "sigma1_max": float(hi[j])}  # fmt: skip
        rate = 0.0 if isinstance(declared, Constant) else declared.rate
        return CheckResult(
            NAME, Verdict.UNJUSTIFIED,
            f"input {certs[chosen[j]]['input_id']}: σ(x1) in [{lo[j]:.10g}, {hi[j]:.10g}] inside the "
            f"ball of radius {radius[j]:.10g} leaves the envelope σ0·e^(±rR) = [{sigma0[j] * math.exp(-rate * radius[j]):.10g}, "
            f"{sigma0[j] * math.exp(rate * radius[j]):.10g}] of the declared {declared.describe()} σ the "
            "radius was computed with (Súkeník et al. 2022, Thm 3.2)", evidence,
        )  # fmt: skip
    margin = 0.5 - float(worst[k])
    position = (f"{margin:.3g} below 1/2" if margin > 0 else
                f"at 1/2 within the rounding tolerance {TOLERANCE:g}, as at Cohen's exact radius")  # fmt: skip
    return CheckResult(NAME, Verdict.SOUND,
                       f"all {len(chosen)} audited radii covered (worst ξ = {float(worst[k]):.10g}, "
                       f"{position})", evidence)  # fmt: skip


ENVELOPE_SLACK = 1e-6
"""Relative slack on the declared envelope (σ evaluated in float32)."""


def _outside_declared_rate(declared, radius, sigma0, lo, hi) -> int | None:
    """Index of the first audited ball whose σ leaves σ0·e^(±rR) for the declared r, or None."""
    if not isinstance(declared, Constant | SemiElastic):
        return None
    rate = 0.0 if isinstance(declared, Constant) else float(declared.rate)
    low = sigma0 * np.exp(-rate * radius) * (1 - ENVELOPE_SLACK)
    high = sigma0 * np.exp(rate * radius) * (1 + ENVELOPE_SLACK)
    bad = np.flatnonzero((lo < low) | (hi > high))
    return int(bad[0]) if len(bad) else None


def _checked(audit: Audit):
    """The σ-provider, its values checked to be in range (a bad σ is the provider's fault)."""

    def sigma(x: torch.Tensor) -> torch.Tensor:
        s = audit.sigma_provider(x)
        checked_sigma(s.detach(), len(x), audit.method.sigma_provider, " inside a certified ball")
        return s

    return sigma


def lipschitz_of_weights(weights) -> float:
    """∏ ‖W_i‖₂ (largest singular values, float64): a bound on the Lipschitz constant of a
    feed-forward network with these weights and 1-Lipschitz activations."""
    out = 1.0
    for w in weights:
        out *= float(torch.linalg.matrix_norm(w.detach().double(), ord=2))
    return out


FLOAT32 = 1e-6
"""Relative slack for σ compared with its declared floor (σ_min may be a float32 value)."""

LIP_SLACK = 1e-6
"""Relative slack on Lip(σ) comparisons (the providers' own SVD bounds carry a safety factor)."""


def _soft_hypotheses(audit: Audit, declared) -> CheckResult:
    """Bergstrom et al., Thm 2 and 3: each hypothesis checked on the objects themselves."""
    if isinstance(declared, Constant):
        declared = Lipschitz(0.0, declared.sigma)
    if not isinstance(declared, Lipschitz):
        return CheckResult(NAME, Verdict.UNJUSTIFIED,
                           f"soft smoothing needs a Lipschitz σ with a floor (Bergstrom et al., Thm 2); "
                           f"the σ-provider declares {declared.describe()}")  # fmt: skip
    certs, budget, device = audit.certificates, audit.budget, audit.context.device
    failed: list[str] = []
    evidence: dict = {"declared": declared.describe()}
    weights = getattr(audit.sigma_provider, "weights", None)
    if weights is not None:
        product = lipschitz_of_weights(weights)
        evidence["lip_from_weights"] = product
        if product > declared.lip * (1 + LIP_SLACK):
            failed.append(f"Lip(σ) <= {declared.lip:.10g}: the weights only give {product:.10g}")
    chosen = audit.subset(f"{NAME}/pairs-inputs", len(audit.inputs), budget.audited_inputs)
    x0 = audit.inputs[torch.as_tensor(chosen)].to(device, torch.float32)
    gen = audit.generator(f"{NAME}/pairs")
    scales = (0.01, 0.1, 1.0)
    points = [x0]
    for scale in scales:
        d = torch.randn(x0.flatten(1).shape, generator=gen).to(device)
        d *= scale / d.norm(dim=1, keepdim=True)
        points.append((x0.flatten(1) + d).view_as(x0))
    # the inputs and their pairs at every scale in one query (calls of the run's batch)
    s = torch.cat([audit.sigma(part, " at or near an audited input")
                   for part in torch.cat(points).split(calls_of(audit))]).double()  # fmt: skip
    s0, pairs = s[: len(x0)], s[len(x0) :].view(len(scales), len(x0))
    worst_q, min_sigma = 0.0, float(s.min())
    for scale, s1 in zip(scales, pairs, strict=True):
        worst_q = max(worst_q, float(((s1 - s0).abs() / scale).max()))
    stored_min = min((float(c["sigma"]) for c in certs), default=math.inf)
    evidence.update(lip_empirical=worst_q, min_sigma=min(min_sigma, stored_min))
    if worst_q > declared.lip * (1 + 1e-3) + 1e-5:
        failed.append(f"Lip(σ) <= {declared.lip:.10g}: a pair gives |Δσ|/‖δ‖ = {worst_q:.10g}")
    if min(min_sigma, stored_min) < declared.sigma_min * (1 - FLOAT32):
        failed.append(
            f"σ >= σ_min = {declared.sigma_min:.10g}: found σ = {min(min_sigma, stored_min):.10g}"
        )
    p_mins = [(c.get("evidence") or {}).get("p_min") for c in certs]
    if any((c.get("evidence") or {}).get("normalized") is False for c in certs):
        failed.append("outputs normalized to [p_min, 1 − p_min] (Remark 2): the certificates "
                      "declare raw outputs")  # fmt: skip
    if p_mins and all(p is not None for p in p_mins):
        p_min = min(p_mins)
        evidence["p_min"] = p_min
        if not 0 < p_min < 1 / max(2, audit.context.dataset.num_classes):
            failed.append(f"0 < p_min < 1/K (Remark 2): the certificates record p_min = {p_min!r}")
    else:
        failed.append("outputs in [p_min, 1 − p_min] (Remark 2): the certificates record no p_min")
    evidence["failed"] = failed
    if failed:
        return CheckResult(NAME, Verdict.UNJUSTIFIED, "hypotheses of Thm 3 not met: " + "; ".join(failed),
                           evidence)  # fmt: skip
    return CheckResult(NAME, Verdict.SOUND,
                       f"hypotheses of Thm 3 verified: Lip(σ) <= {declared.lip:.10g} (pairs: "
                       f"{worst_q:.10g}), σ >= {declared.sigma_min:.10g} (min {evidence['min_sigma']:.10g}), "
                       f"outputs in [p_min, 1 − p_min]", evidence)  # fmt: skip
