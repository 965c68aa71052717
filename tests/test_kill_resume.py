"""A run killed with SIGKILL at random points of every stage, resumed, equals an
uninterrupted one row for row: training, certification, a memory-certifier shard and
the soundness checks (Alfarra et al.'s memory, kept in the run's database, included)."""

import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

INPUTS = 8
"""The benchmark's test points."""
METHODS = {"cohen": [{"sigma": 0.5}],
           "alfarra-ds-memory": [{"sigma": 0.5, "steps": 8, "beta": 0.05}]}  # fmt: skip
ENTROPY = "47ab"
"""The checks' entropy (``run --entropy``), the same for the reference and the killed run:
their verdicts are compared, and with fresh entropy each would flag a sound row 1 time in
1,000, as the checks promise."""

CERTIFICATES = (
    "SELECT method, setting, input_id, shard, label, prediction, predict, radius, p_lower, sigma,"
    " counts_selection, counts_estimation, evidence FROM certificates"
    " ORDER BY method, setting, input_id"
)
STATE = "SELECT method, setting, seq, record, data FROM state ORDER BY method, setting, seq"
CHECKS = (
    "SELECT method, setting, check_name, verdict FROM checks ORDER BY method, setting, check_name"
)


CERTIFIED = "SELECT 1 FROM certificates WHERE method = '{}'"


def _query(db: Path, sql: str) -> list[tuple]:
    try:
        with sqlite3.connect(db, timeout=5) as con:
            return con.execute(sql).fetchall()
    except sqlite3.OperationalError:
        return []


def _spec(small_benchmark, methods: dict) -> str:
    """The benchmark of ``methods`` (its model trained 10 epochs: long enough to be killed
    in)."""
    return small_benchmark(methods, name="kill", seed=5, shard_size=4, test_count=INPUTS,
                           epochs=10)  # fmt: skip


def _command(spec: Path, db: Path) -> list[str]:
    return [sys.executable, "-m", "harness.cli.main", "run", str(spec), "--db", str(db),
            "--entropy", ENTROPY]  # fmt: skip


def _env(cache: Path) -> dict[str, str]:
    # a killed process's leases expire after 2 s, so each resumption takes its work over soon
    return {**os.environ, "IDRS_BENCH_CACHE": str(cache),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "IDRS_BENCH_LEASE_SECONDS": "2"}  # fmt: skip


