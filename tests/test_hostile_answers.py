"""A plugin host's answers are bounded before they are read, and checked when they are
(docs/threat-model.md, "Answers"): a frame whose head claims more than its request can
need is refused from the head alone, whatever it claims, with the harness's memory
untouched; a malformed σ, claim or staged record fails its row naming the plugin, never
certifies; evidence is bounded and strict JSON, integers fit SQLite, and the run export
is strict JSON."""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
import textwrap
import tomllib

import numpy as np
import pytest
import torch

from harness.foundation.storable import EVIDENCE_BYTES, evidence_json
from harness.plugin.hosting.in_harness import limits
from harness.plugin.hosting.shared import host_protocol as protocol
from harness.plugin.hosting.shared import wire

HOSTILE = '''
import math, os
from dataclasses import replace

import numpy as np
import torch

from harness import CertifierSpec, Constant, MethodSpec, SigmaProviderSpec, StateRecord, hookimpl
from harness.plugin.hosting.shared import wire

IDRS_BENCH_CONTRACT = 4


def _frame_head(header, payload):
    """A frame's head claiming these lengths, on the descriptor the answers travel on
    (found as a plugin could: a pipe open for writing, not stdin's or stderr's)."""
    ours = {os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 2)}
    for entry in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{entry}")
            with open(f"/proc/self/fdinfo/{entry}") as info:
                flags = int(info.read().split("flags:")[1].split()[0], 8)
        except (OSError, IndexError, ValueError):
            continue
        if link.startswith("pipe:") and link not in ours and flags & os.O_ACCMODE == os.O_WRONLY:
            os.write(int(entry), wire.HEAD.pack(wire.MAGIC, header, payload))


SIGMAS = {
    "payload-claim": lambda n: _frame_head(2, 1 << 62),
    "header-claim": lambda n: _frame_head(114 << 20, 0),
    "complex": lambda n: torch.full((n,), 0.25, dtype=torch.complex64),
    "object": lambda n: np.array([0.25] * n, dtype=object),
    "integer": lambda n: torch.ones(n, dtype=torch.int64),
    "nan": lambda n: torch.full((n,), math.nan),
}


class Sigma:
    def __init__(self, act):
        self.act, self.regularity = act, Constant(0.25)

    def __call__(self, x):
        bent = SIGMAS.get(self.act, lambda n: None)(len(x))
        return torch.full((len(x),), 0.25, device=x.device) if bent is None else bent


def _bend(act, claim, context):
    if act == "predict-outside":
        return replace(claim, predict=context.dataset.num_classes)
    if act == "predict-huge":
        return replace(claim, predict=1 << 70)
    if act == "prediction-huge":
        return replace(claim, prediction=1 << 70)
    if act == "abstain-radius":
        return replace(claim, prediction=-1, radius=0.5)
    if act == "evidence-large":
        return replace(claim, evidence={"blob": "x" * 20_000})
    if act == "evidence-nan":
        return replace(claim, evidence={"score": math.nan})
    if act == "state-seq-huge":
        context.state.staged.append(StateRecord(1 << 70, {}, b""))
    return claim


class Bent:
    """Cohen's certifier, one of its claims bent as ``act`` says."""

    def __init__(self, inner, act, context):
        self.inner, self.act, self.context = inner, act, context
        self.smoothing, self.order_dependent = inner.smoothing, inner.order_dependent
        self.radius_formula = inner.radius_formula

    def certify(self, evidence):
        claims = list(self.inner.certify(evidence))
        return [_bend(self.act, claims[0], self.context), *claims[1:]]


def _certifier(context, params, sigma_provider):
    inner = context.registry.get("certifiers", "cohen").build(context, params, sigma_provider)
    return Bent(inner, params["act"], context)


@hookimpl
def idrs_register_sigma_providers(register):
    register(SigmaProviderSpec("hostile-sigma", lambda context, params: Sigma(params["act"])))


@hookimpl
def idrs_register_certifiers(register):
    register(CertifierSpec("hostile-certifier", _certifier))


@hookimpl
def idrs_register_methods(register):
    for act in SIGMA_ACTS:
        register(MethodSpec(f"hostile-{act}", "hostile-sigma", "cohen", {"act": act}))
    for act in CLAIM_ACTS:
        register(MethodSpec(f"hostile-{act}", "hostile-sigma", "hostile-certifier",
                            {"act": act}))
'''

