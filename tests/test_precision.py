"""Precision, channels-last, noise scheme and batch_size = "auto" as part of the protocol."""

import json
import sqlite3
import subprocess
import sys

import numpy as np
import pytest
import torch
from scipy.stats import norm

from harness.certification.certify import certify_drawn
from harness.engine.batchsize import CACHE_FILE, auto_batch_size
from harness.engine.precision import PrecisionModel, prepare_model
from harness.engine.sampling import SamplingEngine
from harness.foundation.errors import ParameterError, SpecError
from harness.foundation.progress import Progress
from harness.foundation.protocol import CertificationProtocol
from harness.running.benchmark import benchmark_from_dict, parse_benchmark
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark
from plugins.cohen.certifier import CohenCertifier

TINY = {
    "name": "tiny-bf16",
    "seed": 1,
    "dataset": {"name": "cone-10", "test_count": 6},
    "model": {"architecture": "mlp", "trainer": "gaussian-augmentation",
              "architecture_params": {"width": 16}, "trainer_params": {"sigma": 0.5, "epochs": 1}},
    "certification": {"n0": 20, "n": 300, "alpha": 0.001, "batch_size": "auto",
                      "precision": "bf16"},
    "methods": [{"name": "cohen", "settings": [{"sigma": 0.5}]}],
}  # fmt: skip


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "precision",
            "fp8",
            "unknown precision 'fp8'; choose auto or one of fp32, tf32, tf32-conv, bf16, fp16",
        ),
        ("channels_last", "yes", "channels_last must be true or false"),
        ("batch_size", "big", 'batch_size must be an integer >= 1 or "auto"'),
        ("batch_size", 0, 'batch_size must be an integer >= 1 or "auto"'),
        ("noise", "mt", "unknown noise scheme 'mt'; choose auto or one of philox-v1, block-v1"),
        ("cudnn", "fast", "unknown cudnn mode 'fast'; choose one of heuristic, benchmark"),
    ],
)
def test_protocol_values_are_validated(key, value, message):
    with pytest.raises(ParameterError, match=message.replace("(", r"\(")):
        parse_benchmark({**TINY, "certification": {**TINY["certification"], key: value}})


def test_unknown_certification_key_names_the_allowed_ones():
    with pytest.raises(SpecError, match="precision"):
        parse_benchmark({**TINY, "certification": {"n": 10, "precison": "bf16"}})


def test_old_runs_read_as_block_noise_and_fp32():
    config = parse_benchmark(TINY).to_dict()
    for key in ("precision", "channels_last", "noise"):
        del config["protocol"][key]
    protocol = benchmark_from_dict(config).protocol
    assert (protocol.noise, protocol.precision, protocol.channels_last) == (
        "block-v1",
        "fp32",
        False,
    )


def test_cudnn_mode_is_set_around_every_forward_pass_and_named_in_the_run_id():
    """Benchmark mode on (whatever was set globally) only inside the certified classifier's
    forward pass; heuristic mode off even where a plugin turned it on. The default leaves
    every earlier run's id as it was; benchmark mode is another run."""
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(torch.backends.cudnn.benchmark)
            return x

    before = torch.backends.cudnn.benchmark
    try:
        for mode, globally in (("benchmark", False), ("heuristic", True)):
            torch.backends.cudnn.benchmark = globally
            PrecisionModel(Probe(), "fp32", False, mode)(torch.zeros(1, 2))
            assert torch.backends.cudnn.benchmark is globally
    finally:
        torch.backends.cudnn.benchmark = before
    assert seen == [True, False]
    plain = parse_benchmark(TINY).to_dict()
    assert "cudnn" not in plain["protocol"] and benchmark_from_dict(plain).protocol.cudnn == (
        "heuristic"
    )
    timed = {**TINY, "certification": {**TINY["certification"], "cudnn": "benchmark"}}
    assert parse_benchmark(timed).to_dict()["protocol"]["cudnn"] == "benchmark"
    assert benchmark_from_dict(parse_benchmark(timed).to_dict()).protocol.cudnn == "benchmark"