def _kill_during(spec, db, cache, marker: str, rng: random.Random, method: str | None = None,
                 until: str | None = None) -> bool:  # fmt: skip
    """Start the run, wait for the progress line ``marker``, then SIGKILL it at a random
    moment: after a random delay (or at once on the progress line ``until``, the stage's
    end), or (``method``) after a random number of its certificates. Returns whether it
    killed the run: one that ends well first (an earlier kill landed past this stage, or
    this busy machine woke the test late) is left to end; one that fails or hangs fails."""
    if method is not None and len(_query(db, CERTIFIED.format(method))) == INPUTS:
        return False  # an earlier kill landed past this stage: none of it is left to cut
    proc = subprocess.Popen(_command(spec, db), cwd=ROOT, env=_env(cache), text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    seen, ended, lines = threading.Event(), threading.Event(), []

    def watch():
        for line in proc.stderr:
            lines.append(line)
            if marker in line:
                seen.set()
            if until is not None and until in line:
                ended.set()
        seen.set()  # the run closed its stderr: it ends

    threading.Thread(target=watch, daemon=True).start()
    seen.wait(180)
    if any(marker in line for line in lines):
        if method is None:
            ended.wait(rng.uniform(0.0, 0.5))
        else:
            # at most all of its inputs (an earlier kill may have left some stored)
            target = min(len(_query(db, CERTIFIED.format(method))) + rng.randint(1, 6), INPUTS)
            while proc.poll() is None and len(_query(db, CERTIFIED.format(method))) < target:
                time.sleep(0.005)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            return True
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:  # it hangs
        proc.kill()
        code = proc.wait()
    assert code == 0, f"waiting for {marker!r}, the run ended ({code}):\n{''.join(lines[-20:])}"
    return False


@pytest.mark.long
@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_equals_an_uninterrupted_run(
    tmp_path, small_benchmark
):
    seed = int(time.time())
    rng = random.Random(seed)
    spec = tmp_path / "kill.toml"
    spec.write_text(_spec(small_benchmark, METHODS))
    reference_db, killed_db = tmp_path / "ref.sqlite", tmp_path / "killed.sqlite"
    # the uninterrupted reference runs beside the killed one (its own model cache)
    reference = subprocess.Popen(_command(spec, reference_db), cwd=ROOT, env=_env(tmp_path / "c1"),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    cache = tmp_path / "c2"
    killed = [
        _kill_during(spec, killed_db, cache, "training: started", rng, until="training: finished"),
        _kill_during(spec, killed_db, cache, "cohen sigma=0.5: started", rng, method="cohen"),
        _kill_during(spec, killed_db, cache, "alfarra-ds-memory", rng, method="alfarra-ds-memory"),
        _kill_during(spec, killed_db, cache, "checks ", rng),
    ]
    context = f"(random seed {seed}, kills that landed: {killed})"
    assert killed[0], context  # the first, in training (or at its end), whatever came after
    resumed = subprocess.run(_command(spec, killed_db), cwd=ROOT, env=_env(cache),
                             capture_output=True, text=True)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    _, err = reference.communicate(timeout=300)
    assert reference.returncode == 0, err

    rows = _query(reference_db, CERTIFICATES)
    assert len(rows) == 16
    assert _query(killed_db, CERTIFICATES) == rows, context
    state = _query(reference_db, STATE)
    assert len(state) == 8  # one memory entry per input of the memory certifier
    assert _query(killed_db, STATE) == state, context
    assert len(_query(reference_db, CHECKS)) >= 2
    assert _query(killed_db, CHECKS) == _query(reference_db, CHECKS), context
    recorded = _query(killed_db, "SELECT DISTINCT json_extract(evidence, '$.entropy') FROM checks")
    assert recorded == [(f"{int(ENTROPY, 16):032x}",)]
    assert len(_query(killed_db, "SELECT 1 FROM runs WHERE finished IS NOT NULL")) == 1


RESUMED_METHODS = {"cohen": [{"sigma": s} for s in (0.25, 0.5, 0.75, 1.0)]}
"""The run with cohen alone, at four σ: one row audited whole, three cut short."""
ENTROPIES = (
    "SELECT setting, json_extract(evidence, '$.entropy'), COUNT(*) FROM checks GROUP BY 1, 2"
)


def _entropies(db: Path) -> dict[str, tuple[str, int]]:
    """Per setting: (its checks' entropy, how many checks); one entropy per setting asserted."""
    rows = _query(db, ENTROPIES)
    assert len({s for s, _, _ in rows}) == len(rows), rows
    return {s: (e, n) for s, e, n in rows}


@pytest.mark.slow
def test_a_resumed_run_audits_only_the_rows_whose_audit_was_cut_short(tmp_path, small_benchmark):
    """Rows audited whole before an interruption keep their stored audit (the same
    entropy); a row cut short is audited again from the start, every check from one new
    entropy: some of its checks missing (sigma=0.5), an earlier audit's checks partly
    replaced by a later one's (sigma=0.75), or its attack left from an earlier audit
    (sigma=1.0). `idrs-bench check` still audits every row anew."""
    from harness import api
    from harness.audit.auditor import run_checks
    from harness.foundation.progress import Progress
    from harness.running.preparation import RunOptions

    spec, db = tmp_path / "resume.toml", tmp_path / "resume.sqlite"
    spec.write_text(_spec(small_benchmark, RESUMED_METHODS))
    run_id = api.run(spec, db=db)["run_id"]
    before = _entropies(db)
    checks = before["sigma=0.5"][1]
    assert len(before) == 4 and checks >= 2
    stale = "0" * 32
    with sqlite3.connect(db) as con:
        con.execute("DELETE FROM checks WHERE setting = 'sigma=0.5' AND rowid NOT IN "
                    "(SELECT MIN(rowid) FROM checks WHERE setting = 'sigma=0.5')")  # fmt: skip
        con.execute("UPDATE checks SET evidence = json_set(evidence, '$.entropy', ?) WHERE rowid ="
                    " (SELECT MIN(rowid) FROM checks WHERE setting = 'sigma=0.75')", (stale,))  # fmt: skip
        con.execute("UPDATE attacks SET result = json_set(result, '$.entropy', ?)"
                    " WHERE setting = 'sigma=1.0'", (stale,))  # fmt: skip

    api.run(spec, db=db)
    after = _entropies(db)
    assert after["sigma=0.25"] == before["sigma=0.25"]  # not audited again
    for setting in ("sigma=0.5", "sigma=0.75", "sigma=1.0"):  # every check, from one entropy
        assert after[setting][1] == checks and after[setting][0] not in (before[setting][0],
                                                                         stale), setting  # fmt: skip
    attacks = "SELECT setting, json_extract(result, '$.entropy') FROM attacks"
    assert dict(_query(db, attacks)) == {s: e for s, (e, _) in after.items()}

    # not resumed: a whole row audited anew (here from a given entropy, that row only)
    run_checks(db, run_id, RunOptions(db=db), Progress(enabled=False), entropy={
        ("cohen", "sigma=0.25"): 0x5EED}, attack=False)  # fmt: skip
    assert _entropies(db)["sigma=0.25"][0] == f"{0x5EED:032x}"
