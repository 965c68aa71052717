"""Rigged methods: what a plugin author who wants to top the board could write.

Each is a third-party plugin written against the public API (``from harness import ...``
only, like any plugin), one per class of cheat that the soundness checks must catch
(issue 22, item 6). Used by the detection-power command,

    python3 -m tests.rigged_methods [--benchmark ball-2|fashion-mnist|both] [--seeds 5]
        [--alarm-seeds 10] [--budget small|full] [--test-count N]
        [--sampling fixed|sequential] [--out FILE.md]

which runs :func:`harness.audit.detection_power.main` with these methods, and by the
tests (a pytest fixture module loaded through ``pytest_plugins`` in ``tests/conftest.py``;
the fixture :func:`rigged_methods` is this module).

- ``padded-counts``: claims its bound from the estimation counts with 3 % of n moved
  onto the top class; declares Cohen's formula.
- ``padded-formula``: the same, and declares a formula that pads the counts too, so
  that its claims derive from the harness's draws by its own formula.
- ``n-over-8``: draws n/8 estimation samples itself (``context.engine``) and bounds
  p_A as if they were n (counts × 8).
- ``best-of-4-streams``: draws three more estimation streams itself and keeps the best
  of the four bounds.
- ``class-from-estimation``: selects the class from the estimation counts instead of
  the independent selection counts (a bug of public re-implementations of CERTIFY).
- ``seed-after-result``: where the harness's draws abstain, re-draws with other seeds,
  chosen after looking at the result, until one certifies.
- ``sigma-at-test-points``: σ × 1.3 exactly at the benchmark's test points, declared
  constant (the test split withheld from it, it loads the dataset again itself).
- ``honest-when-rebuilt``: ``padded-formula`` on the base model it was first built for in
  a run (the run's, by its recipe hash), Cohen's honest certificate on any other model
  (as when a check rebuilds it).
- at a diagonal scale, each on the ramp scale σ … 2σ of ``fixed-scale``
  (:mod:`plugins.anisotropic.fixed_scale`): ``geometric-mean-radius`` claims
  κ·(∏σ_i)^{1/d}, UCAN's geometric-mean "radius", as its ℓ2 radius and declares a formula
  that derives exactly that (only the geometry is false: a ball wider than the
  ellipsoid's smallest axis); ``diagonal-padded-counts``, the anisotropic certificate
  (ball and ellipsoid) from counts padded by 3 %, declaring Cohen's formula;
  ``scale-at-test-points``, the fixed scale × 1.3 at the test points, declared constant;
  ``centre-toward-prediction``, the fixed scale drawn around a noise centre
  (:mod:`harness.engine.centre`) that moves each input 2σ toward the inside of its
  predicted class, so that p_A is that of a deeper point.
- ``engine-patch`` (:func:`engine_patched`): a plugin that, when imported, patches the
  harness's :class:`~harness.SamplingEngine` to move 3 % of the estimation votes onto the
  top class; the method itself is plain Cohen.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import types
from collections.abc import Iterator
from dataclasses import replace
from typing import ClassVar

import numpy as np
import pytest
import torch
from scipy.special import ndtri

from harness import (
    ABSTAIN,
    COHEN,
    STREAM_ESTIMATION,
    CertifierSpec,
    Claim,
    Constant,
    HardSmoothingCertifier,
    MethodSpec,
    RadiusFormula,
    Recomputed,
    SamplingEngine,
    SigmaProviderSpec,
    clopper_pearson_lower,
    cohen_radius,
    hookimpl,
)
from plugins.anisotropic.certifier import AnisotropicCertifier
from plugins.anisotropic.fixed_scale import FixedScale

IDRS_BENCH_CONTRACT = 3
"""The plugin contract the rigged methods are written against (installed with --isolated)."""

SIGMA = 0.25
PAD = 0.03
"""Fraction of n moved onto the top class by the padding cheats."""
SIGMA_FACTOR = 1.3
"""σ at the test points of ``sigma-at-test-points``, relative to σ elsewhere."""


def padded(counts: np.ndarray, top: int, n: int) -> np.ndarray:
    """``counts`` with PAD·n votes moved onto class ``top`` from the other classes (largest
    first); the total stays n."""
    out = np.array(counts, dtype=np.int64)
    moved = min(round(PAD * n), n - int(out[top]))
    out[top] += moved
    for other in np.argsort(out)[::-1]:
        if other == top or moved <= 0:
            continue
        take = min(moved, int(out[other]))
        out[other] -= take
        moved -= take
    return out


def _bound(counts: np.ndarray, top: int, alpha: float) -> float:
    return clopper_pearson_lower(int(counts[top]), int(counts.sum()), alpha)


def _claim(top: int, bound: float, sigma: float, predict: int = ABSTAIN) -> Claim:
    if bound <= 0.5:
        return Claim(ABSTAIN, 0.0, bound, predict)
    return Claim(top, float(cohen_radius(bound, sigma)), bound, predict)


def padded_recompute(rows, inputs, protocol, regularity) -> Recomputed:
    """Cohen's formula on estimation counts padded by 3 % (a formula that lies)."""
    honest = COHEN.recompute(rows, inputs, protocol, regularity)
    bound, prediction, radius = honest.bound.copy(), honest.prediction.copy(), honest.radius.copy()
    for i, row in enumerate(rows):
        base = row["draws"]["base"]
        top = int(np.argmax(base["selection"]))
        counts = padded(np.asarray(base["estimation"]), top, int(base["n"]))
        bound[i] = _bound(counts, top, protocol.alpha)
        prediction[i] = top if bound[i] > 0.5 else ABSTAIN
        radius[i] = cohen_radius(bound[i], float(row["sigma"])) if bound[i] > 0.5 else 0.0
    return Recomputed(honest.n0, honest.n, bound, prediction, radius)


