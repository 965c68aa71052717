"""The variants ``idrs-bench bench`` times against the engine's fixed-n, scalar-σ CERTIFY.

Each certifies the same inputs again on the same engine, right after the fixed-n timing
(:func:`harness.cli.bench.bench_model`), and is reported as its wall time against it:

- ``--sampling sequential``: estimation samples drawn in rounds up to n_max = n at the
  default radius grid (:mod:`harness.mathematics.sequential`), with the samples it drew;
- ``--diagonal``: the noise x + Σ^{1/2}·ε at a diagonal scale, Σ^{1/2} = diag(σ_1, …, σ_d)
  with σ_i evenly (linearly) from σ to 2σ over the input's dimensions, the same scale
  for every input, claims at the smallest axis σ (Eiras et al., ANCER, Thm 1): what a
  scale per dimension costs the engine against one σ per input.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

Certify = Callable[..., list]
"""``certify(count, protocol, sigma)``: the harness's CERTIFY of the first ``count`` inputs."""


def sequential_variant(certify: Certify, protocol: Any, sigmas: np.ndarray, inputs: int,
                       fixed_seconds: float, sync: Callable[[], None]) -> dict[str, Any]:  # fmt: skip
    """Sequential sampling's estimation samples per input, share of n saved and wall time
    against the fixed-n certification of the same inputs."""
    from harness.mathematics.accuracy import RADII

    rounds = replace(protocol, sampling="sequential", n_max=protocol.n, grid=RADII)
    start = time.perf_counter()
    drawn = [c.draws["base"]["n"] for c in certify(inputs, rounds, sigmas)]
    sync()
    mean = sum(drawn) / len(drawn)
    return {"sampling": "sequential", "sequential_samples": mean,
            "samples_saved": 1 - mean / protocol.n,
            "sequential_vs_fixed_time": (time.perf_counter() - start) / fixed_seconds}  # fmt: skip


def diagonal_scale(sigma: float, inputs: int, dims: int) -> np.ndarray:
    """[inputs, dims]: σ_i evenly from σ to 2σ, the same scale for every input."""
    return np.tile(np.linspace(sigma, 2 * sigma, dims, dtype=np.float32), (inputs, 1))


def diagonal_variant(certify: Certify, protocol: Any, sigma: float, inputs: int, dims: int,
                     fixed_seconds: float, sync: Callable[[], None]) -> dict[str, Any]:  # fmt: skip
    """The wall time of CERTIFY at :func:`diagonal_scale` against the scalar σ's."""
    scale = diagonal_scale(sigma, inputs, dims)
    certify(1, protocol, scale[:1])  # warm-up (the scale's buffers and kernels)
    sync()
    start = time.perf_counter()
    certify(inputs, protocol, scale)
    sync()
    return {"diagonal_vs_scalar_time": (time.perf_counter() - start) / fixed_seconds}


def cohen_certifier():
    """Cohen et al. (2019), Thm 1, as the built-in plugin certifies; at a diagonal scale
    its claim is the ℓ2 ball at the smallest axis (ANCER, Thm 1), the scale's certificate
    without the ellipsoid."""
    from harness.certification.certify import HardSmoothingCertifier
    from harness.mathematics.radius import COHEN
    from harness.mathematics.worstcase import cohen_radius

    class Cohen(HardSmoothingCertifier):
        radius_formula = COHEN
        diagonal_scale = True

        def radius(self, p_lower: np.ndarray, sigma: np.ndarray) -> np.ndarray:
            return np.asarray(cohen_radius(p_lower, sigma))

    return Cohen()
