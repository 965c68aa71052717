"""Re-drawing a run's samples in a process that loads no third-party plugin.

A plugin is Python running in the harness's process: when it is imported it can patch
the sampling engine, so the counts drawn in that process are only as good as the
process. The replay check (:mod:`harness.audit.replay`) and ``idrs-bench
leaderboard --replay`` (:mod:`harness.reports.leaderboard.recheck`) therefore re-draw a few
inputs in a fresh interpreter, ``python -m harness.running.redraw``, whose plugin manager holds
the built-in plugins only (:class:`~harness.plugin.manager.PluginManager` with
``third_party=False``; the parent also sets ``IDRS_BENCH_PLUGINS=""``). It is given the
run's spec, the base model's weights file (refused unless its weights digest is the
run's), the data files' digests, the input ids, their stored σ and the noise keys, and
it loads the dataset and builds the model itself:

- on the run's arithmetic (:mod:`harness.engine.arithmetic`: the same fingerprint here) it
  draws the selection and estimation samples of the base model on the run's keys
  (streams 0 and 1) at the stored σ (and scale, around the stored centre), and those of a σ-smoothing's σ-estimator (streams
  4 and 5), every forward pass padded to the run's batch size, so the counts must equal
  the stored ones bit for bit;
- on another arithmetic it draws n fresh estimation samples at the stored σ (and of the
  σ-estimator) on streams derived from the audit's entropy (:func:`fresh_streams`), for
  the statistical replication test (:func:`harness.mathematics.stats.replication_z`).

Draws made sequentially are re-drawn round by round at the stored looks (the same
samples, so every look's counts must agree bit for bit); on another arithmetic the fresh
samples are as many as the first look's, the one look drawn whatever the counts.

Its limits: the dataset and the base model's architecture must be built-in (a
third-party one would need its plugin, which could patch the engine), and a
σ-smoothing's σ-estimator must declare a built-in ``architecture`` (its state dict is
saved with the run, :mod:`harness.running.runfiles`).

Protocol (a request: :func:`harness.running.redraw_request.replay_request`): one JSON
request per line on stdin, one JSON answer per line on stdout
(``{"ok": false, "error": ...}`` when a request cannot be served); the process ends
when its stdin closes, so it never outlives the process that started it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.foundation.errors import IdrsError
from harness.foundation.threads import child_environment, stop_child

FRESH_STREAM_BASE = 1 << 32
"""Fresh replication streams lie above every documented stream (harness/README.md,
"Noise contract": 0–5 for the harness, 100 and up for plugins)."""


def fresh_streams(seed: int) -> tuple[int, int]:
    """The streams of fresh estimation samples of the base model and of a σ-estimator,
    from a 64-bit seed drawn from the audit's entropy."""
    base = FRESH_STREAM_BASE + 2 * (int(seed) % (1 << 30))
    return base, base + 1


@dataclass(frozen=True)
class ReplaySource:
    """Everything the replay process needs about a run besides the inputs to re-draw.

    ``config``: the run's spec (:meth:`~harness.running.benchmark.Benchmark.to_dict`);
    ``weights`` and ``weights_format``: the base model's weights file and how to read it
    (:mod:`harness.running.checkpoint`); ``weights_digest``: the run's; ``arithmetic``: the run's
    fingerprint; ``data_files``: the data files the run read (path → SHA-256);
    ``sigma_models``: per ``"<method> <setting>"`` the σ-estimator's saved state dict
    (``path``, ``sha256`` and the meta of :mod:`harness.running.runfiles`); ``missing_weights``:
    what to tell a user whose ``weights`` file does not exist.
    """

    config: Mapping[str, Any]
    weights: Path | None
    weights_format: str
    weights_digest: str | None
    arithmetic: Mapping[str, Any] | None
    data_files: Mapping[str, str] | None
    data_root: str | None = None
    sigma_models: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    missing_weights: str = ""

    def header(self, device: str) -> dict[str, Any]:
        """The run part of a request, checked: the weights file must exist."""
        if self.weights is None or not Path(self.weights).is_file():
            raise IdrsError(
                f"the base model's weights file {str(self.weights)!r} is missing, so no sample "
                f"can be re-drawn; {self.missing_weights or 'rerun the benchmark'}"
            )
        return {"config": dict(self.config), "weights": str(self.weights),
                "weights_format": self.weights_format, "weights_digest": self.weights_digest,
                "arithmetic": self.arithmetic, "data_files": self.data_files,
                "data_root": self.data_root, "device": str(device)}  # fmt: skip


