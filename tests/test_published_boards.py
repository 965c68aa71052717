"""Every board published in leaderboards/ verifies and replays with the current code: a
board made by an earlier format or an earlier declaration of its methods is read by what
its records mean (``--verify BOARD --replay K``, as a reviewer types it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.audit.evidence import Declaration

ROOT = Path(__file__).resolve().parents[1]
BOARDS = sorted(p.name for p in (ROOT / "leaderboards").glob("*.md") if p.name != "README.md")
FASHION = Path("/usr/share/datasets/fashion-mnist")


def test_every_published_board_is_tested():
    assert {"quick.md", "fashion-mnist.md", "fashion-mnist-sequential.md"} <= set(BOARDS)


@pytest.mark.skipif(not FASHION.is_dir(), reason="the boards' replays need Fashion-MNIST "
                    "(apt-get install dataset-fashion-mnist)")  # fmt: skip
@pytest.mark.parametrize("board", BOARDS)
def test_a_published_board_verifies_and_replays(board):
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli.main", "leaderboard", "--verify",
         f"leaderboards/{board}", "--replay", "2", "--device", "cpu"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert f"leaderboards/{board}: verified" in out, out[-3000:]
    assert f"leaderboards/{board}: replayed" in out, out[-3000:]


def _formula(threshold: bool, inner: dict | None = None) -> dict:
    record = {"name": "cohen", "recompute": "harness.mathematics.radius.cohen_recompute"}
    if threshold:
        record["threshold"] = "harness.mathematics.radius.cohen_threshold"
    return {**record, "inner": inner} if inner is not None else record


def _declaration(formula: dict) -> dict:
    return {"formula": formula, "regularity": {"kind": "constant"}, "smoothing": "hard",
            "sigma_smoothing": None}  # fmt: skip


@pytest.mark.parametrize("ours, theirs, same", [
    (_formula(True), _formula(False), True),  # recorded before thresholds were
    (_formula(True), _formula(True), True),
    (_formula(False), _formula(True), False),  # the installed method lost its threshold
    ({**_formula(True), "recompute": "x.y"}, _formula(False), False),
    ({**_formula(True), "name": "memory(cohen)", "inner": _formula(True)},
     {**_formula(False), "name": "memory(cohen)", "inner": _formula(False)}, True),
    ({**_formula(True), "inner": {**_formula(True), "recompute": "x.y"}},
     {**_formula(False), "inner": _formula(False)}, False),
])  # fmt: skip
def test_declarations_are_compared_by_what_they_mean(ours, theirs, same):
    assert Declaration.same_meaning(_declaration(ours), _declaration(theirs)) is same
    changed = {**_declaration(theirs), "smoothing": "soft"}
    assert not Declaration.same_meaning(_declaration(ours), changed)
