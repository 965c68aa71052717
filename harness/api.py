"""A Python API for notebooks: certify a model you hold, or run a benchmark file.

    >>> from harness.api import certify
    >>> table = certify(model, inputs, labels, method="cohen", sigma=0.25, n=10_000)

:func:`certify` returns one row per input with the columns of the results store's
``certificates`` table (prediction, radius, p_A's lower bound, σ, class counts,
evidence), so a certificate made here carries the same evidence as one from
``idrs-bench run``. :func:`run` runs a benchmark file as ``idrs-bench run`` does, and
:func:`check` audits a stored run as ``idrs-bench check`` does (``entropy`` re-runs an
audit from its record).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

CERTIFICATE_COLUMNS = (
    "method", "setting", "input_id", "label", "prediction", "predict", "radius", "p_lower",
    "sigma", "alpha", "counts_selection", "counts_estimation", "seconds", "evidence", "draws",
)  # fmt: skip


def certify(
    model: torch.nn.Module,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    method: str = "cohen",
    sigma: float = 0.25,
    n0: int = 100,
    n: int = 100_000,
    alpha: float = 0.001,
    device: str | torch.device | None = None,
    seed: int = 0,
    batch_size: int | str = 1024,
    train_inputs: torch.Tensor | None = None,
    train_labels: torch.Tensor | None = None,
    precision: str = "auto",
    channels_last: bool = False,
    cudnn: str = "heuristic",
    sampling: str = "fixed",
    n_max: int | None = None,
    radii: Sequence[float] | None = None,
    fold_batchnorm: bool = False,
    compile: bool = False,
    cuda_graphs: bool = False,
    **params: Any,
) -> pd.DataFrame:
    """Certify ``inputs`` [N, *shape] (labels [N]) with a registered method, by default
    Cohen et al.'s constant σ (``method="cohen"``).

    ``model`` maps inputs in their own space to logits (normalization inside it).
    ``sigma`` and ``params`` are the method's parameters (``idrs-bench plugins`` lists
    them); CERTIFY draws ``n0`` selection and ``n`` estimation samples at failure
    probability ``alpha`` per input (Cohen et al. 2019, Alg. "CERTIFY"). Methods whose σ(x)
    uses training data (e.g. ``sukenik``) need ``train_inputs`` (and ``train_labels``).
    ``precision`` (``auto``: PyTorch's default arithmetic, tf32-conv, on CUDA and fp32
    elsewhere; or fp32, tf32, tf32-conv, bf16, fp16), ``channels_last`` and ``cudnn``
    (heuristic or benchmark) fix the arithmetic of the certified classifier, as
    ``[certification]`` does in a benchmark file (:mod:`harness.engine.precision`; the
    table's ``attrs["precision"]`` is the one used); σ-providers query the model in the same
    arithmetic. ``batch_size="auto"`` is the probed batch (:mod:`harness.engine.batchsize`).
    ``sampling="sequential"`` draws the estimation samples in rounds, at most ``n_max``
    (default ``n``), until each input's place on the radius grid ``radii`` (default
    0, 0.25, …, 1) is decided, as ``[certification] sampling`` does
    (:mod:`harness.mathematics.sequential`; hard-smoothing methods with a radius formula
    of idrs-bench, others are refused with the reason). ``fold_batchnorm`` (eval-mode
    BatchNorm folded into the convolution before it), ``compile`` (``torch.compile``) and
    ``cuda_graphs`` (CUDA graphs; nothing on a CPU) speed up the forward pass at the
    engine's batch shape, as the same keys of ``[certification]`` do
    (:mod:`harness.engine.forward`; folding and compiling round differently, so they are
    part of the arithmetic). Input k gets the noise of test point k of a benchmark with the
    same seed and arithmetic, so it gets that run's certificate.
    """
    from harness.running.held_model import certify_held_model

    rows, attrs = certify_held_model(
        model, inputs, labels, method, sigma, params, n0, n, alpha, device, seed, batch_size,
        train_inputs, train_labels, precision, channels_last, cudnn, sampling, n_max, radii,
        {"fold_batchnorm": fold_batchnorm, "compile": compile, "cuda_graphs": cuda_graphs},
    )  # fmt: skip
    frame = pd.DataFrame(rows, columns=list(CERTIFICATE_COLUMNS))
    frame.attrs.update(attrs)
    return frame.sort_values("input_id", ignore_index=True)


def run(
    spec: str | Path | Mapping[str, Any],
    db: str | Path = "idrs-bench.sqlite",
    device: str | None = None,
    data_root: str | None = None,
    download: bool = False,
    check: bool = True,
    cache_dir: str | Path | None = None,
    progress: bool = False,
    **overrides: Any,
) -> dict[str, Any]:
    """Run (or resume) the benchmark file ``spec``, as ``idrs-bench run`` does.

    ``spec`` is a benchmark file's path, or its tables as a mapping (the TOML's content).

    ``overrides`` set spec values by dotted key, with ``__`` standing for the dot:
    ``run("b.toml", certification__n=200)`` is ``--set certification.n=200``. Returns
    the run id, the weights digest, the per-row summary (a DataFrame, one row per method
    and setting, with each row's ``verdict``, the ``checks_applied`` and their ``flags``,
    as ``idrs-bench results`` shows them), the ``verdicts`` (a dict (method, setting) ->
    verdict), the certificates (a DataFrame with the store's columns) and the ``failures``
    (one dict per row that failed: method, setting, error; calling ``run`` again retries
    them). Processes that run the same benchmark on the same database share the work, as
    ``idrs-bench run`` does. The plugin hosts it starts end when it returns.
    """
    from harness.foundation.progress import Progress
    from harness.plugin.manager import PluginManager
    from harness.running.benchmark import load_benchmark, parse_benchmark, set_value
    from harness.running.preparation import RunOptions
    from harness.running.runner import run_benchmark
    from harness.store.store import ResultStore
    from harness.store.storedrun import read_run

    dotted = {key.replace("__", "."): value for key, value in overrides.items()}
    if isinstance(spec, Mapping):
        raw = copy.deepcopy(dict(spec))
        for key, value in dotted.items():
            set_value(raw, key, value)
        loaded = parse_benchmark(raw)
    else:
        loaded = load_benchmark(spec, dotted)
    options = RunOptions(
        db=Path(db), device=device, data_root=data_root, download=download,
        cache_dir=None if cache_dir is None else Path(cache_dir),
    )  # fmt: skip
    reporter = Progress(enabled=progress)
    with PluginManager() as manager:  # (the run's and the checks': its hosts end here)
        run_id = run_benchmark(loaded, options, reporter, manager)
        if check:
            from harness.audit.auditor import run_checks
            from harness.store.leases import exclusive

            with exclusive(db, run_id, "the soundness checks", reporter.note) as ours:
                if ours:
                    run_checks(
                        Path(db), run_id, options, reporter, manager, budget="small", resume=True
                    )
    store = ResultStore(db)
    try:
        stored = read_run(store, run_id)
        certificates = list(store.certificates(run_id))
    finally:
        store.close()
    rows = stored.rows()
    verdicts = {(row.method, row.setting): row.verdict for row in rows}
    summary = pd.DataFrame(
        [
            s | {"verdict": row.verdict, "checks_applied": row.applied, "flags": row.flags}
            for s, row in zip(stored.summaries(), rows, strict=True)
        ]
    )
    return {
        "run_id": run_id,
        "weights_digest": stored.run.get("weights_digest"),
        "summary": summary,
        "verdicts": verdicts,
        "certificates": pd.DataFrame(certificates),
        "failures": [{k: f[k] for k in ("method", "setting", "error")} for f in stored.failures],
    }


def check(
    db: str | Path = "idrs-bench.sqlite",
    run: str | None = None,
    method: str | None = None,
    budget: str = "small",
    entropy: str | int | None = None,
    device: str | None = None,
    data_root: str | None = None,
    cache_dir: str | Path | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Audit the run ``run`` (id or unique prefix; default: the latest) in ``db`` as
    ``idrs-bench check`` does, and store the verdicts.

    Each audit draws fresh entropy (``os.urandom``) and records it (hex) in every check's
    evidence; ``entropy`` (that hex string, or the integer) re-runs an audit from its
    record with the same random choices, hence the same verdicts and evidence. Returns one
    row per (method, setting, check): verdict, summary, evidence.
    """
    from harness.audit.audit import parse_entropy
    from harness.audit.auditor import run_checks
    from harness.foundation.progress import Progress
    from harness.running.preparation import RunOptions

    options = RunOptions(
        db=Path(db), device=device, data_root=data_root,
        cache_dir=None if cache_dir is None else Path(cache_dir),
    )  # fmt: skip
    results = run_checks(Path(db), run, options, Progress(enabled=progress), method=method,
                         budget=budget, entropy=parse_entropy(entropy))  # fmt: skip
    return pd.DataFrame([
        {"method": m, "setting": s, "check": r.check, "verdict": str(r.verdict),
         "summary": r.summary, "evidence": r.evidence}
        for (m, s), rs in results.items() for r in rs
    ])  # fmt: skip
