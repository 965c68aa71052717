"""What a check costs: its wall time, the σ queries it makes, the samples drawn for it.

A method's σ(x) is queried by the checks at many more points than the ones it certified
(S1 certifies on exact classifiers, S2 and S3 search around and inside certified balls,
S4 attacks), so a σ that is costly to compute makes the audit costly. Each check's
:class:`Cost` is stored beside its verdict (``checks.cost``; the empirical attack's in
``attacks.cost``) and shown by ``idrs-bench run --timings``, ``check --timings`` and
``results``:

- ``seconds``: wall time of the check;
- ``sigma_calls``, ``sigma_points``: calls of the method's σ-provider, and the points
  they asked about, whether the check calls it or S1's rebuilt copies
  (:meth:`~harness.audit.audit.Audit.rebuild`), a memoized answer included;
- ``samples``: noisy samples the harness's engines drew in this process (the method's
  own Monte Carlo through ``context.engine`` included; a hosted plugin's draws happen in
  its host), and ``forward_rows``: rows they passed through base models, padding
  included (:data:`harness.engine.sampling.TALLY`; an
  :class:`~harness.engine.exact.ExactSampling` sample costs no row).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import torch

from harness.engine.sampling import TALLY


class SigmaQueries:
    """Calls of a method's σ-providers and the points they were asked about."""

    def __init__(self) -> None:
        self.calls = 0
        self.points = 0

    def counting(self, provider: Any) -> CountingSigma:
        """``provider``, its calls counted here (a provider already counted is unwrapped)."""
        return CountingSigma(getattr(provider, "uncounted", provider), self)


class CountingSigma:
    """A σ-provider whose calls are counted in a :class:`SigmaQueries`; every attribute is
    the provider's own (``uncounted`` is the provider itself)."""

    def __init__(self, provider: Any, queries: SigmaQueries) -> None:
        self.uncounted = provider
        self._queries = queries

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self._queries.calls += 1
        self._queries.points += len(x)
        return self.uncounted(x)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.uncounted, name)


@dataclass(frozen=True)
class Cost:
    """One check's cost (module docstring)."""

    seconds: float
    sigma_calls: int
    sigma_points: int
    samples: int
    forward_rows: int

    def record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: Any) -> Cost | None:
        """From a stored record (None for a check stored before costs were)."""
        if not isinstance(record, dict):
            return None
        try:
            return cls(**{k: type(v)(record[k]) for k, v in asdict(ZERO).items()})
        except (KeyError, TypeError, ValueError):
            return None

    def __add__(self, other: Cost) -> Cost:
        return Cost(*(a + b for a, b in zip(asdict(self).values(), asdict(other).values(),
                                            strict=True)))  # fmt: skip


ZERO = Cost(0.0, 0, 0, 0, 0)


@contextmanager
def measured(queries: SigmaQueries) -> Iterator[Callable[[], Cost]]:
    """Measures what runs inside; yields a function that returns its :class:`Cost` so far."""
    start = (time.perf_counter(), queries.calls, queries.points, TALLY.samples, TALLY.rows)

    def cost() -> Cost:
        return Cost(time.perf_counter() - start[0], queries.calls - start[1],
                    queries.points - start[2], TALLY.samples - start[3], TALLY.rows - start[4])  # fmt: skip

    yield cost
