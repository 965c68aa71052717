"""CERTIFY the harness's way: the harness draws every sample, a certifier only claims.

For a batch of inputs (harness/README.md, "Certifier contract"):

1. σ(x): the σ-provider's answer, checked to lie in (0, SIGMA_MAX] (one σ per input, or
   a diagonal scale per input dimension: :mod:`harness.certification.diagonal`); or, for a
   provider that declares a :class:`~harness.engine.draws.SigmaSmoothing`, the harness
   draws that smoothed σ choice itself (Sun et al. 2026) and sets σ(x) = levels[ĉ_σ].
2. The harness draws n0 selection samples (stream 0) and n estimation samples
   (stream 1) of the base model at σ(x), on the run's keys (seed, stream, input id):
   class counts for a ``hard`` certifier, mean softmax outputs for a ``soft`` one.
3. The certifier gets them as :class:`~harness.engine.draws.Evidence` and returns one
   :class:`~harness.engine.draws.Claim` per input: prediction, bound, radius, PREDICT.
4. The harness checks each claim against the contract (a certifier that hands back
   samples, counts or n is a :class:`~harness.foundation.errors.ContractError` naming it) and
   stores its own draws beside it; S0 re-derives every claim from those draws.

:class:`HardSmoothingCertifier` is CERTIFY's claim (Cohen et al. 2019, §3.2): ĉ_A from
the selection counts, p_A_lower from the estimation counts; a subclass supplies the
radius formula.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from harness.certification.diagonal import (
    check_centred,
    check_diagonal,
    ellipsoid_problem,
    region_of,
)
from harness.certification.predict import draws_predictions
from harness.engine.centre import centre_of, shifted
from harness.engine.draws import (
    HARD,
    SOFT,
    STREAM_SIGMA_ESTIMATION,
    STREAM_SIGMA_SELECTION,
    Claim,
    Draws,
    Evidence,
    SigmaSmoothing,
)
from harness.engine.sampling import STREAM_ESTIMATION, STREAM_SELECTION, SamplingEngine
from harness.engine.scale import as_scale, smallest_axis
from harness.foundation.certificate import ABSTAIN, Certificate
from harness.foundation.errors import ContractError, IdrsError
from harness.foundation.protocol import SIGMA_MAX, CertificationProtocol
from harness.foundation.regularity import Regularity
from harness.foundation.storable import evidence_json
from harness.mathematics.radius import RadiusFormula, grid_thresholds

if TYPE_CHECKING:
    from harness.plugin.components import BuildContext, Certifier, MethodSpec, SigmaProvider

CLAIM_CHUNK = 8
"""Inputs per certifier call: claims are made (and stored) as the estimation finishes;
an order-dependent certifier (a memory) is called once per input."""

RESERVED_EVIDENCE = ("n", "n0", "draws", "sigma", "alpha", "samples")
"""Keys a claim's evidence may not use (nor any key starting with ``counts`` or
``means``): the harness records the samples itself."""


class HardSmoothingCertifier:
    """CERTIFY's claims from the harness's class counts (Cohen et al. 2019, §3.2).

    ĉ_A = argmax of the n0 selection counts, p_A_lower = the harness's lower bound of
    ĉ_A's estimation count at the evidence's α (:meth:`Evidence.lower_bound`:
    Clopper–Pearson, or the anytime-valid bound of sequential sampling); abstain when
    p_A_lower <= 1/2, else certify ĉ_A with :meth:`radius`. PREDICT (the two-sided
    binomial test of the top two estimation counts at level α) is answered beside it
    (under the grid-place rule its anytime-valid test at the stopping time,
    :func:`draws_predictions`).
    """

    smoothing = HARD
    order_dependent = False
    radius_formula: RadiusFormula  # set by each subclass: the formula its ``radius`` applies

    def radius(self, p_lower: np.ndarray, sigma: np.ndarray) -> np.ndarray:
        """Certified radius for lower bounds ``p_lower`` > 1/2 at σ(x0) = ``sigma``."""
        raise NotImplementedError

    def certify(self, evidence: Evidence) -> list[Claim]:
        """One claim per input; the radii of a batch are computed in one vectorized call
        (a radius such as Súkeník et al.'s Thm 3.2 costs far less per input batched)."""
        selection = evidence.base.selection
        rows = np.arange(len(evidence))
        top = np.argmax(selection, axis=1)
        p_lower = evidence.lower_bound(top)
        certified = p_lower > 0.5
        radii = np.zeros(len(evidence))
        if certified.any():
            radii[certified] = self.radius(p_lower[certified], evidence.sigma[certified])
        predicts = draws_predictions(evidence.base, evidence.alpha)
        return [
            Claim(
                prediction=int(top[i]) if certified[i] else ABSTAIN,
                radius=float(radii[i]) if certified[i] else 0.0,
                p_lower=float(p_lower[i]),
                predict=int(predicts[i]),
            )
            for i in rows
        ]


def checked_sigma(
    sigma: torch.Tensor, count: int, provider: str, where: str = "", dims: int | None = None
) -> torch.Tensor:
    """``sigma`` if it is a real floating tensor of shape (count,) (with ``dims``, the
    input's dimension, also a diagonal scale (count, dims) or (count, *input_shape):
    :mod:`harness.engine.scale`) and every value lies in (0, SIGMA_MAX], else raise an
    error that names the σ-provider and the offending value (not the base model)."""
    if not (isinstance(sigma, torch.Tensor) and sigma.dtype.is_floating_point):
        kind = sigma.dtype if isinstance(sigma, torch.Tensor) else type(sigma).__name__
        raise IdrsError(f"σ-provider {provider!r} returned σ of type {kind}{where}; a σ-provider "
                        "returns a real floating tensor of shape [B]")  # fmt: skip
    diagonal = dims is not None and sigma.dim() >= 2 and sigma[0].numel() == dims
    if sigma.shape != (count,) and not (diagonal and len(sigma) == count):
        scale = "" if dims is None else f" or a diagonal scale ({count}, {dims})"
        raise IdrsError(f"σ-provider {provider!r} returned shape {tuple(sigma.shape)}, "
                        f"expected ({count},){scale}")  # fmt: skip
    bad = ~(torch.isfinite(sigma) & (sigma > 0) & (sigma <= SIGMA_MAX))
    if bool(bad.any()):
        k, j = (int(v) for v in torch.nonzero(bad.reshape(len(bad), -1))[0])
        value = float(sigma.reshape(count, -1)[k, j])
        raise IdrsError(
            f"σ-provider {provider!r} returned σ = {value:.6g}{where} (entry {k}), out of "
            f"range (0, {SIGMA_MAX:g}]: σ must be positive and finite, and noise that large "
            "overflows float32 inputs; the σ-provider is at fault, not the base model"
        )
    return sigma


def sigma_smoothing(provider: SigmaProvider) -> SigmaSmoothing | None:
    """The :class:`SigmaSmoothing` a σ-provider declares (its ``smoothing``), or None."""
    smoothing = getattr(provider, "smoothing", None)
    if smoothing is not None and not isinstance(smoothing, SigmaSmoothing):
        raise ContractError(
            f"a σ-provider's `smoothing` must be a harness.SigmaSmoothing, got {smoothing!r}"
        )
    return smoothing


def check_sigma_smoothing(smoothing: SigmaSmoothing, alpha: float, provider: str) -> None:
    """Raise unless the σ-smoothing's noise and levels are positive and its α share lies
    strictly between 0 and the run's α (the certifier's bound needs the rest)."""
    levels = np.asarray(smoothing.levels, dtype=np.float64)
    if not (len(levels) >= 1 and np.all(np.isfinite(levels)) and np.all(levels > 0)):
        raise ContractError(
            f"σ-provider {provider!r} declares σ levels {smoothing.levels!r}: each must be "
            "positive and finite"
        )
    if not (math.isfinite(smoothing.noise) and smoothing.noise > 0):
        raise ContractError(
            f"σ-provider {provider!r} smooths its σ choice with noise {smoothing.noise!r}; it "
            "must be positive"
        )
    if not 0 < smoothing.alpha < alpha:
        raise ContractError(
            f"σ-provider {provider!r} spends α = {smoothing.alpha!r} on its σ choice; it must "
            f"lie in (0, {alpha:g}), the run's α, which the certifier's bound shares"
        )


def point_ids(x: torch.Tensor) -> list[int]:
    """Noise-key ids of points that are not test inputs (e.g. inside a certified ball):
    a 63-bit hash of each point's float32 bytes, so σ drawn at a point is a function of it."""
    import hashlib

    flat = x.detach().to("cpu", torch.float32).flatten(1).numpy()
    return [int.from_bytes(hashlib.sha256(row.tobytes()).digest()[:8], "little") >> 1
            for row in flat]  # fmt: skip


def sigma_of(
    context: BuildContext, provider: SigmaProvider, x: torch.Tensor,
    input_ids: Sequence[int] | None, provider_name: str, where: str = "",
) -> tuple[np.ndarray, Draws | None]:  # fmt: skip
    """σ(x) [B] (float64) and, for a provider with a σ-smoothing, the harness's draws of it.

    Without a σ-smoothing, σ is the provider's answer (checked); a provider that answers a
    diagonal scale gets it as [B, d] float32 (:func:`harness.engine.scale.as_scale`). With one, the harness
    draws n0 samples (stream 4) and n samples (stream 5) of the σ-estimator at the
    smoothing's noise level on the inputs' keys (``input_ids``; None: points that are
    not test inputs, keyed by :func:`point_ids`) and answers σ = levels[argmax of the
    selection counts] (:class:`~harness.engine.draws.SigmaSmoothing`).
    """
    smoothing = sigma_smoothing(provider)
    if smoothing is None:
        with torch.no_grad():
            sigma = checked_sigma(provider(x), len(x), provider_name, where, x[0].numel())
        if sigma.dim() > 1:  # a diagonal scale, held in float32 (harness.engine.scale)
            return as_scale(sigma.detach().to("cpu", torch.float32).numpy(), len(x)), None
        return sigma.double().cpu().numpy(), None
    protocol = context.protocol
    check_sigma_smoothing(smoothing, protocol.alpha, provider_name)
    from harness.engine.precision import prepare_model

    levels = np.asarray(smoothing.levels, dtype=np.float64)
    input_ids = point_ids(x) if input_ids is None else input_ids
    engine = SamplingEngine(
        prepare_model(smoothing.model, protocol), len(levels), context.device,
        context.engine.batch_size, context.seed, noise=context.engine.noise, pad_batches=True,
    )  # fmt: skip
    noise = np.full(len(x), float(smoothing.noise))
    selection = engine.counts(x, noise, input_ids, protocol.n0, STREAM_SIGMA_SELECTION)
    estimation = engine.counts(x, noise, input_ids, protocol.n, STREAM_SIGMA_ESTIMATION)
    sigma = levels[np.argmax(selection, axis=1)]
    return sigma, Draws(HARD, protocol.n0, protocol.n, noise, selection, estimation,
                        levels=tuple(smoothing.levels), alpha=float(smoothing.alpha))  # fmt: skip


def certify_inputs(
    context: BuildContext, method: MethodSpec, provider: SigmaProvider, certifier: Certifier,
    x: torch.Tensor, input_ids: Sequence[int],
) -> Iterator[Certificate]:  # fmt: skip
    """The certificates of ``x`` (ids ``input_ids``): σ, the harness's draws, the claims."""
    start = time.perf_counter()
    sigma, sigma_draws = sigma_of(context, provider, x, input_ids, method.sigma_provider)
    centre = centre_of(provider, x, method.sigma_provider)
    seconds = (time.perf_counter() - start) / max(len(input_ids), 1)
    yield from certify_drawn(context.engine, context.protocol, certifier, x, input_ids, sigma,
                             sigma_draws, seconds, certifier_label(context, method),
                             provider.regularity, centre)  # fmt: skip


def certifier_label(context: BuildContext, method: MethodSpec) -> str:
    """``certifier 'NAME' (plugin 'PLUGIN' of DISTRIBUTION)``, how contract errors name a
    certifier (its distribution where the registry knows it)."""
    if context.registry is None:
        return f"certifier {method.certifier!r} (plugin '?')"
    origin = context.registry.provenance("certifiers", method.certifier)
    of = f" of {origin['distribution']}" if origin["distribution"] else ""
    return f"certifier {method.certifier!r} (plugin {origin['plugin']!r}{of})"


def certify_drawn(
    engine: SamplingEngine, protocol: CertificationProtocol, certifier: Certifier,
    x: torch.Tensor, input_ids: Sequence[int], sigma: np.ndarray,
    sigma_draws: Draws | None = None, sigma_seconds: float | np.ndarray = 0.0,
    label: str = "the certifier", regularity: Regularity | None = None,
    centre: np.ndarray | None = None,
) -> Iterator[Certificate]:  # fmt: skip
    """Certificates for inputs whose σ is known: the harness draws the base model's
    samples at σ (around x + ``centre`` where the σ-provider answers one,
    :mod:`harness.engine.centre`) with ``engine`` under ``protocol``, every input in the
    same engine calls (a batch mixes inputs:
    :meth:`~harness.engine.sampling.SamplingEngine.run`), the
    certifier claims in chunks of :data:`CLAIM_CHUNK` inputs as their estimation finishes,
    and each certificate is yielded as soon as it is claimed. ``sigma_seconds``: the time
    σ took per input (one value, or one per input); ``label`` names the certifier in
    contract errors.
    Under sequential sampling the estimation samples are drawn in rounds
    (:func:`harness.certification.rounds.draw_in_rounds`), to the grid place of the
    certifier's declared formula with the σ-provider's declared ``regularity``."""
    kind = certifier.smoothing
    if kind not in (HARD, SOFT):
        raise ContractError(f"{label} declares smoothing = {kind!r}; use 'hard' or 'soft'")
    alpha = protocol.alpha - (0.0 if sigma_draws is None else sigma_draws.alpha)
    ids = [int(i) for i in input_ids]
    scale = as_scale(sigma, len(ids))  # a diagonal scale [B, d]: σ is its smallest axis
    if scale is not None:
        check_diagonal(certifier, label)
        sigma = smallest_axis(scale)
    noise = sigma if scale is None else scale
    if centre is not None:
        check_centred(certifier, label, scale is not None)
    x = x.to(engine.device)
    drawn_at = x if centre is None else shifted(x, centre)
    start = time.perf_counter()
    soft = kind == SOFT
    if soft:
        selection = np.stack([s.means for s in engine.soft_stats(
            drawn_at, noise, ids, protocol.n0, STREAM_SELECTION)]) if ids else np.zeros((0, 0))  # fmt: skip
    else:
        selection = engine.counts(drawn_at, noise, ids, protocol.n0, STREAM_SELECTION)
    seconds = np.full(len(ids), (time.perf_counter() - start) / max(len(ids), 1)) + sigma_seconds
    # an order-dependent certifier stages state per claim: one input per call keeps each
    # certificate and its state in one transaction (harness.foundation.runstate)
    chunk_size = 1 if certifier.order_dependent else CLAIM_CHUNK
    if protocol.sampling == "sequential":
        yield from _certify_in_rounds(engine, protocol, certifier, x, ids, sigma, selection,
                                      seconds, sigma_draws, alpha, label, regularity, chunk_size,
                                      scale, centre)  # fmt: skip
        return
    estimation = np.zeros(selection.shape, dtype=np.float64 if soft else np.int64)
    squares = np.zeros(selection.shape) if soft else None
    last = time.perf_counter()
    done = 0
    for index, result in engine.run(drawn_at, noise, ids, protocol.n, STREAM_ESTIMATION,
                                    soft=soft):  # fmt: skip
        if soft:
            estimation[index], squares[index] = result.means, result.sums_sq / result.num
        else:
            estimation[index] = result
        now = time.perf_counter()
        seconds[index] += now - last
        last = now
        if index + 1 - done == chunk_size or index + 1 == len(ids):
            chunk = slice(done, index + 1)
            base = Draws(kind, protocol.n0, protocol.n, sigma[chunk], selection[chunk],
                         estimation[chunk], None if squares is None else squares[chunk],
                         scale=None if scale is None else scale[chunk],
                         centre=None if centre is None else centre[chunk])  # fmt: skip
            drawn = None if sigma_draws is None else sigma_draws.rows(chunk)
            evidence = Evidence(tuple(ids[chunk]), x[chunk], sigma[chunk], alpha, base, drawn)
            claims = checked_claims(certifier.certify(evidence), len(evidence), label,
                                    engine.num_classes, scale is not None)  # fmt: skip
            share = (time.perf_counter() - last) / len(evidence)
            for k, claim in enumerate(claims):
                yield certificate(evidence, k, claim, protocol.alpha, seconds[done + k] + share)
            last = time.perf_counter()
            done = index + 1


def _certify_in_rounds(
    engine: SamplingEngine, protocol: CertificationProtocol, certifier: Certifier,
    x: torch.Tensor, ids: list[int], sigma: np.ndarray, selection: np.ndarray,
    seconds: np.ndarray, sigma_draws: Draws | None, alpha: float, label: str,
    regularity: Regularity | None, chunk_size: int, scale: np.ndarray | None = None,
    centre: np.ndarray | None = None,
) -> Iterator[Certificate]:  # fmt: skip
    """Sequential CERTIFY: the harness's rounds (:mod:`harness.certification.rounds`), then
    the certifier's claims on the inputs that stopped, checked against the harness's bound.
    At a diagonal ``scale`` the rounds draw at it and the grid is placed at its smallest
    axis ``sigma``, where the ℓ2 ball of the certificate lies; around a ``centre`` they
    draw at x + μ(x)."""
    from harness.certification.rounds import (
        check_bounds,
        draw_in_rounds,
        sequential_rule,
        unsupported,
    )

    why = unsupported(label, certifier, sigma_draws is not None)
    if why:
        raise IdrsError(why)
    rule = sequential_rule(protocol)
    dim = int(x[0].numel()) if len(ids) else 1
    thresholds = grid_thresholds(certifier.radius_formula, rule.radii, sigma, dim, regularity)
    for stopped in draw_in_rounds(engine, rule, shifted(x, centre), sigma, ids, selection,
                                  thresholds, alpha, protocol.n0, chunk_size,
                                  certifier.order_dependent, scale):  # fmt: skip
        index = stopped.index
        start = time.perf_counter()
        drawn = stopped.draws if centre is None else replace(stopped.draws, centre=centre[index])
        evidence = Evidence(tuple(ids[i] for i in index), x[index], sigma[index], alpha,
                            drawn)  # fmt: skip
        claims = checked_claims(certifier.certify(evidence), len(evidence), label,
                                engine.num_classes, scale is not None)  # fmt: skip
        check_bounds(claims, drawn, alpha, label)
        share = (time.perf_counter() - start) / len(evidence)
        for k, claim in enumerate(claims):
            total = seconds[index[k]] + stopped.seconds[k] + share
            yield certificate(evidence, k, claim, protocol.alpha, total)


def certificate(
    evidence: Evidence, k: int, claim: Claim, alpha: float, seconds: float
) -> Certificate:
    """The stored certificate of input ``k`` of ``evidence``: the certifier's claim and
    the harness's own draws (never the certifier's)."""
    base = evidence.base
    draws = {"base": base.record(k)}
    if evidence.sigma_draws is not None:
        draws["sigma"] = evidence.sigma_draws.record(k)
    hard = base.kind == HARD
    return Certificate(
        input_id=evidence.input_ids[k], prediction=int(claim.prediction),
        radius=float(claim.radius), p_lower=float(claim.p_lower),
        sigma=float(evidence.sigma[k]), alpha=alpha, predict=int(claim.predict),
        counts_selection=base.selection[k].tolist() if hard else None,
        counts_estimation=base.estimation[k].tolist() if hard else None,
        seconds=float(seconds), evidence=dict(claim.evidence), draws=draws,
        region=region_of(evidence, k, claim),
    )  # fmt: skip


def checked_claims(
    claims: Any, count: int, who: str, classes: int, scaled: bool = False
) -> list[Claim]:
    """``claims`` as a list of ``count`` :class:`Claim` objects, or a
    :class:`~harness.foundation.errors.ContractError` that names the certifier (``who``, with its
    plugin) and the contract: a certifier never returns samples, counts or n, only claims
    (an ``ellipsoid`` only on evidence drawn at a diagonal scale, ``scaled``)."""
    contract = ("the harness draws every sample and records the counts itself; a certifier "
                "returns one harness.Claim (prediction, radius, p_lower, predict, evidence) per "
                "input of the Evidence it is given (docs/plugins.md)")  # fmt: skip
    claims = list(claims)
    if len(claims) != count:
        raise ContractError(f"{who} returned {len(claims)} claims for {count} inputs; {contract}")
    for claim in claims:
        if not isinstance(claim, Claim):
            held = " with its own class counts" if isinstance(claim, Certificate) else ""
            raise ContractError(f"{who} returned a {type(claim).__name__}{held}; {contract}")
        reserved = [k for k in claim.evidence
                    if k in RESERVED_EVIDENCE or k.startswith(("counts", "means"))]  # fmt: skip
        if reserved:
            raise ContractError(f"{who} put {', '.join(map(repr, reserved))} in a claim's "
                                f"evidence; {contract}")  # fmt: skip
        prediction, radius, bound = claim.prediction, claim.radius, claim.p_lower
        for what, value in (("class", prediction), ("PREDICT class", claim.predict)):
            if not (isinstance(value, int | np.integer) and not isinstance(value, bool)
                    and ABSTAIN <= value < classes):  # fmt: skip
                raise ContractError(f"{who} claimed {what} {value!r:.40}; classes are "
                                    f"0..{classes - 1} and {ABSTAIN} abstains")  # fmt: skip
        if not (_real(radius) and math.isfinite(radius) and radius >= 0) or (
            prediction == ABSTAIN and radius
        ):
            raise ContractError(f"{who} claimed radius {radius!r:.40} with class {prediction}; a "
                                "radius is finite, >= 0, and 0 when abstaining")  # fmt: skip
        if not (_real(bound) and 0.0 <= bound <= 1.0):
            raise ContractError(f"{who} claimed a bound {bound!r:.40} outside [0, 1]")
        if (problem := ellipsoid_problem(claim, scaled)) is not None:
            raise ContractError(f"{who} {problem}")
        try:
            evidence_json(claim.evidence)
        except ValueError as exc:
            raise ContractError(f"{who} returned a claim whose evidence cannot be stored: "
                                f"{exc}") from None  # fmt: skip
    return claims


def _real(value: Any) -> bool:
    """Whether ``value`` is a real number (not a bool, a complex, a string)."""
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)
