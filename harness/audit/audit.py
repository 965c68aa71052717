"""What a soundness check receives: one (run, method, setting) rebuilt from the store."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.audit.cost import SigmaQueries
from harness.certification.certify import sigma_of, sigma_smoothing
from harness.certification.method import build_method
from harness.engine.batchsize import auto_batch_size
from harness.engine.exact import ExactSampling
from harness.engine.precision import prepare_model
from harness.engine.sampling import SamplingEngine
from harness.foundation.data import TrainingSplit
from harness.foundation.errors import IdrsError
from harness.foundation.protocol import CertificationProtocol
from harness.plugin.components import BuildContext, Certifier, MethodSpec, RunMemo, SigmaProvider
from harness.plugin.registry import Registry
from harness.running.redraw import ReplaySource

ENTROPY_BITS = 128
"""Entropy an audit draws (``os.urandom``) and records with every verdict."""


def fresh_entropy() -> int:
    """128 bits from the operating system's entropy source, drawn at audit time."""
    return int.from_bytes(os.urandom(ENTROPY_BITS // 8), "little")


def parse_entropy(entropy: str | int | None) -> int | None:
    """An audit's recorded entropy (hex, as in a check's evidence ``entropy``, or an int)."""
    if entropy is None or (isinstance(entropy, int) and not isinstance(entropy, bool)):
        if entropy is not None and not 0 <= entropy < 2**ENTROPY_BITS:
            raise IdrsError(f"entropy must lie in [0, 2^{ENTROPY_BITS}), got {entropy}")
        return entropy
    text = str(entropy).strip().lower().removeprefix("0x")
    if not text or len(text) > ENTROPY_BITS // 4 or any(c not in "0123456789abcdef" for c in text):
        raise IdrsError(
            f"--entropy takes up to {ENTROPY_BITS // 4} hexadecimal digits, as recorded in a "
            f'check\'s evidence ("entropy"), got {entropy!r}'
        )
    return int(text, 16)


def derived_seed(entropy: int, purpose: str) -> int:
    """A 64-bit seed for ``purpose`` (e.g. ``"coverage/ball"``) from the audit's entropy."""
    digest = hashlib.sha256(f"{entropy:032x}/{purpose}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


@dataclass(frozen=True)
class Budget:
    """How hard the checks search; ``small`` fits in the default benchmark's time.

    ``small`` certifies S1's trials at n <= 2,500, a quarter of the default benchmark's
    n: the calibration test then sees a shift of the counts by >= 0.45 % of n (0.23 % at
    10,000; the evidence states it), far below the 3 % of the rigged ``padded-counts``,
    and the detection-power tables (leaderboards/README.md) are measured at it.
    """

    name: str
    coverage_trials: int  # S1: certified trial points, split between the two exact classifiers
    coverage_n: int  # S1: largest n per trial certificate (S1 certifies at min(run's n, this))
    pairs: int  # S2: random pairs per evaluated input
    ascent_steps: int  # S2/S3: points each projected ascent evaluates (its start, then steps)
    audited_inputs: int  # S2/S3/S4c: how many of the run's certificates are audited (at random)
    attack_steps: int  # S4c: points each PGD path evaluates (its start, steps; the last confirmed)
    attack_samples: int  # S4c: noise samples per attack step / confirmation samples / 16
    orders: int  # S4d: input orders replayed for memory certifiers
    replay_inputs: int = 16  # replay: inputs per row re-certified from the run's keys

    def statement(self, python: str = "python3") -> str:
        """What the checks examine at this budget, and where their power is measured (the
        command with ``python``: how to type the interpreter that runs the harness)."""
        return (
            f"checks at the {self.name!r} budget, every random choice drawn from 128 bits of "
            "audit-time entropy recorded with each verdict: S0 re-derives every certificate "
            "from the harness's draws; "
            f"S1 {self.coverage_trials} certified trial points on exact classifiers in the "
            f"run's dimension and classes (n = the run's n up to {self.coverage_n:,}), tested "
            "for false certificates against Binomial(trials, α) and for calibration of the "
            "drawn counts against Binomial(n, p_exact); "
            f"S2, S3 and S4's attack audit {self.audited_inputs} random certificates per row "
            f"({self.pairs} pairs, ascents of {self.ascent_steps} points, PGD paths of "
            f"{self.attack_steps} points of {self.attack_samples} samples); S5 replays {self.orders} "
            f"input orders; the replay check re-draws {self.replay_inputs} random inputs per "
            "row in a process without third-party plugins (bit for bit on the run's "
            "arithmetic, else a replication test). A sound row is flagged with probability "
            "<= 10⁻³ per statistical check (S1, S4, a replication test). What this budget "
            "detects and how often sound methods are flagged "
            "is measured on ball-2 and Fashion-MNIST (leaderboards/README.md, 'Detection "
            f"power of the checks') by `{python} -m tests.rigged_methods --budget {self.name}` "
            "in a checkout of the repository (tests/ is not installed)."
        )


BUDGETS = {
    "small": Budget("small", coverage_trials=120, coverage_n=2_500, pairs=8, ascent_steps=10,
                    audited_inputs=16, attack_steps=10, attack_samples=64, orders=20,
                    replay_inputs=16),
    "full": Budget("full", coverage_trials=1000, coverage_n=100_000, pairs=32, ascent_steps=50,
                   audited_inputs=200, attack_steps=50, attack_samples=256, orders=100,
                   replay_inputs=64),
}  # fmt: skip


@dataclass
class Audit:
    """One method at one setting of a finished run, ready to be audited.

    ``certificates`` are the stored rows (dicts with input_id, label, prediction,
    radius, p_lower, sigma, alpha, counts, evidence); ``inputs`` holds the certified
    inputs in the same order. ``sigma_provider`` and ``certifier`` are built by
    :func:`harness.certification.method.build_method` (the certifier with that provider); checks read
    only the attributes their protocols declare. ``radii`` are the benchmark's radii.

    ``entropy`` is drawn when the audit is made (``os.urandom``, 128 bits) and recorded
    in every check's evidence: every random choice of a check (trial points, pairs,
    audited inputs, attack starts) comes from :meth:`generator` or :meth:`rng`, so an
    audit is reproducible from its record and unpredictable before it (a plugin cannot
    simulate it offline from the run's public seed).

    ``source`` names the run's files for the replay check (:mod:`harness.running.redraw`).
    ``queries`` counts the σ queries of the checks (:mod:`harness.audit.cost`): the
    σ-provider, and those :meth:`rebuild` returns, are counted there.
    """

    run_id: str
    method: MethodSpec
    setting: str
    params: Mapping[str, Any]
    context: BuildContext
    sigma_provider: SigmaProvider
    certifier: Certifier
    certificates: list[dict[str, Any]]
    inputs: torch.Tensor
    budget: Budget
    registry: Registry
    radii: tuple[float, ...] = ()
    entropy: int = field(default_factory=lambda: fresh_entropy())
    source: ReplaySource | None = None
    queries: SigmaQueries = field(default_factory=SigmaQueries)

    def __post_init__(self) -> None:
        self.sigma_provider = self.queries.counting(self.sigma_provider)

    def seed(self, purpose: str) -> int:
        """A 63-bit seed for one purpose of one check, from the audit's entropy."""
        return derived_seed(self.entropy, purpose) >> 1

    def generator(self, purpose: str, device: str | torch.device = "cpu") -> torch.Generator:
        """A torch generator for one purpose of one check, seeded from the audit's entropy."""
        return torch.Generator(device=device).manual_seed(self.seed(purpose))

    def rng(self, purpose: str) -> np.random.Generator:
        """A numpy generator for one purpose of one check, seeded from the audit's entropy."""
        return np.random.default_rng(derived_seed(self.entropy, purpose))

    def subset(self, purpose: str, count: int, size: int) -> np.ndarray:
        """``min(size, count)`` distinct indices of ``range(count)`` drawn at random for
        ``purpose`` (sorted): which of the run's certificates a check audits, never the
        first ones."""
        size = min(size, count)
        return np.sort(self.rng(purpose).choice(count, size=size, replace=False))

    def fresh_engine(self, purpose: str, engine: SamplingEngine | None = None) -> SamplingEngine:
        """``engine`` (default: the run's: its base model in the run's arithmetic, device,
        batch size and noise scheme) with a noise seed drawn from the audit's entropy for
        ``purpose``: its samples cannot be predicted from the run's public seed."""
        engine = engine or self.context.engine
        return SamplingEngine(engine.model, engine.num_classes, engine.device, engine.batch_size,
                              self.seed(purpose), noise=engine.noise)  # fmt: skip

    def rebuild(
        self, dataset: TrainingSplit, model: torch.nn.Module, protocol: CertificationProtocol,
        artifact_root: Path | None = None, memos: RunMemo | None = None,
    ):  # fmt: skip
        """The same method and setting on another dataset and base model (for S1).

        Returns (σ-provider, certifier, context). The context is the run's with ``model``
        (``context.recipe_hash``: its content hash, ``model.content_hash()``), ``dataset``
        and ``protocol``, and an engine that queries ``model`` in ``protocol``'s arithmetic
        (:func:`harness.engine.precision.prepare_model`) with the run's seed, as a run's would:
        a check draws its own samples with :meth:`fresh_engine`, so what the method
        simulates with ``context.engine`` does not predict them. On an analytic model
        (one with ``class_probabilities``, :mod:`harness.audit.analytic`) that engine is
        :class:`~harness.engine.exact.ExactSampling`: the method's own Monte Carlo gets each
        sample's class from the closed form, with the law it has under the model, for one
        uniform instead of N normals and a forward pass. Artifacts a plugin saves
        go under ``artifact_root`` (give a temporary folder: the cache is not for models
        that exist only in an audit). A σ-provider that declares a σ-smoothing is kept as
        audited: its σ-estimator is a model of its own, fitted to the run's base model,
        and its certificate does not depend on the classifier, so only the certifier is
        built again.
        """
        run = self.context.engine
        certified = prepare_model(model, protocol)
        batch = protocol.batch_size
        if batch == "auto":
            batch = auto_batch_size(certified, dataset.input_shape, self.context.device)
        if hasattr(model, "class_probabilities"):  # an analytic model (see the docstring)
            engine = ExactSampling(certified, model.class_probabilities, dataset.num_classes,
                                   self.context.device, batch, self.context.seed, run.noise,
                                   one_hot=bool(getattr(model, "one_hot", False)))  # fmt: skip
        else:
            engine = SamplingEngine(certified, dataset.num_classes, self.context.device, batch,
                                    self.context.seed, noise=run.noise)  # fmt: skip
        content_hash = getattr(model, "content_hash", None)
        context = replace(self.context, dataset=dataset, model=model, protocol=protocol,
                          engine=engine, artifact_root=artifact_root,
                          memos=memos or self.context.memos.over_same_inputs(),
                          recipe_hash=content_hash() if content_hash else None)  # fmt: skip
        if sigma_smoothing(self.sigma_provider) is not None:
            method = self.registry.get("methods", self.method.name)
            spec = self.registry.get("certifiers", method.certifier)
            certifier = spec.build(context, {**method.defaults, **self.params},
                                   self.sigma_provider.uncounted)  # fmt: skip
            return self.sigma_provider, certifier, context
        provider, certifier = build_method(self.registry, self.method.name, self.params, context)
        return self.queries.counting(provider), certifier, context

    def sigma(self, x: torch.Tensor, where: str = "") -> torch.Tensor:
        """The method's σ at ``x`` (float64, on ``x``'s device), checked to be in range
        (:func:`harness.certification.certify.checked_sigma`): a bad σ is reported as the σ-provider's
        fault. A σ-smoothing's σ is drawn by the harness (:func:`harness.certification.certify.sigma_of`)."""
        sigma, _ = sigma_of(self.context, self.sigma_provider, x, None,
                            self.method.sigma_provider, where)  # fmt: skip
        return torch.from_numpy(sigma).to(x.device)