PADDED = RadiusFormula("cohen-padded", padded_recompute)


class PaddedCounts(HardSmoothingCertifier):
    """Bounds p_A from counts padded by 3 %; declares Cohen's formula."""

    radius_formula = COHEN

    def radius(self, p_lower, sigma):
        return cohen_radius(p_lower, sigma)

    def certify(self, evidence):
        claims = []
        for k in range(len(evidence)):
            top = int(np.argmax(evidence.base.selection[k]))
            counts = padded(evidence.base.estimation[k], top, evidence.base.n)
            claims.append(_claim(top, _bound(counts, top, evidence.alpha), evidence.sigma[k]))
        return claims


class PaddedFormula(PaddedCounts):
    """Pads, and declares a formula that pads: its claims derive from its formula."""

    radius_formula = PADDED


class _Drawing(HardSmoothingCertifier):
    """A certifier that draws samples of its own through ``context.engine``."""

    radius_formula = COHEN

    def __init__(self, context) -> None:
        self.engine = context.engine

    def radius(self, p_lower, sigma):
        return cohen_radius(p_lower, sigma)


class NOverEight(_Drawing):
    """Draws n/8 estimation samples (the harness's stream) and bounds p_A as if n."""

    def certify(self, evidence):
        n = evidence.base.n
        counts = self.engine.counts(evidence.x, evidence.sigma, evidence.input_ids, n // 8,
                                    STREAM_ESTIMATION) * 8  # fmt: skip
        claims = []
        for k in range(len(evidence)):
            top = int(np.argmax(evidence.base.selection[k]))
            claims.append(_claim(top, _bound(counts[k], top, evidence.alpha), evidence.sigma[k]))
        return claims


class BestOfFourStreams(_Drawing):
    """CERTIFY on the harness's estimation stream and three more it draws; the best bound."""

    def certify(self, evidence):
        n, ids = evidence.base.n, evidence.input_ids
        streams = [evidence.base.estimation] + [
            self.engine.counts(evidence.x, evidence.sigma, ids, n, 100 + s) for s in range(3)
        ]
        claims = []
        for k in range(len(evidence)):
            top = int(np.argmax(evidence.base.selection[k]))
            bound = max(_bound(counts[k], top, evidence.alpha) for counts in streams)
            claims.append(_claim(top, bound, evidence.sigma[k]))
        return claims


class ClassFromEstimation(HardSmoothingCertifier):
    """ĉ_A = argmax of the estimation counts (not of the independent selection counts)."""

    radius_formula = COHEN

    def radius(self, p_lower, sigma):
        return cohen_radius(p_lower, sigma)

    def certify(self, evidence):
        claims = []
        for k in range(len(evidence)):
            counts = evidence.base.estimation[k]
            top = int(np.argmax(counts))
            claims.append(_claim(top, _bound(counts, top, evidence.alpha), evidence.sigma[k]))
        return claims


