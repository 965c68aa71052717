"""Empirical robust accuracy: what a PGD attack on the smoothed classifier breaks.

Beside what each row certifies, a board shows, at each of the benchmark's radii r, the
fraction of test inputs that the smoothed classifier answers right (PREDICT, as clean
accuracy counts them) and an attack did not break: an input misclassified or abstained on
is robust at no radius (:func:`harness.mathematics.accuracy.empirical_successes`), so
empirical accuracy is at most clean accuracy. An input is broken at r when the
attack found a point x' with ‖x' − x‖ <= r at which the smoothed classifier — with the
method's own σ(x') — is confirmed by fresh Monte Carlo not to answer the label: the
upper confidence bound on the label's probability (Clopper–Pearson; Hoeffding on the
mean output for soft smoothing) lies below the lower bound of another class
(:func:`harness.audit.ball_attacks.confirm_other_class`, as check S4 confirms its
counterexamples), each bound at level α / (inputs · radii · classes), so that with
probability >= 1 − α every break is real. The empirical robust accuracy is therefore an
upper bound on the smoothed classifier's robust accuracy, not a certificate: a stronger
attack can only lower it, and certified accuracy should lie below it (a row whose
empirical accuracy falls below its certified accuracy has certificates an attack broke).

The attack (:data:`STRENGTHS`, per check budget): at radius 0 the input itself; then for
each radius r > 0 in increasing order, on the inputs not broken yet, ``steps`` steps of
ℓ2 PGD (:func:`harness.audit.ball_attacks.pgd_on_smoothed`) on the mean softmax
over ``samples`` noise draws with σ held at σ(x) (the σ the input was certified with;
σ(x') is recomputed only to confirm), projected on the ball of radius r, continuing from
the last point of the previous radius (one start, no random restarts). A point whose
estimated label probability is not the largest (``samples`` draws) is a candidate and is
confirmed with ``confirm`` fresh samples in noise stream :data:`STREAM_ATTACK`.

A row drawn at a diagonal scale (:mod:`harness.engine.scale`) is attacked the same way
with anisotropic noise x' + σ_i·ε_i: PGD and the screening draw at the scale each input
was certified with (recorded in its draws), and every break is confirmed at the scale
the σ-provider answers at x' (one σ call per radius, as for one σ), so a confirmed break
is one of the smoothed classifier the row certifies; the radii attacked are ℓ2. Around a
noise centre (:mod:`harness.engine.centre`) PGD and the screening draw at x' + μ(x), μ
held at the centre each input was certified with, and a break is confirmed at
x' + μ(x'), the centre the σ-provider answers there.

Memory rows (order-dependent certifiers): their answer at a point depends on the inputs
that came before (Súkeník et al. 2022, App. C.2), so no fixed classifier exists to
attack; the attack targets the classifier the memory certifies through, smoothing with
the method's σ(x) and no memory, the same one as the method's memory-free row.

Results are stored per (run, method, setting) in the ``attacks`` table by ``idrs-bench
check`` (and ``run``, unless ``--no-check``), read back with the run
(:class:`harness.store.storedrun.StoredAttack`) and exported with a board's run.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from harness.audit.audit import Audit

STREAM_ATTACK = 6
"""Noise stream of the fresh Monte Carlo estimates that confirm the attack's candidates."""


@dataclass(frozen=True)
class AttackStrength:
    """How hard the empirical attack searches."""

    steps: int  # PGD steps per radius (continuing from the previous radius's point)
    samples: int  # noise draws per PGD step and per candidate screening
    confirm: int  # fresh Monte Carlo samples that confirm a candidate
    screen: int  # noise draws that estimate the label's margin at a PGD point
    margin: float  # a point is a candidate when the label trails another class by more
    restarts: int = 1  # starts per input: the input itself

    def statement(self) -> str:
        return (
            f"PGD on the smoothed classifier, {self.steps} steps per radius of {self.samples} "
            f"noise samples each, {self.restarts} start per input, every break confirmed with "
            f"{self.confirm:,} fresh Monte Carlo samples: an upper bound on robust accuracy, "
            "not a certificate"
        )


STRENGTHS = {
    "small": AttackStrength(steps=4, samples=8, confirm=256, screen=32, margin=0.3),
    "full": AttackStrength(steps=20, samples=32, confirm=2048, screen=128, margin=0.1),
}
"""The attack of each check budget (``small``: what ``idrs-bench run`` does)."""


def classifier_key(audit: Audit) -> str:
    """What determines the attacked classifier: σ-provider, its parameters, smoothing.

    Two rows with the same key are attacked once."""
    import json

    params = json.dumps(dict(audit.params), sort_keys=True, default=str)
    return f"{audit.method.sigma_provider}|{params}|{audit.certifier.smoothing}"


