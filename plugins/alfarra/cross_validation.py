"""K of OptimizeSigma chosen on the training split, as Alfarra et al. (2022) choose it.

§4 sets β = 10⁻⁴, M = 1 and σ_0 = the training σ, and Table 1 reports "the best COHEN-DS,
cross-validated over all training σ and the number of iterations in Algorithm 1 K": K is
chosen by the certified result it gives. Here (``steps = "cross-validated"``) the
candidates K_1 < … < K_m (``steps_candidates``) are compared on ``cv_examples`` inputs of
the **training** split (evenly spaced over it, :func:`held_out`; the test split is never
seen: a :class:`~harness.foundation.data.TrainingSplit` has none), each certified as the
method certifies, by Cohen's CERTIFY at σ_K(x) with the run's n0, n and α; the chosen K is
the one of the largest average certified radius (ACR: the mean over the inputs of the
radius of a correct certificate, 0 otherwise; MACER's summary of the curve, reported beside
Table 1's envelope). Ties go to the smallest K.

Decisions where the paper is silent:

- the base model was trained on these inputs, so they are not held out from it: their
  margins are larger than a test input's, which favours large σ; the choice never reads the
  test split, which is what the benchmark's comparison needs;
- every candidate is read from one ascent (:func:`~plugins.alfarra.optimize_sigma.sigma_path`:
  σ_k after k steps is what K = k gives, bit for bit), with the σ-provider's own noise
  (stream 100, keyed by the input's content), so σ_K(x) on these inputs is the method's;
- every candidate is certified on the same noise (streams :data:`STREAM_CV_SELECTION` and
  :data:`STREAM_CV_ESTIMATION`, keyed by the training index): the comparison's differences
  are K's, not the draws'; a sequential protocol is read at its n (fixed-n CERTIFY);
- the memory (Alg. 3) is left out of the criterion: it changes few certificates (App. C:
  "we never found … intersecting"), and ``alfarra-ds`` and ``alfarra-ds-memory`` share the
  σ-provider, so both use the one K.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from harness import BuildContext, ParameterError, clopper_pearson_lower, cohen_radius
from plugins.alfarra import check_candidates
from plugins.alfarra.optimize_sigma import STREAM_OPTIMIZE, content_keys, sigma_path

STREAM_CV_SELECTION = 102
"""Noise stream of the criterion's selection draws (n0 per input, keyed by training index)."""
STREAM_CV_ESTIMATION = 103
"""Noise stream of the criterion's estimation draws (n per input, keyed by training index)."""


@dataclass(frozen=True)
class StepsChoice:
    """The chosen K and what it was chosen from (recorded beside the run's trained parts)."""

    steps: int
    candidates: tuple[int, ...]
    acr: tuple[float, ...]
    """ACR on the training inputs at each candidate, in the order of ``candidates``."""
    certified: tuple[float, ...]
    """Share of the training inputs certified correctly (any radius) at each candidate."""
    sigma_range: tuple[tuple[float, float, float], ...]
    """σ_K(x) min, median and max over the training inputs at each candidate."""
    examples: tuple[int, ...]
    """The training indices the candidates were compared on."""

    def to_json(self) -> dict:
        return {"steps": self.steps, "candidates": list(self.candidates), "acr": list(self.acr),
                "certified": list(self.certified),
                "sigma_range": [list(r) for r in self.sigma_range],
                "examples": list(self.examples)}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict) -> StepsChoice:
        return cls(int(data["steps"]), tuple(int(k) for k in data["candidates"]),
                   tuple(float(a) for a in data["acr"]),
                   tuple(float(c) for c in data["certified"]),
                   tuple(tuple(float(v) for v in r) for r in data["sigma_range"]),
                   tuple(int(i) for i in data["examples"]))  # fmt: skip


def held_out(count: int, total: int) -> torch.Tensor:
    """``count`` training indices evenly spaced over ``total`` (all of them if fewer)."""
    if total < 1:
        raise ParameterError("cross-validating K needs a training split with inputs")
    return torch.linspace(0, total - 1, min(count, total), dtype=torch.float64).round().long()


def certified_radii(
    engine, x: torch.Tensor, ids: Sequence[int], labels: np.ndarray, sigma: torch.Tensor,
    n0: int, n: int, alpha: float,
) -> np.ndarray:  # fmt: skip
    """Cohen's CERTIFY at σ per input (streams of the criterion): the radius of each correct
    certificate, 0 for an abstention or a wrong class."""
    selected = engine.counts(x, sigma, ids, n0, STREAM_CV_SELECTION).argmax(axis=1)
    counts = engine.counts(x, sigma, ids, n, STREAM_CV_ESTIMATION)
    top = counts[np.arange(len(ids)), selected]
    lower = np.array([clopper_pearson_lower(int(k), n, alpha) for k in top])
    certified = (lower > 0.5) & (selected == labels)
    radius = np.asarray(cohen_radius(np.where(certified, lower, 0.75), sigma.cpu().numpy()))
    return np.where(certified, radius, 0.0)