class SeedAfterResult(_Drawing):
    """Where the harness's draws abstain, draws again with seeds 1, 2, ... (up to 7) and
    claims the first that certifies."""

    def certify(self, evidence):
        honest = super().certify(evidence)
        claims = []
        for k, claim in enumerate(honest):
            top = int(np.argmax(evidence.base.selection[k]))
            for seed in range(1, 8):
                if claim.prediction != ABSTAIN:
                    break
                engine = SamplingEngine(self.engine.model, self.engine.num_classes,
                                        self.engine.device, self.engine.batch_size, seed)  # fmt: skip
                counts = engine.counts(evidence.x[k : k + 1], evidence.sigma[k : k + 1],
                                       evidence.input_ids[k : k + 1], evidence.base.n,
                                       STREAM_ESTIMATION)[0]  # fmt: skip
                claim = _claim(top, _bound(counts, top, evidence.alpha), evidence.sigma[k])
            claims.append(claim)
        return claims


def _point_keys(x: torch.Tensor) -> list[bytes]:
    flat = x.detach().to("cpu", torch.float32).flatten(1).numpy()
    return [hashlib.sha256(row.tobytes()).digest() for row in flat]


class SigmaAtTestPoints:
    """σ × 1.3 at the benchmark's test points, σ elsewhere; declares a constant σ. The
    harness withholds the test split from plugins (``context.dataset.test_x`` raises, and
    in a plugin host the registry's loaders and the installed datasets' files too), so it
    makes the test split again itself: a ``ball-N`` benchmark's from the public generator
    and the run's seed (which no confinement can withhold: docs/threat-model.md), any
    other through the dataset's own loader (in the harness's process; in a plugin host
    that is refused and the row fails)."""

    def __init__(self, context, sigma: float) -> None:
        self.sigma = sigma
        self.regularity = Constant(sigma)
        registry, name = context.registry, context.dataset.name
        family = registry.family_args("datasets", name)
        if name.startswith("ball-"):
            from harness.audit.analytic import load_ball_dataset

            data = load_ball_dataset(family["dim"], context.seed)
        else:
            data = registry.get("datasets", name).load(data_root=None, download=False,
                                                       seed=context.seed, **family)  # fmt: skip
        self.test_points = set(_point_keys(data.test_x))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        factor = [SIGMA_FACTOR if key in self.test_points else 1.0 for key in _point_keys(x)]
        return self.sigma * torch.tensor(factor, dtype=torch.float64, device=x.device)


class HonestWhenRebuilt(PaddedFormula):
    """``PaddedFormula`` on the first base model it is built for in a run (by its recipe
    hash, so on the run's model in the run and in its checks, also when one process makes
    several runs); Cohen's certificate on any other (S1's rebuilds)."""

    first_model: ClassVar[dict[str, str | None]] = {}

    def __init__(self, context) -> None:
        first = self.first_model.setdefault(context.run_id, context.recipe_hash)
        self.cheating = context.recipe_hash is not None and context.recipe_hash == first
        if not self.cheating:
            self.radius_formula = COHEN

    def certify(self, evidence):
        if self.cheating:
            return super().certify(evidence)
        return HardSmoothingCertifier.certify(self, evidence)


# --- at a diagonal scale (harness.engine.scale), each on the ramp σ … 2σ of ``fixed-scale``


RATIO = 2.0
"""The largest axis over the smallest of the rigged methods' scale (``fixed-scale``'s ramp)."""


def geometric_recompute(rows, inputs, protocol, regularity) -> Recomputed:
    """Cohen's bound, and the radius κ·(∏σ_i)^{1/d} of each row's recorded scale."""
    from harness.engine.scale import geometric_mean, recorded_scale

    honest = COHEN.recompute(rows, inputs, protocol, regularity)
    radius = honest.radius.copy()
    for i, row in enumerate(rows):
        scale = recorded_scale(row.get("draws"))
        if scale is not None and radius[i] > 0:
            radius[i] *= float(geometric_mean(scale[None])[0]) / float(scale.min())
    return Recomputed(honest.n0, honest.n, honest.bound, honest.prediction, radius)


GEOMETRIC = RadiusFormula("geometric-mean-radius", geometric_recompute)


class GeometricMeanRadius(AnisotropicCertifier):
    """The anisotropic certificate with the ball's radius κ·(∏σ_i)^{1/d} (UCAN's claim)."""

    radius_formula = GEOMETRIC

    def certify(self, evidence):
        from harness.engine.scale import geometric_mean

        claims = super().certify(evidence)
        if evidence.scale is None:
            return claims
        mean = geometric_mean(evidence.scale)
        return [c if c.prediction == ABSTAIN else
                replace(c, radius=float(ndtri(c.p_lower) * mean[k]))
                for k, c in enumerate(claims)]  # fmt: skip


