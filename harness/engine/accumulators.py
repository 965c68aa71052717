"""What the engine accumulates per input from the base model's outputs on its noisy
samples: class counts (hard smoothing) or sums of softmax outputs and of their squares
(soft smoothing), on the device, copied to the host once an input is done."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class SoftStats:
    """Soft smoothing evidence of one input: per-class sums of probabilities and squares."""

    num: int
    sums: np.ndarray
    sums_sq: np.ndarray

    @property
    def means(self) -> np.ndarray:
        return self.sums / self.num


class HardCounts:
    """Hard smoothing: per input, how often each class is argmax f(x + σε)."""

    def __init__(self, inputs: int, classes: int, batch_size: int, device: torch.device) -> None:
        self.classes = classes
        self.counts = torch.zeros(inputs, classes, device=device, dtype=torch.int64)
        self._ones = torch.ones(batch_size, dtype=torch.int64, device=device)

    def begin_window(self, rows: torch.Tensor) -> None:
        """A window's rows (job index per row): where each row's count cell starts."""
        self._cells = rows * self.classes

    def add(self, lo: int, hi: int, rows: torch.Tensor, logits: torch.Tensor) -> None:
        """Rows ``lo:hi`` of the window, with their logits: one count each."""
        cells = self._cells[lo:hi] + logits.argmax(dim=1)
        self.counts.view(-1).index_add_(0, cells, self._ones[: hi - lo])

    def result(self, index: int, num: int) -> np.ndarray:
        return self.counts[index].cpu().numpy()


class SoftSums:
    """Soft smoothing: per input, Σ softmax f(x + σε) and Σ of its squares, in float64."""

    def __init__(self, inputs: int, classes: int, batch_size: int, device: torch.device) -> None:
        self.sums = torch.zeros(inputs, classes, device=device, dtype=torch.float64)
        self.sums_sq = torch.zeros_like(self.sums)

    def begin_window(self, rows: torch.Tensor) -> None:
        pass

    def add(self, lo: int, hi: int, rows: torch.Tensor, logits: torch.Tensor) -> None:
        probs = torch.softmax(logits.double(), dim=1)
        self.sums.index_add_(0, rows, probs)
        self.sums_sq.index_add_(0, rows, probs * probs)

    def result(self, index: int, num: int) -> SoftStats:
        return SoftStats(num, self.sums[index].cpu().numpy(), self.sums_sq[index].cpu().numpy())
