"""S3 at a diagonal scale: does a valid proof cover each certified ℓ2 ball and ellipsoid?

A certificate drawn at a diagonal scale Σ0 = diag(σ_1², …, σ_d²) (:mod:`harness.engine.
scale`) claims the ℓ2 ball B(x0, R) with R = σ_min·Φ⁻¹(p_A_lower), σ_min = min_i σ_i of
its recorded scale. The proof the harness knows is ANCER's (Eiras et al., TMLR 2022,
Thm 1, the anisotropic form of Cohen et al. 2019, Thm 1), which holds for a *fixed* Σ:
if every x1 in the ball is smoothed at the same Σ0, the worst case over base classifiers
with P(f(x0 + Σ0^{1/2}ε) = A) >= p_A_lower gives class B probability
1 − Φ(Φ⁻¹(p_A_lower) − ‖Σ0^{-1/2}δ‖₂) at x1 = x0 + δ, and ‖Σ0^{-1/2}δ‖₂ <= ‖δ‖₂/σ_min with
equality along the smallest axis. So the ball is covered iff Súkeník's ξ at σ1 = σ0 =
σ_min (the half-space limit Φ(R/σ_min − Φ⁻¹(p_A_lower)),
:func:`harness.mathematics.worstcase.xi`) stays below 1/2 at R: the scalar machinery at
σ = σ_min decides a fixed scale exactly, both ways.

The reduction to the smallest axis is *not* valid when the scale varies inside the ball:
if Σ(x1) differs from Σ0 on an axis other than the smallest, σ_min is unchanged and ξ at
σ_min is Cohen's, but the two anisotropic Gaussians N(x0, Σ0) and N(x1, Σ(x1)) are told
apart by that axis too (at x1 = x0 the worst case is already above 1 − p_A_lower), so
the scalar ξ would pass a radius no proof covers. The worst case at such an x1 is the
Neyman–Pearson one of two different anisotropic Gaussians (a generalized χ², the
diagonal form of Súkeník et al. 2022, Thm 2.3), computed by inverting its characteristic
function with an error bound (:mod:`harness.mathematics.worstcase.anisotropic`), so:

- each audited ball (``budget.audited_inputs`` of the certified inputs, from the audit's
  entropy) is searched for the scale the σ-provider answers in it (random points, both
  ends of the smallest axis at R, then projected gradient ascent of
  max_i ±(log σ_i(x1) − log σ_i(x0)) when it is differentiable), against the scale
  recorded with the certificate, and so is the ellipsoid the certificate claims beyond
  its ball (:func:`ellipsoid_deviation`); where σ has no gradient, or the noise has a
  centre (below), a derivative-free descent of the worst case itself follows
  (:func:`harness.audit.worst_points.descend`);
- a scale found equal to the recorded one (relative :data:`SCALE_SLACK`, the float32 it
  is drawn in) throughout the ball is judged by ξ at σ_min: ``unjustified`` at or
  above 1/2 (e.g. a radius from the largest axis);
- a scale that varies inside a ball is ``unjustified`` when the σ-provider declares
  ``Constant`` (the fixed Σ the proof assumes is contradicted, as the scalar envelope
  check); under any other regularity, as the scalar S3 judges any σ by its exact worst
  case at the σ found, the points of the search where the scale is the recorded one
  are judged exactly (ANCER Thm 1: ``unjustified`` below 1/2), and the point where the
  scale varies and a normal approximation of the worst case is least is judged by the
  worst case computed there with its numerical error bound: ``unjustified`` when its
  upper bound is below 1/2 (the likelihood-ratio set is then a classifier consistent
  with the certificate whose smoothed class at that point is not A), ``sound`` when
  every such ball's lower bound reaches 1/2, and otherwise an ``error`` (within the
  quadrature's error of 1/2: the row is not verified, never passed). A numeric check,
  as the scalar S3's quadrature of ξ: no randomness, no false-alarm rate.

Around a noise centre (:mod:`harness.engine.centre`: the samples of x drawn at x + μ(x))
the mean of the noise moves from x0 + μ(x0) to x1 + μ(x1), by Δ = δ + μ(x1) − μ(x0)
rather than δ, and every worst case above is that of Δ (the Neyman–Pearson worst case of
two Gaussians depends on their means through their difference alone): the search asks
the centre at each of its points beside the scale (and descends the worst case of Δ),
and a ball where the centre moves (beyond the float32 it is recorded in, relative
:data:`SCALE_SLACK`) is judged as one where the scale varies, at the point where it
moves: ``unjustified`` where the fixed-scale worst case Φ(Φ⁻¹(p_A_lower) − ‖Σ0^{-1/2}Δ‖₂)
(exact there) or the computed one's upper bound is below 1/2. A constant centre moves
nothing, and changes nothing.
"""

