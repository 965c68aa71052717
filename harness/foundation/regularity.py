"""What a σ-provider declares about σ(x), and therefore what a certificate may rely on.

A certificate for input-dependent smoothing is only as good as the regularity of
σ(x). Súkeník et al. (2022), Def. 3.1 and Thm 3.2, need semi-elasticity;
the Lipschitz σ-network certificate (Bergstrom et al., Thm 3) needs a Lipschitz bound
and a floor σ_min; Cohen et al. (2019) needs σ constant.

A σ-provider that answers a diagonal scale σ_1(x) … σ_d(x) declares the same of every
axis i (``Constant``: the whole scale is the same at every x), which makes the smallest
axis, the certificate's σ, as regular (S2 holds every axis to it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Constant:
    """σ(x) = sigma for every x."""

    sigma: float

    def describe(self) -> str:
        return f"constant σ={self.sigma:g}"


@dataclass(frozen=True)
class SemiElastic:
    """|log σ(x0) − log σ(x1)| <= rate · ‖x0 − x1‖ (Súkeník et al. 2022, Def. 3.1)."""

    rate: float

    def describe(self) -> str:
        return f"{self.rate:g}-semi-elastic"


@dataclass(frozen=True)
class Lipschitz:
    """|σ(x0) − σ(x1)| <= lip · ‖x0 − x1‖ and σ(x) >= sigma_min (Bergstrom et al., Thm 3)."""

    lip: float
    sigma_min: float

    def describe(self) -> str:
        return f"{self.lip:g}-Lipschitz, σ >= {self.sigma_min:g}"


@dataclass(frozen=True)
class Unregularized:
    """No guarantee at all (e.g. σ optimized per input)."""

    def describe(self) -> str:
        return "unregularized"


Regularity = Constant | SemiElastic | Lipschitz | Unregularized


def regularity_record(regularity: Regularity) -> dict[str, object]:
    """A declared regularity as data (``{"kind": "SemiElastic", "rate": 0.01}``), as a
    board's run export records it."""
    from dataclasses import asdict

    return {"kind": type(regularity).__name__, **asdict(regularity)}


def regularity_from_record(record: dict[str, object]) -> Regularity:
    """The inverse of :func:`regularity_record`, built only from this module's classes."""
    from harness.foundation.errors import IdrsError

    kinds = {cls.__name__: cls for cls in (Constant, SemiElastic, Lipschitz, Unregularized)}
    fields = {k: v for k, v in record.items() if k != "kind"}
    try:
        return kinds[str(record.get("kind"))](**fields)
    except (KeyError, TypeError):
        raise IdrsError(
            f"unknown regularity {record!r}; known kinds: {', '.join(sorted(kinds))}"
        ) from None