DISTRIBUTION = "idrs-test-hostile"
HOST = f"the plugin host of {DISTRIBUTION}"
SIGMA = f"σ-provider 'hostile-sigma' (plugin 'idrs_test_hostile', in {HOST})"
CERTIFIER = f"certifier 'hostile-certifier' (plugin 'idrs_test_hostile' of {DISTRIBUTION})"
FAILED = {  # each bad answer: what its row's error says (besides the plugin)
    "payload-claim": (
        HOST,
        "answered the request 'sigma' with a frame whose head claims a "
        f"payload of {1 << 62} bytes, past the limit of 64 bytes (σ of 4 inputs",
    ),
    "header-claim": (
        HOST,
        f"claims a header of {114 << 20} bytes, past the limit of "
        f"{limits.CONTROL_BYTES} bytes (σ of 4 inputs",
    ),
    "complex": (HOST, "cannot be sent to the harness: an array of dtype complex64"),
    "object": (HOST, "cannot be sent to the harness: an array of dtype object"),
    "integer": (SIGMA, "returned σ of dtype torch.int64; a σ-provider returns a real"),
    "nan": (SIGMA, "returned σ = nan (entry 0); σ must be positive and finite"),
    "predict-outside": (CERTIFIER, "claimed PREDICT class 2; classes are 0..1 and -1 abstains"),
    "predict-huge": (CERTIFIER, f"claimed PREDICT class {1 << 70}; classes are 0..1"),
    "prediction-huge": (CERTIFIER, f"claimed class {1 << 70}; classes are 0..1"),
    "abstain-radius": (
        CERTIFIER,
        "claimed radius 0.5 with class -1; a radius is finite, >= 0, and 0 when abstaining",
    ),
    "evidence-large": (
        CERTIFIER,
        "whose evidence cannot be stored: it takes 20012 bytes of JSON, "
        f"past the limit of {EVIDENCE_BYTES} bytes per claim (EVIDENCE_BYTES)",
    ),
    "evidence-nan": (CERTIFIER, "whose evidence cannot be stored: it holds a NaN or an infinity"),
    "state-seq-huge": (
        f"certifier 'hostile-certifier' (plugin 'idrs_test_hostile', in {HOST})",
        f"staged a state record of the wrong types: {{'seq': {1 << 70}",
    ),
}
SIGMA_ACTS = ("payload-claim", "header-claim", "complex", "object", "integer", "nan")
CLAIM_ACTS = tuple(act for act in FAILED if act not in SIGMA_ACTS)


# --- the bounds, unit by unit --------------------------------------------------------------


def _head(header: int, payload: int) -> bytes:
    return wire.HEAD.pack(wire.MAGIC, header, payload)


@pytest.mark.parametrize("header, payload, said", [
    (10, 1 << 62, f"a payload of {1 << 62} bytes, past the limit of 256 bytes (σ of 32 inputs)"),
    (10, 3 << 30, f"a payload of {3 << 30} bytes, past the limit of 256 bytes"),
    (114 << 20, 0, f"a header of {114 << 20} bytes, past the limit of 65536 bytes"),
    ((1 << 64) - 1, 0, f"a header of {(1 << 64) - 1} bytes"),
])  # fmt: skip
def test_a_frame_head_past_its_limit_is_refused_from_the_head_alone(header, payload, said):
    with pytest.raises(wire.PastLimit, match=said.replace("(", r"\(").replace(")", r"\)")):
        wire.lengths(_head(header, payload), wire.Limit(65536, 256, "σ of 32 inputs"))
    assert wire.lengths(_head(65536, 256), wire.Limit(65536, 256)) == (65536, 256)


def test_each_request_bounds_its_answer_by_what_it_asks():
    """σ of k inputs: a float64 value per input element (a diagonal scale; twice that with
    the gradients), and so a centre; claims: a bound per claim; a trainer: its state; a
    control request: the generic bound."""
    x = torch.zeros(32, 3, 8, 8)
    sigma = limits.answer_limit(protocol.Sigma(1, "c1", x, "cpu", gradient=False))
    assert (sigma.header, sigma.payload) == (limits.CONTROL_BYTES, 8 * x.numel())
    gradients = limits.answer_limit(protocol.Sigma(1, "c1", x, "cpu", gradient=True))
    assert gradients.payload == 2 * 8 * x.numel()
    centre = limits.answer_limit(protocol.Centre(1, "c1", x, "cpu"))
    assert (centre.header, centre.payload) == (limits.CONTROL_BYTES, 8 * x.numel())
    evidence = {"input_ids": list(range(8)), "x": x[:8]}
    claims = limits.answer_limit(protocol.Certify(1, "c1", evidence))
    per_claim = limits.CLAIM_BYTES + 2 * EVIDENCE_BYTES
    assert claims.header == limits.CONTROL_BYTES + 8 * per_claim < 1 << 20
    state = {"w": torch.zeros(100, 10), "b": torch.zeros(10)}
    train = protocol.Train("t", {"state": state}, {}, {}, 0, "cpu")
    assert limits.answer_limit(train).payload == limits.CONTROL_BYTES + 8 * 1010
    control = limits.answer_limit(protocol.Context({}))
    assert (control.header, control.payload) == (limits.CONTROL_BYTES, limits.CONTROL_BYTES)
    assert "'context'" in control.what
    data = limits.answer_limit(protocol.LoadDataset("d"))
    assert 0 < data.payload <= max(limits.CONTROL_BYTES, limits.available_memory())
    assert "half the memory" in data.what