from __future__ import annotations

import numpy as np
import torch

from harness.audit.audit import Audit
from harness.audit.ball_rounding import inside_radius
from harness.audit.scaled_regions import ellipsoid_axes
from harness.audit.sigma_calls import calls_of, centre_asker, sigma_in_calls, sigma_with_graph
from harness.audit.worst_points import SCALE_SLACK, Candidates, descend
from harness.certification.certify import checked_sigma, sigma_smoothing
from harness.engine.centre import drawn_with_centre, recorded_centre
from harness.engine.scale import recorded_scale
from harness.foundation.certificate import ABSTAIN
from harness.foundation.regularity import Constant
from harness.foundation.verdict import CheckResult, Verdict
from harness.mathematics.worstcase import xi
from harness.mathematics.worstcase.anisotropic import worst_case


def check_scale_justification(audit: Audit, name: str, tolerance: float) -> CheckResult:
    """S3 on a row drawn at a diagonal scale (see the module's docstring); ``tolerance``
    on ξ = 1/2, reached exactly at Cohen's radius."""
    if sigma_smoothing(audit.sigma_provider) is not None:
        return CheckResult(name, Verdict.ERROR,
                           "a σ-smoothing (dual RS) at a diagonal scale: S3's search of its "
                           "levels is for one σ per input; the row is not verified")  # fmt: skip
    if audit.certifier.smoothing == "soft":
        return CheckResult(name, Verdict.ERROR,
                           "soft smoothing at a diagonal scale: the hypotheses of Bergstrom et al. "
                           "(Thm 2 and 3) are for one σ per input and S3 cannot check them for a "
                           "scale; the row is not verified")  # fmt: skip
    certs, declared = audit.certificates, audit.sigma_provider.regularity
    certified = [k for k, c in enumerate(certs) if c["prediction"] != ABSTAIN and c["radius"] > 0]
    picked = audit.subset(f"{name}/inputs", len(certified), audit.budget.audited_inputs)
    chosen = [certified[int(i)] for i in picked]
    if not chosen:
        return CheckResult(name, Verdict.SOUND, "no certified radius to justify")
    device = audit.context.device
    x0 = audit.inputs[torch.tensor(chosen)].to(device, torch.float32)
    dim = int(x0[0].numel())
    scale0, missing = _recorded(certs, chosen, recorded_scale, dim)
    if missing:
        return CheckResult(name, Verdict.ERROR,
                           f"the certificates of inputs {missing[:5]} record no scale of {dim} "
                           "axes in a row drawn at a diagonal scale: S3 cannot tell the σ their "
                           "radii rely on; the row is not verified")  # fmt: skip
    centre0 = centre = None
    if drawn_with_centre(certs):
        centre0, missing = _recorded(certs, chosen, recorded_centre, dim)
        if missing:
            return CheckResult(name, Verdict.ERROR,
                               f"the certificates of inputs {missing[:5]} record no centre of "
                               f"{dim} dimensions in a row drawn around a centre: S3 cannot tell "
                               "the noise their radii rely on; the row is not verified")  # fmt: skip
        centre = centre_asker(audit, " inside a certified ball")
        if centre is None:
            return CheckResult(name, Verdict.ERROR,
                               "the row was drawn around a centre but the σ-provider answers "
                               "none: S3 cannot ask the centre inside a ball; the row is not "
                               "verified")  # fmt: skip
    radius = np.array([certs[k]["radius"] for k in chosen], dtype=np.float64)
    p_lower = np.array([certs[k]["p_lower"] for k in chosen], dtype=np.float64)
    sigma_min = scale0.min(axis=1)
    worst = np.asarray(xi(radius, sigma_min, sigma_min, p_lower, dim), dtype=np.float64)
    gen = audit.generator(f"{name}/scale")
    candidates = Candidates(x0, scale0, p_lower, centre0, centre)
    deviation, axis, differentiable = scale_deviation(
        _checked(audit, dim), x0, torch.tensor(radius, dtype=torch.float32, device=device),
        torch.tensor(scale0, device=device), audit.budget.ascent_steps, gen, calls_of(audit),
        candidates.see,
    )  # fmt: skip
    region = np.full(len(chosen), "ball", dtype=object)
    axes = [ellipsoid_axes(certs[k]) for k in chosen]
    if any(a is not None for a in axes):  # the claimed ellipsoids, beyond their balls
        wide, wide_axis = ellipsoid_deviation(_checked(audit, dim), x0, axes, scale0, gen,
                                              calls_of(audit), candidates.see)  # fmt: skip
        further = wide > deviation
        deviation, axis = np.where(further, wide, deviation), np.where(further, wide_axis, axis)
        region[further] = "ellipsoid"
    descent = None
    if centre is not None or not differentiable:  # no gradient climbs it: worst_points.py
        candidates.keep()
        steps, change, where = descend(
            _checked(audit, dim), candidates, radius, audit.budget.ascent_steps - 1,
            audit.generator(f"{name}/descent"), calls_of(audit), x0,
        )  # fmt: skip
        further = change > deviation
        deviation, axis = np.where(further, change, deviation), np.where(further, where, axis)
        region[further] = "ball"
        descent = {"steps": audit.budget.ascent_steps - 1, "lowering": steps}
    varies = (deviation > np.log1p(SCALE_SLACK)) | (candidates.moved > SCALE_SLACK)
    uncovered = ~varies & ~(worst < 0.5 + tolerance)

    def example(j: int) -> dict:
        return {"input_id": certs[chosen[j]]["input_id"], "radius": float(radius[j]),
                "sigma_min": float(sigma_min[j]), "p_lower": float(p_lower[j]),
                "xi": float(worst[j]), "log_scale_deviation": float(deviation[j]),
                "axis": int(axis[j]), "region": str(region[j]),
                "centre_deviation": float(candidates.moved[j])}  # fmt: skip

    evidence = {"audited": len(chosen), "dim": dim, "declared": declared.describe(),
                "inputs": [int(certs[k]["input_id"]) for k in chosen],
                "uncovered": int(uncovered.sum()), "varying": int(varies.sum()),
                "descent": descent,
                "worst": example(int(np.nanargmax(np.where(varies, -np.inf, worst)))
                                 if not varies.all() else 0)}  # fmt: skip
    if uncovered.any():
        j = int(np.flatnonzero(uncovered)[0])
        evidence["first"] = example(j)
        return CheckResult(
            name, Verdict.UNJUSTIFIED,
            f"{int(uncovered.sum())}/{len(chosen)} radii have no valid proof, e.g. input "
            f"{evidence['first']['input_id']}: R = {radius[j]:.10g} at the fixed scale's smallest "
            f"axis σ_min = {sigma_min[j]:.10g} gives ξ = {worst[j]:.10g} >= 1/2 (the ball exceeds "
            "σ_min·Φ⁻¹(p_A_lower), ANCER Thm 1)", evidence,
        )  # fmt: skip
    if varies.any():
        j = int(np.flatnonzero(varies)[0])
        evidence["first"] = example(j)
        inside = (f"the ball of radius {radius[j]:.10g}" if region[j] == "ball"
                  else "the claimed ellipsoid, beyond the ball")  # fmt: skip
        where = (f"input {evidence['first']['input_id']}: axis {int(axis[j])} of the scale "
                 f"changes by a factor e^{deviation[j]:.4g} inside {inside}")  # fmt: skip
        if isinstance(declared, Constant) and deviation[j] > np.log1p(SCALE_SLACK):
            return CheckResult(name, Verdict.UNJUSTIFIED,
                               f"{where}, though the σ-provider declares a constant scale, the "
                               "fixed Σ the radius is proved for (ANCER Thm 1)", evidence)  # fmt: skip
        return _judge_varying(name, candidates, np.flatnonzero(varies),
                              [certs[k]["input_id"] for k in chosen], declared, evidence,
                              tolerance)  # fmt: skip
    return CheckResult(name, Verdict.SOUND,
                       f"all {len(chosen)} audited balls covered at a scale constant inside each "
                       f"(worst ξ at σ_min = {evidence['worst']['xi']:.10g}, ANCER Thm 1)",
                       evidence)  # fmt: skip


