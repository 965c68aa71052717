"""Verification re-audits: ``leaderboard --verify BOARD.md --reaudit`` and ``check --reaudit``
re-run every check of every row from its recorded entropy against the plugins installed
here and fail on any verdict that differs from the record; plain ``--verify`` never
counts a verdict it only read as verified; a board whose plugin is not installed names
the package that provides it.

The board is a tiny run on the exact ``ball-2`` classifier of three methods, two of them
from a third-party package installed for the test (a distribution with an ``idrs_bench``
entry point on ``sys.path``): ``fast-rate`` (a σ that changes 150 times faster than it
declares, certified by Súkeník's formula: S2 and S3 find it unjustified) and
``half-cohen`` (Cohen's radius halved, under a radius formula of the package's own).
"""

from __future__ import annotations

import importlib
import json
import os
import shlex
import shutil
import sqlite3
import sys
from contextlib import contextmanager

import pytest

from harness.audit.audit import BUDGETS, Budget
from harness.audit.auditor import run_checks
from harness.audit.detection_power import install_plugin_module
from harness.cli.main import main
from harness.foundation.progress import Progress
from harness.plugin.manager import PluginManager
from harness.reports.leaderboard.render import write_board
from harness.reports.leaderboard.source import read_export
from harness.running.preparation import RunOptions
from harness.store.storedrun import load_runs

TINY = Budget("tiny", coverage_trials=24, coverage_n=400, pairs=4, ascent_steps=2,
              audited_inputs=6, attack_steps=2, attack_samples=16, orders=3)  # fmt: skip
ENTROPY = 0x47_5EED
"""The audits' entropy: fixed, so that a verdict asserted here is the same every time (a
sound row audited with fresh entropy is flagged 1 time in 1,000, as the checks promise)."""
PACKAGE, MODULE, PLUGIN = "idrs-rigged-test", "idrs_rigged_test", "rigged"

PLUGIN_SOURCE = '''
"""A third-party package: a σ faster than it declares, and Cohen's radius halved."""
import torch

from harness import (COHEN, CertifierSpec, HardSmoothingCertifier, MethodSpec, RadiusFormula,
                     Recomputed, SemiElastic, SigmaProviderSpec, cohen_radius, hookimpl)

IDRS_BENCH_CONTRACT = 3


class FastSigma:
    regularity = SemiElastic(0.01)

    def __call__(self, x):
        return 0.25 * torch.exp(1.5 * torch.tanh(x.flatten(1)[:, 0].double()))


def half_recompute(rows, inputs, protocol, regularity):
    out = COHEN.recompute(rows, inputs, protocol, regularity)
    return Recomputed(out.n0, out.n, out.bound, out.prediction, out.radius / 2)


class HalfCohen(HardSmoothingCertifier):
    radius_formula = RadiusFormula("half-cohen", half_recompute)

    def radius(self, p_lower, sigma):
        return cohen_radius(p_lower, sigma) / 2


@hookimpl
def idrs_register_sigma_providers(register):
    register(SigmaProviderSpec("fast-sigma", lambda context, params: FastSigma()))


@hookimpl
def idrs_register_certifiers(register):
    register(CertifierSpec("half-cohen", lambda context, params, provider: HalfCohen()))


@hookimpl
def idrs_register_methods(register):
    register(MethodSpec("fast-rate", "fast-sigma", "sukenik", {"sigma": 0.25}))
    register(MethodSpec("half-cohen", "constant", "half-cohen", {"sigma": 0.5}))
'''


