"""The σ-network σ_θ(x) = ReLU(h_θ(x)) + σ_min with a certified Lipschitz bound (Remark 2, §4).

h_θ(x) = W2·ReLU(W1·x + b1) + b2 is a two-layer network (width 200 in §4). Spectral
normalization (Miyato et al. 2018, the paper's [34]): the trained parameters are V1, V2 and
the layers use

    W_j = V_j · c / max(s_j, c),   c = √lip,

with s_2 = ‖V2‖₂ exact (V2 is a row vector) and s_1 a power-iteration estimate of ‖V1‖₂
(persistent vector, two iterations per training step, gradient through uᵀV1v as in Miyato
et al.; an exact SVD per step is far too slow on a 2-core CPU). So ‖W_j‖₂ <= c up to the
power iteration's underestimate, and Lip(σ_θ) <= Lip(h_θ) <= ‖W2‖₂·‖W1‖₂ ≈<= lip (ReLU is
1-Lipschitz, and so are the outer ReLU and + σ_min). Splitting the budget as c·c loses
nothing: a ReLU layer pair is invariant under W1 → a·W1, b1 → a·b1, W2 → W2/a (a > 0).

After training, :func:`certify_sigma_network` freezes the weights and re-certifies the bound
from the exact singular values (float64 SVD of the float32 weights actually used, inflated by
a relative 1e-9 to cover the SVD's own rounding). That certified value, not the declared
one, is what the certificate uses; if it exceeds the declared value, the last layer is
scaled down until it does not (so certified <= declared always).
"""

from __future__ import annotations

import math

import torch

from harness import Lipschitz, ParameterError, padded_chunks

SVD_SAFETY = 1e-9
"""Relative inflation of the product of computed singular values (rounding of the SVD)."""


