"""Boards anyone can re-check: ``--verify`` re-derives every certificate and the verdicts
from the run export's evidence, ``--replay K`` re-draws K inputs per row from the files
shipped beside the board; an edited export (a radius, a count, a verdict) never verifies.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from harness.audit.audit import BUDGETS
from harness.audit.evidence import Declaration, check_evidence
from harness.audit.replay import check_replay
from harness.audit.session import audits
from harness.foundation.errors import IdrsError
from harness.foundation.progress import Progress
from harness.plugin.manager import PluginManager
from harness.reports.leaderboard import add_leaderboard_parser
from harness.reports.leaderboard.render import write_board
from harness.reports.leaderboard.source import EXPORT_FORMAT, read_export
from harness.reports.leaderboard.verify import verify_board
from harness.running.preparation import RunOptions
from harness.store.store import ResultStore
from harness.store.storedrun import load_runs

ENTROPY = "47b0a4dc0ffee"
"""The audits' and the replays' entropy: fixed, so that a verdict asserted here, and a
replication test's, is the same every time (with fresh entropy a sound row is flagged 1
time in 1,000, as the checks promise)."""


def _cli(argv: list[str]) -> int:
    """``idrs-bench leaderboard ARGV``; a replay on the CPU unless ``--device`` is given
    (the boards here are made on the CPU: their replays there are bit for bit), from
    :data:`ENTROPY` unless ``--entropy`` is given."""
    if "--replay" in argv and "--device" not in argv:
        argv = [*argv, "--device", "cpu"]
    if "--replay" in argv and "--entropy" not in argv:
        argv = [*argv, "--entropy", ENTROPY]
    parser = argparse.ArgumentParser()
    add_leaderboard_parser(parser.add_subparsers())
    args = parser.parse_args(["leaderboard", *argv])
    return args.handler(args)


def _check(db, run_id, manager, checks=(check_evidence, check_replay)) -> None:
    """Run S0 and the replay check on every row and store them (the other checks are
    the subject of their own tests)."""
    store = ResultStore(db)
    try:
        for audit in audits(store, run_id, RunOptions(db=db), Progress(enabled=False), manager,
                            budget=BUDGETS["small"], entropy=int(ENTROPY, 16)):  # fmt: skip
            for check in checks:
                result = check(audit)
                store.add_check(run_id, audit.method.name, audit.setting, result, "small")
    finally:
        store.close()


@pytest.fixture(scope="module")
def published(tmp_path_factory, replay_run):
    """A board of an honest row (cohen) and a rigged one (radius × 1.02, the soundness
    tests' ``inflated``), both audited by S0 and the replay check; its markdown's path."""
    import sys

    folder = tmp_path_factory.mktemp("published")
    manager = PluginManager(third_party=False)
    manager.register(sys.modules["tests.soundness_plugins"], name="soundness-test-plugins")
    db, run_id = replay_run(folder, manager, ["cohen", "inflated"], n=500, device="cpu")
    _check(db, run_id, manager)
    out = folder / "board" / "b.md"
    write_board(load_runs(db), out)
    return out


@pytest.fixture
def board(published, tmp_path):
    """A copy of the published board that a test may change."""
    shutil.copytree(published.parent, tmp_path / "board")
    return tmp_path / "board" / "b.md"


def _edited(board, tmp_path, edit, name="edited"):
    """A copy of the board whose export ``edit(data)`` changed, re-rendered from it (so
    that the markdown and the other files agree with the edited export)."""
    folder = tmp_path / name
    shutil.copytree(board.parent, folder)
    export = folder / "b.run.json"
    data = json.loads(export.read_text())
    edit(data)
    export.write_text(json.dumps(data))
    write_board(read_export(export), folder / "b.md")
    return folder / "b.md"


def _row(data, method):
    return next(g for g in data["runs"][0]["certificates"] if g["method"] == method)["columns"]


def _certified(columns) -> int:
    return next(k for k, p in enumerate(columns["prediction"]) if p >= 0)


def _check_record(data, method, check):
    return next(
        c for c in data["runs"][0]["checks"] if (c["method"], c["check"]) == (method, check)
    )


def test_a_board_verifies_and_replays(board, capsys):
    assert verify_board(board, notes=[]) == []
    assert _cli(["--verify", str(board), "--replay", "3"]) == 0
    out = capsys.readouterr().out
    assert "every certificate and the verdicts of S0 and the replay check re-derived" in out
    assert out.count("3/3 inputs agreed bit for bit") == 2
    assert f"replay entropy {int(ENTROPY, 16):032x} (device cpu)" in out  # repeatable
    with pytest.raises(IdrsError, match="--entropy repeats a replay: give it with --verify"):
        _cli(["--verify", str(board), "--entropy", ENTROPY])
    text = board.read_text()
    assert "--verify b.md --replay K" in text and "b.weights.pt" in text
    export = json.loads(board.with_suffix(".run.json").read_text())
    assert export["format"] == EXPORT_FORMAT == "idrs-bench/run-export/3"
    files = {f["role"]: f for f in export["runs"][0]["files"]}
    assert files["weights"]["file"] == "b.weights.pt" and (board.parent / "b.weights.pt").is_file()
    columns = _row(export, "cohen")
    assert {"p_lower", "alpha", "draws", "evidence"} <= set(columns)
    assert all(c["evidence"] for c in export["runs"][0]["checks"])


def test_a_board_written_before_the_layered_layout_still_replays(board, tmp_path, capsys):
    """S0's declaration names the formula by the module it lived in then
    (``harness.radius``): the same formula, so the board verifies and replays."""

    def before_the_layout(data):
        for check in data["runs"][0]["checks"]:
            if check["check"] == "evidence" and check["evidence"].get("declaration"):
                formula = check["evidence"]["declaration"]["formula"]
                formula["recompute"] = formula["recompute"].replace(
                    "harness.mathematics.radius.", "harness.radius."
                )

    edited = _edited(board, tmp_path, before_the_layout)
    assert "harness.radius.cohen_recompute" in edited.with_suffix(".run.json").read_text()
    assert verify_board(edited) == []
    assert _cli(["--verify", str(edited), "--replay", "2"]) == 0
    assert capsys.readouterr().out.count("2/2 inputs agreed bit for bit") == 2


def test_a_board_whose_declaration_differs_from_the_installed_method_does_not_replay(
    board, tmp_path, capsys
):  # fmt: skip
    """The export's S0 names a formula the installed method does not declare (its own
    name for the same function, so the certificates re-derive): no replay."""

    def another_name(data):
        for check in data["runs"][0]["checks"]:
            if check["method"] == "cohen" and check["check"] == "evidence":
                check["evidence"]["declaration"]["formula"]["name"] = "my-cohen"

    edited = _edited(board, tmp_path, another_name)
    assert verify_board(edited) == []
    assert _cli(["--verify", str(edited), "--replay", "2"]) == 1
    out = capsys.readouterr().out
    assert "first disagreement" in out and "the installed method declares" in out, out


@pytest.mark.parametrize("factor", [1.3, 0.9])
def test_an_edited_radius_never_verifies(board, tmp_path, factor):
    def edit(data):
        columns = _row(data, "cohen")
        k = _certified(columns)
        columns["radius"][k] *= factor

    problems = verify_board(_edited(board, tmp_path, edit))
    assert any("not those S0 audited" in p for p in problems), problems
    assert any("stored radius" in p and "formula 'cohen'" in p for p in problems), problems


def test_an_edited_count_never_verifies(board, tmp_path):
    """One vote moved between the top class and the runner-up (n unchanged): a vote
    taken from the top class lowers the bound below the stored one (S0's first test),
    a vote given to it raises the bound above it (the verifier's exact test)."""
    direction = []

    def edit(data):
        columns = _row(data, "cohen")
        base = columns["draws"][_certified(columns)]["base"]
        counts = base["estimation"]
        top = int(np.argmax(base["selection"]))
        direction.append(1 if counts[1 - top] else -1)  # every vote on top: take one away
        counts[top] += direction[0]
        counts[1 - top] -= direction[0]

    problems = verify_board(_edited(board, tmp_path, edit))
    expected = "is not the bound" if direction[0] > 0 else "exceeds the bound"
    assert any(expected in p for p in problems), problems


def test_an_edited_verdict_never_verifies(board, tmp_path):
    original = json.loads(board.with_suffix(".run.json").read_text())
    assert _check_record(original, "inflated", "evidence")["verdict"] == "violated"

    def rigged_sound(data):
        _check_record(data, "inflated", "evidence")["verdict"] = "sound"

    problems = verify_board(_edited(board, tmp_path, rigged_sound, "a"))
    assert any("S0's recorded verdict is 'sound', its evidence gives 'violated'" in p
               for p in problems), problems  # fmt: skip

    def replay_violated(data):
        _check_record(data, "cohen", "replay")["verdict"] = "violated"

    problems = verify_board(_edited(board, tmp_path, replay_violated, "b"))
    assert any("the replay check's recorded verdict is 'violated'" in p for p in problems)


def test_replay_needs_the_boards_weights_and_refuses_others(board, tmp_path):
    weights = board.parent / "b.weights.pt"
    saved = tmp_path / "saved.pt"
    shutil.move(weights, saved)
    with pytest.raises(IdrsError, match=r"b\.weights\.pt is not beside the board .*copy it from"):
        _cli(["--verify", str(board), "--replay", "2"])
    state = torch.load(saved, weights_only=True)
    state = {k: v + 0.5 for k, v in state.items()}  # another model of the same architecture
    torch.save(state, weights)
    with pytest.raises(IdrsError) as caught:
        _cli(["--verify", str(board), "--replay", "2"])
    digest = json.loads(board.with_suffix(".run.json").read_text())["runs"][0]["run"]
    assert "have SHA-256" in str(caught.value) and digest["weights_digest"] in str(caught.value)


@pytest.mark.long
def test_replay_catches_what_the_export_cannot_show(
    tmp_path, manager, replay_run, engine_patch, capsys
):
    """A run whose engine a plugin patched, audited by S0 only: its board verifies (the
    counts are consistent), its replay from the shipped weights does not."""
    manager.register(engine_patch(), name="engine-patch")
    db, run_id = replay_run(tmp_path, manager, ["cohen"], n=500, device="cpu")
    _check(db, run_id, manager, checks=(check_evidence,))
    out = tmp_path / "patched" / "p.md"
    write_board(load_runs(db), out)
    assert verify_board(out) == []
    assert _cli(["--verify", str(out), "--replay", "12"]) == 1
    text = capsys.readouterr().out
    assert "first disagreement: run" in text and "cohen (default): input" in text
    assert ", stream " in text.split("first disagreement:")[1]


@pytest.mark.long
def test_replay_on_another_arithmetic_uses_the_replication_test(board, tmp_path, capsys):
    def elsewhere(data):
        run = data["runs"][0]["run"]
        run["arithmetic"] = run["arithmetic"] | {"device_name": "another CPU"}

    edited = _edited(board, tmp_path, elsewhere)
    assert verify_board(edited) == []
    assert _cli(["--verify", str(edited), "--replay", "6"]) == 0
    out = capsys.readouterr().out
    assert out.count("inputs agreed by the replication test") == 2
    assert "σ not recomputed" in out


@pytest.mark.gpu
def test_a_cpu_board_replays_on_cuda_by_the_replication_test(board, capsys):
    """Another arithmetic: fresh samples on CUDA replicate the CPU's counts, no false alarm."""
    assert _cli(["--verify", str(board), "--replay", "8", "--device", "cuda"]) == 0
    assert capsys.readouterr().out.count("inputs agreed by the replication test") == 2


@pytest.mark.gpu
def test_a_cuda_board_replays_on_the_cpu_by_the_replication_test(
    tmp_path, manager, replay_run, capsys
):  # fmt: skip
    db, run_id = replay_run(tmp_path, manager, ["cohen"], n=500, device="cuda")
    _check(db, run_id, manager)
    out = tmp_path / "cuda" / "c.md"
    write_board(load_runs(db), out)
    assert verify_board(out) == []
    assert _cli(["--verify", str(out), "--replay", "8", "--device", "cpu"]) == 0
    assert "inputs agreed by the replication test" in capsys.readouterr().out


def test_the_board_states_that_no_plugin_had_the_test_split_and_verify_checks_the_record(
    board, tmp_path
):
    from dataclasses import replace

    from harness.reports.leaderboard.board import build_board
    from harness.reports.leaderboard.compare import compare_runs
    from harness.reports.leaderboard.markdown import render_markdown

    assert "| test split | withheld from every plugin (σ-providers, certifiers and the trainer" in (
        board.read_text()
    )
    notes: list[str] = []
    assert verify_board(board, notes=notes) == []
    assert any(n.endswith("test split withheld from every plugin (σ-providers, certifiers and "
                          "the trainer got the training split and the dataset's description, a "
                          "σ-provider each test input only when asked for its σ, no plugin a "
                          "test label; docs/plugins.md)") for n in notes)  # fmt: skip
    # a record the harness never writes does not verify, even re-rendered from it
    forged = _edited(board, tmp_path, lambda d: d["runs"][0]["run"].update(test_split="peeked"),
                     "forged")  # fmt: skip
    assert any("test split record 'peeked' is not one the harness writes" in p
               for p in verify_board(forged, notes=[]))  # fmt: skip
    # a run begun before the record: its board has no such line and verifies, with a note
    legacy = _edited(board, tmp_path, lambda d: d["runs"][0]["run"].pop("test_split"), "legacy")
    assert "| test split |" not in legacy.read_text()
    notes = []
    assert verify_board(legacy, notes=notes) == []
    assert any("test split not recorded (the run began before runs recorded it" in n
               for n in notes)  # fmt: skip
    # a board that claims the rule for such a run does not verify
    legacy.write_text(board.read_text())
    assert any("b.md" in p and "test split" in p for p in verify_board(legacy, notes=[]))
    # a table of a recorded and an older run warns, and so does compare
    [recorded] = read_export(board.with_suffix(".run.json"))
    older = replace(recorded, run={k: v for k, v in recorded.run.items() if k != "test_split"}
                    | {"run_id": "f" * 64})  # fmt: skip
    text = render_markdown(build_board([recorded, older]), None)
    assert (
        "**Warning.** The runs of this table follow different protocols (test_split: "
        "withheld, not recorded (the run began before runs recorded it"
    ) in text
    [warning] = compare_runs(recorded, older).warnings
    assert "test_split: 'withheld' (A) vs 'not recorded (the run began" in warning


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


@pytest.mark.parametrize("plugin, recipe", [("../../outside", "ab12"), ("/", "ab12"),
                                            ("sukenik", "../../outside")])  # fmt: skip
def test_a_forged_export_cannot_stage_a_trained_part_outside_the_cache(tmp_path, plugin, recipe):
    """The plugin's name and the recipe hash an export records become path components when
    a board's trained parts are staged: a forged one is refused, nothing written outside."""
    from harness.reports.leaderboard.shipped_files import stage_trained_parts
    from harness.running.runfiles import PLUGIN_ARTIFACT

    part = tmp_path / "part.pt"
    part.write_bytes(b"trained")
    digest = hashlib.sha256(b"trained").hexdigest()
    run = SimpleNamespace(run={"recipe_hash": recipe}, files=[
        {"role": PLUGIN_ARTIFACT, "path": str(part), "sha256": digest, "name": "part.pt",
         "meta": {"plugin": plugin}}])  # fmt: skip
    root = tmp_path / "cache"
    with pytest.raises(IdrsError):
        stage_trained_parts(run, root)
    written = {p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()}
    assert written == {Path("part.pt")}


def test_a_trained_part_is_staged_under_its_plugins_folder(tmp_path):
    from harness.reports.leaderboard.shipped_files import stage_trained_parts
    from harness.running.runfiles import PLUGIN_ARTIFACT

    part = tmp_path / "part.pt"
    part.write_bytes(b"trained")
    digest = hashlib.sha256(b"trained").hexdigest()
    run = SimpleNamespace(run={"recipe_hash": "ab12"}, files=[
        {"role": PLUGIN_ARTIFACT, "path": str(part), "sha256": digest, "name": "x/part.pt",
         "meta": {"plugin": "sukenik"}}])  # fmt: skip
    stage_trained_parts(run, tmp_path / "cache")
    staged = tmp_path / "cache" / "plugins" / "sukenik" / "ab12" / "part.pt"
    assert staged.read_bytes() == b"trained"
