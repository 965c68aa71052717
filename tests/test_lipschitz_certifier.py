"""Bergstrom et al. Remark 2 and Thm 3: normalization, confidence bounds, radius, coverage."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from harness.certification.certify import certify_drawn
from harness.engine.draws import Evidence
from harness.engine.sampling import SamplingEngine
from harness.foundation.certificate import ABSTAIN
from harness.foundation.errors import IdrsError, ParameterError
from harness.foundation.protocol import CertificationProtocol
from harness.foundation.regularity import Constant, Lipschitz
from plugins.cohen.certifier import ConstantSigma
from plugins.lipschitz.certifier import LipschitzCertifier, confidence_bounds, normalized_means
from plugins.lipschitz.network import CertifiedSigma, SigmaNetwork, certify_sigma_network
from plugins.lipschitz.normalization import NormalizedModel


class FixedLogits(torch.nn.Module):
    def __init__(self, logits):
        super().__init__()
        self.logits = torch.as_tensor(logits, dtype=torch.float32)

    def forward(self, x):
        return self.logits.expand(len(x), -1)


def test_normalized_outputs_are_remark_2_and_survive_the_engines_softmax():
    logits = [[0.0, 1.0, -2.0, 3.0], [1000.0, -1000.0, 0.0, 0.0], [-90.0, -90.0, -90.0, 90.0]]
    p_min = 1e-7
    model = NormalizedModel(FixedLogits(logits), 4, p_min)
    x = torch.zeros(3, 2)
    z = np.array(logits, dtype=np.float64)
    soft = np.exp(z - z.max(1, keepdims=True))
    soft /= soft.sum(1, keepdims=True)
    expected = (1 - 4 * p_min) * soft + p_min
    g = model.probabilities(x).numpy()
    assert g == pytest.approx(expected, rel=1e-14, abs=0)
    # what SamplingEngine.soft_stats computes: softmax of the model output
    assert torch.softmax(model(x).double(), 1).numpy() == pytest.approx(expected, rel=1e-14, abs=0)
    assert g.min() >= p_min * (1 - 1e-15) and g.max() <= 1 - 3 * p_min + 1e-16
    with pytest.raises(ParameterError):
        NormalizedModel(FixedLogits(logits), 4, 0.25)


@pytest.mark.parametrize("n", [50, 1000])
@pytest.mark.parametrize("classes", [2, 10])
def test_bounds_are_never_tighter_than_exact_bounds_for_bernoulli_outputs(n, classes):
    # g_top takes the two extreme values low/high with k of n samples at high; the exact
    # one-sided (Clopper–Pearson) bound at the same level, mapped to [low, high], is the
    # tightest valid bound for such two-point outputs: ours must not exceed it.
    p_min, alpha = 1e-3, 0.01
    low, high = p_min, 1 - (classes - 1) * p_min
    for k in range(n + 1):
        top_mean = low + (high - low) * k / n
        means = np.full(classes, (1 - top_mean) / (classes - 1))
        means[0] = top_mean
        lower, _ = confidence_bounds(means, 0, n, alpha, p_min)
        cp_lower = 0.0 if k == 0 else stats.beta.ppf(alpha / 2, k, n - k + 1)
        assert lower <= low + (high - low) * cp_lower + 1e-15
        # a runner-up with k of n samples at high: its exact upper bound
        means_r = np.full(classes, p_min)
        means_r[1] = top_mean
        means_r[0] = 1 - means_r[1:].sum()
        _, upper_r = confidence_bounds(means_r, 0, n, alpha, p_min)
        # the runner-up bound is min(per-class bound at α/(2(C−1)), 1 − lower at α/2): the
        # exact bound at the looser of the two levels, α/2, is the tightest it may be
        cp_upper = 1.0 if k == n else stats.beta.ppf(1 - alpha / 2, k + 1, n - k)
        assert upper_r >= low + (high - low) * cp_upper - 1e-15


def test_bounds_cover_the_mean_at_the_union_level():
    # simulate two-point outputs and count joint failures of (lower, upper)
    rng = np.random.default_rng(1)
    p_min, alpha, n, trials = 1e-3, 0.2, 40, 4000
    low, high = p_min, 1 - p_min
    true_top = 0.8
    hits = rng.binomial(n, true_top, size=trials)
    failures = 0
    for k in hits:
        top_mean = low + (high - low) * k / n
        lower, upper = confidence_bounds(np.array([top_mean, 1 - top_mean]), 0, n, alpha, p_min)
        mean_top = low + (high - low) * true_top
        failures += (lower > mean_top) or (upper < 1 - mean_top)
    assert failures / trials <= alpha


def _linear_setup(linear_model, trials, d, seed, scale=50.0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(d, generator=gen)
    w /= w.norm()
    b = 0.1
    # a steep logistic base classifier; the smoothed classifier's boundary is still w·x = b
    # for any σ(x) > 0, because E[sigmoid(s·(m + σZ))] > 1/2 iff m > 0 (Z symmetric)
    model = linear_model(scale * w, scale * b)
    distances = torch.empty(trials).uniform_(-1.2, 1.2, generator=gen)
    base = torch.rand(trials, d, generator=gen)
    x = base - ((base @ w - b) - distances)[:, None] * w[None, :]
    return model, x, distances


class _Certify:
    """A LipschitzCertifier fed as in a run: the harness's soft draws of the raw model
    (mean softmax outputs), the certifier's claims on the means of g (Remark 2)."""

    def __init__(self, model, regularity, n0, n, alpha, p_min=1e-7, dim=784, seed=0, classes=2):
        self.engine = SamplingEngine(
            model, classes, torch.device("cpu"), batch_size=4096, seed=seed
        )
        self.protocol = CertificationProtocol(n0=n0, n=n, alpha=alpha)
        self.certifier = LipschitzCertifier(regularity, p_min, dim)
        self.lipschitz, self.p_min = self.certifier.lipschitz, p_min

    def certify(self, x, sigma, ids):
        sigma = torch.as_tensor(sigma).double().numpy()
        return certify_drawn(self.engine, self.protocol, self.certifier, x, ids, sigma)

    def means(self, cert, key="estimation"):
        """The means of g behind a certificate: Remark 2's map of the harness's draws."""
        return normalized_means(cert.draws["base"][key], self.p_min)