@pytest.mark.parametrize(
    ("precision", "matmul", "conv"),
    [("fp32", False, False), ("tf32-conv", False, True), ("tf32", True, True)],
)
def test_tf32_is_set_for_matmuls_and_convolutions_as_the_precision_names(precision, matmul, conv):
    """Inside the certified classifier's forward pass TF32 is what the precision names,
    whatever is set globally (tf32-conv: PyTorch's defaults, cuDNN convolutions in TF32 and
    matmuls in fp32), and the global settings are restored after."""
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
            return x

    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        for globally in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = globally
            PrecisionModel(Probe(), precision, False)(torch.zeros(1, 2))
            assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (
                globally, globally)  # fmt: skip
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
    assert seen == [(matmul, conv)] * 2


def test_auto_precision_is_pytorchs_default_on_cuda_and_leaves_cpu_runs_as_they_were():
    """``precision = "auto"`` (the default) resolves to tf32-conv on CUDA, where PyTorch's
    own defaults are cuDNN convolutions in TF32 and matmuls in fp32 (checked on this torch:
    Cohen et al.'s code inherits them), and to fp32 on a CPU, so a CPU run's spec and its
    id are those of a spec that named fp32, as every run before the default was auto."""
    from harness.engine.precision import default_precision
    from harness.running.preparation import resolved, run_identity

    fresh = [sys.executable, "-c", "import torch; print(torch.backends.cudnn.allow_tf32, "
             "torch.backends.cuda.matmul.allow_tf32)"]  # fmt: skip
    assert subprocess.run(fresh, capture_output=True, text=True).stdout.split() == ["True", "False"]
    assert default_precision("cuda") == "tf32-conv" and default_precision("cpu") == "fp32"
    spec = {**TINY, "certification": {k: v for k, v in TINY["certification"].items()
                                      if k != "precision"}}  # fmt: skip
    auto = parse_benchmark(spec)
    assert auto.protocol.precision == "auto"
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolved(auto, cuda).protocol.precision == "tf32-conv"
    named = parse_benchmark({**spec, "certification": {**spec["certification"], "precision": "fp32",
                                                       "noise": "block-v1"}})  # fmt: skip
    assert resolved(auto, cpu).to_dict() == named.to_dict()
    assert run_identity(resolved(auto, cpu), cpu, "r") == run_identity(named, cpu, "r")
    strict = parse_benchmark({**spec, "certification": {**spec["certification"],
                                                        "precision": "fp32"}})  # fmt: skip
    assert resolved(strict, cuda).protocol.precision == "fp32"  # strict fp32: one option away


def test_prepare_model_casts_a_copy_and_leaves_the_model_alone():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4)).eval()
    protocol = CertificationProtocol(precision="bf16")
    prepared = prepare_model(model, protocol)
    assert isinstance(prepared, PrecisionModel)
    assert model[0].weight.dtype == torch.float32
    x = torch.rand(5, 8)
    out = prepared(x)
    assert out.dtype == torch.bfloat16
    # the bf16 forward pass is the fp32 one up to bf16 rounding (8 bits of mantissa)
    assert torch.allclose(out.float(), model(x), atol=0.05)
    assert prepare_model(model, CertificationProtocol()) is model  # fp32 on CPU: as given
    cl = prepare_model(torch.nn.Conv2d(3, 4, 3).eval(), CertificationProtocol(channels_last=True))
    assert cl(torch.rand(2, 3, 8, 8)).shape == (2, 4, 6, 6)


def test_bf16_certification_of_a_linear_classifier_matches_the_exact_probability(linear_model):
    """f(x) = [x_0 > 0] in bf16: the counts follow Binomial(n, Φ(x_0/σ)) (up to bf16 rounding
    of the noisy input, which cannot move the sign of x_0 + σε)."""
    from scipy.stats import binomtest

    w = torch.zeros(10)
    w[0] = 1.0
    protocol = CertificationProtocol(n0=50, n=4000, alpha=0.001, precision="bf16")
    model = prepare_model(linear_model(w, 0.0), protocol)
    engine = SamplingEngine(model, 2, torch.device("cpu"), batch_size=300, seed=2)
    x = torch.zeros(3, 10)
    x[:, 0] = torch.tensor([0.2, 0.5, -0.4])
    certs = list(certify_drawn(engine, protocol, CohenCertifier(), x, [0, 1, 2], np.full(3, 0.5)))
    for cert, x0 in zip(certs, (0.2, 0.5, -0.4), strict=True):
        p = norm.cdf(x0 / 0.5)
        assert binomtest(cert.counts_estimation[1], 4000, p).pvalue > 1e-4
        assert cert.prediction == (1 if x0 > 0 else 0)
        assert 0 < cert.radius < 0.5 * norm.ppf(max(p, 1 - p))


