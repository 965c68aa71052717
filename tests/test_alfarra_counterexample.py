"""Súkeník et al. (2022), App. C.2: OptimizeSigma's certificate is no certificate.

Base classifier f = [‖x‖ <= 1] in 2-D (class 1 inside the unit ball). At x0 = (50, 0)
the clamped soft radius grows linearly in σ, so OptimizeSigma drives σ(x0) as far as
K·β allow and CERTIFY returns class 0 with a radius above 50; at (0, 0) σ stays small
and the smoothed classifier says class 1 (exactly, by the χ² law of ‖σZ‖²). The
no-memory certificate at x0 is therefore violated at (0, 0). Through the memory
(Alg. 3), in either order, no two certified regions of different classes meet.
"""

import math

import pytest
import torch
from scipy.stats import ncx2, norm

from harness.certification.certify import certify_drawn
from harness.engine.sampling import SamplingEngine
from harness.foundation.protocol import CertificationProtocol
from plugins.alfarra.certifier import MemoryCertifier
from plugins.alfarra.memory import Memory
from plugins.alfarra.optimize_sigma import OptimizedSigma
from plugins.cohen.certifier import CohenCertifier

X0, ORIGIN = (50.0, 0.0), (0.0, 0.0)
OUTSIDE, INSIDE = 0, 1


class Ball(torch.nn.Module):
    """Logits (0, s·(1 − ‖x‖)): argmax is exactly f = [‖x‖ <= 1]."""

    def forward(self, x):
        margin = 20.0 * (1 - x.flatten(1).norm(dim=1))
        return torch.stack([torch.zeros_like(margin), margin], dim=1)


def p_inside(x, sigma):
    """P(‖x + σZ‖ <= 1) = P(χ²_2(‖x‖²/σ²) <= 1/σ²): the smoothed probability of class 1."""
    return ncx2.cdf(1 / sigma**2, df=2, nc=(x[0] ** 2 + x[1] ** 2) / sigma**2)


@pytest.fixture(scope="module")
def setting():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = Ball()
    x = torch.tensor([X0, ORIGIN])
    steps, beta = 300, 0.1
    sigma = OptimizedSigma(model, 0.25, steps, 64, beta, 1e-3, seed=0)(x)
    engine = SamplingEngine(model, 2, torch.device("cpu"), batch_size=4096, seed=0)
    protocol = CertificationProtocol(n0=100, n=2000, alpha=0.001)

    def certify(certifier, x, sigma, ids):
        """The harness's draws at σ and the certifier's claims, as in a run."""
        return list(certify_drawn(engine, protocol, certifier, x, ids, sigma.double().numpy()))

    yield x, sigma, certify, steps, beta
    torch.set_num_threads(threads)


def test_optimize_sigma_makes_sigma_and_radius_at_x0_exceed_50(setting):
    x, sigma, certify, steps, beta = setting
    s0, s_origin = float(sigma[0]), float(sigma[1])
    # E_A is clamped at 0.98 at every step: σ grows by β Φ⁻¹(0.98) each time
    assert s0 == pytest.approx(0.25 + steps * beta * norm.ppf(0.98), rel=1e-9)
    assert s0 > 50
    assert p_inside(X0, s0) < 1e-3  # g(x0) = outside
    assert p_inside(ORIGIN, s_origin) > 0.8  # g(0, 0) = inside, σ stayed small
    c_x0, c_origin = certify(CohenCertifier(), x, sigma, [0, 1])
    assert (c_x0.prediction, c_origin.prediction) == (OUTSIDE, INSIDE)
    assert c_x0.radius > 50


def test_the_certificate_without_memory_is_violated_at_the_origin(setting):
    x, sigma, certify, *_ = setting
    c_x0, _ = certify(CohenCertifier(), x, sigma, [0, 1])
    distance = math.dist(X0, ORIGIN)
    # the certificate claims g = outside on the ball of radius R(x0) > 50 around x0 ...
    assert distance < c_x0.radius and c_x0.prediction == OUTSIDE
    # ... but the data-dependent smoothed classifier says inside at (0, 0), exactly
    assert p_inside(ORIGIN, float(sigma[1])) > 0.5


@pytest.mark.parametrize("order", [[0, 1], [1, 0]], ids=["x0-first", "origin-first"])
def test_through_the_memory_no_two_regions_of_different_classes_meet(setting, order):
    x, sigma, certify, *_ = setting
    memory = MemoryCertifier(CohenCertifier(), Memory())
    certs = {c.input_id: c for c in certify(memory, x[order], sigma[order], order)}
    c_x0, c_origin = certs[0], certs[1]
    distance = math.dist(X0, ORIGIN)
    if c_x0.prediction != c_origin.prediction:
        assert distance >= c_x0.radius + c_origin.radius
    if order == [0, 1]:  # (0, 0) lies inside x0's ball: it takes x0's class
        assert c_origin.prediction == OUTSIDE
        raw = c_origin.evidence["memory_raw_radius"]
        assert c_origin.radius == pytest.approx(min(raw, c_x0.radius - distance))
        assert c_origin.evidence["memory_raw_prediction"] == INSIDE
    else:  # x0's ball shrinks until it no longer meets the ball around (0, 0)
        assert (c_origin.prediction, c_x0.prediction) == (INSIDE, OUTSIDE)
        assert c_x0.radius == pytest.approx(distance - c_origin.radius)
        assert c_x0.radius < distance < c_x0.evidence["memory_raw_radius"]
