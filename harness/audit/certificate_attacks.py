"""S4c (:mod:`harness.audit.counterexamples`): PGD on the smoothed classifier inside
certified regions, every candidate confirmed by fresh Monte Carlo.

An ℓ2 PGD attack (Salman et al. 2019, §3, on E[softmax]) inside each certified ball among
``budget.audited_inputs`` certificates drawn at random from the audit's entropy (as is the
attack's noise), along a path of ``budget.attack_steps`` points (the certified input, then
one per step; σ asked at each), σ(x1) recomputed by the method at the path's end x1, and
every candidate confirmed by a fresh Monte Carlo estimate (noise seeded from the audit's
entropy) whose Clopper–Pearson upper bound on the certified class is below another
class's lower bound. The confirmations err jointly with probability at most
:data:`CONFIRMATION_ERROR`, which is added to the attack's p-value (:func:`attack_pvalue`).
At a diagonal scale the noise is drawn at the scale σ answers at each point and a claimed
ellipsoid is attacked too; around a noise centre (:mod:`harness.engine.centre`) at
x1 + μ(x1).
"""

from __future__ import annotations

import numpy as np
import torch

from harness.audit import sigma_smoothing as smoothed
from harness.audit.analytic import point_keys
from harness.audit.audit import Audit
from harness.audit.ball_attacks import confirm_other_class, pgd_on_smoothed
from harness.audit.scaled_regions import ellipsoid_axes, whitened_norm
from harness.audit.sigma_calls import centre_asker
from harness.certification.certify import checked_sigma, sigma_smoothing
from harness.engine.centre import shifted
from harness.foundation.certificate import ABSTAIN
from harness.foundation.verdict import P_THRESHOLD
from harness.mathematics.stats import false_certificates_pvalue

NAME = "counterexamples"
"""The check the attack belongs to (its randomness is drawn under this name)."""


CONFIRMATION_ERROR = P_THRESHOLD / 100
"""Probability that some fresh Monte Carlo confirmation of an attack candidate is wrong
(its bounds hold jointly over every candidate and class with probability 1 − this); it
is added to the attack's p-value."""


def attack_pvalue(confirmed: int, audited: int, alpha: float) -> float:
    """P(at least ``confirmed`` confirmed violations among ``audited`` sound certificates)
    <= P(Binomial(audited, α) >= confirmed) + :data:`CONFIRMATION_ERROR`: a confirmed
    violation is a false certificate unless some confirmation erred."""
    if not confirmed:
        return 1.0
    return min(1.0, false_certificates_pvalue(confirmed, audited, alpha) + CONFIRMATION_ERROR)


