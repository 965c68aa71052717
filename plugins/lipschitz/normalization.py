"""Base-output normalization g = (1 − n·p_min)·softmax + p_min (Bergstrom et al., Remark 2).

Every g_i then lies in [p_min, 1 − (n − 1)·p_min] ⊂ [p_min, 1 − p_min], so ḡ_i does too, as
Thm 2 and Thm 3 require. The wrapper returns **log g** (in float64): the sampling engine's
soft statistics apply a softmax to the model output, and softmax(log g) = g / Σ_i g_i = g
because Σ_i g_i = 1 exactly in real arithmetic; in float64 the recovered g differs from g by
a relative 1e-15, far below any confidence width. log g is formed as
logaddexp(log(1 − n·p_min) + log_softmax(z), log p_min), which neither underflows nor loses
the p_min floor (a float32 log would blur g near p_min by a relative ~1e-6).
"""

from __future__ import annotations

import math

import torch

from harness import ParameterError


class NormalizedModel(torch.nn.Module):
    """Wraps logits z = base(x) into log g, g = (1 − n·p_min)·softmax(z) + p_min (Remark 2).

    :param base: the base classifier returning logits [B, n].
    :param num_classes: n.
    :param p_min: the floor; needs 0 < n·p_min < 1.
    """

    def __init__(self, base: torch.nn.Module, num_classes: int, p_min: float) -> None:
        super().__init__()
        if not (p_min > 0.0 and num_classes * p_min < 1.0):
            raise ParameterError(
                f"p_min must satisfy 0 < num_classes·p_min < 1, got p_min={p_min!r} with "
                f"{num_classes} classes"
            )
        self.base = base
        self.num_classes = int(num_classes)
        self.p_min = float(p_min)
        self._log_scale = math.log1p(-num_classes * p_min)
        self._log_floor = math.log(p_min)

    def log_probabilities(self, x: torch.Tensor) -> torch.Tensor:
        """log g(x) in float64, shape [B, n]."""
        log_softmax = torch.log_softmax(self.base(x).double(), dim=1)
        # the floor is made on the logits' device: the base model may have no parameters,
        # or be moved after wrapping, so no device is fixed at construction
        floor = log_softmax.new_tensor(self._log_floor)
        return torch.logaddexp(log_softmax + self._log_scale, floor)

    def probabilities(self, x: torch.Tensor) -> torch.Tensor:
        """g(x) in float64, shape [B, n]; every entry in [p_min, 1 − (n − 1)·p_min]."""
        return torch.exp(self.log_probabilities(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.log_probabilities(x)
