"""``tools/gpu-check``, the one command for a lent GPU: its steps, their order and time
caps, what comes back (the device returns at most 8 files of ``$OUT``), and its machinery
run here on the CPU with tiny sizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from harness.plugin.hosting.shared import landlock, policy

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "gpu-check"
RETURNED = 8
"""Files the device brings back from $OUT (the device's documented limit)."""
FASHION = pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist").is_dir(),
    reason="needs Fashion-MNIST under /usr/share/datasets (the default and the board's dataset)",
)


def _run(tmp_path: Path, *args: str, timeout: float = 300,
         python: str = sys.executable) -> subprocess.CompletedProcess:  # fmt: skip
    """The script with ``python`` named (``GPU_CHECK_PYTHON``; by default this interpreter)
    and, first on PATH, a ``python3`` that fails: every step must run the named one."""
    stub = tmp_path / "path" / "python3"
    stub.parent.mkdir(exist_ok=True)
    stub.write_text("#!/bin/sh\necho 'python3 from PATH ran, not GPU_CHECK_PYTHON' >&2\nexit 97\n")
    stub.chmod(0o755)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "GPU_CHECK_WORK": str(tmp_path / "work"),
           "IDRS_BENCH_CACHE": str(tmp_path / "cache"), "GPU_CHECK_PYTHON": python,
           "PATH": f"{stub.parent}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    return subprocess.run([str(SCRIPT), *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def _returned(out: Path) -> list[str]:
    """Every file under $OUT (what the device would have to bring back)."""
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


def _logs(out: Path) -> dict[str, str]:
    with tarfile.open(out / "logs.tar") as tar:
        return {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}


LOGGED = {
    "setup": 5,
    "env": 8,
    "confinement": 16,
    "gpu-tests": 114,
    "default-run": 129,
    "bench-default": 135,
}
"""Seconds each step took on an H200 (two calls of 2026-11-28, docs/gpu.md: the gpu tests
beside the probe; the default run alone from an empty cache); bench-default's mlp and cnn
took about 85 s before its cap cut it, and ResNet-110 at n = 100,000 and batch 8,192 about
50 s a setting in the next call."""


def test_the_dry_run_lists_every_step_in_order_with_its_cap_and_command(tmp_path):
    done = _run(tmp_path, "--dry-run")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    steps = [line.split()[1] for line in out.splitlines() if line.startswith("== ")]
    assert steps == ["setup", "env", "confinement", "gpu-tests", "default-run", "bench-default"]
    assert "== gpu-tests (beside confinement, cap" in out  # the gpu tests with the probe
    assert "== default-run (cap" in out  # the run alone: its --timings are the figure
    header = f"OUT={tmp_path / 'out'} device=cuda budget=510s tiny=0"
    assert f"{header} n=100000 resnet110_n=100000" in out  # ResNet-110 at the target's n
    assert "pip install -q --no-deps --target /tmp/site .gpu/whl/*.whl" in out  # offline
    assert (
        'python3 -m harness.plugin.hosting.in_harness.confinement_probe --device "$DEVICE"' in out
    )
    assert '"${XDIST[@]}" -m gpu -v -rA' in out and '--junitxml="$WORK/$STEP/junit-gpu.xml"' in out
    assert "bench_pair default" in out
    # a Cohen row's samples at the default benchmark's batch
    assert 'bench row --models mlp --n "$ROW_N" --inputs "$ROW_INPUTS" --batch-size 1024' in out
    # ResNet-110 with the forward options, only when named
    forward = _run(tmp_path, "--dry-run", "--steps", "bench-forward").stdout
    assert "bench forward-resnet110" in forward and '"${FORWARD[@]}" --compile' in forward
    assert '--cudnn benchmark "${RESNET_AT[@]}" "${FORWARD[@]}"' in forward  # at batch 8,192
    assert 'run --device "$DEVICE" --timings --db "$WORK/$STEP/default.sqlite"' in out
    caps = {line.split()[1]: int(line.split("cap ")[1].split()[0])
            for line in out.splitlines() if line.startswith("== ")}  # fmt: skip
    # the plan: each group's cap its longest member's, their sum within the budget; the
    # budget, the 20 s between SIGINT and SIGKILL and the summary within one 9-minute call
    groups = [caps["setup"], caps["env"], max(caps["confinement"], caps["gpu-tests"]),
              caps["default-run"], caps["bench-default"]]  # fmt: skip
    [plan] = [line for line in out.splitlines() if line.startswith("plan: ")]
    assert plan == ("plan: setup 30 s + env 15 s + confinement+gpu-tests 130 s + default-run "
                    f"170 s + bench-default 150 s = {sum(groups)} s of the 510 s budget")  # fmt: skip
    assert sum(groups) <= 510 and 510 + 20 + 10 <= 9 * 60
    assert caps["confinement"] <= 60  # early and short
    # every step the logs timed fits its cap with a tenth to spare (the run beside the suite
    # slows both a little)
    assert all(caps[step] >= 1.1 * seconds for step, seconds in LOGGED.items()), caps
    bf16 = _run(tmp_path, "--dry-run", "--steps", "bench-bf16").stdout
    assert "--precision bf16 --channels-last" in bf16 and "plan: bench-bf16 130 s" in bf16
    board = _run(tmp_path, "--dry-run", "--steps", "setup,fashion-board", "--cap",
                 "fashion-board=300").stdout  # fmt: skip
    assert "== fashion-board (cap 300 s" in board and "fashion-mnist.toml" in board
    assert "leaderboard --db" in board and "fashion-board.tar.gz" in board
    suite = _run(tmp_path, "--dry-run", "--steps", "tests").stdout
    assert '"${XDIST[@]}" -v -rA "${TIMEOUT_PLUGIN[@]}" --junitxml="$WORK/$STEP/junit.xml"' in suite
    assert not (tmp_path / "out").exists()  # a dry run writes nothing
    assert "python3 -m pip download" in _run(tmp_path, "prepare", "--dry-run").stdout


