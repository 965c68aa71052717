"""The certification protocol every method of a benchmark shares."""

from __future__ import annotations

from dataclasses import dataclass

from harness.errors import ParameterError


@dataclass(frozen=True)
class CertificationProtocol:
    """Cohen et al. (2019) CERTIFY: ``n0`` samples select the class, ``n`` estimate p_A.

    ``alpha`` is the failure probability of each certificate; ``batch_size`` the
    number of noisy samples per forward pass.
    """

    n0: int = 100
    n: int = 100_000
    alpha: float = 0.001
    batch_size: int = 1024

    def __post_init__(self) -> None:
        check_alpha(self.alpha)
        if not isinstance(self.n, int) or self.n < 1:
            raise ParameterError(f"n must be an integer >= 1, got {self.n!r}")
        if not isinstance(self.n0, int) or self.n0 < 1:
            raise ParameterError(f"n0 must be an integer >= 1, got {self.n0!r}")
        if self.n0 > self.n:
            raise ParameterError(
                f"n0 ({self.n0}) must not exceed n ({self.n}): n0 samples only select "
                "the class, n samples estimate its probability"
            )
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ParameterError(f"batch_size must be an integer >= 1, got {self.batch_size!r}")


def check_alpha(alpha: float) -> float:
    """Return ``alpha`` if it lies in the open interval (0, 1), else raise."""
    if not (isinstance(alpha, int | float) and 0.0 < alpha < 1.0):
        raise ParameterError(f"alpha must lie in (0, 1), got {alpha!r}")
    return float(alpha)


def check_sigma(sigma: float, name: str = "sigma") -> float:
    """Return ``sigma`` if it is a positive finite number, else raise."""
    if not (isinstance(sigma, int | float) and 0.0 < sigma < float("inf")):
        raise ParameterError(f"{name} must be a positive number, got {sigma!r}")
    return float(sigma)
