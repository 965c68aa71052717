"""Base classifiers whose smoothed classifier is known exactly (checks S1 and S4).

- ``linear-N``: f(x) = [w·x > b] with ‖w‖ = 1. For Gaussian noise of *any* σ(x),
  P(f(x + σ(x)ε) = 1) = Φ((w·x − b)/σ(x)), which exceeds 1/2 exactly when w·x > b:
  the smoothed classifier's boundary is the hyperplane, whatever σ(x). At a diagonal
  scale s(x) (:mod:`harness.engine.scale`), w·(x + s⊙ε) ~ N(w·x, ‖s⊙w‖²), so
  P(side 1) = Φ((w·x − b)/‖s(x)⊙w‖₂) (:func:`noise_spread`), the same boundary.
- ``ball-N``: f(x) = [‖x − c‖ <= ρ]. P(f(x + σε) = inside) = P(‖x − c + σε‖² <= ρ²)
  = χ²_N(ρ²/σ²; noncentrality ‖x − c‖²/σ²), the noncentral χ² CDF, for any σ = σ(x);
  at a diagonal scale s(x) a positive combination of noncentral χ²₁ laws, bounded to
  within 10⁻⁹ (:func:`~harness.mathematics.gaussian_ball.ball_probability`; a mass
  bounded no closer raises :class:`~harness.mathematics.gaussian_ball.UndecidedMass`).

Side 1 is "positive side" / "inside". A model answers one of K classes: ``classes`` =
(class of side 0, class of side 1), by default (0, 1) of K = 2; with K > 2 (check S1
places the boundary between two random classes of a benchmark's K) every other class
has probability 0 under any noise, so the smoothed classifier stays exact. With
``one_hot=True`` the logits are L for the answered class and 0 for every other, L =
:data:`ONE_HOT_LOGIT`, so the softmax is exactly one-hot in float32 and float64: then
the soft smoothed classifier of Bergstrom et al. is exact too, E[softmax_c] = P(f = c),
and with the normalization of their Remark 2, g = (1 − K·p_min)·onehot + p_min,
E[g_c] = (1 − K·p_min)·P(f = c) + p_min: its argmax changes exactly where P(side 1)
crosses 1/2, so soft certificates are audited against the exact soft expectation,
whose boundary is the hard one. Without ``one_hot`` (K = 2 only) the logits are
(0, margin).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from harness.foundation.data import Dataset
from harness.foundation.errors import ParameterError
from harness.mathematics.gaussian_ball import ball_probability

ONE_HOT_LOGIT = 1e4
"""Logit of the answered class of a one-hot analytic model (exp(−1e4) = 0 in float64)."""


def noise_spread(sigma: np.ndarray, normals: np.ndarray) -> np.ndarray:
    """The standard deviation of the noise along unit normals ``normals`` ([d] or [B, d]):
    σ [B] itself, or ‖s_b ⊙ n‖₂ of each row of a diagonal scale [B, d] (or [B, *shape])."""
    sigma = np.asarray(sigma, dtype=np.float64)
    if sigma.ndim < 2:
        return sigma
    return np.linalg.norm(sigma.reshape(len(sigma), -1) * normals, axis=1)


def ball_inside(offset: np.ndarray, sigma: np.ndarray, radius: np.ndarray) -> np.ndarray:
    """P(‖offset_b + σ_b ε‖₂ <= ρ_b) [B] of ``offset`` = x − c [B, d]: the noncentral χ²
    CDF at one σ [B] per row; at a diagonal scale [B, d] (or [B, *shape])
    :func:`~harness.mathematics.gaussian_ball.ball_probability`, row by row where the
    radii differ."""
    from scipy import stats

    sigma, radius = np.asarray(sigma, dtype=np.float64), np.asarray(radius, dtype=np.float64)
    offset = np.asarray(offset, dtype=np.float64).reshape(len(offset), -1)
    if sigma.ndim < 2:
        dist2 = np.sum(offset**2, axis=1)
        return stats.ncx2.cdf(radius**2 / sigma**2, offset.shape[1], dist2 / sigma**2)
    scale = sigma.reshape(len(sigma), -1)
    radius = np.broadcast_to(radius, (len(offset),))
    if np.all(radius == radius[0]):
        return ball_probability(offset, scale, float(radius[0])) if len(offset) else radius
    return np.array([ball_probability(offset[b : b + 1], scale[b : b + 1], float(radius[b]))[0]
                     for b in range(len(offset))])  # fmt: skip


class PlacementWithheld(Exception):
    """An analytic model was read while its placement was withheld (:meth:`_Analytic.withheld`):
    what was computed depends on where the plane or ball lies."""


def point_keys(x: torch.Tensor) -> list[bytes]:
    """Each point's float32 bytes: its key in a map by point (a placement per input, σ
    already asked)."""
    rows = torch.as_tensor(x).detach().to("cpu", torch.float32).reshape(len(x), -1)
    return [row.numpy().tobytes() for row in rows]


class _Analytic(torch.nn.Module):
    """A two-sided analytic classifier answering ``classes[side]`` of ``num_classes``.

    Its placement (the plane or the ball: ``PLACEMENT``) can be withheld
    (:meth:`withheld`): then evaluating the model, its smoothed classifier, or reading its
    placement raises :class:`PlacementWithheld`, so a computation that completes did not
    depend on the placement (check S1 asks σ of many trials at once this way, each trial
    on its own placement); or held per input (:meth:`per_input`): then each point is
    answered with the placement of the input it stands for."""

    family = ""
    PLACEMENT: tuple[str, ...] = ()

    def __init__(self, one_hot: bool, num_classes: int, classes: tuple[int, int]) -> None:
        super().__init__()
        negative, positive = (int(c) for c in classes)
        if not (num_classes >= 2 and 0 <= negative < num_classes and 0 <= positive < num_classes
                and negative != positive):  # fmt: skip
            raise ParameterError(f"classes {classes} must be two distinct classes of {num_classes}")
        if not one_hot and (num_classes, negative, positive) != (2, 0, 1):
            raise ParameterError("margin logits (one_hot=False) need classes (0, 1) of 2")
        self.one_hot = one_hot
        self.num_classes = num_classes
        self.classes = (negative, positive)
        self._withheld = False
        self._routes = None  # per_input's placements, by input

    @contextmanager
    def withheld(self) -> Iterator[None]:
        """Inside, anything that reads the placement raises :class:`PlacementWithheld`."""
        saved, self._withheld = self._withheld, True
        try:
            yield
        finally:
            self._withheld = saved

    def _placed(self) -> None:
        if self.__dict__.get("_withheld"):
            raise PlacementWithheld(f"the {self.family} model's placement is withheld")
        if self.__dict__.get("_routes") is not None:
            raise PlacementWithheld(
                f"the {self.family} model has a placement per input: evaluate it with "
                "harness.outputs_for_inputs, naming the input each point stands for"
            )

    def placement(self) -> tuple[torch.Tensor, float]:
        """The current placement: (normal, offset) of the plane, (center, radius) of the ball."""
        vector, scalar = type(self).PLACEMENT
        return getattr(self, vector).detach().clone(), float(getattr(self, scalar))

    def set_placement(self, placement: tuple[torch.Tensor, float]) -> None:
        """Restore a :meth:`placement`."""
        vector, scalar = type(self).PLACEMENT
        getattr(self, vector).copy_(placement[0])
        setattr(self, scalar, placement[1])

    @contextmanager
    def per_input(
        self, inputs: torch.Tensor, placements: Sequence[tuple[torch.Tensor, float]]
    ) -> Iterator[None]:  # fmt: skip
        """Inside, input ``inputs[i]`` (by its float32 bytes) has its own classifier, this
        model at ``placements[i]``: :meth:`outputs_for` evaluates each point with the
        placement of the input it stands for and :meth:`class_probabilities` each input
        with its own, while anything that reads one placement (a plain call) raises
        :class:`PlacementWithheld`. Check S1 asks σ of many trials at once this way, each
        trial on its own classifier."""
        if len(inputs) != len(placements):
            raise ValueError(f"{len(inputs)} inputs but {len(placements)} placements")
        device = getattr(self, type(self).PLACEMENT[0]).device
        vectors = torch.stack([v.flatten() for v, _ in placements]).to(device) if placements \
            else torch.zeros((0, self.dim), device=device)  # fmt: skip
        scalars = torch.tensor([s for _, s in placements], dtype=torch.float64, device=device)
        routes = {key: i for i, key in enumerate(point_keys(inputs))}
        saved, self._routes = self.__dict__.get("_routes"), (routes, vectors, scalars)
        try:
            yield
        finally:
            self._routes = saved

    def _routed(self, inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The placement index of each input (:meth:`per_input`) with the stacked vectors
        and scalars; :class:`PlacementWithheld` for an input without one."""
        routes, vectors, scalars = self._routes
        try:
            index = [routes[key] for key in point_keys(inputs)]
        except KeyError:
            raise PlacementWithheld(
                f"a point was evaluated for an input that has no {self.family} placement"
            ) from None
        return torch.tensor(index, dtype=torch.long, device=vectors.device), vectors, scalars

    def outputs_for(
        self, points: torch.Tensor, inputs: torch.Tensor, owner: torch.Tensor
    ) -> torch.Tensor:  # fmt: skip
        """The logits at ``points`` [P, *shape], point r drawn for input
        ``inputs[owner[r]]`` (−1: for no input, e.g. padding; answered at the first
        placement): inside :meth:`per_input` each with that input's classifier, else all
        with the one placement (a plain call)."""
        if self.__dict__.get("_routes") is None:
            return self(points)
        owner = torch.as_tensor(owner, dtype=torch.long).cpu()
        used = torch.unique(owner[owner >= 0])
        index, vectors, scalars = self._routed(inputs[used.to(inputs.device)])
        lookup = torch.zeros(len(inputs), dtype=torch.long, device=index.device)
        lookup[used.to(index.device)] = index
        row = lookup[owner.clamp_min(0).to(index.device)]  # padding: the first placement
        flat = points.flatten(1)
        margin = self._margin_rows(flat, vectors[row].to(flat.dtype), scalars[row].to(flat.dtype))
        return self._logits(margin)

    def _margin_rows(self, flat, vectors, scalars) -> torch.Tensor:
        raise NotImplementedError

    def _probability_rows(self, flat: np.ndarray, sigma, vectors, scalars) -> np.ndarray:
        raise NotImplementedError

    def __getattr__(self, name: str) -> Any:  # buffers and the placement's numbers
        if name in type(self).PLACEMENT:
            self._placed()
        return super().__getattr__(name)

    def _logits(self, margin: torch.Tensor) -> torch.Tensor:
        """(0, margin), or one-hot logits of class ``classes[margin > 0]``."""
        if not self.one_hot:
            return torch.stack([torch.zeros_like(margin), margin], dim=1)
        positive = margin > 0
        logits = torch.zeros(
            len(margin), self.num_classes, dtype=margin.dtype, device=margin.device
        )
        logits[:, self.classes[1]] = positive.to(margin.dtype) * ONE_HOT_LOGIT
        logits[:, self.classes[0]] = (~positive).to(margin.dtype) * ONE_HOT_LOGIT
        return logits

    def class_probabilities(self, x: np.ndarray, sigma: np.ndarray) -> np.ndarray:
        """P(f(x + σε) = c) for every class c [B, K]: the smoothed classifier, exactly
        (inside :meth:`per_input`, each input's own)."""
        if self.__dict__.get("_routes") is None:
            side = self.smoothed_probability(x, sigma)
        else:
            flat = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
            index, vectors, scalars = self._routed(torch.from_numpy(flat))
            side = self._probability_rows(flat, np.asarray(sigma, dtype=np.float64),
                                          vectors[index].double().cpu().numpy(),
                                          scalars[index].cpu().numpy())  # fmt: skip
        out = np.zeros((len(side), self.num_classes))
        out[:, self.classes[1]], out[:, self.classes[0]] = side, 1.0 - side
        return out

    def smoothed_probability(self, x: np.ndarray, sigma: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def architecture_description(self) -> dict[str, Any]:
        """This model as a registered architecture (``linear-N`` / ``ball-N``) with its
        current plane or ball, so that a plugin host rebuilds it
        (:mod:`harness.plugin.model_description`; the state dict travels beside it)."""
        return {"architecture": f"{self.family}-N", "input_shape": [self.dim],
                "num_classes": self.num_classes,
                "params": {"one_hot": self.one_hot, "classes": list(self.classes)},
                "attributes": self._attributes()}  # fmt: skip

    def _attributes(self) -> dict[str, float]:
        raise NotImplementedError

    def content_hash(self) -> str:
        """SHA-256 (hex) of the model's family, classes and parameters (float64 bytes):
        the recipe hash of a method rebuilt on it (what its artifacts are keyed by)."""
        digest = hashlib.sha256(
            f"{self.family}/{self.num_classes}/{self.classes}/{self.one_hot}".encode()
        )
        for name, value in sorted(self._parameters_for_hash().items()):
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(value, dtype=np.float64).tobytes())
        return digest.hexdigest()

    def _parameters_for_hash(self) -> dict[str, np.ndarray]:
        raise NotImplementedError


