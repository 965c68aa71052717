"""The certification protocol every method of a benchmark shares."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from harness.foundation.errors import ParameterError

PRECISIONS = ("fp32", "tf32", "tf32-conv", "bf16", "fp16")
"""Arithmetic of the base model's forward pass (see :mod:`harness.engine.precision`);
``precision = "auto"`` resolves to one when a run starts (tf32-conv on CUDA, fp32 elsewhere)."""
PRECISION_MEANINGS = {
    "fp32": "strict fp32, TF32 off",
    "tf32-conv": "PyTorch's default: cuDNN convolutions in TF32, matmuls in fp32",
    "tf32": "matmuls and convolutions in TF32",
    "bf16": "a bf16 copy of the model",
    "fp16": "an fp16 copy of the model",
}
"""What each precision computes on CUDA, as a board's header states it."""
LEGACY_PRECISION = "fp32"
"""The precision of runs whose stored protocol names none (made before it was recorded)."""
NOISE_SCHEMES = ("philox-v1", "block-v1")
"""Noise schemes of the sampling engine (see :mod:`harness.engine.sampling`)."""
CUDNN_MODES = ("heuristic", "benchmark")
"""How cuDNN picks convolution algorithms on CUDA (see :mod:`harness.engine.precision`)."""
LEGACY_NOISE = "block-v1"
"""The scheme of runs whose stored protocol names none (made before it was recorded)."""
SAMPLINGS = ("fixed", "sequential")
"""How the estimation samples are drawn: n of them, or in rounds until the input's place
on the radius grid is decided (:mod:`harness.mathematics.sequential`)."""
SEQUENTIAL_FIELDS = ("sampling", "n_max", "grid", "rule")
"""Protocol fields a fixed-sampling run does not record (its run id stays as it was)."""
SEQUENTIAL_RULES = ("grid-place-v1", "mixture-cs-v2")
"""The sequential rules (:mod:`harness.mathematics.gridplace`, :mod:`harness.mathematics.sequential`);
the first is the default of a new sequential run."""
LEGACY_SEQUENTIAL_RULE = "mixture-cs-v2"
"""The rule of sequential runs whose stored protocol names none (made before it was recorded)."""
FORWARD_OPTIONS = ("fold_batchnorm", "compile", "cuda_graphs")
"""How the base model's forward pass is computed (:mod:`harness.engine.forward`): each off
by default, and recorded with a run (its id, its arithmetic, its board) only when on."""
FORWARD_NAMES = {"fold_batchnorm": "bn-folded", "compile": "compiled", "cuda_graphs": "graphs"}
"""How the name of an arithmetic (``fp32+bn-folded``) shows each forward option."""


