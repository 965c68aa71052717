"""Re-checking a published board from its own files: what ``--verify`` and ``--replay`` add.

Re-rendering (:mod:`harness.reports.leaderboard.verify`) shows that a board is what its run
export renders to; it cannot show that the export is what the audit saw. From an export
of format 2 or later (:mod:`harness.reports.leaderboard.source`) :func:`recheck_runs`
therefore re-derives, for every row:

1. **every certificate** (S0, :func:`harness.audit.evidence.rederive`) from its
   exported evidence (the harness's draws, α, σ, the certifier's derived evidence),
   against the declaration S0 recorded: the radius formula by its importable qualified
   name, resolved from idrs-bench or, for an installed plugin's, re-derived by its plugin
   host (:meth:`harness.plugin.manager.PluginManager.formula`), and the σ-provider's regularity as
   data; formulas that need the inputs get them from the run's dataset, loaded here.
   S0's recorded verdict must be the one the evidence gives; where it is ``sound``, the
   bound, prediction and radius must moreover *equal* the re-derived ones (relative
   1e-9; a certifier that claims less than its declared formula derives cannot be
   verified from a board), and the certificates must hash to the digest S0 recorded,
   so an edited count, bound or radius, in either direction, never verifies;
2. **the verdicts** of the checks whose rule is a function of their recorded evidence:
   S0 (as the audit judged it, one-sided) and the replay check
   (:func:`harness.audit.replay.judge`, from its recorded draws, or its fresh
   counts, PIT uniforms and Holm); an edited verdict never verifies. The row's verdict
   is the combination of its checks' (re-rendered); other checks' verdicts are only read
   (``rederived`` says which were re-derived; ``--reaudit`` re-runs them all,
   :mod:`harness.reports.leaderboard.board_reaudit`). A row whose method no installed
   plugin provides is named with the package the run recorded for it
   (:meth:`harness.plugin.registry.Registry.absent`), not with its formula.

:func:`replay_board` (``--replay K``) re-certifies K random inputs of every row from
the files shipped beside the board: the draws are re-drawn by ``python -m
harness.running.redraw`` (no third-party plugin) from ``NAME.weights.pt`` and the shipped
σ-estimators, bit for bit on the run's arithmetic, else by the replication test
(:mod:`harness.audit.replay`); on the run's arithmetic σ is recomputed too, by
the method rebuilt from the installed plugins with their shipped trained parts, and
the rebuilt method's declared formula and regularity must be those the export records.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from harness.foundation.errors import IdrsError
from harness.reports.leaderboard.shipped_files import replay_source, stage_trained_parts
from harness.store.storedrun import StoredRow, StoredRun

S0, REPLAY = "evidence", "replay"


def _label(run: StoredRun, row: StoredRow) -> str:
    return f"run {run.run_id[:12]} {row.method} ({row.setting})"


class _Inputs:
    """The test inputs of a run's dataset, loaded on first use (None if it cannot be)."""

    def __init__(self, run: StoredRun, data_root: str | None, registry) -> None:
        self.run, self.data_root, self.registry = run, data_root, registry
        self.dataset = None
        self.error: str | None = None

    def rows(self, ids: list[int]):
        if self.dataset is None and self.error is None:
            from harness.running.benchmark import benchmark_from_dict
            from harness.running.preparation import RunOptions, load_dataset

            spec = benchmark_from_dict(self.run.config)
            try:
                self.dataset = load_dataset(spec, self.registry,
                                            RunOptions(db=Path(os.devnull), data_root=self.data_root))  # fmt: skip
            except Exception as exc:
                self.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if self.dataset is None:
            return None
        import torch

        return self.dataset.test_x[torch.tensor(ids, dtype=torch.long)]


def recheck_runs(
    runs: list[StoredRun], data_root: str | None = None, notes: list[str] | None = None,
    rederived: dict[tuple[str, str, str], set[str] | None] | None = None,
) -> list[str]:  # fmt: skip
    """The problems found by re-deriving every row of ``runs`` (empty: all re-derived).

    A row none of whose certificates carries the harness's draws (a run certified before
    the harness drew the evidence, whose S0 is then an ``error``) is not re-derived:
    a line saying so is appended to ``notes``, as is a row whose plugin is not installed
    here but whose certificates re-derive (their formula is idrs-bench's), naming the
    package to install. ``rederived`` receives, per (run id, method, setting), the checks
    whose recorded verdict was re-derived from their evidence (None for a row with
    problems)."""
    from harness.plugin.manager import PluginManager
    from harness.running.benchmark import benchmark_from_dict

    problems: list[str] = []
    with PluginManager() as manager:
        for run in runs:
            if run.imported:
                continue
            protocol = benchmark_from_dict(run.config).protocol
            inputs = _Inputs(run, data_root, manager.registry)
            for row in run.rows():
                if row.checks and all(c.draws is None for c in row.certificates):
                    if notes is not None:
                        notes.append(f"{_label(run, row)}: its certificates carry no draws (certified "
                                     "before the harness drew the evidence): not re-derived")  # fmt: skip
                    continue
                components = run.run.get("components")
                absent = manager.registry.absent([("methods", row.method)], components)
                found: set[str] = set()
                mine = _recheck_row(run, row, protocol, inputs, absent, found, manager.formula)
                if absent and not mine and notes is not None:
                    notes.append(f"{_label(run, row)}: {absent}; its certificates re-derive (their "
                                 "formula is installed), --replay and --reaudit need it")  # fmt: skip
                problems += mine
                if rederived is not None:
                    rederived[run.run_id, row.method, row.setting] = None if mine else found
    return problems