def test_a_run_records_precision_noise_and_auto_batch_size(tmp_path, manager, monkeypatch):
    """On the default device: CPU (block-v1, a batch of 64 to 8,192) or CUDA (philox-v1,
    256 to 65,536)."""
    from harness.engine.batchsize import MAX_BATCH, MAX_CPU_BATCH
    from harness.engine.sampling import default_noise, resolve_device

    device = resolve_device("auto")
    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path / "cache"))
    db = tmp_path / "r.sqlite"
    run_id = run_benchmark(
        parse_benchmark(TINY), RunOptions(db=db), Progress(enabled=False), manager
    )
    with sqlite3.connect(db) as con:
        config = json.loads(
            con.execute("SELECT config FROM runs WHERE run_id = ?", (run_id,)).fetchone()[0]
        )
        certs = con.execute("SELECT prediction, radius FROM certificates").fetchall()
    assert config["protocol"]["precision"] == "bf16"
    assert config["protocol"]["noise"] == default_noise(device)  # "auto", recorded resolved
    assert config["protocol"]["batch_size"] == "auto"
    assert len(certs) == 6 and any(r > 0 for _, r in certs)
    cached = json.loads((tmp_path / "cache" / "models" / CACHE_FILE).read_text())
    low, high = (256, MAX_BATCH) if device.type == "cuda" else (64, MAX_CPU_BATCH)
    assert len(cached) == 1 and low <= next(iter(cached.values())) <= high


def test_auto_batch_size_on_cpu_is_bounded_and_cached(tmp_path, monkeypatch):
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10)).eval()
    size = auto_batch_size(model, (1, 8, 8), "cpu", tmp_path)
    assert 64 <= size <= 8192 and size & (size - 1) == 0
    # the second call reads the cache and probes nothing
    monkeypatch.setattr(
        "harness.engine.batchsize._probe_cpu", lambda *a, **k: pytest.fail("probed")
    )
    assert auto_batch_size(model, (1, 8, 8), "cpu", tmp_path) == size
    # another input shape is another entry
    monkeypatch.undo()
    other = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(27, 10)).eval()
    auto_batch_size(other, (3, 3, 3), "cpu", tmp_path)
    assert len(json.loads((tmp_path / CACHE_FILE).read_text())) == 2


@pytest.mark.parametrize(
    ("rates", "measured", "chosen"),
    [  # millions of samples/s per batch from 256 on (None: out of memory)
        ([10, 19, 35, 60, 80, 81, 82, 95], 7, 4096),  # plateau: the smallest within 3 %
        ([10, 20, 50, 40, 30, 90], 5, 1024),  # slower at large batches: the fastest
        ([10, 20, 40, 80, None], 5, 1024),  # out of memory: at most half the largest fit
        ([10, 20, 40, 80, 160, 320, 640, 1280, 2560], 9, 65536),  # gains up to the cap
        ([1e-4, 2e-4], 1, 256),  # one pass of 256 samples takes 2.6 s: stop there
        ([None], 1, None),  # not even 256 fits
    ],
)
def test_the_cuda_batch_is_chosen_by_measured_throughput(rates, measured, chosen):
    from harness.engine.batchsize import choose_by_rate

    calls = []

    def measure(batch):
        calls.append(batch)
        rate = rates[len(calls) - 1]
        return None if rate is None else rate * 1e6

    assert choose_by_rate(measure, 256, 1 << 16) == chosen
    assert calls == [256 << k for k in range(measured)]