@dataclass(frozen=True)
class CertificationProtocol:
    """Cohen et al. (2019) CERTIFY: ``n0`` samples select the class, ``n`` estimate p_A.

    ``alpha`` is the failure probability of each certificate; ``batch_size`` the
    number of noisy samples per forward pass (``"auto"``: the largest that fits the
    device, :mod:`harness.engine.batchsize`). ``precision`` and ``channels_last`` fix the
    arithmetic of the base classifier that is certified (:mod:`harness.engine.precision`;
    ``"auto"``: PyTorch's default arithmetic, ``tf32-conv``, on CUDA, fp32 elsewhere,
    resolved and recorded when a run starts);
    ``noise`` the noise scheme (``"auto"``: philox-v1 on CUDA, block-v1 elsewhere,
    resolved and recorded when a run starts). ``cudnn`` how cuDNN picks its convolution
    algorithms on CUDA: ``"heuristic"`` (its deterministic heuristics: a replay on the
    same arithmetic repeats the counts bit for bit) or ``"benchmark"`` (timed on first
    use, often faster, but a replay may time another algorithm: such a run replays only
    statistically, :mod:`harness.engine.arithmetic`). ``fold_batchnorm``, ``compile`` and
    ``cuda_graphs`` make the same classifier's forward pass faster
    (:mod:`harness.engine.forward`): eval-mode BatchNorm folded into the convolution before
    it, ``torch.compile`` and CUDA graphs at the engine's batch shape; each is part of the
    arithmetic (folding and compiling round differently). ``sampling = "sequential"`` draws
    the estimation samples in rounds, at most ``n_max`` (default ``n``), until each
    input's place on the radius ``grid`` (the benchmark's ``radii``) is decided, by the
    sequential ``rule`` (default the first of :data:`SEQUENTIAL_RULES`).
    """

    n0: int = 100
    n: int = 100_000
    alpha: float = 0.001
    batch_size: int | str = 1024
    precision: str = "auto"
    channels_last: bool = False
    noise: str = "auto"
    cudnn: str = "heuristic"
    sampling: str = "fixed"
    n_max: int | None = None
    grid: tuple[float, ...] | None = None
    rule: str | None = None
    fold_batchnorm: bool = False
    compile: bool = False
    cuda_graphs: bool = False

    def __post_init__(self) -> None:
        check_alpha(self.alpha)
        for option in FORWARD_OPTIONS:
            if not isinstance(getattr(self, option), bool):
                raise ParameterError(
                    f"{option} must be true or false, got {getattr(self, option)!r}"
                )
        if not isinstance(self.n, int) or self.n < 1:
            raise ParameterError(f"n must be an integer >= 1, got {self.n!r}")
        if not isinstance(self.n0, int) or self.n0 < 1:
            raise ParameterError(f"n0 must be an integer >= 1, got {self.n0!r}")
        if self.n0 > self.n:
            raise ParameterError(
                f"n0 ({self.n0}) must not exceed n ({self.n}): n0 samples only select "
                "the class, n samples estimate its probability"
            )
        if self.batch_size != "auto" and (
            not isinstance(self.batch_size, int)
            or isinstance(self.batch_size, bool)
            or self.batch_size < 1
        ):
            raise ParameterError(
                f'batch_size must be an integer >= 1 or "auto", got {self.batch_size!r}'
            )
        if self.precision != "auto" and self.precision not in PRECISIONS:
            raise ParameterError(
                f"unknown precision {self.precision!r}; choose auto or one of "
                + ", ".join(PRECISIONS)
            )
        if not isinstance(self.channels_last, bool):
            raise ParameterError(f"channels_last must be true or false, got {self.channels_last!r}")
        if self.cudnn not in CUDNN_MODES:
            raise ParameterError(
                f"unknown cudnn mode {self.cudnn!r}; choose one of {', '.join(CUDNN_MODES)}"
            )
        if self.noise != "auto" and self.noise not in NOISE_SCHEMES:
            raise ParameterError(
                f"unknown noise scheme {self.noise!r}; choose auto or one of "
                + ", ".join(NOISE_SCHEMES)
            )
        self._check_sampling()

    def _check_sampling(self) -> None:
        if self.sampling not in SAMPLINGS:
            raise ParameterError(
                f'unknown sampling {self.sampling!r}; choose "fixed" (n samples per input) or '
                '"sequential" (rounds until the place on the radius grid is decided)'
            )
        if self.sampling == "fixed":
            if self.n_max is not None:
                raise ParameterError(
                    f'n_max = {self.n_max!r} is the cap of sampling = "sequential"; set '
                    'sampling = "sequential" or remove n_max (fixed sampling draws n)'
                )
            if self.rule is not None:
                raise ParameterError(
                    f'rule = {self.rule!r} is the rule of sampling = "sequential"; set '
                    'sampling = "sequential" or remove rule (fixed sampling draws n)'
                )
            return
        if self.rule is None:
            object.__setattr__(self, "rule", SEQUENTIAL_RULES[0])
        if self.rule not in SEQUENTIAL_RULES:
            raise ParameterError(
                f"unknown sequential rule {self.rule!r}; choose one of "
                + ", ".join(map(repr, SEQUENTIAL_RULES))
            )
        if self.n_max is None:
            object.__setattr__(self, "n_max", self.n)
        if isinstance(self.n_max, bool) or not isinstance(self.n_max, int) or self.n_max < 1:
            raise ParameterError(f"n_max must be an integer >= 1, got {self.n_max!r}")
        grid = self.grid
        if (
            not isinstance(grid, list | tuple)
            or not grid
            or not all(
                isinstance(r, int | float) and not isinstance(r, bool) and r >= 0 for r in grid
            )
        ):
            raise ParameterError(
                f"sequential sampling needs the radius grid (radii = [...], numbers >= 0) it "
                f"decides; got {grid!r}: set radii, e.g. radii = [0.0, 0.25, 0.5, 0.75, 1.0]"
            )
        if any(b <= a for a, b in pairwise(grid)):
            raise ParameterError(
                f"radii = {list(grid)} is not sorted: sequential sampling decides each input's "
                f"place on this grid, list it in increasing order: {sorted(set(grid))}"
            )
        object.__setattr__(self, "grid", tuple(float(r) for r in grid))

    @property
    def estimation_cap(self) -> int:
        """The most estimation samples an input gets: ``n``, or ``n_max`` when sequential."""
        return self.n if self.sampling == "fixed" else int(self.n_max)


def check_alpha(alpha: float) -> float:
    """Return ``alpha`` if it lies in the open interval (0, 1), else raise."""
    if not (isinstance(alpha, int | float) and 0.0 < alpha < 1.0):
        raise ParameterError(f"alpha must lie in (0, 1), got {alpha!r}")
    return float(alpha)


SIGMA_MAX = 1e30
"""Largest σ accepted: x + σε must stay finite in float32 (max ≈ 3.4e38) for |ε| up to ~10."""


def check_sigma(sigma: float, name: str = "sigma") -> float:
    """Return ``sigma`` if it is a positive finite number, else raise."""
    if not (isinstance(sigma, int | float) and 0.0 < sigma < float("inf")):
        raise ParameterError(f"{name} must be a positive number, got {sigma!r}")
    return float(sigma)
