"""A noise centre: the mean μ(x) a σ-provider may give the noise at x.

A σ-provider may answer, beside σ(x), a centre μ(x) per input dimension through a
``centre(x)`` method (UCAN, Hong et al. 2025, §3: the noise x + μ(x) + λ·v(x)⊙ε of its
noise parameter generators; its ``core.py`` draws ``batch + mean + noise*variance``).
The harness then draws the samples of x at the shifted input x + μ(x) (:func:`shifted`,
in float32, the engine's precision) with the input's own keys, so that the smoothed
classifier is

    g(x) = argmax_c P(f(x + μ(x) + Σ(x)^{1/2}·ε) = c),

and a certificate still claims that g is constant on its ball around x. A constant μ
moves every input alike and changes no proof; a μ that varies with x moves the mean of
the noise between x and x + δ by δ + μ(x + δ) − μ(x), not δ, and only a check that
declares ``centred`` audits such a row (:func:`harness.audit.session.unsupported`).

A certificate's base draws record the centre they were drawn at (float32, little-endian,
base64, as :func:`harness.engine.scale.encode_scale` records a scale), so that the
samples can be drawn again, and re-checked, from the stored row alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from harness.engine.scale import SCALE_DTYPE, decode_scale, encode_scale
from harness.foundation.errors import IdrsError
from harness.foundation.protocol import SIGMA_MAX

encode_centre, decode_centre = encode_scale, decode_scale
"""A centre [d] as recorded (float32 bytes in base64), and back."""
TINY = float(np.finfo(np.float32).tiny)
"""The smallest normal float32: what a centre's change is relative to where it is 0."""


def checked_centre(centre: Any, x: torch.Tensor, provider: str, where: str = "") -> np.ndarray:
    """``centre`` as float32 [B, d] if it is a real floating tensor of the shape of ``x``
    ([B, *input_shape], or [B, d]) with every entry finite and of magnitude at most
    SIGMA_MAX; else an error that names the σ-provider and the offending value."""
    count, dims = len(x), int(x[0].numel()) if len(x) else 0
    if not (isinstance(centre, torch.Tensor) and centre.dtype.is_floating_point):
        kind = centre.dtype if isinstance(centre, torch.Tensor) else type(centre).__name__
        raise IdrsError(f"σ-provider {provider!r} returned a centre of type {kind}{where}; a "
                        "centre is a real floating tensor of the inputs' shape")  # fmt: skip
    if len(centre) != count or centre.reshape(len(centre), -1).shape[1] != dims:
        raise IdrsError(f"σ-provider {provider!r} returned a centre of shape "
                        f"{tuple(centre.shape)}{where}, expected {tuple(x.shape)} or "
                        f"({count}, {dims})")  # fmt: skip
    flat = centre.detach().reshape(count, -1)
    bad = ~(torch.isfinite(flat) & (flat.abs() <= SIGMA_MAX))
    if bool(bad.any()):
        k, j = (int(v) for v in torch.nonzero(bad)[0])
        raise IdrsError(f"σ-provider {provider!r} returned a centre of {float(flat[k, j]):.6g}"
                        f"{where} (input {k}, dimension {j}): a centre is finite and at most "
                        f"{SIGMA_MAX:g} in magnitude; the σ-provider is at fault, not the base "
                        "model")  # fmt: skip
    return np.ascontiguousarray(flat.to("cpu", torch.float32).numpy(), dtype=SCALE_DTYPE)


def centre_of(
    provider: Any, x: torch.Tensor, provider_name: str, where: str = ""
) -> np.ndarray | None:
    """The centre μ(x) [B, d] (float32) the σ-provider (:class:`harness.plugin.components.
    SigmaProvider`) answers for ``x``, checked; None for a provider without a ``centre``
    (its noise is centred at x)."""
    centre = getattr(provider, "centre", None)
    if centre is None:
        return None
    with torch.no_grad():
        return checked_centre(centre(x), x, provider_name, where)


def shifted(x: torch.Tensor, centre: np.ndarray | torch.Tensor | None) -> torch.Tensor:
    """x + μ [B, *input_shape] in float32 on x's device: the inputs the engine draws
    around (``x`` itself, in float32, without a centre). The one place the sum is made, so
    that a run, its replay and a board's re-check draw at the same float32 points."""
    x = x.to(dtype=torch.float32)
    if centre is None:
        return x
    centre = torch.as_tensor(centre, dtype=torch.float32).to(x.device)
    return x + centre.reshape(x.shape)


def centre_change(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """max_i |a_i − b_i| / max_i |b_i| of each row of two centres [..., d] (a centre may be
    0 where a scale may not: 0 where the rows are equal, relative to the smallest normal
    float32 where b is 0)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    gap = np.abs(a - b).max(axis=-1)
    return np.where(gap > 0, gap / np.maximum(np.abs(b).max(axis=-1), TINY), 0.0)


def centre_deviation(a: np.ndarray, b: np.ndarray) -> float:
    """:func:`centre_change` of two centres [d] (inf where their shapes differ), as
    :func:`harness.engine.scale.relative_deviation` compares two scales."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return float("inf")
    return float(centre_change(a, b)) if a.size else 0.0


def recorded_centre(draws: Mapping[str, Any] | None) -> np.ndarray | None:
    """The centre a certificate's base draws were made at, or None (centred at x)."""
    base = (draws or {}).get("base") or {}
    return None if base.get("centre") is None else decode_centre(base["centre"])


def drawn_with_centre(rows: list[Mapping[str, Any]]) -> bool:
    """Whether any of the stored certificates ``rows`` was drawn around a centre."""
    return any(recorded_centre(r.get("draws")) is not None for r in rows)


def recorded_centres(bases: list[Mapping[str, Any]]) -> list[str] | None:
    """The recorded centres of stored base draws, as a replay request carries them (None
    where none was drawn around a centre: the request is then as before centres existed)."""
    centres = [base.get("centre") for base in bases]
    return None if all(c is None for c in centres) else centres


def request_centres(centre: list[str | None] | None, count: int) -> np.ndarray | None:
    """The centres [B, d] a replay request's inputs are drawn around (None: at x); an
    input recorded without one is centred at 0 (as drawn)."""
    if centre is None:
        return None
    if len(centre) != count:
        raise ValueError(f"{len(centre)} recorded centres for {count} inputs")
    rows = [None if text is None else decode_centre(text) for text in centre]
    dims = next(len(r) for r in rows if r is not None)
    return np.stack([np.zeros(dims, SCALE_DTYPE) if r is None else r for r in rows])