class LinearClassifier(_Analytic):
    """f(x) = [w·x > b] with unit normal w (default e_1), as logits (0, w·x − b), or
    one-hot logits of ``classes[w·x > b]``."""

    family = "linear"
    PLACEMENT = ("w", "offset")

    def __init__(
        self, dim: int, offset: float = 0.0, one_hot: bool = False, num_classes: int = 2,
        classes: tuple[int, int] = (0, 1),
    ) -> None:  # fmt: skip
        super().__init__(one_hot, num_classes, classes)
        self.dim = dim
        w = torch.zeros(dim)
        w[0] = 1.0
        self.register_buffer("w", w)
        self._offset = float(offset)

    @property
    def offset(self) -> float:
        self._placed()
        return self._offset

    @offset.setter
    def offset(self, value: float) -> None:
        self._offset = float(value)

    def set_plane(self, normal: torch.Tensor, offset: float) -> None:
        """Move the boundary to {x : w·x = offset}, w = normal / ‖normal‖."""
        normal = normal.flatten().to(self.w.device, self.w.dtype)
        self.w.copy_(normal / normal.norm())
        self.offset = float(offset)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._logits(x.flatten(1) @ self.w - self.offset)

    def signed_distance(self, x: np.ndarray) -> np.ndarray:
        """Euclidean signed distance to the plane (float64; w is stored in float32, so it is
        divided by its norm in float64)."""
        w = self.w.double().cpu().numpy()
        flat = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
        return (flat @ w - self.offset) / np.linalg.norm(w)

    def smoothed_probability(self, x: np.ndarray, sigma: np.ndarray) -> np.ndarray:
        """P(f(x + σε) = side 1) = Φ((w·x − b)/σ); at a diagonal scale s,
        Φ((w·x − b)/‖s⊙w‖₂)."""
        from scipy import stats

        w = self.w.double().cpu().numpy()
        return stats.norm.cdf(self.signed_distance(x) / noise_spread(sigma, w / np.linalg.norm(w)))

    def _margin_rows(self, flat, vectors, scalars) -> torch.Tensor:
        return (flat * vectors).sum(dim=1) - scalars

    def _probability_rows(self, flat, sigma, vectors, scalars) -> np.ndarray:
        from scipy import stats

        norms = np.linalg.norm(vectors, axis=1)
        signed = (np.sum(flat * vectors, axis=1) - scalars) / norms
        return stats.norm.cdf(signed / noise_spread(sigma, vectors / norms[:, None]))

    def _parameters_for_hash(self) -> dict[str, np.ndarray]:
        return {"w": self.w.double().cpu().numpy(), "offset": np.array([self.offset])}

    def _attributes(self) -> dict[str, float]:
        return {"offset": self.offset}


