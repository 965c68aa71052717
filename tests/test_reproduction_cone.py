"""Súkeník et al. App. A.5 on cone-N (long: behind the ``reproduction`` marker).

Run with ``python3 -m pytest -m reproduction -s``. Table 5's pattern reproduced here:
with σ_b < σ, IDRS loses no clean accuracy against constant σ.
"""

import pytest

from plugins.sukenik.reproduce_cone import reproduce

pytestmark = pytest.mark.reproduction


@pytest.mark.parametrize("dim", [2, 60])
def test_idrs_keeps_clean_accuracy_of_constant_sigma(tmp_path, dim):
    rows = reproduce(tmp_path / "cone.sqlite", test_count=200, n=2000, dims=(dim,), quiet=True)
    cohen = next(r for r in rows if r["method"] == "cohen")
    idrs = [r for r in rows if r["method"] == "sukenik"]
    for row in idrs:
        print(dim, row["setting"], row["clean_accuracy"], "vs constant σ", cohen["clean_accuracy"])
    assert max(r["clean_accuracy"] for r in idrs) >= cohen["clean_accuracy"] - 0.02
