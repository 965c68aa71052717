"""The base model's outputs at points drawn for several inputs, each input's classifier
its own where the model has one per input.

A σ-provider that reads the base model (a search or an ascent on its outputs at noisy
copies of each input) asks it through :func:`outputs_for_inputs`, naming the input each
point stands for. Any model answers ``model(points)``; a model with a classifier per
input (check S1's exact classifiers, one per trial, inside their ``per_input``:
:mod:`harness.audit.analytic`) answers each point with its input's classifier, so the
checks ask σ of all their trials in one call. A provider that calls the model directly
is asked trial by trial instead: the same σ, more calls.
"""

from __future__ import annotations

import torch


def outputs_for_inputs(
    model: torch.nn.Module, points: torch.Tensor, inputs: torch.Tensor, owner: torch.Tensor
) -> torch.Tensor:  # fmt: skip
    """The base model's outputs at ``points`` [P, *shape], point r drawn for the input
    ``inputs[owner[r]]`` (``owner`` [P] on any device; −1: drawn for no input, such as
    padding, whose output the caller discards)."""
    evaluate = getattr(model, "outputs_for", None)
    return model(points) if evaluate is None else evaluate(points, inputs, owner)
