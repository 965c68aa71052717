"""Detection power of the soundness checks, measured on rigged and on sound methods.

The rigged methods are third-party plugins handed in by the caller (the core imports no
plugin): ``tests/rigged_methods.py`` writes one per class of cheat against the public
API, and runs this module's :func:`main` with them,

    python3 -m tests.rigged_methods [--benchmark ball-2|fashion-mnist|both] [--seeds 5]
        [--alarm-seeds 10] [--budget small|full] [--test-count N] [--isolated]
        [--sampling fixed|sequential] [--out FILE.md]

For each rigged method, the table gives per check how many of the seeds flagged it
(``unjustified`` or ``violated``), and ``any``; a method that patches the harness's
engine is run on its own (the patch would reach every method of its run). The built-in
sound methods (cohen, sukenik, lipschitz-sigma-net, anisotropic-fixed and
anisotropic-shifted, a constant noise centre) are run over ``--alarm-seeds``
seeds: any flag is a false alarm. The seed is the run's noise seed; every audit draws
its own entropy. By default the rigged plugin is registered in this process (the checks'
power against what a plugin claims); with ``--isolated`` it is installed as a package and
runs in a plugin host, as a third-party plugin does (harness/README.md, "Plugin host"):
then the engine patch reaches only the host, never the samples the harness draws.

With ``--sampling sequential`` the runs draw their estimation samples sequentially
(:mod:`harness.mathematics.sequential`, n_max = n): the rigged row is then plain Cohen
under an invalid sequential rule the caller passes in (``invalid_rule``: a plain
Clopper–Pearson bound at level α at every look), and the sound methods are the hard ones
(cohen, sukenik; a soft certifier is refused under sequential sampling).

Two benchmarks, both at n = 10,000 and α = 0.001:

- ``ball-2``: the analytic ball classifier f = [‖x‖ <= 1] in 2-D, 100 test points,
  σ = 0.25; its smoothed classifier is known in closed form, so S4's exact flips (b)
  apply to the run itself.
- ``fashion-mnist``: 784-d, the default benchmark's MLP (its recipe: 784-200-10, 10
  epochs of Gaussian augmentation at σ = 0.25, cached like the default benchmark's),
  every 50th test point (100 by default), σ = 0.25.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import textwrap
import time
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from harness.audit.audit import BUDGETS, Budget
from harness.audit.auditor import run_checks
from harness.foundation.progress import Progress
from harness.foundation.verdict import Verdict
from harness.plugin.manager import PluginManager
from harness.running.benchmark import parse_benchmark
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark

RUN_ALPHA = 0.001
N = 10_000
SIGMA = 0.25
BENCHMARKS = ("ball-2", "fashion-mnist")
TEST_COUNT = {"ball-2": 100, "fashion-mnist": 100}
SOUND_METHODS: dict[str, dict] = {
    "cohen": {"sigma": SIGMA},
    "sukenik": {"sigma": SIGMA, "rate": 0.2, "k": 5},
    "lipschitz-sigma-net": {"train_examples": 128, "train_steps": 30, "sigma_min": 0.3},
    "anisotropic-fixed": {"sigma": SIGMA, "ratio": 2.0},
    "anisotropic-shifted": {"sigma": SIGMA, "ratio": 2.0, "offset": 0.1},
}
"""Built-in sound methods and the settings of the false-alarm count (small σ-net fit; the
fixed diagonal scale σ … 2σ, the sound anisotropic baseline)."""
FLAGGED = (Verdict.UNJUSTIFIED, Verdict.VIOLATED)
ENGINE_PATCH = "engine-patch"
"""The row of the method (plain Cohen) run with a plugin that patches the engine."""
INVALID_RULE = "naive-sequential-rule"
"""The row of plain Cohen certified under an invalid sequential rule (``--sampling sequential``)."""
SEQUENTIAL_SOUND = ("cohen", "sukenik")
"""The sound methods of the false-alarm count under sequential sampling (hard smoothing)."""


def benchmark(
    name: str, seed: int, methods: Mapping[str, dict], test_count: int | None = None,
    n: int = N, epochs: int = 10, sampling: str = "fixed",
):  # fmt: skip
    """The detection-power benchmark ``name`` (:data:`BENCHMARKS`) with one setting per method."""
    count = TEST_COUNT[name] if test_count is None else test_count
    raw: dict = {"name": f"detection-power-{name}", "seed": seed,
                 "certification": {"n0": 100, "n": n, "alpha": RUN_ALPHA, "batch_size": 1024,
                                   "sampling": sampling},
                 "methods": [{"name": m, "settings": [dict(s)]} for m, s in methods.items()]}  # fmt: skip
    if name == "ball-2":
        raw["dataset"] = {"name": "ball-2", "test_count": count}
        raw["model"] = {"architecture": "ball-N", "trainer": "none"}
    elif name == "fashion-mnist":
        raw["dataset"] = {"name": "fashion-mnist", "test_every": 50, "test_count": count}
        raw["model"] = {"architecture": "mlp", "trainer": "gaussian-augmentation", "seed": 0,
                        "trainer_params": {"sigma": 0.25, "epochs": epochs}}  # fmt: skip
    else:
        raise ValueError(f"unknown benchmark {name!r}; choose one of {', '.join(BENCHMARKS)}")
    return parse_benchmark(raw)


def flags_per_check(
    methods: Mapping[str, dict], seeds: Sequence[int], budget: Budget,
    manager: PluginManager, workdir: Path, name: str = "ball-2", test_count: int | None = None,
    n: int = N, around: Callable[[], contextlib.AbstractContextManager] | None = None,
    label: str | None = None, epochs: int = 10, data_root: str | None = None,
    progress: Progress | None = None, sampling: str = "fixed", entropy: int | None = None,
) -> dict[str, dict[str, int]]:  # fmt: skip
    """For each method, how many seeds each check flagged (and ``any``: any check).

    ``around`` (e.g. a plugin that patches the engine) is entered for each seed's run and
    checks; ``label`` names the row when one method is run (default: its name);
    ``progress`` reports the seeds done. Every row is audited with fresh entropy, as
    ``idrs-bench check`` audits it, unless ``entropy`` fixes it (a test's verdicts)."""
    counts: dict[str, dict[str, int]] = {}
    quiet = Progress(enabled=False)
    what = f"{name}: {label or ', '.join(methods)}"
    with (progress or quiet).task(what, len(seeds), "seeds") as advance:
        for seed in seeds:
            db = workdir / f"{name}-{label or 'methods'}-seed{seed}.sqlite"
            spec = benchmark(name, seed, methods, test_count, n, epochs, sampling)
            options = RunOptions(db=db, data_root=data_root)
            with around() if around else contextlib.nullcontext():
                run_id = run_benchmark(spec, options, quiet, manager)
                results = run_checks(db, run_id, options, quiet, manager, budget=budget,
                                     entropy=entropy, attack=False)  # fmt: skip
            for (method, _), checks in results.items():
                row = counts.setdefault(label or method, {"any": 0})
                for r in checks:
                    row[r.check] = row.get(r.check, 0) + (r.verdict in FLAGGED)
                row["any"] += any(r.verdict in FLAGGED for r in checks)
            advance(1)
    return counts


def markdown(title: str, counts: Mapping[str, Mapping[str, int]], seeds: int) -> str:
    checks = [*sorted({c for row in counts.values() for c in row if c != "any"}), "any"]
    lines = [f"### {title}", "", "| method | " + " | ".join(checks) + " |",
             "|---" * (len(checks) + 1) + "|"]  # fmt: skip
    for method, row in counts.items():
        cells = [f"{row.get(c, 0)}/{seeds}" for c in checks]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def install_plugin_module(
    folder: Path, module: str, entry_point: str, distribution: str, source: str | None = None,
    version: str = "0.1",
) -> None:  # fmt: skip
    """Make ``module`` an installed ``idrs_bench`` plugin for whoever has ``folder`` on its
    path: the distribution's metadata as pip lays it out (``<distribution>-<version>.dist-info``
    with ``METADATA`` and ``entry_points.txt``) and, given its ``source``, the module itself."""
    if source is not None:
        (folder / f"{module}.py").write_text(textwrap.dedent(source))
    info = folder / f"{distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\n"
                                   f"Version: {version}\n")  # fmt: skip
    (info / "entry_points.txt").write_text(f"[idrs_bench]\n{entry_point} = {module}\n")