def _recheck_row(
    run: StoredRun, row: StoredRow, protocol, inputs: _Inputs, absent: str | None,
    found: set[str], formula,
) -> list[str]:  # fmt: skip
    """The row's problems; ``found`` receives the checks whose verdict was re-derived;
    ``formula`` resolves a recorded radius formula."""
    from harness.audit.evidence import Declaration, certificates_digest, rederive
    from harness.audit.replay import judge

    label = _label(run, row)
    checks = {c.check: c for c in row.checks}
    if not checks:
        return []  # `not checked`: the board claims nothing for it
    certs = [c.as_dict() for c in row.certificates]
    if any(c.get("draws") is None for c in certs):
        return [f"{label}: some certificates lack their evidence in the export; they cannot be "
                "re-derived"]  # fmt: skip
    s0 = checks.get(S0)
    if s0 is None or not s0.evidence or "declaration" not in s0.evidence:
        return [f"{label}: no record of check S0 ({S0!r}) with its declaration: the "
                "certificates cannot be re-derived"]  # fmt: skip
    problems = []
    if certificates_digest(certs) != s0.evidence.get("certificates_sha256"):
        problems.append(f"{label}: the certificates are not those S0 audited (their SHA-256 "
                        "differs from the one S0 recorded): the export was edited")  # fmt: skip
    try:
        declaration = Declaration.from_record(s0.evidence["declaration"], formula)
        x = inputs.rows([int(c["input_id"]) for c in certs])
        exact = rederive(certs, x, protocol, declaration, exact=True)
        audited = rederive(certs, x, protocol, declaration)
    except Exception as exc:
        if absent:  # the formula is the plugin's: name the package to install
            formula = s0.evidence["declaration"].get("formula", {}).get("recompute")
            return [*problems, f"{label}: not verified: {absent} (its radius formula is "
                    f"{formula!r}); install it and verify again"]  # fmt: skip
        why = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if inputs.error:
            why += f" (the run's dataset could not be loaded: {inputs.error}; pass --data-root)"
        return [*problems, f"{label}: cannot re-derive its certificates: {why}"]
    if audited.verdict != s0.verdict:
        problems.append(f"{label}: S0's recorded verdict is {s0.verdict!r}, its evidence "
                        f"gives {audited.verdict.value!r}: {audited.summary}")  # fmt: skip
    elif s0.verdict == "sound" and exact.verdict != "sound":
        problems.append(f"{label}: a certificate is not what its evidence derives: {exact.summary}")
    elif not problems:
        found.add(S0)
    replay = checks.get(REPLAY)
    if replay is not None and replay.verdict not in ("error", "not-applicable"):
        if not replay.evidence or "inputs" not in replay.evidence:
            problems.append(f"{label}: the replay check's evidence is missing from the export")
        else:
            by_id = {int(c["input_id"]): c for c in certs}
            verdict, summary, _ = judge(replay.evidence, by_id)
            if verdict != replay.verdict:
                problems.append(f"{label}: the replay check's recorded verdict is "
                                f"{replay.verdict!r}, its evidence gives {verdict.value!r} "
                                f"({summary})")  # fmt: skip
            else:
                found.add(REPLAY)
    return problems


# --- replay ---------------------------------------------------------------------------