class BallClassifier(_Analytic):
    """f(x) = [‖x − c‖ <= ρ] (default c = 0), as logits (0, ρ − ‖x − c‖), or one-hot
    logits of ``classes[inside]``."""

    family = "ball"
    PLACEMENT = ("center", "radius")

    def __init__(
        self, dim: int, radius: float = 1.0, one_hot: bool = False, num_classes: int = 2,
        classes: tuple[int, int] = (0, 1),
    ) -> None:  # fmt: skip
        super().__init__(one_hot, num_classes, classes)
        self.dim = dim
        self._radius = float(radius)
        self.register_buffer("center", torch.zeros(dim))

    @property
    def radius(self) -> float:
        self._placed()
        return self._radius

    @radius.setter
    def radius(self, value: float) -> None:
        self._radius = float(value)

    def set_ball(self, center: torch.Tensor, radius: float) -> None:
        """Move the ball to B(center, radius)."""
        self.center.copy_(center.flatten().to(self.center.device, self.center.dtype))
        self.radius = float(radius)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._logits(self.radius - (x.flatten(1) - self.center).norm(dim=1))

    def smoothed_probability(self, x: np.ndarray, sigma: np.ndarray) -> np.ndarray:
        """P(f(x + σε) = inside) = χ²_N(ρ²/σ²; nc = ‖x − c‖²/σ²) (noncentral χ² CDF), or
        its anisotropic form at a diagonal scale (:func:`ball_inside`)."""
        flat = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
        return ball_inside(flat - self.center.double().cpu().numpy(), sigma, self.radius)

    def _margin_rows(self, flat, vectors, scalars) -> torch.Tensor:
        return scalars - (flat - vectors).norm(dim=1)

    def _probability_rows(self, flat, sigma, vectors, scalars) -> np.ndarray:
        return ball_inside(flat - vectors, sigma, scalars)

    def _parameters_for_hash(self) -> dict[str, np.ndarray]:
        return {"center": self.center.double().cpu().numpy(), "radius": np.array([self.radius])}

    def _attributes(self) -> dict[str, float]:
        return {"radius": self.radius}