def attack_row(audit: Audit, strength: AttackStrength) -> dict[str, Any]:
    """The empirical attack on one row: which inputs break at which radius, and how.

    Radii in increasing order; at each, the inputs not broken yet are attacked (PGD from
    their point at the previous radius); a point whose screening says the label trails
    another class by more than ``strength.margin`` is a candidate, and the radius's
    candidates are confirmed at σ(x') in one σ-provider call and one batch of fresh
    samples. An input whose candidate is not confirmed stays in the attack. Each bound
    is at level α / (inputs · radii · classes) (a union over every confirmation the
    attack could make).

    Returns the stored result: ``radii`` (attacked, sorted), ``inputs``, ``broken``
    (input id -> the radius at which it broke), ``level`` (of each confirmation bound),
    ``strength``, ``entropy`` (of the audit, which seeds the PGD noise), ``candidates``
    (points confirmed or not), ``examples`` (a few confirmed points), ``seconds`` and,
    for memory rows, ``classifier`` (what was attacked).
    """
    import torch

    from harness.audit.ball_attacks import confirm_other_class, pgd_on_smoothed
    from harness.audit.scaled_regions import held_scales
    from harness.audit.sigma_calls import centre_asker
    from harness.engine.centre import recorded_centre, shifted

    start_time = time.perf_counter()
    certs = audit.certificates
    engine = audit.context.engine
    device = audit.context.device
    soft = audit.certifier.smoothing == "soft"
    radii = sorted({float(r) for r in audit.radii} | {0.0})
    ids = [int(c["input_id"]) for c in certs]
    labels = torch.tensor([int(c["label"]) for c in certs], device=device)
    x = audit.inputs.to(device, torch.float32)
    scales = held_scales(certs)  # a diagonal scale: the one each input was drawn at
    sigma0 = (torch.tensor([float(c["sigma"]) for c in certs], device=device) if scales is None
              else scales.to(device))  # fmt: skip
    centre = centre_asker(audit, " at a point the empirical attack reached")
    centre0 = None  # μ(x) as certified (None: the noise is centred at x)
    if centre is not None:
        held = [recorded_centre(c.get("draws")) for c in certs]
        centre0 = torch.stack([torch.zeros(x[0].numel()) if h is None else torch.from_numpy(h)
                               for h in held]).to(device, torch.float32).view_as(x)  # fmt: skip
    level = audit.context.protocol.alpha / (len(certs) * len(radii) * engine.num_classes)
    gen = audit.generator("empirical/pgd")  # the audit's own entropy: unforeseeable noise
    broken: dict[int, float] = {}
    examples: list[dict[str, Any]] = []
    tried = 0
    current = x.clone()
    for radius in radii:
        alive = torch.tensor([k for k in range(len(certs)) if ids[k] not in broken],
                             dtype=torch.long, device=device)  # fmt: skip
        if not len(alive):
            break
        if radius > 0:
            fixed = sigma0[alive]
            current[alive] = pgd_on_smoothed(
                engine.model, x[alive], labels[alive],
                torch.full((len(alive),), radius, dtype=fixed.dtype, device=device),
                lambda _, fixed=fixed: fixed, strength.steps, strength.samples, gen,
                start=current[alive],
                centre_at=None if centre0 is None else lambda _, held=centre0[alive]: held,
            )  # fmt: skip
        at = current[alive] if centre0 is None else current[alive] + centre0[alive]
        margin = _label_margin(engine.model, at, labels[alive], sigma0[alive], strength.screen,
                               gen, soft)  # fmt: skip
        chosen = alive[margin < -strength.margin]
        if not len(chosen):
            continue
        tried += len(chosen)
        points = current[chosen]
        sigma = audit.sigma(points, " at a point the empirical attack reached")
        drawn_at = points if centre is None else shifted(points, centre(points))
        verdicts = confirm_other_class(
            engine, drawn_at, sigma.double().cpu(), [ids[k] for k in chosen.tolist()],
            labels[chosen].tolist(), strength.confirm, level, soft, STREAM_ATTACK,
        )  # fmt: skip
        for j, (k, hit) in enumerate(zip(chosen.tolist(), verdicts, strict=True)):
            if hit is None:
                continue
            broken[ids[k]] = radius
            if len(examples) < 3:
                distance = float((points[j] - x[k]).flatten().norm())
                examples.append({"input_id": ids[k], "radius": radius, "distance": distance,
                                 "label": int(labels[k]), **_sigma_at(sigma[j]), **hit})  # fmt: skip
    out: dict[str, Any] = {
        "radii": radii,
        "inputs": len(certs),
        "broken": {str(i): r for i, r in sorted(broken.items())},
        "level": level,
        "strength": asdict(strength),
        "entropy": f"{audit.entropy:032x}",
        "candidates": tried,
        "examples": examples,
        "seconds": time.perf_counter() - start_time,
    }
    if audit.certifier.order_dependent:
        out["classifier"] = "the σ(x)-smoothed classifier without the memory"
    return out


def _label_margin(model, points, labels, sigma, samples: int, gen, soft: bool) -> torch.Tensor:
    """p_label − max_{c ≠ label} p_c at each point, estimated from ``samples`` draws at σ:
    of the votes argmax f (hard smoothing) or of the mean softmax (soft); negative: the
    label is not the smoothed prediction there, by this estimate."""
    import torch

    from harness.audit.ball_attacks import noise_scale

    with torch.no_grad():
        eps = torch.randn((samples, *points.shape), generator=gen).to(points.device)
        noisy = (points[None] + noise_scale(sigma, points) * eps).reshape(-1, *points.shape[1:])
        logits = model(noisy)
        if soft:
            outputs = torch.softmax(logits, dim=-1)
        else:
            outputs = torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
        probs = outputs.view(samples, len(points), -1).mean(0)
    own = probs.gather(1, labels[:, None]).squeeze(1)
    other = probs.scatter(1, labels[:, None], -1.0).max(dim=1).values
    return own - other


def _sigma_at(sigma: torch.Tensor) -> dict[str, float]:
    """σ(x') of a confirmed break as evidence: the value, or a diagonal scale's smallest
    and largest axes."""
    if sigma.dim() == 0:
        return {"sigma_at_point": float(sigma)}
    return {"sigma_at_point": float(sigma.min()), "scale_max_at_point": float(sigma.max())}