@pytest.mark.parametrize("header", [
    b"[" * 10_000 + b"]" * 10_000,  # deeper than json's recursion
    b"[" * (wire.MAX_DEPTH + 1) + b"]" * (wire.MAX_DEPTH + 1),
    b'{"a": ' * (wire.MAX_DEPTH + 1) + b"0" + b"}" * (wire.MAX_DEPTH + 1),
    b"1" * 5000,  # an integer of 5,000 digits
    b'{"__wire__": "ndarray", "dtype": "float64", "shape": [4294967296, 4294967296], '
    b'"blob": 0, "nbytes": 0}',  # a shape whose product wraps around int64 to 0
])  # fmt: skip
def test_a_header_of_the_wrong_structure_is_a_wire_error(header):
    with pytest.raises(wire.WireError):
        wire.decode(header, memoryview(b""))


@pytest.mark.parametrize("item", [b"{}", b"[]", b"0"])
def test_a_header_within_its_limit_is_decoded_in_place_and_stays_small(item):
    """The decoded value of a header of empty dicts or lists (the worst cases: some 50 bytes
    of objects per header byte) within the generic bound is at most a few MiB."""
    import tracemalloc

    count = limits.CONTROL_BYTES // (len(item) + 1)
    header = b"[" + b",".join([item] * count) + b"]"
    tracemalloc.start()
    value = wire.decode(header, memoryview(b""))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(value) == count and peak < 64 * limits.CONTROL_BYTES


MEMORY = textwrap.dedent("""
    import json, os, threading, time
    from harness.plugin.hosting.in_harness import exchange
    from harness.plugin.hosting.shared import wire

    def high_water():
        with open("/proc/self/status") as status:
            return next(int(l.split()[1]) * 1024 for l in status if l.startswith("VmHWM:"))

    baseline, said = high_water(), []
    limit = wire.Limit(65536, 256, "σ of 32 inputs")
    for header, payload in [(2, 1 << 62), (2, 3 << 30), (114 << 20, 0), (1 << 62, 0)]:
        answers, host = os.pipe()
        requests_read, requests = os.pipe()
        def send():  # the head, then as much of what it claims as the pipe takes
            try:
                os.write(host, wire.HEAD.pack(wire.MAGIC, header, payload))
                os.write(host, b"{}," * (1 << 20))
            except OSError:
                pass
        writer = threading.Thread(target=send)
        writer.start()
        try:
            exchange.exchange(requests, answers, b"", time.monotonic() + 30, limit)
        except wire.PastLimit as exc:
            said.append(str(exc))
        for fd in (answers, requests_read, requests):
            os.close(fd)
        writer.join()
        os.close(host)
    print(json.dumps({"baseline": baseline, "peak": high_water(), "said": said}))
""")


def test_the_harness_peak_memory_stays_at_its_baseline_whatever_a_host_claims():
    """A process reading answers (as the harness does) from a host that claims 2^62 bytes of
    payload, 3 GiB of it, 114 MiB of header and 2^62 of header: each is refused, and the
    process's peak memory (VmHWM) does not grow past a few MiB above its baseline."""
    out = subprocess.run([sys.executable, "-c", MEMORY], capture_output=True, text=True,
                         timeout=120, check=True)  # fmt: skip
    got = json.loads(out.stdout)
    assert len(got["said"]) == 4 and all("past the limit of" in s for s in got["said"])
    assert got["peak"] < got["baseline"] + (8 << 20), got


def test_evidence_is_bounded_strict_json():
    assert json.loads(evidence_json({"level": 2, "p": np.float64(0.5), "t": torch.ones(2)})) == {
        "level": 2, "p": 0.5, "t": [1.0, 1.0]}  # fmt: skip
    with pytest.raises(ValueError, match="holds a NaN or an infinity"):
        evidence_json({"p": math.inf})
    with pytest.raises(ValueError, match=f"past the limit of {EVIDENCE_BYTES} bytes per claim"):
        evidence_json({"blob": "x" * EVIDENCE_BYTES})


def test_the_store_refuses_integers_sqlite_cannot_hold(tmp_path):
    from harness.foundation.certificate import Certificate
    from harness.foundation.errors import IdrsError
    from harness.store.store import ResultStore

    store = ResultStore(tmp_path / "runs.sqlite")
    try:
        store.begin_run("r", "n", {}, {}, "c", "cpu", 0, "h")
        cert = Certificate(0, 1 << 70, 0.0, 0.9, 0.25, 0.001)
        with pytest.raises(IdrsError, match=f"has prediction {1 << 70}, not an integer that "):
            store.add_shard("r", "m", "s", 0, [(1, cert, ())])
        assert list(store.certificates("r")) == []
    finally:
        store.close()