STORE_PATCH_SOURCE = '''
"""Stores every verdict of the audit as sound, whatever the checks found (at import)."""
from dataclasses import replace

from harness import hookimpl
from harness.foundation.verdict import Verdict
from harness.store.store import ResultStore

IDRS_BENCH_CONTRACT = 3
ORIGINAL = ResultStore.add_check


def add_check(self, run_id, method, setting, result, budget):
    return ORIGINAL(self, run_id, method, setting, replace(result, verdict=Verdict.SOUND), budget)


ResultStore.add_check = add_check


def unpatch():
    ResultStore.add_check = ORIGINAL


@hookimpl
def idrs_register_methods(register):
    pass
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A folder holding the rigged package as pip would install it."""
    folder = tmp_path_factory.mktemp("site")
    install_plugin_module(folder, MODULE, PLUGIN, PACKAGE, PLUGIN_SOURCE)
    return folder


@contextmanager
def installed(site, plugins=(PLUGIN,)):
    """The packages in ``site`` installed (on ``sys.path``; ``plugins`` the only
    third-party plugins loaded) while the block runs, uninstalled after it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IDRS_BENCH_PLUGINS", ",".join(plugins))
        mp.syspath_prepend(str(site))  # here, and in the plugin host:
        mp.setenv("PYTHONPATH", os.pathsep.join([str(site), os.getcwd(),
                                                 os.environ.get("PYTHONPATH", "")]))  # fmt: skip
        try:
            yield
        finally:
            sys.modules.pop(MODULE, None)
            patch = sys.modules.pop("idrs_store_patch", None)
            if patch is not None:
                patch.unpatch()
    importlib.invalidate_caches()


@pytest.fixture(scope="module")
def published(tmp_path_factory, site, replay_run):
    """The board of cohen, fast-rate and half-cohen on ball-2, audited at the tiny budget
    with the package installed: (board, db, run id)."""
    folder = tmp_path_factory.mktemp("published")
    with installed(site):
        manager = PluginManager()
        db, run_id = replay_run(folder, manager, ["cohen", "fast-rate", "half-cohen"], n=400)
        run_checks(db, run_id, RunOptions(db=db), Progress(enabled=False), manager, budget=TINY,
                   entropy=ENTROPY, attack=False)  # fmt: skip
        board = folder / "board" / "r.md"
        write_board(load_runs(db), board)
    return board, db, run_id


@pytest.fixture
def board(published, tmp_path, monkeypatch):
    """A copy of the published board; the tiny budget is known to the re-audit."""
    monkeypatch.setitem(BUDGETS, TINY.name, TINY)
    shutil.copytree(published[0].parent, tmp_path / "board")
    return tmp_path / "board" / "r.md"


def _verify(board, capsys, *flags) -> tuple[int, str]:
    code = main(["leaderboard", "--verify", str(board), *flags])
    return code, capsys.readouterr().out


def _edited(board, edit):
    """The board with its export edited by ``edit(data)`` and re-rendered from it, so that
    its markdown and other files agree with the edited export (as a forger would leave it)."""
    export = board.with_suffix(".run.json")
    data = json.loads(export.read_text())
    edit(data)
    export.write_text(json.dumps(data))
    write_board(read_export(export), board)
    return board


def _label(run_id, method) -> str:
    return f"run {run_id[:12]} {method} (default)"


@pytest.mark.long
@pytest.mark.slow
def test_an_unmodified_board_passes_reaudit_and_plain_verify_verifies_no_row(
    published, board, site, capsys
):  # fmt: skip
    run_id = published[2]
    recorded = {c.check: c.verdict for c in load_runs(published[1])[0].checks
                if c.method == "fast-rate"}  # fmt: skip
    assert recorded["sigma-regularity"] == recorded["worst-case-justification"] == "unjustified"
    with installed(site):
        code, out = _verify(board, capsys)
        assert code == 0, out
        assert f"{_label(run_id, 'cohen')}: recorded sound, not re-run (counterexamples, " in out
        assert "0 of 3 row verdicts verified" in out and "--reaudit re-runs every check" in out
        code, out = _verify(board, capsys, "--reaudit")
    assert code == 0, out
    assert f"{_label(run_id, 'cohen')}: sound (verified: every check re-derived or re-run)" in out
    assert f"{_label(run_id, 'fast-rate')}: unjustified (verified: every check" in out
    assert f"{_label(run_id, 'half-cohen')}: sound (verified: every check" in out
    assert "3 of 3 row verdicts verified" in out and "re-audited 3 row(s)" in out


@pytest.mark.long
@pytest.mark.slow
def test_an_edited_verdict_fails_reaudit_naming_row_check_and_both_verdicts(
    published, board, site, capsys
):  # fmt: skip
    """The forger's board: fast-rate's unjustified verdicts stored as sound, re-rendered,
    so the board ranks it sound and every file agrees with its export."""
    run_id = published[2]

    def rigged_sound(data):
        for check in data["runs"][0]["checks"]:
            if check["method"] == "fast-rate" and check["verdict"] == "unjustified":
                check["verdict"] = "sound"

    _edited(board, rigged_sound)
    with installed(site):
        code, out = _verify(board, capsys)
        assert code == 0, out  # S0 and the replay check still re-derive ...
        assert f"{_label(run_id, 'fast-rate')}: recorded sound, not re-run (" in out  # ... only
        assert f"{_label(run_id, 'fast-rate')}: sound (verified" not in out
        code, out = _verify(board, capsys, "--reaudit")
    assert code == 1, out
    for check in ("sigma-regularity", "worst-case-justification"):
        assert (f"{_label(run_id, 'fast-rate')}: check {check}: recorded 'sound', re-audit "
                "'unjustified'") in out, out  # fmt: skip
    assert (
        f"{_label(run_id, 'fast-rate')}: recorded sound, not verified: its re-audit differs" in out
    )
    assert f"{_label(run_id, 'cohen')}: sound (verified: every check" in out
    assert "does not verify (2 problem(s))" in out


@pytest.mark.long
@pytest.mark.slow
def test_check_reaudit_judges_a_stored_run_without_writing_to_it(
    published, site, tmp_path, monkeypatch, capsys
):  # fmt: skip
    """``check --reaudit`` on a results database: an edited verdict is named, and so is a
    row whose unjustified checks' records were deleted (it then reads sound); the record
    itself is left as it was."""
    monkeypatch.setitem(BUDGETS, TINY.name, TINY)
    db = tmp_path / "runs.sqlite"
    shutil.copyfile(published[1], db)
    run_id, fast = published[2], _label(published[2], "fast-rate")
    where = "WHERE method = 'fast-rate' AND check_name = "

    def stored():
        with sqlite3.connect(db) as con:
            return dict(con.execute("SELECT check_name, verdict FROM checks WHERE method = "
                                    "'fast-rate'").fetchall())  # fmt: skip

    argv = ["check", run_id[:8], "--db", str(db), "--reaudit", "--quiet"]
    with sqlite3.connect(db) as con:
        con.execute(f"UPDATE checks SET verdict = 'sound' {where} 'sigma-regularity'")
        con.execute(f"DELETE FROM checks {where} 'worst-case-justification'")
    before = stored()
    with installed(site):
        assert main(argv) == 1
        out = capsys.readouterr().out
        assert f"{_label(run_id, 'cohen')}: sound (verified: 7 checks re-run" in out, out
        assert f"{fast}: check sigma-regularity: recorded 'sound', re-audit 'unjustified'" in out
        assert "2 of 3 row(s) re-audited with their recorded verdicts; 1 problem(s)" in out
        assert stored() == before  # the re-audit wrote nothing to the record
        with sqlite3.connect(db) as con:
            con.execute(f"DELETE FROM checks {where} 'sigma-regularity'")
        assert main([*argv, "--method", "fast-rate"]) == 1
    out = capsys.readouterr().out
    assert (
        f"{fast}: row verdict: recorded 'sound', re-audit 'unjustified' (checks the record "
        "lacks: sigma-regularity: unjustified, worst-case-justification: unjustified)"
    ) in out


def test_reaudit_refuses_what_would_not_re_run_the_recorded_audit(published, capsys):
    assert main(["check", "--db", str(published[1]), "--reaudit", "--entropy", "ab"]) == 2
    assert "--reaudit re-runs the recorded audits" in capsys.readouterr().err
    assert main(["leaderboard", "--db", str(published[1]), "--reaudit"]) == 2
    assert "give them with --verify BOARD.md" in capsys.readouterr().err


@pytest.mark.slow
def test_a_board_whose_plugin_is_not_installed_names_the_package(published, board, capsys):
    """Without the package: the rows of its methods stay unverified, naming the package
    (not a formula); cohen's row is re-audited. An export made before runs recorded their
    packages names what it can."""
    run_id = published[2]
    components = json.loads(board.with_suffix(".run.json").read_text())["runs"][0]["run"][
        "components"
    ]
    assert components["methods"]["half-cohen"] == {"plugin": PLUGIN, "distribution": PACKAGE,
                                                   "version": "0.1"}  # fmt: skip
    assert components["certifiers"]["cohen"]["distribution"] == "idrs-bench"
    code, out = _verify(board, capsys)
    assert code == 1, out
    wanted = (f"method 'half-cohen' comes from plugin '{PLUGIN}' of the package '{PACKAGE}' 0.1, "
              f"which is not installed here ({shlex.quote(sys.executable)} -m pip install {PACKAGE})")  # fmt: skip
    assert f"{_label(run_id, 'half-cohen')}: not verified: {wanted}" in out, out
    assert "is not provided by idrs-bench or an installed plugin" not in out
    # fast-rate's certificates re-derive by Súkeník's formula, a built-in: a note names it
    assert f"note: {_label(run_id, 'fast-rate')}: method 'fast-rate' comes from plugin" in out
    code, out = _verify(board, capsys, "--reaudit")
    assert code == 1
    assert f"{_label(run_id, 'half-cohen')}: not re-audited: {wanted}" in out
    assert f"{_label(run_id, 'cohen')}: sound (verified: every check" in out

    def before_components(data):
        del data["runs"][0]["run"]["components"]

    code, out = _verify(_edited(board, before_components), capsys)
    assert code == 1
    assert ("method 'half-cohen' is provided by no plugin installed here (the run did not record "
            f"which package provided it) (its radius formula is '{MODULE}.half_recompute')") in out  # fmt: skip


@pytest.mark.long
@pytest.mark.slow
def test_a_plugin_that_stores_every_verdict_as_sound_fails_reaudit(
    site, tmp_path, replay_run, monkeypatch, capsys
):  # fmt: skip
    """A plugin that patches the store at import. Installed, it runs in a plugin host and
    cannot reach the store; registered in the harness's own process (as before plugin hosts,
    or by a script) its run's board ranks fast-rate sound, and the re-audit of that board,
    with the packages installed, compares what the checks return."""
    monkeypatch.setitem(BUDGETS, TINY.name, TINY)
    patch_site = tmp_path / "site"
    shutil.copytree(site, patch_site)
    install_plugin_module(patch_site, "idrs_store_patch", "store-patch", "idrs-store-patch",
                          STORE_PATCH_SOURCE)  # fmt: skip
    manager = PluginManager(third_party=False)
    for module, name in ((MODULE, PLUGIN), ("idrs_store_patch", "store-patch")):
        spec = importlib.util.spec_from_file_location(module, patch_site / f"{module}.py")
        loaded = sys.modules[module] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
        manager.register(loaded, name)
    try:
        db, run_id = replay_run(tmp_path, manager, ["fast-rate"], n=400, count=8)
        run_checks(db, run_id, RunOptions(db=db), Progress(enabled=False), manager, budget=TINY,
                   entropy=ENTROPY, attack=False)  # fmt: skip
    finally:
        sys.modules.pop(MODULE, None)
        sys.modules.pop("idrs_store_patch").unpatch()
    assert {c.verdict for c in load_runs(db)[0].checks} == {"sound"}
    board = tmp_path / "board" / "p.md"
    write_board(load_runs(db), board)
    with installed(patch_site, (PLUGIN, "store-patch")):
        code, out = _verify(board, capsys, "--reaudit")
    assert code == 1, out
    assert (f"{_label(run_id, 'fast-rate')}: check worst-case-justification: recorded 'sound', "
            "re-audit 'unjustified'") in out  # fmt: skip


def test_a_board_without_its_weights_or_with_others_is_not_re_audited(published, board, capsys):
    (board.parent / "r.weights.pt").rename(board.parent / "elsewhere.pt")
    code, out = _verify(board, capsys, "--reaudit")
    assert code == 1
    label = _label(published[2], "cohen")
    assert f"{label}: not re-audited: r.weights.pt is not beside the board" in out, out
    assert f"{label}: recorded sound, not verified: not re-audited (below)" in out
    (board.parent / "r.weights.pt").write_bytes(b"not these weights")
    code, out = _verify(board, capsys, "--reaudit")
    assert code == 1 and "r.weights.pt has SHA-256 " in out and "another model, refused" in out