class DiagonalPaddedCounts(AnisotropicCertifier):
    """The ball and ellipsoid from counts with 3 % of n moved onto the top class."""

    def certify(self, evidence):
        claims = []
        for k in range(len(evidence)):
            top = int(np.argmax(evidence.base.selection[k]))
            counts = padded(evidence.base.estimation[k], top, evidence.base.n)
            bound = _bound(counts, top, evidence.alpha)
            if bound <= 0.5:
                claims.append(Claim(ABSTAIN, 0.0, bound))
                continue
            kappa = float(ndtri(bound))
            claims.append(Claim(top, kappa * float(evidence.sigma[k]), bound,
                                ellipsoid=kappa if evidence.scale is not None else None))  # fmt: skip
        return claims


class ScaleAtTestPoints(FixedScale):
    """The fixed scale × 1.3 at the benchmark's test points; declared constant."""

    def __init__(self, context, sigma: float) -> None:
        super().__init__(sigma, RATIO)
        self.test_points = SigmaAtTestPoints(context, sigma)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        factor = self.test_points(x) / self.sigma
        scale = super().__call__(x)
        return scale * factor.to(scale.dtype).view(-1, *([1] * (x.dim() - 1)))


class CentreTowardPrediction(FixedScale):
    """The fixed scale drawn around a centre that moves each input :data:`PULL` along the
    gradient of its top-two logit margin (toward the inside of its predicted class, where
    p_A is larger); declared constant, as if the centre moved nothing."""

    def __init__(self, context, sigma: float) -> None:
        super().__init__(sigma, RATIO)
        self.model = context.model

    def centre(self, x: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            point = x.detach().float().requires_grad_(True)
            top = self.model(point).topk(2, dim=1).values
            if not top.requires_grad:  # a model without a gradient (one-hot logits): stay put
                return torch.zeros_like(x)
            (gradient,) = torch.autograd.grad((top[:, 0] - top[:, 1]).sum(), point)
        flat = gradient.flatten(1)
        flat = flat / flat.norm(dim=1, keepdim=True).clamp_min(1e-12)
        return (PULL * flat).view_as(x).detach()


PULL = 0.5
"""How far ``centre-toward-prediction`` moves each input (2σ at σ = 0.25)."""

DIAGONAL_CERTIFIERS = {
    "geometric-mean-radius": lambda context: GeometricMeanRadius(),
    "diagonal-padded-counts": lambda context: DiagonalPaddedCounts(),
}
"""The rigged certifiers at a diagonal scale, each a method on the ``fixed-scale`` ramp."""
DIAGONAL_SIGMA_PROVIDERS = {
    "scale-at-test-points": SigmaProviderSpec(
        "scale-at-test-points", lambda context, params: ScaleAtTestPoints(context, params["sigma"])
    ),
    "centre-toward-prediction": SigmaProviderSpec(
        "centre-toward-prediction",
        lambda context, params: CentreTowardPrediction(context, params["sigma"]),
    ),
}


CERTIFIERS = {
    "padded-counts": lambda context: PaddedCounts(),
    "padded-formula": lambda context: PaddedFormula(),
    "n-over-8": NOverEight,
    "best-of-4-streams": BestOfFourStreams,
    "class-from-estimation": lambda context: ClassFromEstimation(),
    "seed-after-result": SeedAfterResult,
    "honest-when-rebuilt": HonestWhenRebuilt,
}
METHODS = (*CERTIFIERS, "sigma-at-test-points", *DIAGONAL_CERTIFIERS, *DIAGONAL_SIGMA_PROVIDERS)
"""The rigged methods registered by this plugin (``engine-patch`` is :func:`engine_patched`)."""


@hookimpl
def idrs_register_sigma_providers(register) -> None:
    register(SigmaProviderSpec("sigma-at-test-points",
                               lambda context, params: SigmaAtTestPoints(context, params["sigma"])))  # fmt: skip
    for spec in DIAGONAL_SIGMA_PROVIDERS.values():
        register(spec)


@hookimpl
def idrs_register_certifiers(register) -> None:
    for name, build in (CERTIFIERS | DIAGONAL_CERTIFIERS).items():
        register(CertifierSpec(name, lambda context, params, provider, build=build: build(context),
                               "rigged (tests/rigged_methods.py)"))  # fmt: skip


@hookimpl
def idrs_register_methods(register) -> None:
    for name in CERTIFIERS:
        register(MethodSpec(name, "constant", name, {"sigma": SIGMA}))
    register(MethodSpec("sigma-at-test-points", "sigma-at-test-points", "cohen", {"sigma": SIGMA}))
    ramp = {"sigma": SIGMA, "ratio": RATIO}
    for name in DIAGONAL_CERTIFIERS:
        register(MethodSpec(name, "fixed-scale", name, ramp))
    for name in DIAGONAL_SIGMA_PROVIDERS:
        register(MethodSpec(name, name, "anisotropic", {"sigma": SIGMA}))


def plugin() -> types.ModuleType:
    """A fresh instance of this plugin (``honest-when-rebuilt`` forgets the first model)."""
    HonestWhenRebuilt.first_model.clear()
    return sys.modules[__name__]


def _patched_run(original):
    def run(self, x, sigma, input_ids, num, stream, soft=False, start=0):
        for index, result in original(self, x, sigma, input_ids, num, stream, soft, start):
            if stream == STREAM_ESTIMATION and not soft:
                result = padded(result, int(np.argmax(result)), num)
            yield index, result

    return run


ENGINE_PATCH_SOURCE = """
import numpy as np
from harness import STREAM_ESTIMATION, SamplingEngine
from tests.rigged_methods import _patched_run

IDRS_BENCH_CONTRACT = 3
SamplingEngine.run = _patched_run(SamplingEngine.run)
"""
"""The engine-patching plugin's module: importing it patches the harness's engine."""


@contextlib.contextmanager
def engine_patched() -> Iterator[types.ModuleType]:
    """Import the engine-patching plugin (which patches ``SamplingEngine.run`` as it is
    imported: 3 % of every estimation draw's votes onto its top class); undo on exit."""
    original = SamplingEngine.run
    module = types.ModuleType("rigged_engine_patch")
    try:
        exec(compile(ENGINE_PATCH_SOURCE, "rigged_engine_patch.py", "exec"), module.__dict__)
        yield module
    finally:
        SamplingEngine.run = original


@contextlib.contextmanager
def invalid_rule() -> Iterator[None]:
    """The invalid sequential rule: a plain Clopper–Pearson bound at level α at every look
    (:meth:`harness.mathematics.sequential.SequentialRule.look_bounds` patched), and for
    the grid-place rule the exact binomial test of each place at level α at every look
    (:meth:`harness.mathematics.gridplace.GridPlaceRule.rejects` patched), for the run and
    its checks alike; undone on exit."""
    from harness.mathematics.gridplace import GridPlaceRule
    from harness.mathematics.sequential import SequentialRule

    original, rejects = SequentialRule.look_bounds, GridPlaceRule.rejects
    SequentialRule.look_bounds = plain_clopper_pearson
    GridPlaceRule.rejects = plain_exact_test
    try:
        yield
    finally:
        SequentialRule.look_bounds, GridPlaceRule.rejects = original, rejects


def plain_exact_test(rule, count, k, tau, a, b, alpha: float) -> np.ndarray:
    """The exact binomial test of p_A <= τ at level α at look ``k``, as if it were the only look."""
    from harness.mathematics.gridplace import _exact_rejects

    count, k, tau, _, _ = np.broadcast_arrays(np.asarray(count, dtype=np.int64), np.asarray(k),
                                              tau, a, b)  # fmt: skip
    return _exact_rejects(count, rule.looks[k], tau, alpha)


def plain_clopper_pearson(rule, counts, k, alpha: float) -> np.ndarray:
    """Clopper–Pearson at level α at look ``k`` of ``rule``, as if it were the only look."""
    from harness.mathematics.stats import clopper_pearson_lower_array

    counts, k = np.broadcast_arrays(np.asarray(counts, dtype=np.int64), np.asarray(k))
    return clopper_pearson_lower_array(counts, rule.looks[k], alpha)


@pytest.fixture
def naive_sequential_rule() -> Iterator[None]:
    """The run and checks of the test under :func:`invalid_rule`."""
    with invalid_rule():
        yield


@pytest.fixture
def rigged_methods() -> types.ModuleType:
    """This module, as a fresh plugin to register (``manager.register(rigged, name=...)``)."""
    return plugin()


if __name__ == "__main__":
    from harness.audit.detection_power import main

    sys.exit(main(sys.argv[1:], plugin(), engine_patched, ENGINE_PATCH_SOURCE, invalid_rule))
