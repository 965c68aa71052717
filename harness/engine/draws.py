"""What the harness draws for a certificate, and what a certifier may say about it.

The harness owns every sample a certificate rests on (harness/README.md, "Certifier
contract"). For each input it draws, on the run's keys (seed, stream, input id) of
the noise contract (:mod:`harness.engine.sampling`), the selection samples (n0, stream 0) and
the estimation samples (n, stream 1) of the base model at σ(x): class counts for hard
smoothing (Cohen et al. 2019, CERTIFY), mean softmax outputs for soft smoothing
(Bergstrom et al., Thm 3). A σ-provider that declares a :class:`SigmaSmoothing`
(σ(x) chosen by a smoothed classifier over noise levels, Sun et al. 2026) gets that
smoothing drawn too (streams 4 and 5). A certifier receives these as
:class:`Evidence` and answers one :class:`Claim` per input; the harness stores its own
:class:`Draws` beside each claim, so that check S0 re-derives every claim from samples
no plugin handed back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.engine.centre import decode_centre, encode_centre
from harness.engine.scale import decode_scale, encode_scale
from harness.foundation.certificate import ABSTAIN
from harness.mathematics.gridplace import GridPlaceRule
from harness.mathematics.rules import rule_from_record
from harness.mathematics.sequential import SequentialRule

if TYPE_CHECKING:
    import torch

HARD, SOFT = "hard", "soft"
STREAM_SIGMA_SELECTION = 4
"""Noise stream of a σ-smoothing's selection samples (they choose the σ level)."""
STREAM_SIGMA_ESTIMATION = 5
"""Noise stream of a σ-smoothing's estimation samples (they bound its top level)."""


