"""Insta-RS σ search: instance-wise multiple-start FGSS (Súkeník et al. 2022, App. C.3, Alg. 2).

For an input x, K starts (l_k, s_k) are drawn; σ² = l·σ0². Each evaluation draws M
Monte Carlo samples x + √l·σ0·ε and forms the *empirical* radius (Expression 3 of
App. C.2 reduced to hard smoothing, as in Alg. 2)

    R(√l·σ0) = √l·σ0 · Φ⁻¹(Ê_A),   Ê_A = max_C (1/M) Σ_i [F(x + δ_i) = C],

with Ê_A clamped to at most 1 − 1/(2M) so that it stays finite. Each start hill-climbs
l ← l + s_k while the new radius is not smaller than the current one; σ(x) = √l_k*·σ0
of the start k* with the largest final radius m_k (the pseudo-code writes
``max_k m_k``, a radius; the text of App. C.3 makes clear that the σ is meant).

Choices where the paper is silent (all documented at the parameters):

- Ê_A refers to the top class *of that evaluation's M samples* (``max_C ϕ_C`` in
  Alg. 2), re-chosen at every evaluation, not fixed at the first one: the search may
  drift to a σ where another class dominates, which is the "no control over the
  correctness of the prediction" App. C.3 criticizes.
- Starts: ``uniform`` draws l_k ~ U[l_lo, l_hi] and s_k ~ U(−s_max, s_max) i.i.d.;
  ``stratified`` puts one l_k in each of K equal strata of [l_lo, l_hi] and gives
  the steps alternating signs (k even: up) with magnitudes U(0, s_max). Defaults
  l in [1, 16], s in (−1, 1) as App. C.3 states.
- A step is taken only if l + s stays in [1, T] (the while-condition ``l_k ∈ [1, T]``
  read as a constraint on every accepted l, so σ(x) ∈ [σ0, √T·σ0]); a proposal
  outside ends that start without sampling.
- At most ``max_steps`` (default 32) steps per start: the pseudo-code ends only when
  l leaves [1, T] or the radius decreases, which for |s| → 0 takes ~(T − 1)/|s|
  evaluations (a heavy tail: E[1/|s|] diverges for s ~ U(−1, 1)). Its effect on σ,
  measured on 60 Fashion-MNIST test points (every 50th) with the default search and a
  1-epoch Gaussian-augmentation MLP: the longest climb accepted 11 steps, no start
  reached the cap, and σ(x) was identical to that of an uncapped search
  (``max_steps = 100000``) at every point. The cap binds only where the radius keeps
  growing for 32 steps, i.e. inputs whose Ê_A stays at its clamp for a small step s
  (σ then stops at l_k + 32·s instead of climbing to T).

Noise. σ(x) must be a function of x (and the seed), never of the batch it is computed
in: every input is keyed by a 63-bit hash of its float32 bytes, which plays the role
of the input id for the :class:`~harness.engine.sampling.SamplingEngine` and seeds the
per-input generator of the starts. Stream numbers (>= 100, this plugin's own):
:data:`STREAM_STARTS` seeds the starts; evaluation j (j = 0 the initial one) of
start k uses stream ``STREAM_SEARCH + k·STEP_STRIDE + j``, so every (start, step)
evaluation has fresh noise, reproducible and independent of batching.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import norm

from harness import SamplingEngine, SigmaCache, Unregularized, noise_seed
from plugins.chen.config import STEP_STRIDE, SearchConfig

STREAM_STARTS = 100
"""Seeds the per-input generator of the K starts (l_k, s_k)."""
STREAM_SEARCH = 101
"""First noise stream of the search's Monte Carlo evaluations."""


@dataclass
class SearchResult:
    """Everything Alg. 2 did for a batch of B inputs with K starts.

    ``start_level``, ``step``: the drawn (l_k, s_k) [B, K]; ``level``: the final l_k;
    ``radius``: m_k, the empirical radius at the final l_k; ``steps``: accepted steps;
    ``evaluations``: Monte Carlo evaluations per start; ``best``: k* [B]; ``sigma``:
    σ(x) = √l_k*·σ0 [B].
    """

    start_level: np.ndarray
    step: np.ndarray
    level: np.ndarray
    radius: np.ndarray
    steps: np.ndarray
    evaluations: np.ndarray
    best: np.ndarray
    sigma: np.ndarray


def input_keys(x: torch.Tensor, salt: int = 0) -> list[int]:
    """A 63-bit key per input: a hash of its float32 bytes (and ``salt``)."""
    rows = x.detach().to("cpu", torch.float32).contiguous().reshape(len(x), -1).numpy()
    salt_bytes = int(salt).to_bytes(8, "little", signed=True)
    keys = []
    for row in rows:
        digest = hashlib.blake2b(row.tobytes(), digest_size=8, key=salt_bytes).digest()
        keys.append(int.from_bytes(digest, "little") >> 1)
    return keys