_certifier = _Certify


def test_zero_lipschitz_gives_one_over_sigma_and_the_soft_cohen_radius(linear_model):
    d, sigma, alpha, n, p_min = 784, 0.5, 0.01, 400, 1e-7
    model, x, _ = _linear_setup(linear_model, 16, d, seed=3)
    certifier = _certifier(model, Lipschitz(0.0, sigma), 32, n, alpha, p_min, d)
    assert certifier.lipschitz == 1 / sigma
    width = (1 - 2 * p_min) * math.sqrt(math.log(2 / alpha) / (2 * n))  # Hoeffding, α/2 each
    checked = 0
    for cert in certifier.certify(x, ConstantSigma(sigma)(x), list(range(16))):
        means = certifier.means(cert)
        top = int(np.argmax(certifier.means(cert, "selection")))
        lower = min(max(means[top] - width, p_min), 1 - p_min)
        upper = min(max(min(means[1 - top] + width, 1 - lower), p_min), 1 - p_min)
        soft_cohen = sigma / 2 * (stats.norm.ppf(lower) - stats.norm.ppf(upper))
        assert cert.p_lower == pytest.approx(lower, rel=1e-12)
        assert cert.evidence["upper_runner_up"] == pytest.approx(upper, rel=1e-12)
        if soft_cohen > 0:
            assert cert.prediction == top
            assert cert.radius == pytest.approx(soft_cohen, rel=1e-9)
            checked += 1
        else:
            assert cert.prediction == ABSTAIN and cert.radius == 0.0
    assert checked >= 8
    # Constant(σ) regularity means the same thing
    assert _certifier(model, Constant(sigma), 32, n, alpha, p_min, d).lipschitz == 1 / sigma


def _coverage(certifier, sigma_of, x, distances, radius_scale=1.0):
    violations = certified = 0
    sigma = sigma_of(x)
    for cert in certifier.certify(x, sigma, list(range(len(x)))):
        if cert.prediction == ABSTAIN:
            continue
        certified += 1
        true_class = int(distances[cert.input_id] > 0)
        if cert.prediction != true_class or radius_scale * cert.radius > abs(
            float(distances[cert.input_id])
        ):
            violations += 1
    return violations, certified


def test_coverage_on_linear_classifier_with_constant_sigma(linear_model):
    alpha = 0.05
    model, x, distances = _linear_setup(linear_model, 400, 784, seed=0)
    certifier = _certifier(model, Lipschitz(0.0, 0.5), 32, 256, alpha)
    violations, certified = _coverage(certifier, ConstantSigma(0.5), x, distances)
    assert certified >= 300
    assert stats.binomtest(violations, certified, alpha, alternative="greater").pvalue > 1e-3
    # the same check flags a radius three times too large
    violations, certified = _coverage(certifier, ConstantSigma(0.5), x, distances, 3.0)
    assert stats.binomtest(violations, certified, alpha, alternative="greater").pvalue < 1e-6


def test_coverage_on_linear_classifier_with_a_lipschitz_sigma_network(linear_model):
    alpha, d = 0.05, 784
    model, x, distances = _linear_setup(linear_model, 360, d, seed=1)
    network = SigmaNetwork(d, 32, 0.25, 0.5, torch.Generator().manual_seed(0))
    with torch.no_grad():
        network.b2.fill_(0.3)  # σ varies with x around 0.25 + 0.3
    sigma = certify_sigma_network(network)
    spread = sigma(x)
    assert float(spread.max() - spread.min()) > 0.01
    certifier = _certifier(model, sigma.regularity, 32, 256, alpha, dim=d)
    violations, certified = _coverage(certifier, sigma, x, distances)
    assert certified >= 300
    assert stats.binomtest(violations, certified, alpha, alternative="greater").pvalue > 1e-3


