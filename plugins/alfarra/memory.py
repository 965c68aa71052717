"""Memory-based certification (Alfarra et al. 2022, §3.5, App. C, Alg. 3, Fig. 2).

The memory M = [(x_i, c_i, R_i)] holds every input certified so far with its final
prediction c_i and radius R_i. The region of entry i is the open ball
B(x_i, R_i) = {x : ‖x − x_i‖ < R_i} together with the point x_i itself (the classifier
answered c_i there, even with R_i = 0, e.g. an abstention). Invariant: regions of
entries with different predictions are disjoint, i.e. for c_i ≠ c_j

    ‖x_i − x_j‖ >= R_i + R_j   and   x_i ≠ x_j.

Alg. 3 inserts a new certificate (x, c, R) by walking M in insertion order; for each
entry i with c_i ≠ c (c as updated so far):

- x in the region of i (‖x − x_i‖ < R_i, or x = x_i): LargestInSubset, c ← c_i and
  R ← min(R, R_i − ‖x − x_i‖), the largest ball around x inside both B(x, R) and R_i;
- else if the balls intersect (‖x − x_i‖ < R_i + R): LargestOutSubset,
  R ← ‖x − x_i‖ − R_i, the largest ball around x that does not meet R_i.

This is the algorithm as the paper describes it (App. C), not its published code,
whose overlap branch unpacks a one-argument ``torch.min`` into two values and whose
inside branch ignores R. Radii never grow, and once c switches to c_i the new region
lies inside R_i, which meets no other class's region, so the invariant is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from harness import IdrsError

KEPT, INSIDE, SHRUNK = "kept", "inside", "shrunk"
"""What the memory did to a certificate: nothing, LargestInSubset, LargestOutSubset only."""


@dataclass(frozen=True)
class Resolution:
    """The outcome of Alg. 3 for one new certificate."""

    prediction: int
    radius: float
    action: str
    decided_by: tuple[int, ...] = ()
    """Positions in the memory of the entries that changed the certificate, in order."""


def resolve(
    distances: np.ndarray,
    predictions: np.ndarray,
    radii: np.ndarray,
    prediction: int,
    radius: float,
) -> Resolution:
    """Alg. 3 for (x, ``prediction``, ``radius``) against a memory that satisfies the invariant.

    ``distances[i]`` = ‖x − x_i‖, ``predictions[i]`` = c_i, ``radii[i]`` = R_i, in
    insertion order. Entries that change nothing are skipped with one vectorized test,
    so the walk visits only the (few) entries that act.
    """
    distances = np.asarray(distances, dtype=np.float64)
    predictions = np.asarray(predictions)
    radii = np.asarray(radii, dtype=np.float64)
    inside = (distances < radii) | (distances == 0.0)
    c, r = int(prediction), float(radius)
    action, decided = KEPT, []
    start = 0
    while start < len(distances):
        acts = (predictions[start:] != c) & (
            inside[start:] | (distances[start:] < radii[start:] + r)
        )
        hits = np.flatnonzero(acts)
        if len(hits) == 0:
            break
        i = start + int(hits[0])
        if inside[i]:  # LargestInSubset
            c, r, action = int(predictions[i]), min(r, float(radii[i] - distances[i])), INSIDE
        else:  # LargestOutSubset
            r = float(distances[i] - radii[i])
            action = SHRUNK if action == KEPT else action
        decided.append(i)
        start = i + 1
    return Resolution(c, max(r, 0.0), action, tuple(decided))


@dataclass(frozen=True)
class MemoryEntry:
    """One element of M, with the certificate it came from."""

    position: int
    input_id: int
    prediction: int
    radius: float
    raw_prediction: int
    raw_radius: float
    action: str = KEPT
    decided_by: tuple[int, ...] = field(default=())


class Memory:
    """M of Alg. 3: inputs (kept as float64 on ``device``), predictions and radii.

    Entries are immutable once inserted; an input id already in M returns its entry
    (as the paper's code does for a repeated image), so a resumed run that certifies
    again an input whose certificate was lost in a crash gets the same answer.
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.entries: list[MemoryEntry] = []
        self._by_id: dict[int, int] = {}
        self._x: torch.Tensor | None = None
        self._predictions = np.empty(0, dtype=np.int64)
        self._radii = np.empty(0, dtype=np.float64)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, input_id: int) -> bool:
        return int(input_id) in self._by_id

    @property
    def predictions(self) -> np.ndarray:
        return self._predictions[: len(self)]

    @property
    def radii(self) -> np.ndarray:
        return self._radii[: len(self)]

    @property
    def inputs(self) -> torch.Tensor:
        """The stored inputs, flattened, [len(M), d] float64."""
        if self._x is None:
            return torch.empty(0, 0, dtype=torch.float64, device=self.device)
        return self._x[: len(self)]

    def distances(self, x: torch.Tensor) -> np.ndarray:
        """‖x − x_i‖ for every entry, in float64 (one vectorized pass on the device)."""
        if len(self) == 0:
            return np.empty(0)
        flat = x.detach().to(self.device, torch.float64).flatten()
        return torch.linalg.vector_norm(self.inputs - flat, dim=1).cpu().numpy()

    def certify(
        self, input_id: int, x: torch.Tensor, prediction: int, radius: float
    ) -> MemoryEntry:
        """Alg. 3: the adjusted certificate of x, added to M (or M's entry if already there)."""
        input_id = int(input_id)
        if input_id in self._by_id:
            entry = self.entries[self._by_id[input_id]]
            if not torch.equal(self.inputs[entry.position], _flat64(x, self.device)):
                raise IdrsError(
                    f"input {input_id} is already in the certification memory with a different "
                    "content; the run's stored memory belongs to other data (use a new --db)"
                )
            return entry
        res = resolve(self.distances(x), self.predictions, self.radii, prediction, radius)
        entry = MemoryEntry(
            len(self), input_id, res.prediction, res.radius, int(prediction), float(radius),
            res.action, res.decided_by,
        )  # fmt: skip
        self.add(entry, x)
        return entry

    def add(self, entry: MemoryEntry, x: torch.Tensor) -> None:
        """Append an already resolved entry (restoring a persisted memory)."""
        if entry.position != len(self) or entry.input_id in self._by_id:
            raise IdrsError(f"memory entry {entry} does not continue the memory of {len(self)}")
        flat = _flat64(x, self.device)
        if self._x is None:
            self._x = torch.empty((16, flat.numel()), dtype=torch.float64, device=self.device)
        elif flat.numel() != self._x.shape[1]:
            raise IdrsError(
                f"input of {flat.numel()} values in a memory of {self._x.shape[1]}-value inputs"
            )
        n = len(self)
        if n == len(self._x):
            self._x = torch.cat([self._x, torch.empty_like(self._x)])
        if n == len(self._predictions):
            size = max(16, 2 * n)
            self._predictions = np.resize(self._predictions, size)
            self._radii = np.resize(self._radii, size)
        self._x[n] = flat
        self._predictions[n] = entry.prediction
        self._radii[n] = entry.radius
        self._by_id[entry.input_id] = n
        self.entries.append(entry)


def _flat64(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    return x.detach().to(device, torch.float64).flatten()
