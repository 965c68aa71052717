"""``tools/gpu-check``, the one command for a lent GPU: its steps, their order and time
caps, where the logs go, and its machinery run here on the CPU with tiny sizes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "gpu-check"


def _run(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(tmp_path / "out")}
    return subprocess.run([str(SCRIPT), *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def test_the_dry_run_lists_every_step_in_order_with_its_cap_and_command(tmp_path):
    done = _run(tmp_path, "--dry-run")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    steps = [line.split()[1] for line in out.splitlines() if line.startswith("== ")]
    assert steps == ["setup", "env", "tests", "bench-fp32", "bench-bf16", "default-run"]
    assert f"OUT={tmp_path / 'out'} device=cuda budget=450s" in out
    assert "pip install -q --no-deps --target /tmp/site .gpu/whl/*.whl" in out  # offline
    assert '"${XDIST[@]}" -v -rA "${TIMEOUT_PLUGIN[@]}" --junitxml="$OUT/junit.xml"' in out
    assert "--precision bf16 --channels-last" in out
    assert 'run --device "$DEVICE" --timings --db "$OUT/default.sqlite"' in out
    caps = {line.split()[1]: int(line.split("cap ")[1].split()[0])
            for line in out.splitlines() if line.startswith("== ")}  # fmt: skip
    # no step may take the whole call; the budget (plus 20 s between SIGINT and SIGKILL)
    # keeps the call within 8 minutes
    assert all(v < 450 for v in caps.values()) and 450 + 20 <= 8 * 60
    gpu_only = _run(tmp_path, "--dry-run", "--steps", "gpu-tests").stdout
    assert "-m gpu -v -rA" in gpu_only and '--junitxml="$OUT/junit-gpu.xml"' in gpu_only
    assert not (tmp_path / "out").exists()  # a dry run writes nothing
    assert "python3 -m pip download" in _run(tmp_path, "prepare", "--dry-run").stdout


def test_a_tiny_run_on_the_cpu_writes_every_log_and_the_summary(tmp_path):
    done = _run(tmp_path, "--device", "cpu", "--tiny", "--steps", "env,bench-fp32",
                "--budget", "240")  # fmt: skip
    out = tmp_path / "out"
    summary = (out / "summary.txt").read_text()
    assert done.returncode == 0, summary + done.stdout
    assert summary.startswith("env: ok") and "\nbench-fp32: ok" in summary
    assert "torch" in (out / "env.log").read_text()
    bench = json.loads((out / "bench-fp32-small.json").read_text())
    [row] = bench["engine"]
    assert row["model"] == "mlp" and row["device"] == "cpu" and row["n"] == 400
    assert f"engine/limit {row['engine_vs_limit']:.2f}" in summary
    assert "api" in summary and "s/input" in summary


def test_steps_past_the_budget_are_skipped_and_unknown_steps_refused(tmp_path):
    done = _run(tmp_path, "--device", "cpu", "--steps", "env,tests", "--budget", "5")
    assert done.returncode == 0
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "env: skipped" in summary and "tests: skipped" in summary
    bad = _run(tmp_path, "--steps", "env,suite")
    assert bad.returncode == 2 and "unknown step suite" in bad.stderr