def _judge_varying(name: str, found: Candidates, balls: np.ndarray, ids: list, declared,
                   evidence: dict, tolerance: float) -> CheckResult:  # fmt: skip
    """Balls where the scale varies (module docstring): ``unjustified`` where the exact
    fixed-scale worst case at a point whose scale did not vary, or the upper bound on the
    computed worst case at a candidate point (the search's, and the descent's), is below
    1/2; else ``sound`` where every lower bound reaches 1/2; else ``error``."""
    fixed = [j for j in balls if found.fixed[j] < 0.5 - tolerance]
    if fixed:
        j = fixed[0]
        return CheckResult(
            name, Verdict.UNJUSTIFIED,
            f"{len(fixed)}/{len(balls)} balls have no valid proof, e.g. input {ids[j]}: at a "
            f"point of the ball where the scale is the recorded one, ANCER's exact worst case "
            f"(Thm 1, fixed Σ{_moved(found, j)}) gives P(A) = {found.fixed[j]:.10g} < 1/2",
            evidence,
        )  # fmt: skip
    judged = []
    for j in balls:
        row = {"input_id": ids[j], "lower": 0.0, "upper": 1.0}  # no point to judge: neither
        if not np.isfinite(found.approx[j]) and np.isfinite(found.fixed[j]):
            # only the centre moved: the fixed scale's worst case at the least point, exact
            value = float(found.fixed[j])
            row.update(distance=float(found.fixed_distance[j]), value=value, lower=value,
                       upper=value, max_log_scale_change=0.0)  # fmt: skip
        elif np.isfinite(found.approx[j]):
            judge = [(worst_case(delta, found.scale0[j], scale, float(found.p_lower[j])),
                      approx, delta, scale, distance)
                     for approx, delta, scale, distance in found.candidates(j)]  # fmt: skip
            below = [w for w in judge if w[0].upper < 0.5]  # the worst: refuted, else least
            worst, approx, delta, scale, distance = (min(below, key=lambda w: w[0].upper)
                                                     if below else
                                                     min(judge, key=lambda w: w[0].lower))  # fmt: skip
            change = np.abs(np.log(scale) - np.log(found.scale0[j])).max()
            row.update(distance=distance, value=worst.value, lower=worst.lower,
                       upper=worst.upper, max_log_scale_change=float(change),
                       normal_approximation=approx)  # fmt: skip
            if found.moved[j] > SCALE_SLACK:
                row["mean_shift"] = float(np.linalg.norm(delta))
        if found.moved[j] > SCALE_SLACK:
            row["centre_deviation"] = float(found.moved[j])
        judged.append(row)
    evidence["worst_case"] = {"judged": judged}
    law = ("the Neyman–Pearson worst case of the two anisotropic Gaussians, a generalized χ² "
           "computed by inverting its characteristic function (Imhof 1961) with a numerical "
           "error bound")  # fmt: skip
    below = [r for r in judged if r["upper"] < 0.5]
    if below:
        r = below[0]
        return CheckResult(
            name, Verdict.UNJUSTIFIED,
            f"{len(below)}/{len(balls)} balls where the scale (or the centre) varies have no valid proof, e.g. "
            f"input {r['input_id']}: at a point at distance {r['distance']:.6g} from x0, where "
            f"the scale changes by up to e^{r['max_log_scale_change']:.4g}{_moved_by(r)}, a "
            f"classifier with the certificate's p_A_lower has P(A) <= {r['upper']:.10g} < 1/2 "
            f"({law})", evidence,
        )  # fmt: skip
    unshown = [r for r in judged if not r["lower"] >= 0.5]
    if unshown:
        r = unshown[0]
        return CheckResult(
            name, Verdict.ERROR,
            f"{len(unshown)}/{len(balls)} balls where the scale varies (declared "
            f"{declared.describe()}) could not be judged, e.g. input {r['input_id']}: the worst "
            f"case lies in [{r['lower']:.10g}, {r['upper']:.10g}], which its error bound "
            f"cannot place on either side of 1/2 ({law}); the row is not verified", evidence,
        )  # fmt: skip
    least = min(r["lower"] for r in judged)
    return CheckResult(name, Verdict.SOUND,
                       f"all {len(evidence['inputs'])} audited balls covered: {len(judged)} where "
                       f"the scale varies by a worst case >= {least:.10g} >= 1/2 ({law}), the "
                       f"others at a fixed scale (ANCER Thm 1)", evidence)  # fmt: skip