def test_engine_batch_size_is_decided_before_it_is_made(tmp_path, monkeypatch):
    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path))
    model = torch.nn.Sequential(torch.nn.Linear(6, 3)).eval()
    with pytest.raises(ValueError, match="resolve 'auto'"):
        SamplingEngine(model, 3, torch.device("cpu"), batch_size="auto", seed=0)
    batch = auto_batch_size(model, (6,), "cpu")
    engine = SamplingEngine(model, 3, torch.device("cpu"), batch_size=batch, seed=0)
    counts = engine.counts(torch.rand(2, 6), [0.5, 0.5], [0, 1], 100, stream=1)
    assert engine.batch_size == batch and np.all(counts.sum(1) == 100)


@pytest.mark.gpu
def test_bf16_channels_last_certification_on_cuda(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(8 * 8 * 8, 4),
    ).cuda().eval()  # fmt: skip
    x = torch.rand(4, 3, 8, 8, device="cuda")
    out = {}
    for precision, cl in (("fp32", False), ("bf16", True)):
        protocol = CertificationProtocol(n0=20, n=2000, precision=precision, channels_last=cl)
        prepared = prepare_model(model, protocol)
        batch = auto_batch_size(prepared, (3, 8, 8), "cuda", tmp_path)
        engine = SamplingEngine(prepared, 4, torch.device("cuda"), batch, seed=1)
        out[precision] = engine.counts(x, [0.25] * 4, [0, 1, 2, 3], 2000, stream=1)
    assert np.all(out["bf16"].sum(1) == 2000)
    # bf16 flips argmax decisions only near ties: most counts agree
    assert np.abs(out["bf16"] - out["fp32"]).sum() <= 0.05 * 4 * 2000 * 2


CHECKED = {
    **TINY,
    "name": "checked-bf16",
    "certification": {"n0": 20, "n": 300, "alpha": 0.001, "batch_size": 256, "precision": "bf16"},
    "methods": [
        {"name": "cohen", "settings": [{"sigma": 0.5}]},
        {"name": "alfarra-ds", "settings": [{"sigma": 0.5, "steps": 4, "samples": 8, "beta": 0.05}]},
        {"name": "chen-fgss", "settings": [{"sigma": 0.5, "num_starts": 2, "num_samples": 40,
                                            "max_steps": 2}]},
    ],
}  # fmt: skip


def _run_and_audit(tmp_path, manager, raw, device=None):
    from harness.audit.audit import Budget
    from harness.audit.session import audits
    from harness.store.store import ResultStore

    db = tmp_path / f"{raw['certification']['precision']}.sqlite"
    options = RunOptions(db=db, cache_dir=tmp_path / "cache", device=device)
    run_id = run_benchmark(parse_benchmark(raw), options, Progress(enabled=False), manager)
    budget = Budget("tiny", coverage_trials=8, coverage_n=50, pairs=2, ascent_steps=1,
                    audited_inputs=6, attack_steps=1, attack_samples=8, orders=2)  # fmt: skip
    store = ResultStore(db)
    try:
        return {a.method.name: a for a in audits(store, run_id, options, Progress(enabled=False),
                                                  manager, budget=budget)}  # fmt: skip
    finally:
        store.close()


def test_checks_query_the_classifier_that_was_certified(tmp_path, manager):
    """In a bf16 run the checks' base model is the bf16 one: it reproduces the run's class
    counts sample for sample, and the σ-providers query it (σ of OptimizeSigma is that of
    the bf16 model, not of the fp32 one)."""
    from plugins.alfarra.optimize_sigma import STREAM_OPTIMIZE, content_keys, optimize_sigma

    found = _run_and_audit(tmp_path, manager, CHECKED)
    assert set(found) == {"cohen", "alfarra-ds", "chen-fgss"}
    trained = found["cohen"].context.model
    reference = PrecisionModel(trained, "bf16", False).eval()  # built here, independently
    x = found["cohen"].inputs.to(found["cohen"].context.device)  # where the model lives
    for audit in found.values():
        classifier = audit.context.engine.model
        with torch.no_grad():
            out = classifier(x)
            assert out.dtype == torch.bfloat16 and torch.equal(out, reference(x))
        # replaying CERTIFY with the audit's σ and classifier gives the stored counts exactly
        ids = [c["input_id"] for c in audit.certificates]
        replay = certify_drawn(audit.context.engine, audit.context.protocol, audit.certifier, x,
                               ids, audit.sigma(x).cpu().numpy())  # fmt: skip
        for stored, again in zip(audit.certificates, sorted(replay, key=lambda c: c.input_id),
                                 strict=True):  # fmt: skip
            assert stored["counts_estimation"] == list(again.counts_estimation)
            assert stored["sigma"] == again.sigma and stored["radius"] == again.radius
    params = found["alfarra-ds"].params
    args = dict(seed=CHECKED["seed"], stream=STREAM_OPTIMIZE, steps=params["steps"],
                samples=params["samples"], beta=params["beta"], sigma_min=params["sigma_min"])  # fmt: skip
    in_bf16 = optimize_sigma(reference, x, 0.5, content_keys(x), **args)
    in_fp32 = optimize_sigma(trained, x, 0.5, content_keys(x), **args)
    sigma = found["alfarra-ds"].sigma(x)
    assert torch.equal(sigma, in_bf16) and not torch.equal(sigma, in_fp32)


