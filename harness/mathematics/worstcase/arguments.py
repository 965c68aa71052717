"""Argument checks shared by the public functions of :mod:`harness.mathematics.worstcase`.

Each check converts to float64 (int64 for dimensions) and raises ``ValueError`` naming
the argument and its accepted range; :func:`as_result` returns a Python float for
scalar inputs and the array otherwise.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatOrArray = float | NDArray[np.float64]


def as_float(name: str, x: ArrayLike) -> NDArray[np.float64]:
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a real number or array of real numbers") from exc
    return arr


def check_prob(name: str, x: ArrayLike) -> NDArray[np.float64]:
    arr = as_float(name, x)
    if not np.all((arr >= 0.0) & (arr <= 1.0)):
        raise ValueError(f"{name} must lie in [0, 1] (got values outside that range or NaN)")
    return arr


def check_positive(name: str, x: ArrayLike) -> NDArray[np.float64]:
    arr = as_float(name, x)
    if not np.all(np.isfinite(arr) & (arr > 0.0)):
        raise ValueError(f"{name} must be finite and > 0 (accepted range: (0, inf))")
    return arr


def check_nonneg(name: str, x: ArrayLike) -> NDArray[np.float64]:
    arr = as_float(name, x)
    if not np.all(np.isfinite(arr) & (arr >= 0.0)):
        raise ValueError(f"{name} must be finite and >= 0 (accepted range: [0, inf))")
    return arr


def check_dim(dim: ArrayLike) -> NDArray[np.int64]:
    arr = np.asarray(dim)
    if arr.dtype == np.bool_ or not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
    ):
        raise ValueError("dim must be an integer >= 1 (accepted range: 1, 2, 3, ...)")
    if np.issubdtype(arr.dtype, np.floating) and not np.all(
        np.isfinite(arr) & (arr == np.round(arr))
    ):
        raise ValueError("dim must be an integer >= 1 (accepted range: 1, 2, 3, ...)")
    if not np.all(arr >= 1):
        raise ValueError("dim must be an integer >= 1 (accepted range: 1, 2, 3, ...)")
    return arr.astype(np.int64)


def as_result(x: NDArray[np.float64], scalar: bool) -> FloatOrArray:
    if scalar:
        return float(x.reshape(-1)[0])
    return x
