"""The sukenik method next to cohen on the identical base model, and its certificate."""

import json
import sqlite3

import numpy as np
import pytest
from scipy.stats import norm

from harness.certification.certify import certify_drawn
from harness.cli.main import main
from harness.engine.draws import Evidence
from harness.foundation.progress import Progress
from harness.foundation.protocol import CertificationProtocol
from harness.foundation.regularity import Constant, SemiElastic
from harness.mathematics.worstcase import certified_radius
from harness.running.benchmark import parse_benchmark
from harness.running.preparation import RunOptions
from harness.running.runner import run_benchmark
from plugins.sukenik.certifier import SukenikCertifier


@pytest.mark.slow
def test_sukenik_and_cohen_certify_the_same_cached_fashion_mnist_model(tmp_path, manager, capsys):
    raw = {
        "name": "fm-tiny",
        "dataset": {"name": "fashion-mnist", "test_every": 1000, "test_count": 3},
        "model": {"architecture": "mlp", "trainer": "gaussian-augmentation",
                  "trainer_params": {"sigma": 0.25, "epochs": 1}},
        "certification": {"n0": 20, "n": 200, "alpha": 0.001},
        "methods": [{"name": "cohen", "settings": [{"sigma": 0.25}]},
                    {"name": "sukenik", "settings": [{"sigma": 0.25}]}],
    }  # fmt: skip
    db = tmp_path / "fm.sqlite"
    run_id = run_benchmark(
        parse_benchmark(raw), RunOptions(db=db), Progress(enabled=False), manager
    )
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 1
        rows = con.execute(
            "SELECT method, input_id, sigma, radius, p_lower FROM certificates"
        ).fetchall()
    by_method = {m: [r for r in rows if r[0] == m] for m in ("cohen", "sukenik")}
    assert (
        [r[1] for r in by_method["cohen"]]
        == [r[1] for r in by_method["sukenik"]]
        == [0, 1000, 2000]
    )
    for _, _, sigma, radius, p_lower in by_method["sukenik"]:
        assert sigma >= 0.25 * (1 - 1e-12)  # m = the minimum kNN distance: σ(x) >= σ_b mostly
        if radius > 0:
            assert radius <= sigma * norm.ppf(p_lower) * (1 + 1e-12)  # never above Cohen (Thm B.6)
    assert main(["results", run_id[:10], "--db", str(db), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {m["method"] for m in out["methods"]} == {"cohen", "sukenik"}


def test_certificate_uses_the_thm_3_2_radius():
    evidence = Evidence.from_counts([0, 10], [40, 960], 0.3, alpha=0.001)
    [cert] = SukenikCertifier(SemiElastic(0.01), dim=784).certify(evidence)
    assert cert.prediction == 1
    assert cert.radius == pytest.approx(
        float(certified_radius(cert.p_lower, 0.3, 0.01, 784)), rel=1e-12
    )
    assert 0 < cert.radius < 0.3 * norm.ppf(cert.p_lower)
    [zero_rate] = SukenikCertifier(Constant(0.3), dim=784).certify(evidence)
    assert zero_rate.radius == 0.3 * norm.ppf(zero_rate.p_lower)  # r = 0 is Cohen exactly


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("sigma = 0.5, rate = -0.1", "rate must be a number >= 0"),
        ("sigma = 0.5, k = 0", "k must be an integer >= 1"),
        ('sigma = 0.5, m = "mean"', "m must be a number, 'min' or 'median'"),
        ("sigma = 0.0", "sigma must be a positive number"),
    ],
)
def test_invalid_parameters_are_rejected_before_work(
    tmp_path, capsys, setting, message, spec_template
):
    spec = tmp_path / "s.toml"
    text = spec_template.format(
        dataset="cone-4", arch="mlp", n0=10, n=20, alpha=0.01, method="sukenik", sigma=0.5
    )
    spec.write_text(text.replace("{ sigma = 0.5 }", "{ " + setting + " }"))
    assert main(["run", str(spec), "--db", str(tmp_path / "r.sqlite"), "--quiet"]) == 2
    assert message in capsys.readouterr().err


def test_shard_radii_are_computed_in_one_call_and_equal_the_per_input_radii(linear_model):
    import torch

    from harness.engine.sampling import SamplingEngine

    w = torch.zeros(784)
    w[0] = 1.0
    model = linear_model(w, 0.0)
    engine = SamplingEngine(model, 2, torch.device("cpu"), batch_size=512, seed=3)
    protocol = CertificationProtocol(n0=20, n=2000, alpha=0.001)
    certifier = SukenikCertifier(SemiElastic(0.02), dim=784)
    calls = []
    inner = certifier.radius
    certifier.radius = lambda p, s: calls.append(len(p)) or inner(p, s)
    x = torch.zeros(6, 784)
    x[:, 0] = torch.tensor([0.05, 0.1, 0.2, 0.4, -0.3, 0.8])
    sigma = np.array([0.3, 0.25, 0.5, 0.3, 0.3, 0.4])
    batched = list(certify_drawn(engine, protocol, certifier, x, list(range(6)), sigma))
    assert len(calls) == 1 and calls[0] == sum(c.radius > 0 for c in batched) >= 4
    for cert in batched:
        evidence = Evidence.from_counts(cert.counts_selection, cert.counts_estimation,
                                        cert.sigma, protocol.alpha)  # fmt: skip
        [alone] = SukenikCertifier(SemiElastic(0.02), dim=784).certify(evidence)
        assert (alone.prediction, alone.p_lower) == (cert.prediction, cert.p_lower)
        # one bisection bracket per input, closed at a relative width of 1e-9
        assert alone.radius == pytest.approx(cert.radius, rel=1e-8)
        single = float(certified_radius(cert.p_lower, cert.sigma, 0.02, 784)) if alone.radius else 0
        assert cert.radius == pytest.approx(single, rel=1e-8)
