"""Detection power of the soundness checks, measured on rigged and on sound methods.

    python3 -m harness.soundness.detection_power [--seeds 5] [--budget small|full]
        [--alarm-seeds 10] [--out FILE.md]

Rigged methods (constant σ, registered in-process as a plugin): Cohen's certificate with
the radius multiplied by 1.02, 1.05 or 1.15, and Cohen's certificate whose p_A bound is
computed at α_eff ∈ {0.002, 0.01, 0.05} while the run's α is 0.001 (the certificate
stores α_eff honestly). For each, the table gives per check how many of the seeds
flagged it (``unjustified`` or ``violated``). The built-in sound methods (cohen,
sukenik, lipschitz-sigma-net) are run over ``--alarm-seeds`` seeds: any flag is a false
alarm (0 expected).

The benchmark is cheap and exact: the ``ball-N`` dataset and base classifier in 2-D
(f = [‖x‖ <= 1]), 100 test points, n = 10 000, α = 0.001, σ = 0.25; the smoothed
classifier is known in closed form, so S4's exact flips (b) apply to the run itself.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import types
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from harness import hookimpl
from harness.components import CertifierSpec, MethodSpec
from harness.plugins import PluginManager
from harness.progress import Progress
from harness.runner import RunOptions, run_benchmark
from harness.soundness.audit import BUDGETS, Budget
from harness.soundness.runner import run_checks
from harness.soundness.verdict import Verdict
from harness.spec import parse_spec

RADIUS_FACTORS = (1.02, 1.05, 1.15)
ALPHA_EFFECTIVE = (0.002, 0.01, 0.05)
RUN_ALPHA = 0.001
SIGMA = 0.25
SOUND_METHODS: dict[str, dict] = {
    "cohen": {"sigma": SIGMA},
    "sukenik": {"sigma": SIGMA, "rate": 0.2, "k": 5},
    "lipschitz-sigma-net": {"train_examples": 128, "train_steps": 30, "sigma_min": 0.3},
}
"""Built-in sound methods and the settings of the false-alarm count (small σ-net fit)."""
FLAGGED = (Verdict.UNJUSTIFIED, Verdict.VIOLATED)


def rigged_plugin() -> types.ModuleType:
    """Methods ``cohen-radius-x<f>`` and ``cohen-alpha-<α_eff>`` (constant σ)."""
    from plugins.cohen.certifier import CohenCertifier

    module = types.ModuleType("rigged_cohen")

    def inflated(factor: float):
        class Inflated(CohenCertifier):
            def radius(self, p_lower, sigma):
                return factor * super().radius(p_lower, sigma)

        return lambda context, params, sigma_provider: Inflated()

    def laundered(alpha: float):
        class Laundered(CohenCertifier):
            def certify(self, evidence):
                return super().certify(replace(evidence, alpha=alpha))

        return lambda context, params, sigma_provider: Laundered()

    certifiers = {f"cohen-radius-x{f:g}": inflated(f) for f in RADIUS_FACTORS}
    certifiers |= {f"cohen-alpha-{a:g}": laundered(a) for a in ALPHA_EFFECTIVE}

    @hookimpl
    def idrs_register_certifiers(register):
        for name, build in certifiers.items():
            register(CertifierSpec(name, build, "rigged for the detection-power table"))

    @hookimpl
    def idrs_register_methods(register):
        for name in certifiers:
            register(MethodSpec(name, "constant", name, {"sigma": SIGMA}))

    module.idrs_register_certifiers = idrs_register_certifiers
    module.idrs_register_methods = idrs_register_methods
    module.METHODS = tuple(certifiers)
    return module


def benchmark(seed: int, methods: Mapping[str, dict], test_count: int = 100, n: int = 10_000):
    """The cheap exact benchmark (ball-2) with one setting per method."""
    return parse_spec({
        "name": "detection-power", "seed": seed,
        "dataset": {"name": "ball-2", "test_count": test_count},
        "model": {"architecture": "ball-N", "trainer": "none"},
        "certification": {"n0": 100, "n": n, "alpha": RUN_ALPHA, "batch_size": 4096},
        "methods": [{"name": m, "settings": [dict(s)]} for m, s in methods.items()],
    })  # fmt: skip


def flags_per_check(
    methods: Mapping[str, dict], seeds: Sequence[int], budget: Budget,
    manager: PluginManager, workdir: Path, test_count: int = 100, n: int = 10_000,
) -> dict[str, dict[str, int]]:  # fmt: skip
    """For each method, how many seeds each check flagged (and ``any``: any check)."""
    counts: dict[str, dict[str, int]] = {m: {"any": 0} for m in methods}
    for seed in seeds:
        db = workdir / f"seed{seed}.sqlite"
        quiet = Progress(enabled=False)
        spec = benchmark(seed, methods, test_count, n)
        run_id = run_benchmark(spec, RunOptions(db=db), quiet, manager)
        results = run_checks(db, run_id, RunOptions(db=db), quiet, manager, budget=budget,
                             attack=False)  # fmt: skip
        for (method, _), checks in results.items():
            row = counts[method]
            for r in checks:
                row[r.check] = row.get(r.check, 0) + (r.verdict in FLAGGED)
            row["any"] += any(r.verdict in FLAGGED for r in checks)
    return counts


def markdown(title: str, counts: Mapping[str, Mapping[str, int]], seeds: int) -> str:
    checks = [*sorted({c for row in counts.values() for c in row if c != "any"}), "any"]
    lines = [f"### {title}", "", "| method | " + " | ".join(checks) + " |",
             "|---" * (len(checks) + 1) + "|"]  # fmt: skip
    for method, row in counts.items():
        cells = [f"{row.get(c, 0)}/{seeds}" for c in checks]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds per rigged method")
    parser.add_argument("--alarm-seeds", type=int, default=10, help="seeds per sound method")
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="small")
    parser.add_argument("--out", type=Path, help="also write the tables to this markdown file")
    args = parser.parse_args(argv)
    manager = PluginManager(third_party=False)
    plugin = rigged_plugin()
    manager.register(plugin, name="rigged-cohen")
    budget = BUDGETS[args.budget]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        rigged = flags_per_check({m: {} for m in plugin.METHODS}, range(args.seeds), budget,
                                 manager, Path(tmp))  # fmt: skip
        alarms = flags_per_check(SOUND_METHODS, range(100, 100 + args.alarm_seeds), budget,
                                 manager, Path(tmp))  # fmt: skip
    text = (
        f"Detection power at the `{args.budget}` budget (ball-2, n = 10000, α = {RUN_ALPHA}, "
        f"σ = {SIGMA}; `python3 -m harness.soundness.detection_power --seeds {args.seeds} "
        f"--budget {args.budget}`, {time.perf_counter() - start:.0f} s)\n\n"
        + markdown("Rigged methods: seeds flagged per check", rigged, args.seeds)
        + "\n"
        + markdown("Sound methods: false alarms per check", alarms, args.alarm_seeds)
    )
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
