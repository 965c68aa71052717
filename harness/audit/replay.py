"""Replay: a few certificates of the row re-drawn where no plugin runs.

S0 re-derives every claim from the draws the store holds; this check asks whether the
store holds what the harness's sampling really gives. ``m`` = ``budget.replay_inputs``
certificates of the row (16 at the ``small`` budget, 64 at ``full``), chosen with the
audit's entropy (``audit.rng("replay")``, recorded), are re-examined:

1. **σ.** σ(x) is recomputed for all m in a shuffled batch, then for each input alone
   (a batch of one); the three (and the stored σ) must agree within a relative
   :data:`SIGMA_TOLERANCE` on every arithmetic, the run's own included. Bit for bit would
   be a premise of the machine: a BLAS may round a row by its position in the batch in a
   product the run's forward-only measurement (``arithmetic.rows_independent``) does not
   see (MKL's AVX-512 kernels round the odd rows of the input gradient otherwise:
   Alfarra et al.'s ascent alone and in a batch differ by 1.8·10⁻⁸ after 100 steps on an
   AMD EPYC, and agree bit for bit under ``MKL_CBWR=AVX2``), and another CPU's ``exp``
   may round a last bit otherwise. A σ-provider whose answer depends on the batch it is
   asked in, or on its state, by more than that is ``violated`` (naming the input and
   both values); within it, no certificate gains more than that relative radius. (A
   provider that memoizes σ by input, such as the built-in σ searches, answers the
   second query from its memo: the batch is then the recomputation, in another
   composition than the run's shard.)
2. **Samples.** ``python -m harness.running.redraw`` (:mod:`harness.running.redraw`: a fresh interpreter
   that loads no third-party plugin, given only the run's files, the input ids, the
   stored σ and the noise keys) re-draws them. On the run's arithmetic (the same
   fingerprint, :mod:`harness.engine.arithmetic`) the selection and estimation draws of the
   base model (streams 0/1) and of a σ-smoothing (streams 4/5) must equal the stored
   ones bit for bit (soft smoothing's float64 means on CUDA, whose atomic sums reorder
   additions, up to n·2⁻⁵², the bound of reordering n terms in [0, 1]); a mismatch is
   ``violated``, naming input, stream and both counts. On another arithmetic, n fresh
   estimation samples at the stored σ on streams from the audit's entropy give, per
   input, a score z that is exactly N(0, 1) under the null (hard smoothing: the
   randomized PIT of the stored count of the certified class given the total of stored
   and fresh counts, :func:`harness.mathematics.stats.replication_z`; soft smoothing: the Welch
   score of the certified class's mean output, :func:`harness.mathematics.stats.mean_difference_z`,
   N(0, 1) by the central limit theorem since the outputs lie in [0, 1] and there is no
   count to condition on); bias (Σz/√m) and dispersion (Σz² against χ²_m) are tested
   two-sided, Holm-corrected at p < 10⁻³ (:func:`harness.mathematics.stats.replication_test`).
   Draws made sequentially are re-drawn round by round: every stored look's counts must
   be replayed bit for bit; on another arithmetic the score is that of the first look
   (n_1 fresh samples), the only look drawn whatever the counts (a later look's count is
   not binomial given the data-dependent decision to draw it).

Null: the stored draws are the harness's samples of the run's keys at the stored σ,
and σ is a function of the input alone. Under it the bit-for-bit comparisons never
fail and the replication test rejects with probability at most 10⁻³.

The verdict is a function of the recorded evidence and the row's certificates
(:func:`judge`), so a board's verifier re-derives it (:mod:`harness.reports.leaderboard.recheck`).
A row drawn at a diagonal scale (:mod:`harness.engine.scale`) is replayed at its recorded
scales, and σ's test holds every axis of the recomputed scale (alone, in the batch,
stored) within the same tolerance.

Applicability: every row with the harness's draws. A run whose dataset or base-model
architecture is not built in, whose weights file is gone, or whose σ-smoothing declares
no built-in architecture cannot be replayed: an ``error`` (the row is not verified).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from harness.audit.audit import Audit, derived_seed
from harness.certification.certify import sigma_of, sigma_smoothing
from harness.engine.centre import centre_deviation, centre_of, decode_centre
from harness.engine.scale import decode_scale, relative_deviation, smallest_axis
from harness.foundation.errors import IdrsError
from harness.foundation.verdict import P_THRESHOLD, CheckResult, Verdict

NAME = "replay"
STREAMS = {"base": ("selection", 0, "estimation", 1), "sigma": ("selection", 4, "estimation", 5)}
"""Per smoothing: the name and noise stream of its selection and estimation draws."""
SIGMA_TOLERANCE = 1e-6
"""Relative difference allowed between the stored σ, σ recomputed alone and σ in a batch
(seen: 1 ulp for a closed form on another CPU, 3·10⁻⁹ for a σ found by gradient ascent on
another CPU, 1.8·10⁻⁸ for that ascent alone against in a batch on an AVX-512 CPU)."""
REPLAYER = ("harness.running.redraw", "process")
"""The run memo's key of the replay process (:class:`~harness.running.redraw.Replayer`),
started once per audit session and stopped when it ends (:func:`stop_replayer`)."""


def stop_replayer(context) -> None:
    """Stop the replay process of ``context``'s run, if one was started."""
    replayer = context.memos.pop(*REPLAYER)
    if replayer is not None:
        replayer.close()


