"""The anisotropic regions a table's rows claim beside their ℓ2 balls: shown, never ranked.

A certificate drawn at a diagonal scale may claim the ellipsoid {δ : ‖Σ^{-1/2}δ‖₂ <= κ}
(Eiras et al., ANCER, TMLR 2022, Thm 1; :mod:`harness.engine.scale`), recorded with its
proxy radius κ·(∏σ_i)^{1/d}: the radius of the ball of the same volume, ANCER's measure
of a region's size (its §4). It is not an ℓ2 radius (along the smallest axis the ellipsoid
ends at κ·σ_min, the certificate's ℓ2 radius, below the proxy radius), so a board shows
it in a section of its own, per row: how many correctly classified inputs claim an
ellipsoid, their proxy radii (median) and the mean proxy radius over all inputs (0 where
none is claimed or the class is wrong, as the ACR counts), beside the row's ACR and
verdict, which is the row's: an ellipsoid claim is audited with its certificate
(docs/soundness.md, "A diagonal scale").
"""

from __future__ import annotations

from harness.reports.leaderboard.board import Table
from harness.reports.leaderboard.escape import md_text
from harness.reports.leaderboard.per_radius_markdown import identity_columns


def regions_section(table: Table) -> list[str]:
    """The markdown section of ``table``'s claimed regions ([] where no row claims one)."""
    rows = [row for row in table.rows if row.regions is not None]
    if not rows:
        return []
    names, identity = identity_columns(table)
    out = ["### Anisotropic regions: the ellipsoids claimed beside the ℓ2 balls (not ranked)", "",
           "Certificates drawn at a diagonal scale Σ(x) also claim the ellipsoid "
           "{δ : ‖Σ^(-1/2)δ‖ ≤ κ}, κ = Φ⁻¹(p_A_lower) (Eiras et al. 2022, Thm 1). Its proxy "
           "radius κ·(∏σ_i)^(1/d) is the radius of the ball of the same volume (ANCER's "
           "measure), not an ℓ2 radius: the ellipsoid reaches only κ·σ_min, the ℓ2 radius "
           "above, along its smallest axis. Each row's verdict covers its ellipsoids too.", "",
           "| " + " | ".join([*names, "verdict", "inputs with an ellipsoid",
                              "proxy radius (median)", "mean proxy radius", "ACR"]) + " |",
           "|" + "|".join([":--"] * len(names) + [":--", "--:", "--:", "--:", "--:"]) + "|"]  # fmt: skip
    for row in rows:
        r = row.regions
        median = "–" if r["median"] is None else f"{r['median']:.3f}"
        mean = "–" if r["mean"] is None else f"{r['mean']:.3f}"
        acr = row.metrics.get("acr")
        cells = [*identity(row), md_text(row.verdict), f"{r['claimed']} of {r['inputs']}", median,
                 mean, "–" if acr is None else f"{acr:.3f}"]  # fmt: skip
        out.append("| " + " | ".join(cells) + " |")
    return [*out, ""]