# --- a run: every malformed answer fails its own row, named ---------------------------------


def test_each_malformed_answer_fails_its_row_naming_the_plugin_beside_a_certified_row(
    install_plugin, tmp_path, beside_cohen
):
    """One run: the built-in ``cohen`` row certifies; each row whose plugin answered a frame
    past its limit, a σ that is complex, of objects, of integers or NaN, a PREDICT class
    outside the classes, a class or PREDICT of 2^70, an abstention with a radius, evidence
    past its bound or with a NaN, or a state record at 2^70, failed, naming the plugin (and
    the limit), and stored no certificate."""
    from harness.foundation.progress import Progress
    from harness.plugin.manager import PluginManager
    from harness.running.benchmark import parse_benchmark
    from harness.running.preparation import RunOptions
    from harness.running.runner import run_benchmark
    from harness.store.storedrun import load_runs

    source = HOSTILE.replace("IDRS_BENCH_CONTRACT = 4", f"IDRS_BENCH_CONTRACT = 4\nSIGMA_ACTS = "
                             f"{SIGMA_ACTS!r}\nCLAIM_ACTS = {CLAIM_ACTS!r}")  # fmt: skip
    install_plugin("idrs_test_hostile", source, distribution=DISTRIBUTION)
    spec = tmp_path / "hostile.toml"
    spec.write_text(beside_cohen("hostile", [f"hostile-{act}" for act in FAILED]))
    db = tmp_path / "runs.sqlite"
    with PluginManager() as manager:
        run_benchmark(parse_benchmark(tomllib.loads(spec.read_text())), RunOptions(db=db),
                      Progress(enabled=False), manager)  # fmt: skip
    [run] = load_runs(db)
    failures = {f["method"].removeprefix("hostile-"): f["error"] for f in run.failures}
    assert sorted(failures) == sorted(FAILED), failures
    for act, (who, said) in FAILED.items():
        assert who in failures[act] and said in failures[act], (act, failures[act])
    counts = run.counts()
    assert {m for m, _ in counts} == {"cohen"} and set(counts.values()) == {4}, counts
    alone = tmp_path / "alone.sqlite"  # the built-in row certifies exactly as without them
    spec.write_text(beside_cohen("hostile"))
    with PluginManager() as manager:
        run_benchmark(parse_benchmark(tomllib.loads(spec.read_text())), RunOptions(db=alone),
                      Progress(enabled=False), manager)  # fmt: skip
    assert _cohen_certificates(db) == _cohen_certificates(alone)
    with sqlite3.connect(db) as con:
        methods = {m for (m,) in con.execute("SELECT DISTINCT method FROM certificates")}
    assert methods == {"cohen"}


# --- the run export ------------------------------------------------------------------------


def _strict(text: str):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_the_run_export_is_strict_json_and_older_exports_with_nan_still_read(
    tmp_path, monkeypatch, make_run
):
    """A NaN or infinity in a run (a check's statistic, a certificate's evidence stored
    before evidence was checked) is exported as null: strict JSON; an export written before,
    with a bare NaN, is still read."""
    from harness.reports.leaderboard.source import export_runs, read_export
    from harness.store.storedrun import load_runs

    db = tmp_path / "runs.sqlite"
    make_run(db, monkeypatch)
    with sqlite3.connect(db) as con:
        con.execute("UPDATE checks SET evidence = ?", ('{"p": NaN, "q": -Infinity, "r": 1.5}',))
        con.execute("UPDATE certificates SET evidence = ? WHERE input_id = 0",
                    ('{"score": NaN}',))  # fmt: skip
    text = export_runs(load_runs(db))
    data = _strict(text)
    checks = data["runs"][0]["checks"]
    assert checks and all(c["evidence"] == {"p": None, "q": None, "r": 1.5} for c in checks)
    columns = [g["columns"] for g in data["runs"][0]["certificates"]]
    assert {"score": None} in [e for c in columns for e in c["evidence"]]
    path = tmp_path / "board.run.json"
    path.write_text(text)
    assert [r.run_id for r in read_export(path)] == [r.run_id for r in load_runs(db)]
    older = tmp_path / "older.run.json"
    older.write_text(text.replace('"r":1.5', '"r":NaN'))
    [run] = read_export(older)
    assert any(math.isnan(c.evidence.get("r", 0.0)) for c in run.checks if c.evidence)


def _cohen_certificates(db) -> list[tuple]:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT input_id, prediction, radius, p_lower FROM certificates "
                           "WHERE method = 'cohen' ORDER BY input_id").fetchall()  # fmt: skip