def scale_deviation(
    provider, x0: torch.Tensor, radius: torch.Tensor, scale0: torch.Tensor, steps: int,
    gen: torch.Generator, batch: int, see=None,
) -> tuple[np.ndarray, np.ndarray, bool]:  # fmt: skip
    """The largest max_i |log σ_i(x1) − log scale0_i| found in each ball B(x0_k, R_k) (x0
    included), the axis it was found on, and whether σ answered with a gradient: random points at R, R/2 and R/4 and both ends of
    the smallest axis of ``scale0`` at R (the fixed scale's worst points) in one query,
    then (σ differentiable) two projected ascents, of max_i ±(log σ_i − log scale0_i), in
    steps of R/4, every ball in lock-step (``steps`` − 1 queries), all inside the ball
    after rounding (:func:`~harness.audit.ball_rounding.inside_radius`). ``see(points,
    scales, balls)``, when given, is shown every point asked, its scale and its ball."""
    flat = x0.flatten(1)
    count = len(flat)
    radius = inside_radius(flat, radius)
    log0 = torch.log(scale0.double())
    points = [flat]
    for fraction in (1.0, 0.5, 0.25):
        for _ in range(4):
            d = torch.randn(flat.shape, generator=gen, dtype=flat.dtype).to(flat.device)
            points.append(flat + d * (fraction * radius / d.norm(dim=1))[:, None])
    smallest = torch.zeros_like(flat).scatter_(1, scale0.argmin(dim=1, keepdim=True), 1.0)
    points += [flat + sign * radius[:, None] * smallest for sign in (1.0, -1.0)]  # ANCER's worst
    _, sigma, differentiable = sigma_with_graph(provider, torch.cat(points).view(-1, *x0.shape[1:]),
                                                batch)  # fmt: skip
    if see is not None:
        see(torch.cat(points), sigma, np.tile(np.arange(count), len(points)))
    found = (torch.log(sigma.detach().double()) - log0.repeat(len(points), 1)).abs()
    best, axis = found.view(len(points), count, -1).amax(dim=0).max(dim=1)
    if differentiable and steps > 1:
        sign = torch.tensor([1.0, -1.0], device=flat.device).repeat_interleave(count)[:, None]
        centre, reach, ref = flat.repeat(2, 1), radius.repeat(2), log0.repeat(2, 1)
        start = torch.randn(centre.shape, generator=gen).to(flat.device)
        x1 = centre + start * (reach / 2 / start.norm(dim=1).clamp_min(1e-12))[:, None]
        for _ in range(steps - 1):
            x1 = x1.detach().requires_grad_(True)
            with torch.enable_grad():
                s = sigma_in_calls(provider, x1.view(-1, *x0.shape[1:]), batch)
                if not s.requires_grad:
                    break
                change = torch.log(s.double()) - ref
                (grad,) = torch.autograd.grad((sign * change).amax(dim=1).sum(), x1,
                                              allow_unused=True)  # fmt: skip
            if see is not None:
                see(x1, s, np.tile(np.arange(count), 2))
            gap, where = change.detach().abs().view(2, count, -1).amax(dim=0).max(dim=1)
            better = gap > best
            best, axis = torch.where(better, gap, best), torch.where(better, where, axis)
            if grad is None:
                break
            with torch.no_grad():
                g = grad / grad.norm(dim=1, keepdim=True).clamp_min(1e-12)
                delta = x1 + sign * (reach / 4)[:, None] * g - centre
                delta *= (reach / delta.norm(dim=1).clamp_min(1e-12)).clamp(max=1.0)[:, None]
                x1 = centre + delta
    return best.cpu().numpy(), axis.cpu().numpy(), differentiable