@dataclass(frozen=True)
class Draws:
    """One smoothing's Monte Carlo evidence for a batch of B inputs, as the harness drew it.

    ``kind`` ``hard``: ``selection`` and ``estimation`` are class counts [B, C] (int64)
    over ``n0`` and ``n`` samples. ``soft``: they are the mean softmax outputs [B, C]
    (float64), and ``estimation_sq`` the mean of their squares. ``sigma`` [B] is the
    noise level each input was smoothed at. A σ-smoothing's draws also carry the σ
    ``levels`` its classes stand for and the ``alpha`` its bound spends.

    Drawn sequentially (hard only), they carry the ``rule``, the cumulative class counts
    ``looks`` [B, K, C] at the rule's looks and each input's last look ``stops`` [B]
    (counts after it are 0); ``estimation`` is then the last look's counts, and ``n`` the
    rule's cap n_max (an input's own n is its last look's, :meth:`samples`). Under the
    grid-place rule (:mod:`harness.mathematics.gridplace`) they also carry the grid
    ``thresholds`` [B, G] the rule tested at each input's σ.

    Drawn at a diagonal scale (:mod:`harness.engine.scale`), ``scale`` [B, d] (float32)
    holds it and ``sigma`` its smallest axis per input. Drawn around a centre
    (:mod:`harness.engine.centre`: the samples of x at x + μ(x)), ``centre`` [B, d]
    (float32) holds μ.
    """

    kind: str
    n0: int
    n: int
    sigma: np.ndarray
    selection: np.ndarray
    estimation: np.ndarray
    estimation_sq: np.ndarray | None = None
    levels: tuple[float, ...] | None = None
    alpha: float | None = None
    rule: SequentialRule | GridPlaceRule | None = None
    looks: np.ndarray | None = None
    stops: np.ndarray | None = None
    thresholds: np.ndarray | None = None
    scale: np.ndarray | None = None
    centre: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.sigma)

    def rows(self, index) -> Draws:
        """The draws of the inputs ``index`` (an index array or slice)."""
        sq = None if self.estimation_sq is None else self.estimation_sq[index]
        looks = None if self.looks is None else self.looks[index]
        stops = None if self.stops is None else self.stops[index]
        thresholds = None if self.thresholds is None else self.thresholds[index]
        scale = None if self.scale is None else self.scale[index]
        centre = None if self.centre is None else self.centre[index]
        return Draws(self.kind, self.n0, self.n, self.sigma[index], self.selection[index],
                     self.estimation[index], sq, self.levels, self.alpha, self.rule, looks,
                     stops, thresholds, scale, centre)  # fmt: skip

    @staticmethod
    def joined(parts: list[Draws]) -> Draws:
        """The draws of ``parts`` (of one kind and protocol) one after another."""
        first = parts[0]

        def stacked(name: str) -> np.ndarray | None:
            arrays = [getattr(p, name) for p in parts]
            return None if arrays[0] is None else np.concatenate(arrays)

        return Draws(first.kind, first.n0, first.n, stacked("sigma"), stacked("selection"),
                     stacked("estimation"), stacked("estimation_sq"), first.levels, first.alpha,
                     first.rule, stacked("looks"), stacked("stops"),
                     stacked("thresholds"), stacked("scale"), stacked("centre"))  # fmt: skip

    def samples(self) -> np.ndarray:
        """Estimation samples behind each input's evidence [B]."""
        if self.stops is None:
            return np.full(len(self), self.n, dtype=np.int64)
        return self.rule.looks[self.stops]

    def lower_bound(self, top: np.ndarray, alpha: float) -> np.ndarray:
        """The harness's lower confidence bound at level ``alpha`` on the probability of
        class ``top[i]`` of each input (hard draws): Clopper–Pearson of its estimation
        count, or, drawn sequentially, the rule's anytime-valid bound at the input's last
        look (:mod:`harness.mathematics.sequential`), or under the grid-place rule the
        threshold of the grid place it decided (:mod:`harness.mathematics.gridplace`). A
        certifier that takes its bound from here is certified under either sampling."""
        from harness.mathematics.stats import clopper_pearson_lower_array

        rows = np.arange(len(self))
        top = np.asarray(top, dtype=np.int64)
        if self.looks is None:
            return clopper_pearson_lower_array(self.estimation[rows, top],
                                               self.estimation.sum(axis=1), alpha)  # fmt: skip
        if isinstance(self.rule, GridPlaceRule):
            return self.rule.stopped_bounds(self.looks[rows, :, top], self.stops, self.thresholds,
                                            self.selection[rows, top], self.n0, alpha)  # fmt: skip
        bounds = self.rule.bounds(self.looks[rows, :, top], alpha)
        return bounds[rows, self.stops]

    def record(self, i: int) -> dict[str, Any]:
        """Input ``i``'s draws as a JSON-able dict (floats round-trip exactly)."""
        out: dict[str, Any] = {"kind": self.kind, "n0": self.n0, "n": int(self.samples()[i]),
                               "sigma": float(self.sigma[i]),
                               "selection": self.selection[i].tolist(),
                               "estimation": self.estimation[i].tolist()}  # fmt: skip
        if self.estimation_sq is not None:
            out["estimation_sq"] = self.estimation_sq[i].tolist()
        if self.levels is not None:
            out["levels"], out["alpha"] = [float(v) for v in self.levels], float(self.alpha)
        if self.looks is not None:
            sizes = self.rule.looks.tolist()
            out["rule"] = self.rule.record()
            out["looks"] = [{"n": sizes[k], "counts": self.looks[i, k].tolist()}
                            for k in range(int(self.stops[i]) + 1)]  # fmt: skip
        if self.thresholds is not None:
            out["thresholds"] = [float(t) for t in self.thresholds[i]]
        if self.scale is not None:
            out["scale"] = encode_scale(self.scale[i])
        if self.centre is not None:
            out["centre"] = encode_centre(self.centre[i])
        return out

    @staticmethod
    def from_records(records: list[Mapping[str, Any]]) -> Draws:
        """The draws of stored records (the inverse of :meth:`record`, one per input)."""
        kind = records[0]["kind"] if records else HARD
        dtype = np.int64 if kind == HARD else np.float64
        first = records[0] if records else {}
        sq = None
        if "estimation_sq" in first:
            sq = np.array([r["estimation_sq"] for r in records], dtype=np.float64)
        levels = tuple(first["levels"]) if "levels" in first else None
        selection = np.array([r["selection"] for r in records], dtype=dtype)
        estimation = np.array([r["estimation"] for r in records], dtype=dtype)
        rule = looks = stops = thresholds = None
        n = int(first.get("n", 0))
        if "thresholds" in first:
            thresholds = np.array([r["thresholds"] for r in records], dtype=np.float64)
        scale = np.stack([decode_scale(r["scale"]) for r in records]) if "scale" in first else None
        centre = None
        if "centre" in first:
            centre = np.stack([decode_centre(r["centre"]) for r in records])
        if "looks" in first:
            rule = rule_from_record(first["rule"])
            n = rule.n_max
            looks = np.zeros((len(records), len(rule.looks), selection.shape[1]), dtype=np.int64)
            stops = np.array([len(r["looks"]) - 1 for r in records], dtype=np.int64)
            for i, r in enumerate(records):
                looks[i, : len(r["looks"])] = [look["counts"] for look in r["looks"]]
        return Draws(kind, int(first.get("n0", 0)), n,
                     np.array([float(r["sigma"]) for r in records]), selection, estimation, sq,
                     levels, first.get("alpha"), rule, looks, stops, thresholds,
                     scale, centre)  # fmt: skip