def attack_certificates(audit: Audit) -> tuple[list[dict], int, list[int]]:
    """S4c: PGD inside the certified balls among ``audited_inputs`` certificates drawn at
    random from the audit's entropy (abstentions count as audited trials: the guarantee is
    per input asked about); the attack's noise and the confirmations' too.

    At a diagonal scale the smoothed classifier draws at the scale σ answers at each
    iterate, and a certificate that claims an ellipsoid is also attacked inside it (a
    path of its own in the same σ calls, :func:`pgd_on_smoothed` with its semi-axes); a
    certificate counts once, whichever of its regions is broken.

    Returns (confirmed violations, attacked, the audited input ids)."""
    budget, certs = audit.budget, audit.certificates
    picked = audit.subset(f"{NAME}/attack-inputs", len(certs), budget.audited_inputs).tolist()
    audited = [int(certs[k]["input_id"]) for k in picked]
    chosen = [k for k in picked if certs[k]["prediction"] != ABSTAIN and certs[k]["radius"] > 0]
    if not chosen:
        return [], 0, audited
    gen = audit.generator(f"{NAME}/attack")
    engine = audit.context.engine
    device, provider = audit.context.device, audit.sigma_provider
    smoothing = sigma_smoothing(provider)
    ellipsoids = [(k, a) for k in chosen if (a := ellipsoid_axes(certs[k])) is not None]
    rows = chosen + [k for k, _ in ellipsoids]  # a path per ball, then per ellipsoid
    x0 = audit.inputs[torch.tensor(rows)].to(device, torch.float32)
    radius = torch.tensor([certs[k]["radius"] for k in rows], device=device)
    target = torch.tensor([certs[k]["prediction"] for k in rows], device=device)
    axes = None
    if ellipsoids:
        balls = radius[: len(chosen), None].double().cpu().expand(-1, x0[0].numel())
        axes = torch.cat([balls, torch.from_numpy(np.stack([a for _, a in ellipsoids]))])

    known: dict[bytes, float | list[float]] = {}  # σ at the iterates asked
    differentiable = [True]  # until σ answers without a gradient

    def sigma_at(x1: torch.Tensor) -> torch.Tensor:
        if smoothing is not None:  # the certificate's own σ, meant to be constant in its ball
            return torch.tensor([certs[k]["sigma"] for k in rows], device=device)
        keys = point_keys(x1)
        new = [i for i, key in enumerate(keys) if key not in known]
        if differentiable[0] or len(new) == len(keys):  # (a gradient is asked again)
            return _sigma_of(x1, keys)
        if new:  # an iterate that did not move: its σ is known
            _sigma_of(x1[torch.tensor(new, device=device)], [keys[i] for i in new])
        return torch.tensor([known[key] for key in keys], dtype=torch.float64, device=device)

    def _sigma_of(x1: torch.Tensor, keys: list[bytes]) -> torch.Tensor:
        sigma = provider(x1)
        checked_sigma(sigma.detach(), len(x1), audit.method.sigma_provider,
                      " at a PGD point inside a certified ball", x1[0].numel())  # fmt: skip
        known.update(zip(keys, sigma.detach().double().cpu().tolist(), strict=True))
        differentiable[0] = sigma.requires_grad
        return sigma if sigma.requires_grad else sigma.detach()

    centre = centre_asker(audit, " at a PGD point inside a certified ball")

    def centre_at(x1: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(centre(x1)).to(x1.device, torch.float32)

    # a path of attack_steps points (as S2's and S3's ascents): σ asked at each, the last confirmed
    x1 = pgd_on_smoothed(engine.model, x0, target, radius, sigma_at, budget.attack_steps - 1,
                         budget.attack_samples, gen, axes=axes,
                         centre_at=None if centre is None else centre_at)  # fmt: skip
    engine = audit.fresh_engine(f"{NAME}/confirm")
    drawn_at = x1 if centre is None else shifted(x1, centre_at(x1))
    found = _confirm(audit, engine, x0, x1, rows, target, known, drawn_at)
    return _per_certificate(found, x0, x1, axes, len(chosen)), len(chosen), audited


def _per_certificate(found: list[dict], x0, x1, axes, balls: int) -> list[dict]:
    """The confirmed points one per certificate (its ball's first), those of the ellipsoid
    paths (rows from ``balls`` on) marked ``"region": "ellipsoid"``; a point that float32
    rounding put outside its region is not counted."""
    out, seen = [], set()
    for hit in sorted(found, key=lambda h: h["row"]):
        k = hit.pop("row")
        if axes is not None:
            norm = float(whitened_norm((x1[k] - x0[k])[None], axes[k][None])[0])
            if norm >= 1:
                continue
            if k >= balls:
                hit = {**hit, "region": "ellipsoid", "whitened_norm": norm}
        if hit["input_id"] not in seen:
            seen.add(hit["input_id"])
            out.append(hit)
    return out


def _confirm(
    audit, engine, x0, x1, chosen, target, known: dict[bytes, float], drawn_at=None
) -> list[dict]:  # fmt: skip
    """Fresh Monte Carlo at each candidate x1 (:func:`confirm_other_class`, noise seeded
    from the audit's entropy; drawn at ``drawn_at``, x1 + μ(x1) around a noise centre),
    jointly at level :data:`CONFIRMATION_ERROR` over all candidates, classes and σ (a
    union bound).

    σ at x1 is the method's; for a σ-smoothing, every level plausible at x1 by the
    harness's draws of its σ-estimator
    (:func:`harness.audit.sigma_smoothing.plausible_at`, which spends a share of the
    same error), and a candidate is confirmed only if another class wins at each. ``known``:
    σ already asked at some of the points (a last PGD step that did not move)."""
    certs, budget = audit.certificates, audit.budget
    num = 16 * budget.attack_samples
    ids = [certs[k]["input_id"] for k in chosen]
    smoothing = sigma_smoothing(audit.sigma_provider)
    if smoothing is None:
        keys = point_keys(x1)
        new = [i for i, key in enumerate(keys) if key not in known]
        if new:
            with torch.no_grad():
                asked = audit.sigma(x1[torch.tensor(new, device=x1.device)],
                                    " at a PGD point inside a certified ball")  # fmt: skip
            known.update(zip([keys[i] for i in new], asked.double().cpu().tolist(), strict=True))
        sigma = torch.tensor([known[key] for key in keys], dtype=torch.float64)
        candidates = [(sigma, np.ones(len(chosen), dtype=bool))]
        error = CONFIRMATION_ERROR
    else:
        levels, plausible = smoothed.plausible_at(audit, smoothing, x1, num, CONFIRMATION_ERROR / 2,
                                                  f"{NAME}/confirm-sigma")  # fmt: skip
        candidates = [(torch.full((len(chosen),), s, dtype=torch.float64), plausible[:, j])
                      for j, s in enumerate(levels)]  # fmt: skip
        error = CONFIRMATION_ERROR / 2
    level = error / (len(chosen) * engine.num_classes * len(candidates))  # union bound
    soft = audit.certifier.smoothing == "soft"
    weakest: list[dict | None] = [None] * len(chosen)  # per candidate, its weakest plausible σ
    confirmed = np.ones(len(chosen), dtype=bool)
    for sigma, applies in candidates:
        verdicts = confirm_other_class(engine, x1 if drawn_at is None else drawn_at, sigma, ids,
                                       target.tolist(), num, level, soft)  # fmt: skip
        for k, hit in enumerate(verdicts):
            if not applies[k]:
                continue
            if hit is None:
                confirmed[k] = False
                continue
            gap = hit["lower_bound_winning_class"] - hit["upper_bound_certified_class"]
            if weakest[k] is None or gap < weakest[k]["gap"]:
                weakest[k] = {"gap": gap, **_sigma_at_point(sigma[k]), **hit}
    found = []
    for k, t in enumerate(target.tolist()):
        if confirmed[k] and weakest[k] is not None:
            hit = {key: v for key, v in weakest[k].items() if key != "gap"}
            found.append({
                "row": k, "input_id": ids[k], "certified_class": t, "radius": certs[chosen[k]]["radius"],
                "distance": float((x1[k] - x0[k]).flatten().norm()), **hit, "samples": num,
                "level": level,
            })  # fmt: skip
    return found


def _sigma_at_point(sigma: torch.Tensor) -> dict[str, float]:
    """σ at a confirmed point as evidence: the value, or a diagonal scale's smallest and
    largest axes."""
    if sigma.dim() == 0:
        return {"sigma_at_point": float(sigma)}
    return {"sigma_at_point": float(sigma.min()), "scale_max_at_point": float(sigma.max())}
