"""What the engine accumulates per input from the base model's outputs on its noisy
samples: class counts (hard smoothing) or sums of softmax outputs and of their squares
(soft smoothing), on the device. Once inputs are done, :meth:`fetch` copies their rows to
pinned host memory without blocking (CUDA; :class:`~harness.engine.sampling.
SamplingEngine` hands them out once the copy has landed); on a CPU the rows are read
where they are.

Both are deterministic (:mod:`harness.engine.determinism`): counts are integer additions,
exact in any order; soft sums add each input's rows in order (on a CPU ``index_add_`` runs
through the rows; on CUDA ``index_put_(accumulate=True)`` sorts the rows by input, stably,
and sums each input's rows of the batch in order, where ``index_add_`` would add float
atomics in whatever order the threads arrive), so the same batches give the same bits."""

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


def _host(tensor: torch.Tensor) -> torch.Tensor:
    """Where ``tensor``'s finished rows are read: itself on a CPU, else pinned memory."""
    if tensor.device.type == "cpu":
        return tensor
    return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)


class HardCounts:
    """Hard smoothing: per input, how often each class is argmax f(x + σε)."""

    def __init__(self, inputs: int, classes: int, batch_size: int, device: torch.device) -> None:
        self.classes = classes
        self.counts = torch.zeros(inputs, classes, device=device, dtype=torch.int64)
        self._host = _host(self.counts)
        self._ones = torch.ones(batch_size, dtype=torch.int64, device=device)

    def begin_window(self, rows: torch.Tensor) -> None:
        """A window's rows (job index per row): where each row's count cell starts."""
        self._cells = rows * self.classes

    def add(self, lo: int, hi: int, rows: torch.Tensor, logits: torch.Tensor) -> None:
        """Rows ``lo:hi`` of the window, with their logits: one count each."""
        cells = self._cells[lo:hi] + logits.argmax(dim=1)
        # integer atomics are exact in any order: under torch's deterministic mode (which
        # would sort every batch's cells instead) they run as atomics all the same
        strict = self.counts.is_cuda and torch.are_deterministic_algorithms_enabled()
        if strict:
            warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
            torch.use_deterministic_algorithms(False)
        try:
            self.counts.view(-1).index_add_(0, cells, self._ones[: hi - lo])
        finally:
            if strict:
                torch.use_deterministic_algorithms(True, warn_only=warn_only)

    def fetch(self, lo: int, hi: int) -> None:
        """Start copying the counts of inputs ``lo:hi`` (all done) to the host."""
        if self._host is not self.counts:
            self._host[lo:hi].copy_(self.counts[lo:hi], non_blocking=True)

    def result(self, index: int, num: int) -> np.ndarray:
        """Input ``index``'s counts, once :meth:`fetch` has landed."""
        return self._host[index].numpy()


class SoftSums:
    """Soft smoothing: per input, Σ softmax f(x + σε) and Σ of its squares, in float64."""

    def __init__(self, inputs: int, classes: int, batch_size: int, device: torch.device) -> None:
        self.sums = torch.zeros(inputs, classes, device=device, dtype=torch.float64)
        self.sums_sq = torch.zeros_like(self.sums)
        self._host, self._host_sq = _host(self.sums), _host(self.sums_sq)

    def begin_window(self, rows: torch.Tensor) -> None:
        pass

    def add(self, lo: int, hi: int, rows: torch.Tensor, logits: torch.Tensor) -> None:
        probs = torch.softmax(logits.double(), dim=1)
        if self.sums.is_cuda:  # sorted by input, each input's rows added in order
            self.sums.index_put_((rows,), probs, accumulate=True)
            self.sums_sq.index_put_((rows,), probs * probs, accumulate=True)
        else:
            self.sums.index_add_(0, rows, probs)
            self.sums_sq.index_add_(0, rows, probs * probs)

    def fetch(self, lo: int, hi: int) -> None:
        """Start copying the sums of inputs ``lo:hi`` (all done) to the host."""
        if self._host is not self.sums:
            self._host[lo:hi].copy_(self.sums[lo:hi], non_blocking=True)
            self._host_sq[lo:hi].copy_(self.sums_sq[lo:hi], non_blocking=True)

    def result(self, index: int, num: int) -> SoftStats:
        """Input ``index``'s sums, once :meth:`fetch` has landed."""
        return SoftStats(num, self._host[index].numpy(), self._host_sq[index].numpy())