def test_radius_never_exceeds_the_cap_that_l_allows():
    p_min = 1e-7
    certifier = LipschitzCertifier(Lipschitz(0.5, 0.65), p_min, 784)
    # softmax means (0, 1) are g means (p_min, 1 − p_min), the extreme Remark 2 allows
    [cert] = certifier.certify(Evidence.from_means([0.0, 1.0], [0.0, 1.0], 0.7, 0.001, 10, 10**6))
    cap = (stats.norm.ppf(1 - p_min) - stats.norm.ppf(p_min)) / (2 * certifier.lipschitz)
    assert 0 < cert.radius < cap
    assert cert.evidence["L"] == certifier.lipschitz
    assert cert.evidence["sigma_min"] == 0.65 and cert.evidence["lip_sigma"] == 0.5


def test_refuses_sigma_below_the_floor_and_unregularized_sigma():
    certifier = _certifier(FixedLogits([[0.0, 1.0]]), Lipschitz(0.1, 0.5), 10, 100, 0.01)
    with pytest.raises(IdrsError, match="below the declared floor"):
        list(certifier.certify(torch.zeros(2, 784), [0.5, 0.4], [0, 1]))
    from harness.foundation.regularity import Unregularized

    with pytest.raises(IdrsError):
        _certifier(FixedLogits([[0.0, 1.0]]), Unregularized(), 10, 100, 0.01)


def test_certifier_runs_the_lemma3_check_before_certifying(monkeypatch):
    from plugins.lipschitz import certifier as module

    def failing(p_min, dim):
        raise ParameterError("Lemma 3's precondition fails (test)")

    monkeypatch.setattr(module, "check_lemma3", failing)
    with pytest.raises(ParameterError, match="Lemma 3"):
        _certifier(FixedLogits([[0.0, 1.0]]), Lipschitz(0.1, 0.5), 10, 100, 0.01)


def test_certified_sigma_is_a_sigma_provider():
    from harness.plugin.components import SigmaProvider

    w1 = torch.eye(3)
    sigma = CertifiedSigma(w1, torch.zeros(3), torch.ones(1, 3), torch.zeros(1), 0.2, 2.0)
    assert isinstance(sigma, SigmaProvider)
    out = sigma(torch.tensor([[1.0, 2.0, -5.0], [-1.0, -1.0, -1.0]]))
    assert out.dtype == torch.float64 and out.tolist() == pytest.approx([3.2, 0.2])


@pytest.mark.gpu
def test_normalized_model_runs_on_cuda_with_a_parameterless_base():
    """The p_min floor is made on the logits' device (a base without parameters, or one
    moved after wrapping, once left it on the CPU: ``wrapper_CUDA_logaddexp``)."""
    import torch

    from plugins.lipschitz.normalization import NormalizedModel

    class Shift(torch.nn.Module):
        def forward(self, x):
            return torch.stack([x[:, 0], -x[:, 0], 0 * x[:, 0]], dim=1)

    wrapped = NormalizedModel(Shift(), 3, 0.01)
    g = wrapped.probabilities(torch.randn(8, 4, device="cuda"))
    assert g.device.type == "cuda"
    assert torch.all(g >= 0.01 * (1 - 1e-12))
    assert torch.allclose(g.sum(1), torch.ones(8, dtype=torch.float64, device="cuda"))
    assert bool(torch.isfinite(g).all())


def test_predict_is_the_soft_smoothed_classifiers_own_answer():
    """PREDICT = argmax of the estimated means when it beats the runner-up (Hoeffding at
    α/(2·n_cls) per side, recomputed here), else abstain; CERTIFY does not decide it."""
    p_min, alpha, n = 1e-7, 0.01, 400
    width = (1 - 2 * p_min) * math.sqrt(math.log(2 * 3 / alpha) / (2 * n))
    for probs in ([0.70, 0.2, 0.1], [0.45, 0.44, 0.11], [0.1, 0.3, 0.6]):
        logits = torch.log(torch.tensor(probs))
        certifier = _Certify(FixedLogits(logits), Lipschitz(0.0, 0.5), 16, n, alpha, p_min,
                             classes=3)  # fmt: skip
        x = torch.zeros(2, 784)
        for cert in certifier.certify(x, ConstantSigma(0.5)(x), [0, 1]):
            means = certifier.means(cert)
            order = np.argsort(means)[::-1]
            beats = means[order[0]] - width > means[order[1]] + width
            assert cert.predict == (int(order[0]) if beats else ABSTAIN)
            assert cert.predict == (int(np.argmax(probs)) if probs[0] != 0.45 else ABSTAIN)