def check_replay(audit: Audit) -> CheckResult:
    from harness.running.redraw import Replayer
    from harness.running.redraw_request import replay_request

    rows = audit.certificates
    if any(not r.get("draws") for r in rows):
        return CheckResult(NAME, Verdict.ERROR, "certificates without the harness's draws: the "
                           "run was certified before the harness drew the evidence; re-run it")  # fmt: skip
    if audit.source is None:
        return CheckResult(NAME, Verdict.ERROR, "the audit names no files of the run to replay")
    rng = audit.rng("replay")
    m = min(audit.budget.replay_inputs, len(rows))
    chosen = np.sort(rng.choice(len(rows), m, replace=False)) if m else np.zeros(0, dtype=int)
    ids = [int(rows[k]["input_id"]) for k in chosen]
    x = audit.inputs[chosen].to(audit.context.device) if m else audit.inputs[:0]

    def sigma(index) -> np.ndarray:  # on the inputs' own keys (a σ-smoothing draws on them)
        return sigma_of(audit.context, audit.sigma_provider, x[index], [ids[k] for k in index],
                        audit.method.sigma_provider)[0]  # fmt: skip

    def centre(index) -> np.ndarray | None:
        return centre_of(audit.sigma_provider, x[index], audit.method.sigma_provider)

    bases = [rows[k]["draws"]["base"] for k in chosen]
    stored_scale = [base.get("scale") for base in bases]
    stored_centre = [base.get("centre") for base in bases]
    noise = sigma_record(sigma, rng.permutation(m), stored_scale, centre, stored_centre)
    evidence: dict[str, Any] = {"inputs": ids, "budget": audit.budget.name, "sigma": noise}
    kind = rows[0]["draws"]["base"]["kind"] if rows else audit.certifier.smoothing
    smoothed = sigma_smoothing(audit.sigma_provider) is not None
    fresh_seed = derived_seed(audit.entropy, "replay/noise")
    request = replay_request(audit.source, str(audit.context.device), ids, bases, kind,
                             f"{audit.method.name} {audit.setting}" if smoothed else None,
                             fresh_seed)  # fmt: skip
    replayer = audit.context.memo(*REPLAYER, Replayer)
    answer = replayer.request(request) if m else {"mode": "exact", "base": {}, "arithmetic": {},
                                                  "differences": []}  # fmt: skip
    evidence |= {"mode": answer["mode"], "arithmetic": answer["arithmetic"],
                 "differences": answer["differences"], "fresh_seed": fresh_seed,
                 "seconds": answer.get("seconds")}  # fmt: skip
    drawn = {name: answer[name] for name in ("base", "sigma") if name in answer}
    if answer["mode"] == "exact":
        evidence["replayed"] = drawn
    else:
        evidence["fresh"] = drawn
        evidence["u"] = audit.rng("replay/pit").uniform(size=(2, m)).tolist()
    verdict, summary, detail = judge(evidence, {int(r["input_id"]): r for r in rows})
    evidence |= detail
    return CheckResult(NAME, verdict, summary, evidence)