def _on_path(folder: Path) -> None:
    """``folder`` first on this process's and its children's module search path."""
    import importlib

    sys.path.insert(0, str(folder))
    paths = [str(folder), os.getcwd(), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    importlib.invalidate_caches()


def measure(
    name: str, rigged: Sequence[str], seeds: int, alarm_seeds: int, budget: Budget,
    manager: PluginManager, workdir: Path, engine_patch=None, test_count: int | None = None,
    data_root: str | None = None, progress: Progress | None = None,
    patched: PluginManager | None = None, invalid_rule=None,
) -> tuple[dict, dict]:  # fmt: skip
    """(rigged rows, sound rows) of one benchmark: seeds flagged per method and check. The
    engine patch is entered around its rows (``engine_patch``), or is a plugin the manager
    ``patched`` loads in its plugin host; with ``invalid_rule``, under sequential sampling
    (plain Cohen under that rule, and the hard sound methods)."""
    common = {"name": name, "test_count": test_count, "data_root": data_root,
              "progress": progress}  # fmt: skip
    if invalid_rule is not None:
        common["sampling"] = "sequential"
        caught = flags_per_check({"cohen": {"sigma": SIGMA}}, range(seeds), budget, manager,
                                 workdir, around=invalid_rule, label=INVALID_RULE, **common)  # fmt: skip
        sound = {m: SOUND_METHODS[m] for m in SEQUENTIAL_SOUND}
        alarms = flags_per_check(sound, range(100, 100 + alarm_seeds), budget, manager, workdir,
                                 **common)  # fmt: skip
        return caught, alarms
    caught = flags_per_check({m: {} for m in rigged}, range(seeds), budget, manager, workdir,
                             **common)  # fmt: skip
    if patched is not None:
        caught |= flags_per_check({"cohen": {"sigma": SIGMA}}, range(seeds), budget, patched,
                                  workdir, label=ENGINE_PATCH, **common)  # fmt: skip
    elif engine_patch is not None:
        caught |= flags_per_check({"cohen": {"sigma": SIGMA}}, range(seeds), budget, manager,
                                  workdir, around=engine_patch, label=ENGINE_PATCH, **common)  # fmt: skip
    alarms = flags_per_check(SOUND_METHODS, range(100, 100 + alarm_seeds), budget, manager,
                             workdir, **common)  # fmt: skip
    return caught, alarms


def main(
    argv: Sequence[str] | None, plugin: types.ModuleType,
    engine_patch: Callable[[], contextlib.AbstractContextManager] | None = None,
    engine_patch_source: str | None = None,
    invalid_rule: Callable[[], contextlib.AbstractContextManager] | None = None,
) -> int:  # fmt: skip
    """The detection-power tables of the rigged methods ``plugin.METHODS`` (a plugin module,
    registered here or, ``--isolated``, installed for a plugin host) and of plain Cohen under
    the engine patch (``engine_patch`` here; the module ``engine_patch_source`` installed);
    with ``--sampling sequential``, of plain Cohen under ``invalid_rule``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--benchmark", choices=[*BENCHMARKS, "both"], default="both")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per rigged method")
    parser.add_argument("--alarm-seeds", type=int, default=10, help="seeds per sound method")
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="small")
    parser.add_argument("--test-count", type=int, help="test points (default: 100)")
    parser.add_argument("--data-root", help="folder with the Fashion-MNIST files")
    parser.add_argument(
        "--isolated",
        action="store_true",
        help="install the rigged plugins as packages: they run in a plugin host",
    )
    parser.add_argument("--sampling", choices=("fixed", "sequential"), default="fixed",
                        help="sequential: the invalid-rule row and the hard sound methods")  # fmt: skip
    parser.add_argument("--out", type=Path, help="also write the tables to this markdown file")
    args = parser.parse_args(argv)
    patched = None
    if args.isolated:
        rigged, patch = (Path(tempfile.mkdtemp(prefix=f"idrs-{p}-")) for p in ("rigged", "patch"))
        module = plugin.__spec__.name if plugin.__spec__ else plugin.__name__  # (not __main__)
        install_plugin_module(rigged, module, "rigged", "idrs-rigged-methods")
        _on_path(rigged)
        manager = PluginManager()
        manager.registry  # noqa: B018 (its plugin host starts before the patch is installed)
        if engine_patch_source is not None:
            install_plugin_module(patch, "idrs_engine_patch", ENGINE_PATCH, "idrs-engine-patch",
                                  engine_patch_source)  # fmt: skip
            _on_path(patch)
            patched = PluginManager()
    else:
        manager = PluginManager(third_party=False)
        manager.register(plugin, name="rigged")
    try:
        sections = _sections(args, plugin, manager, patched, engine_patch, invalid_rule)
    finally:  # (their plugin hosts end here, not when this process does)
        for opened in (manager, patched):
            if opened is not None:
                opened.close()
    command = "python3 -m tests.rigged_methods " + " ".join(argv or [])
    text = f"`{command.strip()}`\n\n" + "\n".join(sections)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


def _sections(args, plugin, manager, patched, engine_patch, invalid_rule) -> list[str]:
    """Each benchmark's section of the report: its two tables, measured."""
    budget = BUDGETS[args.budget]
    names = BENCHMARKS if args.benchmark == "both" else (args.benchmark,)
    sections = []
    for name in names:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            rule = invalid_rule if args.sampling == "sequential" else None
            caught, alarms = measure(name, plugin.METHODS, args.seeds, args.alarm_seeds, budget,
                                     manager, Path(tmp), engine_patch, args.test_count,
                                     args.data_root, Progress(), patched, rule)  # fmt: skip
        count = TEST_COUNT[name] if args.test_count is None else args.test_count
        where = ("installed, in a plugin host" if args.isolated else
                 "registered in the harness's process")  # fmt: skip
        sections.append(
            f"## {name}: detection power at the `{args.budget}` budget (rigged plugins {where})\n\n"
            f"{count} test points, {'sequential sampling up to n_max' if rule else 'n'} = {N}, "
            f"α = {RUN_ALPHA}, σ = {SIGMA}; "
            f"{time.perf_counter() - start:.0f} s.\n\n"
            + markdown("Rigged methods: seeds flagged per check", caught, args.seeds)
            + "\n"
            + markdown("Sound methods: false alarms per check", alarms, args.alarm_seeds)
        )
    return sections