def replay_board(
    runs: list[StoredRun], k: int, data_root: str | None = None, device: str = "auto",
    entropy: int | None = None,
) -> tuple[list[str], list[str]]:  # fmt: skip
    """Re-certify ``k`` random inputs of every row (:mod:`harness.audit.replay`).

    Returns one report line per row (how many inputs agreed) and the disagreements
    (empty: every row replayed). ``entropy`` (128 bits, default ``os.urandom``) chooses
    the inputs and the fresh noise, and is printed so that a replay can be repeated."""
    from harness.audit.audit import derived_seed, fresh_entropy
    from harness.engine.sampling import resolve_device
    from harness.running.redraw import Replayer

    if k < 1:
        raise IdrsError(f"--replay takes the number of inputs per row, >= 1; got {k}")
    entropy = fresh_entropy() if entropy is None else entropy
    device = str(resolve_device(device))
    lines, disagreements = [f"replay entropy {entropy:032x} (device {device})"], []
    replayer = Replayer()
    try:
        for run in runs:
            if run.imported:
                continue
            source = replay_source(run, data_root)
            methods = _Methods(run, source, device)
            for row in run.rows():
                purpose = f"board-replay/{run.run_id}/{row.method}/{row.setting}"
                rng = np.random.default_rng(derived_seed(entropy, purpose))
                line, problem = _replay_row(run, row, source, methods, replayer, rng, k, device,
                                            derived_seed(entropy, purpose + "/noise"))  # fmt: skip
                lines.append(line)
                if problem:
                    disagreements.append(problem)
            methods.close()
    finally:
        replayer.close()
    return lines, disagreements


def _replay_row(run, row, source, methods, replayer, rng, k, device, noise_seed):
    from harness.audit.replay import judge
    from harness.running.redraw_request import replay_request

    label = _label(run, row)
    certs = [c.as_dict() for c in row.certificates]
    if any(c.get("draws") is None for c in certs):
        return f"{label}: no evidence in the export; nothing replayed", None
    m = min(k, len(certs))
    chosen = np.sort(rng.choice(len(certs), m, replace=False))
    ids = [int(certs[i]["input_id"]) for i in chosen]
    kind = certs[0]["draws"]["base"]["kind"]
    smoothed = "sigma" in certs[0]["draws"]
    bases = [certs[i]["draws"]["base"] for i in chosen]
    request = replay_request(source, device, ids, bases, kind,
                             f"{row.method} {row.setting}" if smoothed else None, noise_seed)  # fmt: skip
    answer = replayer.request(request)
    stored = [float(certs[i]["sigma"]) for i in chosen]
    sigma = {"alone": stored, "batch": stored, "order": list(range(m))}
    note = ""
    if answer["mode"] == "exact":
        recomputed, note = methods.sigma(row, ids, [b.get("scale") for b in bases],
                                         [b.get("centre") for b in bases])  # fmt: skip
        if recomputed is not None:
            sigma = recomputed
    else:
        note = "; σ not recomputed (another arithmetic may round it differently)"
    evidence: dict[str, Any] = {"inputs": ids, "sigma": sigma, "mode": answer["mode"],
                                "arithmetic": answer["arithmetic"],
                                "differences": answer["differences"]}  # fmt: skip
    drawn = {name: answer[name] for name in ("base", "sigma") if name in answer}
    by_id = {int(c["input_id"]): c for c in certs}
    if answer["mode"] == "exact":
        evidence["replayed"] = drawn
        agreed = sum(judge(_one(evidence, p), by_id)[0] == "sound" for p in range(m))
        how = "bit for bit"
    else:
        evidence["fresh"] = drawn
        evidence["u"] = rng.uniform(size=(2, m)).tolist()
        how = "by the replication test"
    verdict, summary, detail = judge(evidence, by_id)
    if answer["mode"] != "exact":
        from scipy.stats import norm

        limit = norm.isf(1e-3 / (2 * max(len(detail["z"]), 1)))
        agreed = sum(abs(z) <= limit for z in detail["z"][:m])
        how += f" (bias p = {detail['test']['p_bias']:.3g}, dispersion p = {detail['test']['p_dispersion']:.3g})"
    declared = methods.declaration_problem(row)
    problem = None
    if verdict != "sound":
        problem = f"{label}: {summary}"
    elif declared:
        problem = f"{label}: {declared}"
    return f"{label}: {agreed}/{m} inputs agreed {how}{note}", problem


def _one(evidence: dict[str, Any], p: int) -> dict[str, Any]:
    """The exact-mode evidence of the ``p``-th replayed input alone."""
    sigma = evidence["sigma"]
    return {**evidence, "inputs": [evidence["inputs"][p]],
            "sigma": {"alone": [sigma["alone"][p]], "batch": [sigma["batch"][p]], "order": [0]},
            "replayed": {name: {draw: [values[p]] for draw, values in drawn.items()}
                         for name, drawn in evidence["replayed"].items()}}  # fmt: skip


