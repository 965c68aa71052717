"""Searching inside a certified ball B(x0, R) in floating point: the radius to search
within so that every point asked, once rounded, lies in the ball (S3's searches of σ
and of a diagonal scale: a point found outside it would flag a sound certificate)."""

from __future__ import annotations

import math

import torch


def inside_radius(flat: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    """The radius to search within so that every point x0 + δ, rounded to ``flat``'s dtype,
    lies in B(x0, R): R less twice the rounding of √d coordinates of magnitude up to
    max|x0| + R (unit roundoff u), and 2⁻²⁰·R for the rounding of ‖δ‖."""
    unit = torch.finfo(flat.dtype).eps / 2
    reach = flat.abs().amax(dim=1) + radius
    slack = 2 * math.sqrt(flat.shape[1]) * unit * reach + radius * 2.0**-20
    return (radius - slack).clamp_min(0)