class SigmaNetwork(torch.nn.Module):
    """Trainable σ_θ with spectrally normalized layers (Lip(σ_θ) <= ``lip`` up to power iteration).

    :param dim: input dimension d (inputs are flattened).
    :param width: hidden width.
    :param sigma_min: the floor σ_min > 0.
    :param lip: the declared Lipschitz bound Lip(σ) >= 0.
    :param generator: CPU generator for the initial weights (PyTorch's Linear init,
        U(−1/√fan_in, 1/√fan_in)) and the power iteration's start vector.
    """

    POWER_ITERATIONS = 2

    def __init__(
        self, dim: int, width: int, sigma_min: float, lip: float, generator: torch.Generator
    ) -> None:
        super().__init__()
        if width < 1 or dim < 1:
            raise ParameterError(f"the σ-network needs width >= 1 and dim >= 1, got {width}, {dim}")
        self.sigma_min = float(sigma_min)
        self.lip = float(lip)
        self.layer_bound = math.sqrt(self.lip)

        def uniform(shape, fan_in):
            bound = 1.0 / math.sqrt(fan_in)
            return torch.nn.Parameter((torch.rand(shape, generator=generator) * 2 - 1) * bound)

        self.v1 = uniform((width, dim), dim)
        self.b1 = uniform((width,), dim)
        self.v2 = uniform((1, width), width)
        self.b2 = uniform((1,), width)
        u = torch.randn(width, generator=generator)
        self.register_buffer("u1", u / u.norm())
        self._power_iteration(20)

    def _power_iteration(self, steps: int) -> None:
        with torch.no_grad():
            u = self.u1
            for _ in range(steps):
                v = torch.nn.functional.normalize(self.v1.t() @ u, dim=0, eps=1e-30)
                u = torch.nn.functional.normalize(self.v1 @ v, dim=0, eps=1e-30)
            self.u1.copy_(u)

    def spectral_estimates(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(s_1 ≈ ‖V1‖₂ by power iteration, s_2 = ‖V2‖₂ exactly), differentiable."""
        if self.training:
            self._power_iteration(self.POWER_ITERATIONS)
        u = self.u1
        v = torch.nn.functional.normalize(self.v1.detach().t() @ u, dim=0, eps=1e-30)
        return u @ (self.v1 @ v), torch.linalg.vector_norm(self.v2)

    def normalized_layers(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(W1, W2, ‖W1‖₂, ‖W2‖₂) after spectral normalization (norms as estimated)."""
        c = self.layer_bound
        if c == 0:
            zero = self.v2.new_zeros(())
            return torch.zeros_like(self.v1), torch.zeros_like(self.v2), zero, zero
        s1, s2 = (s.clamp_min(1e-30) for s in self.spectral_estimates())
        n1, n2 = torch.clamp(s1, max=c), torch.clamp(s2, max=c)
        return self.v1 * (n1 / s1), self.v2 * (n2 / s2), n1, n2

    def weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(W1, W2) after spectral normalization."""
        return self.normalized_layers()[:2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w1, w2 = self.weights()
        return sigma_forward(x, w1, self.b1, w2, self.b2, self.sigma_min)


def sigma_forward(x, w1, b1, w2, b2, sigma_min: float) -> torch.Tensor:
    """σ(x) = ReLU(W2·ReLU(W1·x + b1) + b2) + σ_min, shape [B] (float64 out)."""
    hidden = torch.relu(torch.nn.functional.linear(x.flatten(1).to(w1.dtype), w1, b1))
    h = torch.nn.functional.linear(hidden, w2, b2)[:, 0]
    return torch.relu(h).double() + sigma_min


FIXED_ROWS = 64
"""Inputs per forward pass of the certified σ-network (:meth:`CertifiedSigma.__call__`)."""


class CertifiedSigma:
    """Frozen σ_θ with its certified regularity ``Lipschitz(lip, σ_min)`` (a σ-provider).

    ``declared_lip`` is the constraint it was trained under; ``regularity.lip`` the
    certified value (product of exact spectral norms, <= declared); ``rescaled`` tells
    whether the last layer had to be scaled down to meet the declared value.
    """

    def __init__(self, w1, b1, w2, b2, sigma_min: float, declared_lip: float) -> None:
        self.w1, self.b1, self.w2, self.b2 = (t.detach().clone() for t in (w1, b1, w2, b2))
        self.sigma_min = float(sigma_min)
        self.declared_lip = float(declared_lip)
        self.rescaled = False
        certified = self.certified_product()
        for _ in range(8):
            if certified <= self.declared_lip:
                break
            self.w2 = self.w2 * (self.declared_lip / certified) * (1 - 1e-6)
            self.rescaled = True
            certified = self.certified_product()
        else:  # pragma: no cover - the scaling converges at the first try in practice
            raise ParameterError("could not certify the σ-network's Lipschitz bound")
        self.regularity = Lipschitz(certified, self.sigma_min)

    @property
    def weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(W1, W2): σ = ReLU(W2·ReLU(W1·x + b1) + b2) + σ_min, so Lip(σ) <= ‖W1‖₂·‖W2‖₂."""
        return self.w1, self.w2

    def certified_product(self) -> float:
        """‖W1‖₂·‖W2‖₂ from a float64 SVD of the stored weights, inflated by SVD_SAFETY."""
        n1 = float(torch.linalg.svdvals(self.w1.double().cpu())[0])
        n2 = float(torch.linalg.svdvals(self.w2.double().cpu())[0])
        return n1 * n2 * (1.0 + SVD_SAFETY)

    def to(self, device: torch.device) -> CertifiedSigma:
        self.w1, self.b1, self.w2, self.b2 = (
            t.to(device) for t in (self.w1, self.b1, self.w2, self.b2)
        )
        return self

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """σ_θ(x) for a batch [B, ...] -> [B] (float64, >= σ_min exactly), bit for bit
        whatever batch x is in: the network sees chunks of exactly :data:`FIXED_ROWS` rows
        (zeros padding the last), so every input goes through products of one shape (a
        product's rows depend on how many rows it has, not on their position: one input
        alone, a matrix-vector product, rounds otherwise than in a batch)."""
        rows = x.to(self.w1.device).flatten(1)
        with torch.no_grad():
            parts = [sigma_forward(chunk, self.w1, self.b1, self.w2, self.b2, self.sigma_min)[:real]
                     for chunk, real in padded_chunks(rows, FIXED_ROWS)]  # fmt: skip
        if not parts:
            return torch.zeros(0, dtype=torch.float64, device=x.device)
        return torch.cat(parts).to(x.device)


def certify_sigma_network(network: SigmaNetwork) -> CertifiedSigma:
    """Freeze a trained :class:`SigmaNetwork` and certify Lip(σ_θ) from exact singular values."""
    network.eval()
    with torch.no_grad():
        w1, w2 = network.weights()
        return CertifiedSigma(w1, network.b1, w2, network.b2, network.sigma_min, network.lip).to(
            w1.device
        )
