"""Soft-smoothing certificate of Bergstrom et al., Thm 3, with confidence bounds.

Thm 3: with Φ⁻¹∘ḡ_i L-Lipschitz for every class i (Thm 2), f̄(x + δ) = y for
‖δ‖ <= (Φ⁻¹(ḡ_y(x)) − Φ⁻¹(max_{i≠y} ḡ_i(x))) / (2L). The means ḡ are unknown; as in
CERTIFY (Cohen et al. 2019) n0 samples (stream 0) select y = argmax of the mean of g, and n
independent samples (stream 1) bound

    ḡ_y(x) >= lower                     (Hoeffding at level α/2),
    max_{i≠y} ḡ_i(x) <= upper           (Hoeffding for each i ≠ y at level α/(2(n_cls − 1)),
                                          and upper <= 1 − lower since Σ_i ḡ_i = 1),

so that both hold together with probability >= 1 − α (union bound). Every sample g_i lies in
[p_min, 1 − (n_cls − 1)·p_min] (Remark 2), the range Hoeffding's inequality uses; since ḡ_i
does as well, the bounds are clipped to that range (valid, as the true value lies in it).
The radius is (Φ⁻¹(lower) − Φ⁻¹(upper)) / (2L); the certifier abstains when it is <= 0.

Why all n_cls − 1 others and not only the empirical runner-up: Thm 3 needs an upper bound on
ḡ_{y'} for the *true* runner-up y'; a bound for the class that merely looks second in the
sample is not one (it may be a different class). With two classes both readings coincide.

The paper's experiments used raw Monte Carlo means (no confidence bounds); this does not.

PREDICT (stored beside each certificate, the clean-accuracy column) is the soft smoothed
classifier's own answer, not CERTIFY's: from the n estimation means, every class i gets
a two-sided Hoeffding interval on ḡ_i at level α/(2·n_cls) per side (all simultaneous
with probability >= 1 − α, so choosing the top class from the same samples is allowed);
PREDICT answers the top class when its lower bound exceeds every other class's upper
bound, i.e. it beats the runner-up, and abstains otherwise. It is then wrong (answers a
class other than argmax ḡ) with probability at most α, as Cohen et al.'s PREDICT.
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtri

from harness import (
    ABSTAIN,
    CertificationProtocol,
    Claim,
    Constant,
    Evidence,
    IdrsError,
    Lipschitz,
    RadiusFormula,
    Recomputed,
    check_alpha,
    hoeffding_lower,
    hoeffding_upper,
)
from plugins.lipschitz.constant import check_lemma3, check_p_min, lipschitz_constant

BOUND = "hoeffding"


def confidence_bounds(
    means: np.ndarray, top: int, n: int, alpha: float, p_min: float
) -> tuple[float, float]:
    """(lower bound on ḡ_top, upper bound on max_{i≠top} ḡ_i), jointly at level 1 − alpha.

    ``means`` are the Monte Carlo means of the normalized outputs g over ``n`` samples.
    """
    check_alpha(alpha)
    means = np.asarray(means, dtype=np.float64)
    classes = len(means)
    low, high = p_min, 1.0 - (classes - 1) * p_min
    lower = float(hoeffding_lower(means[top], n, alpha / 2, low, high))
    lower = min(max(lower, low), high)
    others = np.delete(means, top)
    upper = float(np.max(hoeffding_upper(others, n, alpha / (2 * (classes - 1)), low, high)))
    upper = min(max(min(upper, 1.0 - lower), low), high)
    return lower, upper


def soft_predict(means: np.ndarray, n: int, alpha: float, p_min: float) -> int:
    """PREDICT for soft smoothing: argmax of the means if it beats the runner-up at level α.

    Every ḡ_i lies in [p_min, 1 − (n_cls − 1)·p_min]; with Hoeffding intervals of half-width
    w = (range)·√(ln(2·n_cls/α)/(2n)) for all classes at once, the top class is returned when
    mean_top − w > mean_i + w for every other i, else ``ABSTAIN``.
    """
    check_alpha(alpha)
    means = np.asarray(means, dtype=np.float64)
    classes = len(means)
    low, high = p_min, 1.0 - (classes - 1) * p_min
    level = alpha / (2 * classes)
    top = int(np.argmax(means))
    lower = float(hoeffding_lower(means[top], n, level, low, high))
    upper = float(np.max(hoeffding_upper(np.delete(means, top), n, level, low, high)))
    return top if lower > upper else ABSTAIN


def soft_radius(lower: float, upper: float, lipschitz: float) -> float:
    """(Φ⁻¹(lower) − Φ⁻¹(upper)) / (2L) (Thm 3 with confidence bounds)."""
    return float((ndtri(lower) - ndtri(upper)) / (2.0 * lipschitz))


def normalized_means(means: np.ndarray, p_min: float, normalized: bool = True) -> np.ndarray:
    """Means of g = (1 − n·p_min)·softmax + p_min (Remark 2) from the harness's mean
    softmax outputs: g is affine in the softmax, so its mean is the same map of theirs."""
    means = np.asarray(means, dtype=np.float64)
    return (1.0 - means.shape[-1] * p_min) * means + p_min if normalized else means


class LipschitzCertifier:
    """Thm 3 claims for σ with the given regularity, on the normalized base output.

    The harness draws the soft smoothing of the base model (mean softmax outputs); the
    claims use the means of g = (1 − n·p_min)·softmax + p_min (Remark 2, ``normalized``).

    :param regularity: ``Lipschitz(lip, sigma_min)`` of σ (or ``Constant(σ)``: Lip(σ) = 0).
    :param p_min: the normalization floor; Lemma 3's precondition is checked here, before any
        certificate, and :class:`~harness.foundation.errors.ParameterError` raised if it fails.
    :param dim: the input dimension d of χ²_d.
    """

    smoothing = "soft"
    order_dependent = False

    def __init__(
        self,
        regularity: Lipschitz | Constant,
        p_min: float,
        dim: int,
        normalized: bool = True,
        bounds: bool = True,
    ) -> None:
        if isinstance(regularity, Constant):
            regularity = Lipschitz(0.0, regularity.sigma)
        if not isinstance(regularity, Lipschitz):
            raise IdrsError(
                f"the lipschitz certifier needs a Lipschitz σ with a floor σ_min, got "
                f"{regularity.describe()}; use the σ-provider lipschitz-net"
            )
        self.regularity = regularity
        self.p_min = check_p_min(p_min)
        self.dim = dim
        check_lemma3(self.p_min, dim)
        self.lipschitz = lipschitz_constant(regularity.sigma_min, regularity.lip, self.p_min, dim)
        self.normalized, self.bounds = normalized, bounds
        self.radius_formula = LIPSCHITZ_THM3

    def certify(self, evidence: Evidence) -> list[Claim]:
        if np.any(evidence.sigma < self.regularity.sigma_min):
            raise IdrsError(
                f"σ(x) = {float(evidence.sigma.min()):g} is below the declared floor "
                f"σ_min = {self.regularity.sigma_min:g}; Thm 3 does not apply"
            )
        base = evidence.base
        selection = normalized_means(base.selection, self.p_min, self.normalized)
        estimation = normalized_means(base.estimation, self.p_min, self.normalized)
        return [self.claim(selection[i], estimation[i], base.n, evidence.alpha)
                for i in range(len(evidence))]  # fmt: skip

    def claim(self, selection_means: np.ndarray, means: np.ndarray, n: int, alpha: float) -> Claim:
        """The claim implied by the selection means and the estimation means of g over n."""
        top = int(np.argmax(selection_means))
        if self.bounds:
            lower, upper = confidence_bounds(means, top, n, alpha, self.p_min)
        else:  # the paper's experiments: raw Monte Carlo means (no guarantee)
            lower, upper = float(means[top]), float(np.max(np.delete(means, top)))
        radius = soft_radius(lower, upper, self.lipschitz)
        prediction = top if radius > 0 else ABSTAIN
        others = np.delete(np.arange(len(means)), top)
        return Claim(
            prediction=prediction,
            radius=radius if prediction != ABSTAIN else 0.0,
            p_lower=lower,
            predict=soft_predict(means, n, alpha, self.p_min),
            evidence={
                "upper_runner_up": upper,
                "runner_up": int(others[np.argmax(means[others])]),
                "L": self.lipschitz,
                "lip_sigma": self.regularity.lip,
                "sigma_min": self.regularity.sigma_min,
                "p_min": self.p_min,
                "bound": BOUND if self.bounds else "none (raw means)",
                "normalized": self.normalized,
            },
        )


def lipschitz_recompute(rows, inputs, protocol: CertificationProtocol, regularity) -> Recomputed:
    """Thm 3 re-derived from the harness's mean softmax outputs: g's means by Remark 2 at
    the certificate's p_min (``normalized`` as it declares), y = argmax of the selection
    means, the Hoeffding bounds of :func:`confidence_bounds` at the run's α, L of Thm 2
    from the declared ``Lipschitz(lip, σ_min)`` (Lemma 3 checked),
    R = (Φ⁻¹(lower) − Φ⁻¹(upper)) / 2L."""
    if isinstance(regularity, Constant):
        regularity = Lipschitz(0.0, regularity.sigma)
    if not isinstance(regularity, Lipschitz):
        raise IdrsError(f"Thm 3 needs a Lipschitz σ with a floor, the σ-provider declares "
                        f"{regularity.describe()}")  # fmt: skip
    dim = int(inputs[0].numel()) if len(rows) else 1
    constants: dict[float, float] = {}
    out = {k: np.zeros(len(rows)) for k in ("n0", "n", "bound", "prediction", "radius")}
    for i, row in enumerate(rows):
        ev = row.get("evidence") or {}
        base = (row.get("draws") or {}).get("base")
        if base is None or base.get("kind") != "soft" or "p_min" not in ev:
            out["prediction"][i] = ABSTAIN
            continue
        p_min = float(ev["p_min"])
        if p_min not in constants:
            check_lemma3(check_p_min(p_min), dim)
            constants[p_min] = lipschitz_constant(regularity.sigma_min, regularity.lip, p_min, dim)
        normalized = ev.get("normalized", True) is not False
        selection = normalized_means(base["selection"], p_min, normalized)
        means = normalized_means(base["estimation"], p_min, normalized)
        top = int(np.argmax(selection))
        n = int(base["n"])
        lower, upper = confidence_bounds(means, top, n, protocol.alpha, p_min)
        radius = soft_radius(lower, upper, constants[p_min])
        out["n0"][i], out["n"][i], out["bound"][i] = base["n0"], n, lower
        out["prediction"][i] = top if radius > 0 else ABSTAIN
        out["radius"][i] = max(radius, 0.0)
    return Recomputed(out["n0"].astype(np.int64), out["n"].astype(np.int64), out["bound"],
                      out["prediction"].astype(np.int64), out["radius"])  # fmt: skip


LIPSCHITZ_THM3 = RadiusFormula("bergstrom-thm3", lipschitz_recompute)
