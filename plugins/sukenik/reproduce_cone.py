"""Reproduce Súkeník et al. (2022), App. A.5 (Table 5, Fig. 10): IDRS vs constant σ on cone-N.

For N in {2, 6, 18, 60, 180, 400}, one base model per N (trained without augmentation,
as in the paper) is certified by ``cohen`` at the paper's constant σ and by ``sukenik``
at its σ_b and rate r, with σ(x) <= 5σ_b. Run::

    python3 -m plugins.sukenik.reproduce_cone [--db PATH] [--test-count 200] [--n 10000]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from harness.api import run

# N: (constant σ, [(σ_b, r), ...]) — App. A.5 and Table 5
SETUPS: dict[int, tuple[float, list[tuple[float, float]]]] = {
    2: (0.5, [(0.4, 0.2), (0.5, 0.2)]),
    6: (0.5, [(0.4, 0.1)]),
    18: (1.0, [(0.8, 0.05)]),
    60: (1.0, [(0.8, 0.03), (1.0, 0.03)]),
    180: (2.0, [(1.9, 0.01)]),
    400: (2.0, [(1.95, 0.005)]),
}
RADII = (0.0, 0.5, 1.0, 2.0, 4.0)


def cone_spec(dim: int, test_count: int, n: int, epochs: int = 30) -> dict:
    sigma, idrs = SETUPS[dim]
    return {
        "name": f"cone-{dim}",
        "dataset": {"name": f"cone-{dim}", "test_count": test_count},
        "model": {"architecture": "mlp", "trainer": "gaussian-augmentation",
                  "trainer_params": {"sigma": 0.0, "epochs": epochs}},
        "certification": {"n0": 100, "n": n, "alpha": 0.001, "batch_size": 4096},
        "radii": list(RADII),
        "methods": [
            {"name": "cohen", "settings": [{"sigma": sigma}]},
            {"name": "sukenik", "settings": [{"sigma": sb, "rate": r, "max_ratio": 5.0} for sb, r in idrs]},
        ],
    }  # fmt: skip


def reproduce(
    db: Path, test_count: int, n: int, dims=tuple(SETUPS), quiet: bool = False
) -> list[dict]:
    """Run every N; return one row per (N, method, setting) with clean and certified accuracy."""
    rows = []
    for dim in dims:
        result = run(cone_spec(dim, test_count, n), db=db, check=False, progress=not quiet)
        rows += [{"N": dim, **row} for row in result["summary"].to_dict("records")]
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, default=Path("cone-reproduction.sqlite"))
    parser.add_argument("--test-count", type=int, default=200)
    parser.add_argument("--n", type=int, default=10_000)
    args = parser.parse_args(argv)
    rows = reproduce(args.db, args.test_count, args.n)
    table = Table(title="Súkeník et al. App. A.5 on cone-N: constant σ (cohen) vs IDRS (sukenik)")
    for column in ("N", "method", "setting", "clean acc", *[f"cert@{r:g}" for r in RADII], "ACR"):
        table.add_column(column)
    for r in rows:
        table.add_row(str(r["N"]), r["method"], r["setting"], f"{r['clean_accuracy']:.3f}",
                      *[f"{r['certified_accuracy'][f'{x:g}']:.3f}" for x in RADII], f"{r['acr']:.3f}")  # fmt: skip
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