def draw_starts(config: SearchConfig, seed: int, key: int) -> tuple[np.ndarray, np.ndarray]:
    """The K starts (l_k, s_k) of one input, from a generator seeded by (seed, key) alone."""
    rng = np.random.default_rng(noise_seed(seed, STREAM_STARTS, key, 0))
    k = config.num_starts
    lo, hi, s_max = config.start_level_min, config.start_level_max, config.max_step_size
    u_level = rng.random(k)
    u_step = rng.random(k)
    if config.start_sampling == "uniform":
        level = lo + (hi - lo) * u_level
        step = s_max * (2.0 * u_step - 1.0)
    else:  # stratified
        level = lo + (hi - lo) * (np.arange(k) + u_level) / k
        sign = np.where(np.arange(k) % 2 == 0, 1.0, -1.0)
        step = sign * s_max * (1.0 - u_step)  # magnitude in (0, s_max]
    return level, step


def empirical_radius(counts: np.ndarray, sigma: np.ndarray, num_samples: int) -> np.ndarray:
    """R = σ·Φ⁻¹(Ê_A), Ê_A = max_C counts_C / M clamped to <= 1 − 1/(2M) (Alg. 2)."""
    top = np.asarray(counts).max(axis=1) / num_samples
    return np.asarray(sigma) * norm.ppf(np.minimum(top, 1.0 - 0.5 / num_samples))


def search_sigma(
    engine: SamplingEngine,
    x: torch.Tensor,
    config: SearchConfig,
    seed: int,
    salt: int = 0,
) -> SearchResult:
    """Alg. 2 for a batch of inputs at once; noise from ``engine`` (streams as documented).

    Every round evaluates, for each start k, all inputs whose start k is still
    climbing in one :meth:`SamplingEngine.counts` call on stream
    ``STREAM_SEARCH + k·STEP_STRIDE + j``.
    """
    count, k_starts, m = len(x), config.num_starts, config.num_samples
    keys = input_keys(x, salt)
    starts = [draw_starts(config, seed, key) for key in keys]
    start_level = np.array([s[0] for s in starts]).reshape(count, k_starts)
    step = np.array([s[1] for s in starts]).reshape(count, k_starts)
    level = start_level.copy()
    radius = np.empty((count, k_starts))
    steps = np.zeros((count, k_starts), dtype=np.int64)
    evaluations = np.zeros((count, k_starts), dtype=np.int64)
    active = np.ones((count, k_starts), dtype=bool)

    def evaluate(rows: np.ndarray, k: int, levels: np.ndarray, j: int) -> np.ndarray:
        sigma = np.sqrt(levels) * config.sigma0
        counts = engine.counts(
            x[torch.as_tensor(rows, device=x.device)],
            sigma,
            [keys[i] for i in rows],
            m,
            STREAM_SEARCH + k * STEP_STRIDE + j,
        )
        evaluations[rows, k] += 1
        return empirical_radius(counts, sigma, m)

    all_rows = np.arange(count)
    if count:
        for k in range(k_starts):
            radius[:, k] = evaluate(all_rows, k, level[:, k], 0)
    for j in range(1, config.max_steps + 1):
        proposal = level + step
        inside = (proposal >= 1.0) & (proposal <= config.max_level)
        active &= inside
        if not active.any():
            break
        for k in range(k_starts):
            rows = np.flatnonzero(active[:, k])
            if len(rows) == 0:
                continue
            new_radius = evaluate(rows, k, proposal[rows, k], j)
            accept = new_radius >= radius[rows, k]
            up = rows[accept]
            level[up, k] = proposal[up, k]
            radius[up, k] = new_radius[accept]
            steps[up, k] += 1
            active[rows[~accept], k] = False
    best = np.argmax(radius, axis=1) if count else np.zeros(0, dtype=np.int64)
    sigma = np.sqrt(level[all_rows, best]) * config.sigma0
    return SearchResult(start_level, step, level, radius, steps, evaluations, best, sigma)


class InstanceSigma:
    """σ-provider ``chen-fgss``: σ(x) from Alg. 2 on the base model; :class:`Unregularized`.

    σ(x) is a function of x and the seed alone: noise is keyed by x's content, and
    given an engine whose forward passes all have one shape
    (:meth:`SamplingEngine.padded`, as the plugin builds it), no sample's logits
    depend on the other inputs searched with it. Memoized (:class:`~harness.foundation.sigmacache.SigmaCache`) because the checks query
    the same inputs repeatedly. ``last`` holds the :class:`SearchResult` of the inputs
    searched by the latest call (for inspection).
    """

    def __init__(self, engine: SamplingEngine, config: SearchConfig, seed: int) -> None:
        self.engine = engine
        self.config = config
        self.seed = seed
        self.regularity = Unregularized()
        self.last: SearchResult | None = None
        self.cache = SigmaCache()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.cache.get(x, self._search)

    def _search(self, x: torch.Tensor) -> torch.Tensor:
        self.last = search_sigma(self.engine, x, self.config, self.seed)
        return torch.as_tensor(self.last.sigma, dtype=torch.float64, device=x.device)