def choose_steps(
    engine, train_x: torch.Tensor, train_y: torch.Tensor, *, sigma0: float, samples: int,
    beta: float, sigma_min: float, seed: int, candidates: Sequence[int], examples: int,
    n0: int, n: int, alpha: float, advance: Callable[[int], None] = lambda done: None,
) -> StepsChoice:  # fmt: skip
    """K of the largest ACR among ``candidates`` on ``examples`` training inputs (module
    docstring); ``engine`` draws the criterion's samples and holds the model σ ascends on
    (``engine.model``, as the σ-provider's). ``advance(1)`` is called after the ascent and
    after each candidate's certificates (1 + len(candidates) calls)."""
    candidates = check_candidates(candidates)
    index = held_out(examples, len(train_x))
    x = train_x[index].to(engine.device, torch.float32)
    labels = train_y[index].cpu().numpy()
    ids = index.tolist()
    path = sigma_path(
        engine.model, x, sigma0, content_keys(x), seed=seed, stream=STREAM_OPTIMIZE,
        steps=candidates[-1], samples=samples, beta=beta, sigma_min=sigma_min,
        read_at=candidates,
    )  # fmt: skip
    advance(1)
    acr, certified, ranges = [], [], []
    for k in candidates:
        radii = certified_radii(engine, x, ids, labels, path[k], n0, n, alpha)
        acr.append(float(radii.mean()))
        certified.append(float((radii > 0).mean()))
        s = path[k].cpu()
        ranges.append((float(s.min()), float(s.median()), float(s.max())))
        advance(1)
    best = int(np.argmax(acr))  # the first maximum: the smallest K among ties
    return StepsChoice(candidates[best], candidates, tuple(acr), tuple(certified), tuple(ranges),
                       tuple(ids))  # fmt: skip


def cross_validated_steps(context: BuildContext, params: Mapping[str, Any]) -> int:
    """K chosen on the training split (:func:`choose_steps`), with ``params`` complete,
    once per run and base model (``context.memo``; ``alfarra-ds`` and ``alfarra-ds-memory``
    share it) and kept in the plugin's artifact directory, named by everything it depends on
    but the base model (whose recipe hash names the directory), so that a resumed run, the
    soundness checks and a board's replay use the very K the run used (a recomputation on
    other hardware could round σ otherwise and, at a near tie, choose another K)."""
    protocol = context.protocol
    key = {
        "dataset": context.dataset.name, "train": len(context.dataset.train_x),
        "seed": context.seed, "sigma": float(params["sigma"]), "samples": params["samples"],
        "beta": float(params["beta"]), "sigma_min": float(params["sigma_min"]),
        "candidates": list(check_candidates(params["steps_candidates"])),
        "examples": params["cv_examples"], "n0": protocol.n0, "n": protocol.n,
        "alpha": protocol.alpha,
    }  # fmt: skip

    def stored_or_chosen() -> int:
        directory = context.artifact_dir("alfarra")
        name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
        path = None if directory is None else directory / f"steps-{name}.json"
        if path is not None and path.is_file():
            try:
                saved = json.loads(path.read_text())
                if saved["key"] == key:
                    return StepsChoice.from_json(saved["choice"]).steps
            except (OSError, ValueError, KeyError, TypeError):
                pass  # a damaged file: K is chosen and written again
        data = context.dataset
        parts = 1 + len(key["candidates"])  # the ascent, then each candidate's CERTIFY
        with context.progress.task(
            "alfarra: cross-validating K", total=parts, unit="parts"
        ) as done:
            choice = choose_steps(
                context.engine, data.train_x, data.train_y, sigma0=float(params["sigma"]),
                samples=params["samples"], beta=float(params["beta"]),
                sigma_min=float(params["sigma_min"]), seed=context.seed,
                candidates=key["candidates"], examples=key["examples"], n0=protocol.n0,
                n=protocol.n, alpha=protocol.alpha, advance=done,
            )  # fmt: skip
        table = ", ".join(f"K = {k}: {a:.4f}" for k, a in zip(choice.candidates, choice.acr,
                                                                strict=True))  # fmt: skip
        low, median, high = choice.sigma_range[choice.candidates.index(choice.steps)]
        context.progress.log(
            f"alfarra: K = {choice.steps} cross-validated on {len(choice.examples)} training "
            f"inputs (ACR {table}); σ there {low:.4f} / {median:.4f} / {high:.4f}"
        )
        if path is not None:  # written whole, then renamed: never read half-written
            partial = path.with_name(path.name + ".tmp")
            partial.write_text(json.dumps({"key": key, "choice": choice.to_json()}, indent=1))
            partial.replace(path)
        return choice.steps

    return context.memo("alfarra", ("steps", json.dumps(key, sort_keys=True)), stored_or_chosen)