def build_linear(input_shape: tuple[int, ...], num_classes: int, params: Mapping[str, Any]):
    dim = _checked_dim(input_shape, num_classes, params, "linear-N")
    return LinearClassifier(dim, params.get("offset", 0.0), **_sides(num_classes, params))


def build_ball(input_shape: tuple[int, ...], num_classes: int, params: Mapping[str, Any]):
    dim = _checked_dim(input_shape, num_classes, params, "ball-N")
    radius = float(params.get("radius", 1.0))
    if radius <= 0:
        raise ParameterError(f"ball-N radius must be positive, got {radius}")
    return BallClassifier(dim, radius, **_sides(num_classes, params))


def _sides(num_classes: int, params: Mapping[str, Any]) -> dict[str, Any]:
    """The answered classes: (0, 1) of 2, or (``one_hot``) the two ``classes`` of K."""
    one_hot = bool(params.get("one_hot", False))
    return {"one_hot": one_hot, "num_classes": num_classes,
            "classes": tuple(params.get("classes", (0, 1)))}  # fmt: skip


def _checked_dim(input_shape, num_classes, params, name) -> int:
    dim = int(np.prod(input_shape))
    if "dim" in params and params["dim"] != dim:
        raise ParameterError(
            f"{name} with N={params['dim']} needs {params['dim']}-dimensional inputs, got {dim}"
        )
    if num_classes != 2 and not params.get("one_hot"):
        raise ParameterError(
            f"{name} is a binary classifier; the dataset has {num_classes} classes"
        )
    return dim


def load_ball_dataset(
    dim: int, seed: int = 0, radius: float = 1.0, train_size: int = 2000, test_size: int = 500
) -> Dataset:
    """Points x = ‖x‖·u with u uniform on the sphere and ‖x‖ uniform in [0, 2ρ]; label [‖x‖ <= ρ]."""
    if dim < 1:
        raise ParameterError(f"ball-N needs N >= 1, got {dim}")
    rng = np.random.default_rng([seed, dim, 7])

    def sample(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        u = rng.standard_normal((count, dim))
        u /= np.linalg.norm(u, axis=1, keepdims=True)
        norms = rng.uniform(0, 2 * radius, count)
        x = u * norms[:, None]
        return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(
            (norms <= radius).astype(np.int64)
        )

    train_x, train_y = sample(train_size)
    test_x, test_y = sample(test_size)
    return Dataset(f"ball-{dim}", train_x, train_y, test_x, test_y, 2, ("outside", "inside"))