class Replayer:
    """A ``python -m harness.running.redraw`` process, started on first use, answering requests.

    It loads no third-party plugin; it is stopped when this object is closed or
    collected, or when the interpreter exits (its stdin then closes).
    """

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._log = None
        self._finalizer = None
        self._unread = 0  # answers to warm-up requests not read yet

    def _start(self) -> subprocess.Popen:
        env = child_environment(environ=dict(os.environ, IDRS_BENCH_PLUGINS=""))
        self._log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (open while it runs)
        process = subprocess.Popen(
            [sys.executable, "-m", "harness.running.redraw"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._log, env=env, text=True,
        )  # fmt: skip
        self._finalizer = weakref.finalize(self, _stop, process, self._log)
        return process

    def warm(self, run: Mapping[str, Any]) -> None:
        """Start the process and have it load the run (``run``: a request's ``"run"``
        header) while this process goes on; the next :meth:`request` reads past it. A
        process already running is left as it is."""
        if self._process is not None and self._process.poll() is None:
            return
        self._send({"run": run, "inputs": [], "sigma": [], "kind": "hard",
                    "sigma_model": None, "fresh_streams": [0, 0], "looks": None})  # fmt: skip
        self._unread += 1

    def _send(self, payload: Mapping[str, Any]) -> subprocess.Popen:
        if self._process is None or self._process.poll() is not None:
            self._process = self._start()
            self._unread = 0
        try:
            self._process.stdin.write(json.dumps(payload) + "\n")
            self._process.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the answer's absence says why
        return self._process

    def request(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Send one request; its answer, or an error naming why the process failed. The
        samples it drew count as this process's (:data:`harness.engine.sampling.TALLY`)."""
        from harness.engine.sampling import TALLY

        process = self._send(payload)
        try:
            for _ in range(self._unread):  # warm-ups answered first (a failed one says why again)
                process.stdout.readline()
            self._unread = 0
            line = process.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            process.wait(timeout=30)
            self._log.seek(0)
            tail = self._log.read().strip().splitlines()[-5:]
            raise IdrsError(
                "the replay process (python -m harness.running.redraw) ended without an answer "
                f"(exit {process.returncode}): " + (" | ".join(tail) or "no output")
            )
        answer = json.loads(line)
        if not answer.get("ok"):
            raise IdrsError(f"replay: {answer.get('error')}")
        TALLY.samples += int(answer.get("samples", 0))
        TALLY.rows += int(answer.get("forward_rows", 0))
        return answer

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self._process = None


def _stop(process: subprocess.Popen, log) -> None:
    stop_child(process)
    log.close()


# --- the replay process ----------------------------------------------------------------


class _Refused(Exception):
    """A request the replay process cannot serve; its message goes back as the error."""


def _built_in(registry, kind: str, name: str, what: str):
    try:
        return registry.get(kind, name)
    except IdrsError:
        raise _Refused(
            f"{what} {name!r} is not provided by a built-in plugin; the replay process loads no "
            "third-party plugin (one could patch the engine when imported), so this run's "
            "samples cannot be re-drawn"
        ) from None


@dataclass
class _LoadedRun:
    spec: Any
    dataset: Any
    model: Any
    registry: Any
    fingerprint: dict[str, Any]
    differences: list[str]
    batch_size: int


def _load_run(header: Mapping[str, Any]) -> _LoadedRun:
    """The run's dataset (files checked) and base model (weights digest checked), here."""
    import torch

    from harness.engine.arithmetic import differences, fingerprint
    from harness.engine.determinism import enable_deterministic_kernels
    from harness.engine.sampling import resolve_device
    from harness.plugin.manager import PluginManager
    from harness.running.benchmark import benchmark_from_dict
    from harness.running.checkpoint import load_checkpoint
    from harness.running.preparation import RunOptions, load_dataset
    from harness.running.weights import weights_digest

    spec = benchmark_from_dict(dict(header["config"]))
    registry = PluginManager(third_party=False).registry
    _built_in(registry, "datasets", spec.dataset.name, "dataset")
    _built_in(registry, "models", spec.model.architecture, "architecture")
    device = resolve_device(header["device"])
    enable_deterministic_kernels(device)  # this process exists to recompute a run's draws
    recorded = header.get("arithmetic") or {}
    if device.type == "cpu" and recorded.get("threads"):
        torch.set_num_threads(int(recorded["threads"]))
    dataset = load_dataset(spec, registry, RunOptions(db=Path(os.devnull),
                                                      data_root=header.get("data_root")))  # fmt: skip
    files = header.get("data_files")
    if files is not None and sorted(files.values()) != sorted(dataset.files.values()):
        raise _Refused(
            f"the data files read here (SHA-256 {sorted(dataset.files.values())}) are not the "
            f"run's ({sorted(files.values())}); pass the run's --data-root"
        )
    from dataclasses import replace

    config = replace(spec.model, checkpoint=header["weights"], format=header["weights_format"])
    model, _ = load_checkpoint(config, dataset, registry)
    digest = weights_digest(model)
    if header.get("weights_digest") and digest != header["weights_digest"]:
        raise _Refused(
            f"the weights in {header['weights']} have SHA-256 {digest}, the run's are "
            f"{header['weights_digest']}: they are another model, refused"
        )
    batch_size = recorded.get("batch_size") or spec.protocol.batch_size
    if batch_size == "auto":
        from harness.engine.batchsize import auto_batch_size
        from harness.engine.precision import prepare_model

        batch_size = auto_batch_size(
            prepare_model(model.to(device), spec.protocol), dataset.input_shape, device
        )
    here = fingerprint(device, spec.protocol, int(batch_size))
    return _LoadedRun(spec, dataset, model.to(device).eval(), registry, here,
                      differences(recorded, here), int(batch_size))  # fmt: skip


def _engine(run: _LoadedRun, model, classes: int, seed: int):
    from harness.engine.precision import prepare_model
    from harness.engine.sampling import SamplingEngine

    return SamplingEngine(
        prepare_model(model, run.spec.protocol), classes, run.fingerprint["device_type"],
        run.batch_size, seed, noise=run.spec.protocol.noise, pad_batches=True,
    )  # fmt: skip


def _sigma_estimator(run: _LoadedRun, meta: Mapping[str, Any]):
    """The σ-estimator rebuilt from its saved state dict (digest checked)."""
    import torch

    from harness.foundation.artifacts import file_digest

    path = Path(meta["path"])
    if not path.is_file():
        raise _Refused(f"the σ-estimator's state dict {path} is missing; it ships beside the "
                       "board or in the run's cache folder")  # fmt: skip
    if file_digest(path) != meta["sha256"]:
        raise _Refused(f"{path} has SHA-256 {file_digest(path)}, the run recorded "
                       f"{meta['sha256']}: another σ-estimator, refused")  # fmt: skip
    if not meta.get("architecture"):
        raise _Refused(
            "the σ-smoothing declares no architecture (SigmaSmoothing.architecture), so its "
            "σ-estimator cannot be rebuilt from its state dict outside its plugin"
        )
    arch = _built_in(run.registry, "models", meta["architecture"], "σ-estimator architecture")
    params = {**arch.defaults, **dict(meta.get("architecture_params") or {})}
    model = arch.build(run.dataset.input_shape, len(meta["levels"]), params)
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return model.to(run.fingerprint["device_type"]).eval()


def _draws(engine, x, sigma, ids, n0: int, n: int, streams: tuple[int, int], soft: bool,
           fresh: bool) -> dict[str, Any]:  # fmt: skip
    """Selection (unless ``fresh``) and estimation draws, as the harness stores them."""
    out: dict[str, Any] = {}
    if not fresh:
        if soft:
            out["selection"] = [s.means.tolist() for s in
                                engine.soft_stats(x, sigma, ids, n0, streams[0])]  # fmt: skip
        else:
            out["selection"] = engine.counts(x, sigma, ids, n0, streams[0]).tolist()
    if soft:
        stats = engine.soft_stats(x, sigma, ids, n, streams[1])
        out["estimation"] = [s.means.tolist() for s in stats]
        out["estimation_sq"] = [(s.sums_sq / s.num).tolist() for s in stats]
    else:
        out["estimation"] = engine.counts(x, sigma, ids, n, streams[1]).tolist()
    return out


def _rounds(engine, x, sigma, ids, looks: Sequence[Sequence[int]], stream: int) -> dict[str, Any]:
    """Sequential draws re-drawn as the run drew them: round k (samples n_{k−1} … n_k − 1)
    for every input whose looks reach it, in one engine call; per input the cumulative
    counts at each of its looks, and its last look's as its estimation."""
    import numpy as np

    out: list[list[list[int]]] = [[] for _ in ids]
    total = [None] * len(ids)
    before = [0] * len(ids)
    for k in range(max((len(row) for row in looks), default=0)):
        live = [i for i, row in enumerate(looks) if len(row) > k]
        size = {looks[i][k] - before[i] for i in live}
        for num in sorted(size):  # one call per round size (the same for every input)
            group = [i for i in live if looks[i][k] - before[i] == num]
            starts = {before[i] for i in group}
            for start in sorted(starts):
                part = [i for i in group if before[i] == start]
                counts = engine.counts(x[part], [sigma[i] for i in part], [ids[i] for i in part],
                                       num, stream, start=start)  # fmt: skip
                for j, i in enumerate(part):
                    total[i] = counts[j] if total[i] is None else total[i] + counts[j]
                    out[i].append(np.asarray(total[i]).tolist())
        for i in live:
            before[i] = looks[i][k]
    return {"looks": out, "estimation": [row[-1] if row else [] for row in out]}


def _answer(request: Mapping[str, Any], runs: dict[str, _LoadedRun]) -> dict[str, Any]:
    from harness.engine.centre import request_centres, shifted
    from harness.engine.draws import SOFT, STREAM_SIGMA_ESTIMATION, STREAM_SIGMA_SELECTION
    from harness.engine.sampling import STREAM_ESTIMATION, STREAM_SELECTION, TALLY
    from harness.engine.scale import noise_levels

    start, samples, rows = time.perf_counter(), TALLY.samples, TALLY.rows
    key = json.dumps(request["run"], sort_keys=True)
    if key not in runs:
        runs.clear()  # one run at a time
        runs[key] = _load_run(request["run"])
    run = runs[key]
    protocol, seed = run.spec.protocol, run.spec.seed
    ids = [int(i) for i in request["inputs"]]
    x = run.dataset.test_x[ids].to(run.fingerprint["device_type"])
    exact = not run.differences
    fresh_base, fresh_sigma = request["fresh_streams"]
    soft = request["kind"] == SOFT
    engine = _engine(run, run.model, run.dataset.num_classes, seed)
    streams = (STREAM_SELECTION, STREAM_ESTIMATION) if exact else (None, fresh_base)
    looks = request.get("looks")
    sigma = noise_levels(request["sigma"], request.get("scale"))  # (a diagonal scale's)
    at = shifted(x, request_centres(request.get("centre"), len(ids)))  # the base draws' points
    if looks is None:
        base = _draws(engine, at, sigma, ids, protocol.n0, protocol.n, streams, soft, not exact)
    elif exact:  # sequential: the selection, then every stored look's round
        base = _draws(engine, at, sigma, ids, protocol.n0, 0, streams, False, False)
        base.update(_rounds(engine, at, sigma, ids, looks, streams[1]))
    else:  # the first look, drawn whatever the counts: fresh samples of as many
        base = _draws(engine, at, sigma, ids, protocol.n0, looks[0][0], streams, False, True)
    out: dict[str, Any] = {
        "ok": True, "mode": "exact" if exact else "replication", "arithmetic": run.fingerprint,
        "differences": run.differences, "base": base,
    }  # fmt: skip
    meta = request.get("sigma_model")
    if meta is not None:
        estimator = _engine(run, _sigma_estimator(run, meta), len(meta["levels"]), seed)
        noise = [float(meta["noise"])] * len(ids)
        streams = (
            (STREAM_SIGMA_SELECTION, STREAM_SIGMA_ESTIMATION) if exact else (None, fresh_sigma)
        )
        out["sigma"] = _draws(estimator, x, noise, ids, protocol.n0, protocol.n, streams, False,
                              not exact)  # fmt: skip
    out["seconds"] = time.perf_counter() - start
    out["samples"], out["forward_rows"] = TALLY.samples - samples, TALLY.rows - rows
    return out


def serve(lines, write) -> None:
    """Answer each JSON request of ``lines`` with one JSON line through ``write``."""
    runs: dict[str, _LoadedRun] = {}
    for line in lines:
        if not line.strip():
            continue
        try:
            answer = _answer(json.loads(line), runs)
        except (_Refused, IdrsError) as exc:
            answer = {"ok": False, "error": str(exc).splitlines()[0]}
        except Exception as exc:  # reported to the parent, which records the check's error
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        write(json.dumps(answer) + "\n")


def main() -> None:
    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    serve(sys.stdin, write)


if __name__ == "__main__":
    main()