def ellipsoid_deviation(
    provider, x0: torch.Tensor, axes: list[np.ndarray | None], scale0: np.ndarray,
    gen: torch.Generator, batch: int, see=None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """As :func:`scale_deviation`, in the claimed ellipsoids {x0_k + δ : ‖δ/a_k‖₂ < 1}
    (semi-axes ``axes[k]`` = κ·σ_i, None where none is claimed: 0 there): random
    directions carried to 1, 1/2 and 1/4 of the ellipsoid's extent along them and both
    ends of its two longest axes, just inside (a point float32 rounds out is dropped), in
    one query (no ascent: the ball's search already climbs where σ grows)."""
    flat = x0.flatten(1)
    points, balls = [], []
    for k, a in enumerate(axes):
        if a is None:
            continue
        semi = torch.from_numpy(np.asarray(a, dtype=np.float64))
        for fraction in (1.0, 0.5, 0.25):
            for _ in range(4):
                u = torch.randn(len(semi), generator=gen, dtype=torch.float64)
                points.append(semi * u * ((1 - 1e-6) * fraction / u.norm()))
        for i in torch.argsort(semi, descending=True)[:2]:
            for sign in (1.0, -1.0):
                along = torch.zeros_like(semi)
                along[i] = sign * (1 - 1e-6) * semi[i]
                points.append(along)
        balls += [k] * (len(points) - len(balls))
    owners = np.array(balls)
    centres = flat.double()[torch.from_numpy(owners).to(flat.device)]
    asked = (centres + torch.stack(points).to(flat.device)).float()
    semi = torch.from_numpy(np.stack([axes[k] for k in owners])).to(flat.device)
    inside = (((asked.double() - centres) / semi).norm(dim=1) < 1).cpu().numpy()
    asked, owners = asked[torch.from_numpy(inside).to(flat.device)], owners[inside]  # rounded out
    best, axis = np.zeros(len(axes)), np.zeros(len(axes), dtype=np.int64)
    if not len(owners):
        return best, axis
    with torch.no_grad():
        sigma = sigma_in_calls(provider, asked.view(-1, *x0.shape[1:]), batch)
    if see is not None:
        see(asked, sigma, owners)
    found = (torch.log(sigma.double().cpu()) - torch.log(torch.from_numpy(scale0)[owners])).abs()
    gap, where = found.max(dim=1)
    for row in np.argsort(gap.numpy(), kind="stable"):  # the largest last, so it stays
        best[owners[row]], axis[owners[row]] = float(gap[row]), int(where[row])
    return best, axis


def _recorded(certs, chosen: list[int], read, dim: int) -> tuple[np.ndarray | None, list]:
    """What ``read`` finds in the draws of the ``chosen`` certificates, as float64 [B, d];
    or (None, the input ids of those that record none of ``dim`` entries)."""
    values = [read(certs[k].get("draws")) for k in chosen]
    missing = [certs[k]["input_id"] for k, v in zip(chosen, values, strict=True)
               if v is None or v.size != dim]  # fmt: skip
    return (None, missing) if missing else (np.stack(values).astype(np.float64), [])


def _moved_by(row: dict) -> str:
    """How far the noise's mean moved at a judged point, for a summary ("" where the
    centre did not move)."""
    if "centre_deviation" not in row:
        return ""
    shift = f" by {row['mean_shift']:.6g}" if "mean_shift" in row else ""
    return (f" and the noise's mean moves{shift} (its centre by up to "
            f"{row['centre_deviation']:.4g} of its largest entry)")  # fmt: skip


def _moved(found: Candidates, j: int) -> str:
    """How a ball's noise centre moved, for a summary ("" where it did not)."""
    if not found.moved[j] > SCALE_SLACK:
        return ""
    return (f", the noise's mean moved by δ + μ(x1) − μ(x0): the centre changes by up to "
            f"{found.moved[j]:.4g} of its largest entry")  # fmt: skip


def _checked(audit: Audit, dim: int):
    """The σ-provider as a scale [B, d]: its values checked to be in range (a bad scale is
    the provider's fault), one σ per input taken as that σ on every axis."""

    def scale(x: torch.Tensor) -> torch.Tensor:
        s = audit.sigma_provider(x)
        checked_sigma(s.detach(), len(x), audit.method.sigma_provider,
                      " inside a certified ball", dims=dim)  # fmt: skip
        return s.reshape(len(x), -1).expand(len(x), dim)

    return scale