@dataclass(frozen=True)
class SigmaSmoothing:
    """σ(x) chosen by a smoothed classifier over noise levels (Sun et al. 2026, dual RS).

    A σ-provider that has this as its ``smoothing`` attribute leaves σ to the harness:
    ``model`` maps inputs to logits over ``len(levels)`` classes; the harness smooths it
    with Gaussian noise of level ``noise`` (hard smoothing), draws n0 selection samples
    (stream 4) and n estimation samples (stream 5), and sets σ(x) = levels[ĉ] with ĉ the
    top class of the selection counts. With probability >= 1 − ``alpha`` ĉ is the
    smoothed classifier's class on the ball of Cohen's radius
    R_σ = noise·Φ⁻¹(p_lower) (p_lower the Clopper–Pearson bound at level ``alpha`` of ĉ's
    estimation count), so σ is constant there; the certifier's own bound gets the rest
    of the run's α (``Evidence.alpha``), and every certificate is capped at R_σ.

    ``architecture`` (a registered model name, e.g. ``"mlp"``) and ``architecture_params``
    say how to rebuild ``model`` from its state dict: the harness saves that state dict
    with the run (a file with its SHA-256, :mod:`harness.running.runfiles`), and the replay check
    redraws the σ draws in a process that loads no third-party plugin, so the
    architecture must be a built-in one. A σ-smoothing without it cannot be replayed
    (the replay check then does not complete, and the row is not verified).
    """

    model: Any
    noise: float
    levels: tuple[float, ...]
    alpha: float
    architecture: str | None = None
    architecture_params: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Evidence:
    """What a certifier receives for a batch of inputs: the inputs and the harness's draws.

    ``base`` is the base model smoothed at σ(x) (``sigma``), of the certifier's declared
    ``smoothing`` kind; ``sigma_draws`` the σ-smoothing's draws when the σ-provider
    declares one (else None). ``alpha`` is the level the certifier's bound must hold at:
    the run's α, less what the σ-smoothing spends. ``scale`` [B, d] (float32): the
    diagonal scale the base model was smoothed at (:mod:`harness.engine.scale`; ``sigma``
    is then its smallest axis), None for one σ per input; only a certifier that declares
    ``diagonal_scale = True`` is given one.
    """

    input_ids: tuple[int, ...]
    x: torch.Tensor
    sigma: np.ndarray
    alpha: float
    base: Draws
    sigma_draws: Draws | None = None

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def scale(self) -> np.ndarray | None:
        """The diagonal scale [B, d] of the base draws, or None (one σ per input)."""
        return self.base.scale

    @property
    def centre(self) -> np.ndarray | None:
        """The centre μ(x) [B, d] the base draws were made around, or None (at x)."""
        return self.base.centre

    def lower_bound(self, top: np.ndarray) -> np.ndarray:
        """The harness's lower bound on p of class ``top[i]`` of the base model's hard
        draws at this evidence's α (:meth:`Draws.lower_bound`)."""
        return self.base.lower_bound(top, self.alpha)

    @classmethod
    def from_counts(
        cls, selection, estimation, sigma, alpha: float, input_ids=None, x=None
    ) -> Evidence:
        """Hard-smoothing evidence from class counts [B, C] (e.g. to test a certifier's
        claims on given counts); n0 and n are the counts' row sums."""
        selection = np.atleast_2d(np.asarray(selection, dtype=np.int64))
        estimation = np.atleast_2d(np.asarray(estimation, dtype=np.int64))
        return cls._of(HARD, selection, estimation, None, int(selection[0].sum()),
                       int(estimation[0].sum()), sigma, alpha, input_ids, x)  # fmt: skip

    @classmethod
    def from_means(
        cls, selection, estimation, sigma, alpha: float, n0: int, n: int, input_ids=None, x=None
    ) -> Evidence:
        """Soft-smoothing evidence from mean softmax outputs [B, C] over n0 and n samples."""
        selection = np.atleast_2d(np.asarray(selection, dtype=np.float64))
        estimation = np.atleast_2d(np.asarray(estimation, dtype=np.float64))
        return cls._of(SOFT, selection, estimation, estimation**2, n0, n, sigma, alpha,
                       input_ids, x)  # fmt: skip

    @classmethod
    def _of(cls, kind, selection, estimation, squares, n0, n, sigma, alpha, input_ids, x):
        import torch

        count = len(selection)
        sigma = np.broadcast_to(np.asarray(sigma, dtype=np.float64), (count,)).copy()
        ids = tuple(range(count)) if input_ids is None else tuple(int(i) for i in input_ids)
        x = torch.zeros(count, 1) if x is None else x
        base = Draws(kind, n0, n, sigma, selection, estimation, squares)
        return cls(ids, x, sigma, float(alpha), base)


@dataclass(frozen=True)
class Claim:
    """A certifier's answer for one input: CERTIFY's class (``ABSTAIN`` = -1) with
    certified ℓ2 ``radius``, the lower confidence bound ``p_lower`` it rests on, PREDICT's
    answer ``predict``, and what the certifier derived (``evidence``: e.g. a memory's
    actions). Never samples: the harness records those itself.

    ``ellipsoid`` (evidence drawn at a diagonal scale only): κ of the anisotropic region
    the claim certifies, {δ : ‖Σ^{-1/2}δ‖₂ <= κ} with Σ = diag(scale²), semi-axes κ·σ_i
    (Eiras et al., ANCER, TMLR 2022, Thm 1: κ = Φ⁻¹(p_A_lower)); the harness records the
    region with its proxy radius (:func:`harness.engine.scale.ellipsoid_region`) beside,
    never as, the ℓ2 ``radius``."""

    prediction: int
    radius: float
    p_lower: float
    predict: int = ABSTAIN
    evidence: Mapping[str, Any] = field(default_factory=dict)
    ellipsoid: float | None = None