def sigma_record(
    sigma: Callable[[Sequence[int]], np.ndarray], order: np.ndarray, stored_scale: list[str | None],
    centre: Callable[[Sequence[int]], np.ndarray | None] | None = None,
    stored_centre: list[str | None] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """σ of the replayed inputs recomputed in a shuffled batch (``order``), then each alone
    (``sigma(index)``: the provider's answer for those inputs, [k] or a scale [k, d]), as
    :func:`judge` reads them: their σ (of a diagonal scale its smallest axis) and, where a
    scale was drawn or is answered, every axis's deviations (``stored_scale``: the records);
    where a centre was drawn or is answered (``centre(index)``, ``stored_centre``,
    :mod:`harness.engine.centre`), every dimension's deviations of it."""
    m = len(order)
    in_batch = np.zeros(m)
    batch = sigma(order) if m else np.zeros(0)  # the batch first: a provider that memoizes
    in_batch[order] = smallest_axis(batch) if batch.ndim > 1 else batch  # answers the rest
    alone_answers = [sigma([k]) for k in range(m)]
    alone = [float(smallest_axis(a)[0] if a.ndim > 1 else a[0]) for a in alone_answers]
    record: dict[str, Any] = {"alone": alone, "batch": in_batch.tolist(), "order": order.tolist()}
    if any(text is not None for text in stored_scale) or batch.ndim > 1:
        stored = [None if t is None else decode_scale(t) for t in stored_scale]
        alone_rows = [a[0] if a.ndim > 1 else None for a in alone_answers]
        record["scale"] = _deviations(stored, batch if batch.ndim > 1 else None, order,
                                      alone_rows, relative_deviation)  # fmt: skip
    if centre is not None and m:
        stored = [None if t is None else decode_centre(t) for t in stored_centre or [None] * m]
        batch_centre = centre(order)
        if batch_centre is not None or any(c is not None for c in stored):
            alone_rows = [None if (c := centre([k])) is None else c[0] for k in range(m)]
            record["centre"] = _deviations(stored, batch_centre, order, alone_rows,
                                           centre_deviation)  # fmt: skip
    return record


def _deviations(
    stored: list[np.ndarray | None], batch: np.ndarray | None, order: np.ndarray,
    alone: list[np.ndarray | None], deviation: Callable[[np.ndarray, np.ndarray], float],
) -> dict[str, list[float]]:  # fmt: skip
    """Per replayed input, the ``deviation`` of its answer (a scale or a centre) recomputed
    alone from the one in a batch and from the stored one (inf where either is missing)."""
    in_batch = None
    if batch is not None:
        in_batch = np.empty_like(batch)
        in_batch[order] = batch
    vs_batch, vs_stored = [], []
    for k, (kept, mine) in enumerate(zip(stored, alone, strict=True)):
        same = in_batch is not None and mine is not None
        vs_batch.append(deviation(mine, in_batch[k]) if same else float("inf"))
        known = kept is not None and mine is not None
        vs_stored.append(deviation(mine, kept) if known else float("inf"))
    return {"alone_vs_batch": vs_batch, "alone_vs_stored": vs_stored}


def warm(audit: Audit) -> None:
    """Start the replay process and have it load the run while the other checks run
    (:meth:`harness.running.redraw.Replayer.warm`); a run it cannot load is the check's
    error, reported when it runs."""
    from harness.running.redraw import Replayer

    if audit.source is None:
        return
    try:
        header = audit.source.header(str(audit.context.device))
    except IdrsError:
        return
    audit.context.memo(*REPLAYER, Replayer).warm(header)


def judge(
    evidence: Mapping[str, Any], certificates: Mapping[int, Mapping[str, Any]]
) -> tuple[Verdict, str, dict[str, Any]]:
    """The verdict, summary and derived evidence of a replay record against the row's
    certificates (by input id): σ, then the bit-for-bit draws or the replication test."""
    ids = [int(i) for i in evidence["inputs"]]
    missing = [i for i in ids if i not in certificates]
    if missing:
        return Verdict.VIOLATED, f"replayed input {missing[0]} has no certificate in the row", {}
    rows = [certificates[i] for i in ids]
    sigma = evidence["sigma"]
    allowed = f"within {SIGMA_TOLERANCE:g} (relative)"

    def differ(u: float, v: float) -> bool:
        return not abs(u - v) <= SIGMA_TOLERANCE * abs(v)

    for i, row, a, b in zip(ids, rows, sigma["alone"], sigma["batch"], strict=True):
        stored, a, b = float(row["sigma"]), float(a), float(b)
        if differ(a, b):
            return Verdict.VIOLATED, (
                f"input {i}: σ recomputed alone (a batch of one) is {a!r} and in a shuffled batch "
                f"{b!r}, not equal {allowed}: the σ-provider's answer depends on the batch or on "
                "its state"
            ), {"mismatch": {"input_id": i, "quantity": "sigma", "how": "alone vs batch",
                             "alone": a, "batch": b}}  # fmt: skip
        if differ(a, stored):
            return Verdict.VIOLATED, (
                f"input {i}: σ recomputed is {a!r}, the stored σ is {stored!r}, not equal "
                f"{allowed}: the σ-provider's answer depends on its state"
            ), {"mismatch": {"input_id": i, "quantity": "sigma", "how": allowed,
                             "stored": stored, "recomputed": a}}  # fmt: skip
    # drawn at a diagonal scale: every axis, not only σ_min; around a centre: every dimension
    for quantity, what in (("scale", "diagonal scale"), ("centre", "centre")):
        record = sigma.get(quantity)
        for k, i in enumerate(ids if record is not None else []):
            for how, deviation in (("alone vs batch", record["alone_vs_batch"][k]),
                                   ("alone vs stored", record["alone_vs_stored"][k])):  # fmt: skip
                if not float(deviation if deviation is not None else "inf") <= SIGMA_TOLERANCE:
                    return Verdict.VIOLATED, (
                        f"input {i}: its {what} recomputed {how} differs by {deviation!r} "
                        f"(largest relative difference of a dimension), not {allowed}: the "
                        "σ-provider's answer depends on the batch or on its state"
                    ), {"mismatch": {"input_id": i, "quantity": quantity, "how": how,
                                     "relative": deviation}}  # fmt: skip
    where = f"{len(ids)} inputs"
    if evidence["mode"] == "exact":
        found = _first_mismatch(ids, rows, evidence["replayed"], evidence.get("arithmetic") or {})
        if found is not None:
            return Verdict.VIOLATED, found[0], {"mismatch": found[1]}
        return (
            Verdict.SOUND,
            (
                f"{where}: σ reproduced alone and in a shuffled batch, and every draw re-drawn bit "
                "for bit by a process without third-party plugins, on the run's arithmetic"
            ),
            {},
        )
    z, details = _scores(ids, rows, evidence["fresh"], evidence["u"])
    test = replication_record(z)
    derived = {"z": [float(v) for v in z], "scores": details, "test": test}
    text = (f"replication test with fresh noise on another arithmetic "
            f"({'; '.join(evidence.get('differences') or [])}): bias Σz/√m = {test['bias']:.3g} "
            f"(p = {test['p_bias']:.3g}), dispersion Σz² = {test['dispersion']:.3g} on "
            f"{test['m']} scores (p = {test['p_dispersion']:.3g}), Holm at p < {P_THRESHOLD:g}")  # fmt: skip
    if test["rejected"]:
        worst = int(np.argmax(np.abs(z))) if len(z) else 0
        return Verdict.VIOLATED, (
            f"{where}: the stored draws are not replicated by fresh samples ({', '.join(test['rejected'])} "
            f"rejected): {text}; largest score {details[worst]}"
        ), derived  # fmt: skip
    return Verdict.SOUND, f"{where}: σ reproduced; {text}", derived


def replication_record(z: Sequence[float]) -> dict[str, Any]:
    """:func:`harness.mathematics.stats.replication_test` at the checks' threshold."""
    from harness.mathematics.stats import replication_test

    return replication_test(np.asarray(z, dtype=np.float64), P_THRESHOLD)


def _first_mismatch(ids, rows, replayed, arithmetic) -> tuple[str, dict] | None:
    """The first stored draw that differs from its replay: (message, record), or None."""
    for smoothing, drawn in replayed.items():
        for position, (i, row) in enumerate(zip(ids, rows, strict=True)):
            stored = (row.get("draws") or {}).get(smoothing)
            if stored is None:
                return (f"input {i}: the replay drew a {smoothing} smoothing the certificate "
                        "does not carry", {"input_id": i, "smoothing": smoothing})  # fmt: skip
            tolerance = 0.0
            if stored.get("kind") == "soft" and arithmetic.get("device_type") == "cuda":
                tolerance = int(stored["n"]) * 2.0**-52
            names = STREAMS[smoothing]
            if "looks" in drawn:  # drawn in rounds: every look's counts
                found = _look_mismatch(i, smoothing, names[3], stored, drawn["looks"][position])
                if found is not None:
                    return found
            for name, stream in ((names[0], names[1]), (names[2], names[3]),
                                 ("estimation_sq", names[3])):  # fmt: skip
                if name not in drawn:
                    continue
                mine = np.asarray(drawn[name][position], dtype=np.float64)
                theirs = np.asarray(stored.get(name, []), dtype=np.float64)
                if mine.shape != theirs.shape or np.any(np.abs(mine - theirs) > tolerance):
                    c = int(np.argmax(np.abs(mine - theirs))) if mine.shape == theirs.shape else 0
                    hard = stored.get("kind") == "hard"
                    plain = int if hard else float
                    mine_l, theirs_l = [plain(v) for v in mine], [plain(v) for v in theirs]
                    s = theirs_l[c] if theirs_l else None
                    r = mine_l[c] if mine_l else None
                    return (
                        f"input {i}, stream {stream} ({smoothing} {name}): class {c} stored "
                        f"{s!r}, replayed {r!r} ({'counts' if hard else 'means'} stored "
                        f"{theirs_l}, replayed {mine_l})",
                        {"input_id": i, "smoothing": smoothing, "stream": stream, "draw": name,
                         "class": c, "stored": theirs_l, "replayed": mine_l},
                    )  # fmt: skip
    return None


def _look_mismatch(
    i: int, smoothing: str, stream: int, stored, replayed
) -> tuple[str, dict] | None:
    """The first look of a sequential draw whose replayed counts differ from the stored."""
    looks = stored.get("looks") or []
    if len(looks) != len(replayed):
        return (f"input {i}, stream {stream} ({smoothing}): {len(looks)} looks stored, "
                f"{len(replayed)} replayed", {"input_id": i, "smoothing": smoothing,
                                              "stream": stream, "looks": len(looks)})  # fmt: skip
    for k, (look, counts) in enumerate(zip(looks, replayed, strict=True)):
        if [int(c) for c in look.get("counts", [])] != [int(c) for c in counts]:
            return (f"input {i}, stream {stream} ({smoothing} look {k + 1}, n = {look.get('n')}): "
                    f"counts stored {look.get('counts')}, replayed {counts}",
                    {"input_id": i, "smoothing": smoothing, "stream": stream, "look": k + 1,
                     "stored": look.get("counts"), "replayed": counts})  # fmt: skip
    return None


def _scores(ids, rows, fresh, u) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Scores z per input and smoothing (base, then σ), N(0, 1) under the null."""
    from harness.mathematics.stats import mean_difference_z, replication_z

    z: list[float] = []
    details: list[dict[str, Any]] = []
    for s, smoothing in enumerate(("base", "sigma")):
        drawn = fresh.get(smoothing)
        if drawn is None:
            continue
        for position, (i, row) in enumerate(zip(ids, rows, strict=True)):
            stored = row["draws"][smoothing]
            top = int(np.argmax(stored["selection"]))
            n = int(stored["n"])
            if stored.get("looks"):  # sequential: the first look, drawn whatever the counts
                first = stored["looks"][0]
                n, k = int(first["n"]), int(first["counts"][top])
                f = int(drawn["estimation"][position][top])
                score = float(replication_z(np.array([k]), np.array([f]), n, n,
                                            np.array([u[s][position]]))[0])  # fmt: skip
            elif stored["kind"] == "hard":
                k, f = int(stored["estimation"][top]), int(drawn["estimation"][position][top])
                score = float(replication_z(np.array([k]), np.array([f]), n, n,
                                            np.array([u[s][position]]))[0])  # fmt: skip
            else:
                k, f = float(stored["estimation"][top]), float(drawn["estimation"][position][top])
                score = float(mean_difference_z(
                    k, stored["estimation_sq"][top], f, drawn["estimation_sq"][position][top], n
                ))  # fmt: skip
            z.append(score)
            details.append({"input_id": i, "smoothing": smoothing, "class": top, "stored": k,
                            "fresh": f, "z": score})  # fmt: skip
    return np.asarray(z), details