def test_an_fp32_run_on_the_cpu_queries_the_model_as_trained(tmp_path, manager):
    raw = {**CHECKED, "certification": {**CHECKED["certification"], "precision": "fp32"},
           "methods": CHECKED["methods"][:2]}  # fmt: skip
    found = _run_and_audit(tmp_path, manager, raw, device="cpu")
    for audit in found.values():
        assert audit.context.engine.model is audit.context.model
    assert found["alfarra-ds"].sigma_provider.model is audit.context.model


def test_exact_ball_flips_do_not_apply_to_a_rounded_ball(tmp_path, manager):
    """S4b compares with the closed form of the fp32 ball; a bf16 ball is another classifier."""
    from harness.audit.counterexamples import check_counterexamples

    raw = {"name": "ball-bf16", "seed": 0, "dataset": {"name": "ball-2", "test_count": 8},
           "model": {"architecture": "ball-N", "trainer": "none"},
           "certification": {"n0": 20, "n": 200, "batch_size": 512, "precision": "bf16"},
           "methods": [{"name": "cohen", "settings": [{"sigma": 0.25}]}]}  # fmt: skip
    [audit] = _run_and_audit(tmp_path, manager, raw).values()
    result = check_counterexamples(audit)
    assert result.evidence["exact_flips"].startswith("not applicable: the run certified the ball")
    assert "attack" in result.evidence and result.evidence["attack"]["audited"] == 6


def test_the_api_certifies_in_the_precision_it_is_given(linear_model):
    """On the default device (the API's), against an engine built here in bf16."""
    from harness.api import certify
    from harness.engine.sampling import resolve_device

    device = resolve_device("auto")
    torch.manual_seed(3)
    w = torch.randn(6)
    x, y = torch.randn(4, 6) * 0.3, torch.zeros(4, dtype=torch.long)
    args = dict(method="cohen", sigma=0.5, n0=20, n=500, batch_size=128, seed=4)
    table = certify(linear_model(w, 0.0), x, y, precision="bf16", **args)
    protocol = CertificationProtocol(n0=20, n=500, precision="bf16")
    engine = SamplingEngine(PrecisionModel(linear_model(w, 0.0).to(device), "bf16", False), 2,
                            device, batch_size=128, seed=4)  # fmt: skip
    expected = certify_drawn(engine, protocol, CohenCertifier(), x, [0, 1, 2, 3], np.full(4, 0.5))
    assert [list(c.counts_estimation) for c in expected] == table["counts_estimation"].tolist()
    with pytest.raises(ParameterError, match="unknown precision 'fp64'"):
        certify(linear_model(w, 0.0), x, y, precision="fp64", **args)


def test_a_cuda_boards_header_says_what_its_precision_computes():
    from harness.reports.leaderboard.protocol_markdown import _arithmetic

    cuda = _arithmetic({"precision": "tf32-conv", "device": "cuda", "noise": "philox-v1"})
    assert cuda == (", precision tf32-conv (PyTorch's default: cuDNN convolutions in TF32, "
                    "matmuls in fp32), noise philox-v1")  # fmt: skip
    strict = _arithmetic({"precision": "fp32", "device": "cuda"})
    assert strict == ", precision fp32 (strict fp32, TF32 off)"
    assert _arithmetic({"precision": "fp32", "device": "cpu"}) == ", precision fp32"  # no TF32
