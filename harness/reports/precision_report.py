"""What a lower precision (or a faster forward pass) changes: one benchmark certified in
plain fp32 and in another arithmetic.

    python3 -m harness.reports.precision_report SPEC.toml [--set KEY=VALUE ...] [--precision bf16]
        [--fold-batchnorm] [--compile] [--db PATH] [--device cpu|cuda] [--json]

Runs (or resumes) the benchmark twice in the same database, identical but for
``[certification] precision`` and the forward options (``fold_batchnorm``, ``compile``:
:mod:`harness.engine.forward`; the first run in plain fp32 without them), with the same
seed, so the same noise for the same input and σ, and counts, per method and setting:

- **decisions**: argmax decisions of the base classifier that differ, over the very
  noisy samples x + σ(x)·ε of the fp32 run's estimation counts (n per certificate, at
  the fp32 σ(x)); both arithmetics see each sample once (:class:`JointDecisions`), so
  this is an exact count, not a difference of counts;
- **predictions**, **abstentions** and **certified** (radius > 0): certificates whose
  value differs between the two runs;
- **radii**: certificates certified in both whose radius differs, and the largest and
  mean |ΔR| over those certified in both;
- **σ(x)**: certificates whose σ differs (σ-providers that query the base model).

For hard-smoothing certificates the fp32 half of the joint decisions must reproduce the
stored estimation counts (``counts_reproduced``: the samples are the certificates' own);
soft-smoothing certificates store no counts (``None``), their samples are drawn alike.

It also counts the argmax decisions that differ on the clean test inputs (the whole
test split). A certificate is a statement about one classifier; this says how far the
bf16 one is from the fp32 one on a benchmark (:mod:`harness.engine.precision`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.certification.certify import STREAM_ESTIMATION
from harness.engine.precision import PrecisionModel, prepare_model
from harness.engine.sampling import SamplingEngine
from harness.foundation.certificate import ABSTAIN
from harness.foundation.errors import IdrsError
from harness.foundation.progress import Progress
from harness.foundation.protocol import FORWARD_NAMES, FORWARD_OPTIONS
from harness.running.benchmark import load_benchmark
from harness.running.preparation import RunOptions, prepare
from harness.running.runner import run_benchmark
from harness.store.store import ResultStore


class JointDecisions(torch.nn.Module):
    """Both arithmetics on the same inputs: "logits" over C² joint classes whose argmax
    is ``a·C + b``, a and b the argmax of the first and the second model."""

    def __init__(self, first: torch.nn.Module, second: torch.nn.Module, classes: int) -> None:
        super().__init__()
        self.first, self.second, self.classes = first, second, classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        joint = self.first(x).argmax(1) * self.classes + self.second(x).argmax(1)
        return torch.nn.functional.one_hot(joint, self.classes**2).float()


def _radius_row(a: dict, b: dict) -> tuple[bool, float]:
    both = a["radius"] > 0 and b["radius"] > 0
    return both, abs(a["radius"] - b["radius"]) if both else 0.0


def compare_certificates(first: list[dict], second: list[dict]) -> dict[str, dict[str, Any]]:
    """Per ``method setting``: certificates whose prediction, abstention, certification,
    radius or σ differ between two runs of the same inputs."""
    by_key = {(c["method"], c["setting"], c["input_id"]): c for c in second}
    out: dict[str, dict[str, Any]] = defaultdict(lambda: {
        "certificates": 0, "predictions": 0, "abstentions": 0, "certified": 0,
        "certified_in_both": 0, "radii": 0, "max_radius_change": 0.0, "mean_radius_change": 0.0,
        "sigmas": 0,
    })  # fmt: skip
    for a in first:
        b = by_key.get((a["method"], a["setting"], a["input_id"]))
        if b is None:
            continue
        row = out[f"{a['method']} {a['setting']}"]
        row["certificates"] += 1
        row["predictions"] += a["prediction"] != b["prediction"]
        row["abstentions"] += (a["prediction"] == ABSTAIN) != (b["prediction"] == ABSTAIN)
        row["certified"] += (a["radius"] > 0) != (b["radius"] > 0)
        row["sigmas"] += a["sigma"] != b["sigma"]
        both, change = _radius_row(a, b)
        if both:
            row["certified_in_both"] += 1
            row["radii"] += change != 0.0
            row["max_radius_change"] = max(row["max_radius_change"], change)
            row["mean_radius_change"] += change
    for row in out.values():
        row["mean_radius_change"] /= max(row["certified_in_both"], 1)
    return dict(out)


def noisy_decisions(engine: SamplingEngine, x: torch.Tensor, certs: list[dict], n: int):
    """(samples, differing decisions, fp32 counts per certificate): the joint decisions of
    ``engine`` (a :class:`JointDecisions` model) on the estimation samples of ``certs``."""
    classes = engine.model.classes
    ids = [c["input_id"] for c in certs]
    sigma = [c["sigma"] for c in certs]
    joint = engine.counts(x, sigma, ids, n, STREAM_ESTIMATION).reshape(len(certs), classes, classes)
    differ = int(joint.sum() - np.trace(joint, axis1=1, axis2=2).sum())
    return len(certs) * n, differ, joint.sum(axis=2)


def precision_report(spec_path: str, overrides: list[str], precision: str, options: RunOptions,
                     progress: Progress, forward: Sequence[str] = ()) -> dict[str, Any]:  # fmt: skip
    """Run ``spec_path`` in plain fp32 and in ``precision`` with the ``forward`` options on
    (:data:`~harness.foundation.protocol.FORWARD_OPTIONS`); the counts of the module
    docstring. The report names the second arithmetic ``precision`` (e.g. ``bf16``, or
    ``fp32+bn-folded``)."""
    label = precision + "".join(f"+{FORWARD_NAMES[o]}" for o in forward)
    if label == "fp32":
        raise IdrsError("compare fp32 with another precision or with a forward option on "
                        "(--precision bf16, --fold-batchnorm, --compile)")  # fmt: skip

    def arithmetic(p: str, on: Sequence[str]) -> list[str]:
        return [*overrides, f'certification.precision="{p}"',
                *(f"certification.{o}={str(o in on).lower()}" for o in FORWARD_OPTIONS)]  # fmt: skip

    specs = {"fp32": load_benchmark(spec_path, arithmetic("fp32", ())),
             label: load_benchmark(spec_path, arithmetic(precision, forward))}  # fmt: skip
    precision = label
    run_ids = {p: run_benchmark(s, options, progress) for p, s in specs.items()}
    store = ResultStore(options.db)
    try:
        certs = {p: list(store.certificates(r)) for p, r in run_ids.items()}
    finally:
        store.close()
    rows = compare_certificates(certs["fp32"], certs[precision])
    prepared = prepare(specs["fp32"], options, progress)
    context, spec, test_x = prepared.context, prepared.benchmark, prepared.dataset.test_x
    model = context.model
    lower = prepare_model(model, specs[precision].protocol)
    if isinstance(lower, PrecisionModel):  # compiled at the run's batch shape, as certified
        lower.serve(context.engine.batch_size)
    classes = context.dataset.num_classes
    # padded as the run's engine is: each row's logits are then those the run computed
    joint = SamplingEngine(JointDecisions(context.engine.model, lower, classes), classes**2,
                           context.device, context.engine.batch_size, spec.seed,
                           noise=spec.protocol.noise, pad_batches=True)  # fmt: skip
    grouped: dict[str, list[dict]] = defaultdict(list)
    for c in certs["fp32"]:
        grouped[f"{c['method']} {c['setting']}"].append(c)
    for key, group in grouped.items():
        x = test_x[torch.tensor([c["input_id"] for c in group])]
        samples, differ, counts = noisy_decisions(joint, x, group, spec.protocol.n)
        hard = all(c["counts_estimation"] is not None for c in group)
        # the same samples as the fp32 certificates: their stored counts come out again
        same = (
            bool(np.array_equal(counts, [c["counts_estimation"] for c in group])) if hard else None
        )
        rows[key].update(samples=samples, decisions=differ, counts_reproduced=same)
    with torch.no_grad():
        clean = sum(int((context.engine.model(b.to(context.device)).argmax(1)
                         != lower(b.to(context.device)).argmax(1)).sum())
                    for b in test_x.split(4096))  # fmt: skip
    return {"spec": spec.name, "precision": precision, "runs": run_ids,
            "clean_inputs": len(test_x), "clean_decisions": clean, "settings": rows}  # fmt: skip


def format_report(report: dict[str, Any]) -> str:
    """A markdown table of :func:`precision_report`'s counts."""
    p = report["precision"]
    lines = [
        f"fp32 vs {p} on {report['spec']} (runs {report['runs']['fp32'][:12]}, "
        f"{report['runs'][p][:12]}); clean test inputs: {report['clean_decisions']} of "
        f"{report['clean_inputs']} argmax decisions differ",
        "",
        "| method setting | certificates | noisy decisions differ | predictions | abstentions "
        "| certified | σ(x) | radii differ (of both certified) | max abs ΔR | mean abs ΔR |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    total = defaultdict(float)
    for key, r in report["settings"].items():
        lines.append(
            f"| {key} | {r['certificates']} | {r['decisions']:,} of {r['samples']:,} "
            f"| {r['predictions']} | {r['abstentions']} | {r['certified']} | {r['sigmas']} "
            f"| {r['radii']} of {r['certified_in_both']} | {r['max_radius_change']:.3g} "
            f"| {r['mean_radius_change']:.3g} |"
        )
        for k in ("certificates", "decisions", "samples", "predictions", "abstentions",
                  "certified", "sigmas", "radii", "certified_in_both"):  # fmt: skip
            total[k] += r[k]
        total["max"] = max(total["max"], r["max_radius_change"])
    t = {k: int(v) for k, v in total.items() if k != "max"}
    lines.append(
        f"| **all** | {t['certificates']} | {t['decisions']:,} of {t['samples']:,} "
        f"| {t['predictions']} | {t['abstentions']} | {t['certified']} | {t['sigmas']} "
        f"| {t['radii']} of {t['certified_in_both']} | {total['max']:.3g} | |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m harness.reports.precision_report",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("spec", help="benchmark TOML file")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a spec value (VALUE is TOML), as for idrs-bench run")  # fmt: skip
    parser.add_argument(
        "--precision", default="bf16", choices=("fp32", "tf32", "tf32-conv", "bf16", "fp16")
    )
    parser.add_argument("--fold-batchnorm", action="store_true",
                        help="the second run folds BatchNorm into the convolutions")  # fmt: skip
    parser.add_argument("--compile", action="store_true",
                        help="the second run computes with torch.compile")  # fmt: skip
    parser.add_argument("--db", default="idrs-bench.sqlite", help="results database")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None)
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    args = parser.parse_args(argv)
    options = RunOptions(db=Path(args.db), device=args.device)
    forward = [o for o, on in (("fold_batchnorm", args.fold_batchnorm),
                               ("compile", args.compile)) if on]  # fmt: skip
    report = precision_report(args.spec, args.set, args.precision, options,
                              Progress(enabled=not args.json), forward)  # fmt: skip
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