@pytest.mark.slow
def test_a_tiny_run_on_the_cpu_brings_every_log_back_in_a_few_files(tmp_path):
    """The bench's JSON and ratios come back; a Cohen row of the default run (here the log
    of a run cut while running, as the progress lines read) is held to the engine's time
    for its samples at the row's n and batch; the run with the batch chosen for the device
    shows its rows' seconds beside them."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "default-run.log").write_text(
        "cohen sigma=0.25: started, 4 inputs\n"
        "cohen sigma=0.25: finished, 4/4 inputs, 2.50 inputs/s, elapsed 2 s, ETA 0 s\n"
    )
    (out / "default-run-auto-batch.log").write_text(
        "cohen sigma=0.25: finished, 4/4 inputs, 8.00 inputs/s, elapsed 0 s, ETA 0 s\n"
    )
    done = _run(tmp_path, "--device", "cpu", "--tiny", "--steps", "env,bench-default",
                "--budget", "300")  # fmt: skip
    summary = (out / "summary.txt").read_text()
    assert done.returncode == 0, summary + done.stdout
    assert summary.startswith("env: ok") and "\nbench-default: ok" in summary
    # caches and databases elsewhere
    returned = ["default-run-auto-batch.log", "default-run.log", "logs.tar", "summary.txt"]
    assert _returned(out) == returned
    logs = _logs(out)
    assert "torch" in logs["env.log"] and "PyTorch's defaults" in logs["env.log"]
    assert logs["env.log"].startswith(sys.version)  # GPU_CHECK_PYTHON ran, not PATH's python3
    bench = json.loads(logs["bench-default/bench-default-small.json"])
    [row] = bench["engine"]
    assert row["model"] == "mlp" and row["device"] == "cpu" and row["n"] == 400
    assert row["precision"] == "fp32"  # auto, on a CPU
    assert f"engine/limit {row['engine_vs_limit']:.2f}" in summary
    assert "reference in PyTorch's default" in summary and "api sequential" in summary
    [cohen] = json.loads(logs["bench-default/bench-row.json"])["engine"]
    assert cohen["model"] == "mlp" and cohen["n"] == 200 and cohen["batch_size"] == 1024
    engine = 4 * (100 + 200) / cohen["engine_per_s"]  # 4 inputs of n0 + n samples
    diagonal = cohen["diagonal_vs_scalar_time"]  # the row's mlp, also at a diagonal scale
    assert f"diagonal scale (σ … 2σ): {diagonal:.2f}x the wall time at one σ" in summary
    assert (f"default-run cohen sigma=0.25: certification 1.6 s, the engine's time for its "
            f"samples {engine:.3g} s (bench mlp, n = 200, batch 1024): {1.6 / engine:.2f}x") in summary  # fmt: skip
    assert "default-run-auto-batch cohen sigma=0.25: certified 4 inputs in 0.5 s" in summary


@pytest.mark.slow
def test_the_confinement_step_runs_beside_another_and_says_one_line_per_host(tmp_path):
    """Two steps at once (``env+confinement``): a summary line and a log each. The
    confinement probe on the CPU: every host (unconfined, each layer alone, all) names its
    threads, makes a memory file and computes; CUDA is unavailable here, which fails
    nothing with ``--device cpu``; the host confined by all layers refuses what it must."""
    done = _run(tmp_path, "--device", "cpu", "--tiny", "--steps", "env+confinement", "--budget",
                "280", "--cap", "env=120", "--cap", "confinement=270")  # (a shared CPU: slow)  # fmt: skip
    out = tmp_path / "out"
    summary = (out / "summary.txt").read_text()
    assert done.returncode == 0, summary + done.stdout
    assert summary.startswith("env: ok") and "\nconfinement (beside env): ok" in summary
    assert _returned(out) == ["logs.tar", "summary.txt"]
    logs = _logs(out)
    assert "PyTorch's defaults" in logs["env.log"]
    lines = {line.split()[0]: line for line in logs["confinement.log"].splitlines()[1:]}
    assert sorted(lines) == sorted(["unconfined", *policy.LAYERS, "all"])
    abi = landlock.landlock_abi()
    for variant, line in lines.items():
        if line.split()[1] == "skip":  # a kernel without what the layer needs
            assert variant.startswith("landlock") or variant == "all"
            assert abi < (4 if variant == "landlock-net" else policy.MINIMUM_ABI)
            continue
        assert line.split()[1] == "ok", line
        for part in ("thread names: ok", "memfd: ok", "cpu: ok", "cuInit: "):
            assert part in line, line
        assert ("refused: ok" in line) == (variant == "all"), line


@pytest.mark.slow
@FASHION
def test_the_fashion_board_step_brings_back_its_database_and_board(tmp_path):
    """The second call's step, tiny on the CPU: the run with its checks, the board, and
    both tarred into $OUT beside the summary and the logs."""
    done = _run(tmp_path, "--device", "cpu", "--tiny", "--steps", "fashion-board",
                "--budget", "240")  # fmt: skip
    out = tmp_path / "out"
    summary = (out / "summary.txt").read_text()
    assert done.returncode == 0, summary + done.stdout
    assert summary.startswith("fashion-board: ok")
    assert _returned(out) == ["fashion-board.tar.gz", "logs.tar", "summary.txt"]
    with tarfile.open(out / "fashion-board.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"fashion-mnist.sqlite", "board/fashion-mnist.md", "board/fashion-mnist.run.json",
            "board/fashion-mnist.weights.pt"} <= names  # fmt: skip
    log = _logs(out)["fashion-board.log"]
    assert "checks cohen sigma=0.25" in log and "wrote " in log  # checks, --timings, the board


@pytest.mark.slow
def test_a_step_cut_at_its_cap_keeps_its_log_and_the_rest_goes_on(tmp_path):
    """A default run that outlasts its cap (an interpreter whose ``run`` prints its first
    line and then waits, however fast the machine) is cut; what it wrote is in its log, with
    a line that says so, and the next step runs."""
    python = tmp_path / "slow-run-python"
    python.write_text(
        "#!/bin/sh\n"
        'case " $* " in *" harness.cli.main run "*)\n'
        "  echo 'cohen sigma=0.25: started, 4 inputs'; exec sleep 600 ;;\n"
        "esac\n"
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    done = _run(tmp_path, "--device", "cpu", "--tiny", "--steps", "default-run,env", "--cap",
                "default-run=10", "--budget", "120", python=str(python))  # fmt: skip
    out = tmp_path / "out"
    summary = (out / "summary.txt").read_text()
    assert done.returncode == 1, summary
    assert "default-run: cut at its cap of 10s" in summary and "\nenv: ok" in summary
    assert len(_returned(out)) <= RETURNED and "default-run.log" not in _returned(out)
    lines = _logs(out)["default-run.log"].rstrip().splitlines()
    assert lines[-1].startswith("gpu-check: step default-run cut at its cap of 10s")
    assert lines[0] == "cohen sigma=0.25: started, 4 inputs"  # what the run wrote before the cut


def test_steps_past_the_budget_are_skipped_and_unknown_steps_refused(tmp_path):
    done = _run(tmp_path, "--device", "cpu", "--steps", "env,tests", "--budget", "5")
    assert done.returncode == 0
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "env: skipped" in summary and "tests: skipped" in summary
    bad = _run(tmp_path, "--steps", "env,suite")
    assert bad.returncode == 2 and "unknown step suite" in bad.stderr