class _Methods:
    """A run's methods rebuilt from the installed plugins, their trained parts read from
    the files shipped beside the board (a temporary cache root holds copies)."""

    def __init__(self, run: StoredRun, source, device: str) -> None:
        from harness.plugin.manager import PluginManager

        self.run, self.source, self.device = run, source, device
        self.context = self.test_x = None  # test_x: the run's (the context withholds them)
        self.manager = PluginManager()  # (its plugin hosts start when a method is built)
        self.error: str | None = None
        self.built: dict[tuple[str, str], Any] = {}
        self.folder = tempfile.mkdtemp(prefix="idrs-replay-")

    def close(self) -> None:
        self.manager.close()  # (its plugin hosts end)
        shutil.rmtree(self.folder, ignore_errors=True)

    def _cache(self):
        from harness.foundation.artifacts import cache_root_at

        return cache_root_at(self.folder)

    def _build_context(self):
        from harness.foundation.progress import Progress
        from harness.running.benchmark import benchmark_from_dict
        from harness.running.checkpoint import load_checkpoint
        from harness.running.preparation import RunOptions, build_context, load_dataset

        stage_trained_parts(self.run, Path(self.folder))
        spec = benchmark_from_dict(self.run.config)
        registry = self.manager.registry
        dataset = load_dataset(spec, registry, RunOptions(db=Path(os.devnull),
                                                          data_root=self.source.data_root))  # fmt: skip
        config = replace(spec.model, checkpoint=str(self.source.weights),
                         format=self.source.weights_format)  # fmt: skip
        model, _ = load_checkpoint(config, dataset, registry)
        batch = (self.run.run.get("arithmetic") or {}).get("batch_size") or spec.protocol.batch_size
        context = build_context(spec, dataset, model.to(self.device).eval(),
                                self.run.run["recipe_hash"], self.device, batch, Progress(False),
                                registry, self.run.run_id)  # fmt: skip
        self.test_x = dataset.test_x
        return spec, registry, context

    def _method(self, row: StoredRow):
        key = (row.method, row.setting)
        if key not in self.built:
            from harness.certification.method import build_method
            from harness.foundation.identity import setting_key

            with self._cache():
                if self.context is None:
                    self.context = self._build_context()
                spec, registry, context = self.context
                setting = next(s for m in spec.methods if m.name == row.method
                               for s in m.settings if setting_key(s) == row.setting)  # fmt: skip
                context = replace(context, method=row.method, setting=row.setting)
                self.built[key] = (context, *build_method(registry, row.method, setting, context))
        return self.built[key]

    def sigma(
        self, row: StoredRow, ids: list[int], stored_scale: list[str | None],
        stored_centre: list[str | None],
    ) -> tuple[dict | None, str]:  # fmt: skip
        """σ of ``ids`` recomputed in a shuffled batch, then alone, with the run's thread
        count and deterministic kernels (as it was computed), as the replay check records it
        (:func:`harness.audit.replay.sigma_record`: a diagonal scale's every axis against
        ``stored_scale``, a centre's against ``stored_centre``); or None and why not."""
        from harness.audit.replay import sigma_record
        from harness.certification.certify import sigma_of
        from harness.engine.arithmetic import computing_with, run_threads
        from harness.engine.centre import centre_of
        from harness.engine.determinism import deterministic_kernels

        threads = run_threads(self.run.run.get("arithmetic"))
        try:
            with computing_with(threads), deterministic_kernels(self.device), self._cache():
                context, provider, _ = self._method(row)
                x = self.test_x[ids].to(context.device)

                def answer(index) -> np.ndarray:
                    return sigma_of(context, provider, x[index], [ids[i] for i in index],
                                    row.method)[0]  # fmt: skip

                def centre(index) -> np.ndarray | None:
                    return centre_of(provider, x[index], row.method)

                order = np.random.default_rng(len(ids)).permutation(len(ids))
                return sigma_record(answer, order, stored_scale, centre, stored_centre), ""
        except Exception as exc:
            return None, f"; σ not recomputed ({type(exc).__name__}: {exc})".splitlines()[0]

    def declaration_problem(self, row: StoredRow) -> str | None:
        """Whether the installed method declares what the export's S0 record says (the
        record read as S0's re-derivation reads it: a formula by a module name that has
        moved since is the same formula, :func:`harness.mathematics.radius.formula_from_record`;
        a key recorded since, by its meaning: :meth:`Declaration.same_meaning`)."""
        from harness.audit.evidence import Declaration

        if (row.method, row.setting) not in self.built:
            return None
        _, provider, certifier = self.built[row.method, row.setting]
        record = next((c.evidence or {} for c in row.checks if c.check == S0), {})
        ours = Declaration(certifier.radius_formula, provider.regularity, certifier.smoothing,
                           getattr(provider, "smoothing", None)).record()  # fmt: skip
        theirs = record.get("declaration")
        if theirs is None:
            return None
        try:
            theirs = Declaration.from_record(theirs, self.manager.formula).record()
        except IdrsError as exc:
            return f"the export's declaration cannot be read here: {exc}"
        if Declaration.same_meaning(ours, theirs):
            return None
        return f"the export records the declaration {theirs}, the installed method declares {ours}"
