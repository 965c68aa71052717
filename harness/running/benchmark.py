"""Benchmark specifications: a TOML file, parsed and checked before any work starts.

Example (the built-in default benchmark is ``harness/benchmarks/quick.toml``)::

    name = "quick"
    seed = 0

    [dataset]
    name = "fashion-mnist"
    test_every = 50        # every k-th test point ...
    test_count = 100       # ... at most this many

    [model]
    architecture = "mlp"
    trainer = "gaussian-augmentation"
    trainer_params = { sigma = 0.25, epochs = 5 }

    [certification]
    n0 = 100
    n = 2000
    alpha = 0.001
    batch_size = 1024      # or "auto": the largest batch that fits the device
    precision = "auto"     # the certified classifier's arithmetic: tf32-conv (PyTorch's
                           # default) on CUDA, fp32 elsewhere; or "fp32", "tf32", "bf16", "fp16"
    channels_last = false  # image models in channels-last memory format
    noise = "auto"         # "philox-v1" (CUDA default) or "block-v1" (CPU default)
    cudnn = "heuristic"    # or "benchmark": cuDNN times its algorithms (replays statistically)
    fold_batchnorm = false # eval-mode BatchNorm folded into the convolution before it
    compile = false        # torch.compile at the engine's batch shape
    cuda_graphs = false    # CUDA graphs at the engine's batch shape (CUDA only)

    [[methods]]
    name = "cohen"
    settings = [{ sigma = 0.12 }, { sigma = 0.25 }, { sigma = 0.5 }]
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from harness.foundation.errors import DatasetMissingError, ParameterError, SpecError
from harness.foundation.identity import setting_key
from harness.foundation.protocol import (
    FORWARD_OPTIONS,
    LEGACY_NOISE,
    LEGACY_PRECISION,
    LEGACY_SEQUENTIAL_RULE,
    SEQUENTIAL_FIELDS,
    CertificationProtocol,
)
from harness.mathematics.accuracy import RADII
from harness.plugin.registry import Registry
from harness.running.model_variants import ModelAxes, model_axes

CHECKPOINT_FORMATS = ("cohen", "state_dict", "torchscript")
AUTO_ARCHITECTURE = "auto"
"""``[model] architecture`` of a ``format = "cohen"`` checkpoint that leaves it out: the
file names it (:func:`harness.running.checkpoint.resolve_architecture`), and the run records it."""
BENCHMARKS_DIR = Path(__file__).parents[1] / "benchmarks"
DEFAULT_BENCHMARK = BENCHMARKS_DIR / "quick.toml"
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


@dataclass(frozen=True)
class DataConfig:
    name: str
    test_every: int = 1
    test_count: int | None = None  # None (or "all" in a spec): every test_every-th point


@dataclass(frozen=True)
class ModelConfig:
    """Everything that makes the base model; its content hash names the cached weights."""

    architecture: str
    trainer: str
    seed: int = 0
    architecture_params: dict[str, Any] = field(default_factory=dict)
    trainer_params: dict[str, Any] = field(default_factory=dict)
    checkpoint: str | None = None  # weights from this file instead of training
    format: str = "state_dict"  # the checkpoint's format, see harness.running.checkpoint.FORMATS


@dataclass(frozen=True)
class MethodConfig:
    name: str
    settings: list[dict[str, Any]]


@dataclass(frozen=True)
class Benchmark:
    name: str
    dataset: DataConfig
    model: ModelConfig
    protocol: CertificationProtocol
    methods: list[MethodConfig]
    seed: int = 0
    device: str = "auto"
    shard_size: int = 32
    radii: tuple[float, ...] = RADII
    headline_radius: float | None = None
    model_axes: ModelAxes | None = None  # several base models: expanded into runs before work

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.model_axes is None:  # a run's spec (one model) keeps its id as it was
            del out["model_axes"]
        if self.protocol.sampling == "fixed":  # keeps the run ids of fixed-n specs as they were
            for key in SEQUENTIAL_FIELDS:
                del out["protocol"][key]
        if self.model.checkpoint is None:  # keeps the run ids of trained-model specs as they were
            del out["model"]["checkpoint"], out["model"]["format"]
        if self.protocol.cudnn == "heuristic":  # the default keeps every earlier run's id
            del out["protocol"]["cudnn"]
        for option in FORWARD_OPTIONS:  # off (the default): every earlier run's id
            if not getattr(self.protocol, option):
                del out["protocol"][option]
        return out


@dataclass(frozen=True)
class CheckedBenchmark(Benchmark):
    """A benchmark whose every name and parameter :func:`validate` checked against the
    registry: what the CLI hands to the runner, which then does not check it again.
    Its fields, its :meth:`~Benchmark.to_dict` and so its run id are the spec's."""


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``raw`` with each ``KEY=VALUE`` set, e.g. ``certification.n=200``.

    KEY is a dotted path of tables; VALUE is read as a TOML value (``200``, ``0.5``,
    ``true``, ``[0.12, 0.25]``, ``"text"``), and as a plain string when it is not one.
    """
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"--set needs KEY=VALUE (e.g. certification.n=200), got {item!r}")
        try:
            value = tomllib.loads(f"value = {text.strip()}")["value"]
        except tomllib.TOMLDecodeError:
            value = text.strip()
        set_value(raw, key.strip(), value)
    return raw


def set_value(raw: dict[str, Any], key: str, value: Any) -> None:
    """Set the dotted ``key`` (e.g. ``certification.n``) of a raw spec to ``value``."""
    *tables, last = key.split(".")
    node = raw
    for name in tables:
        child = node.setdefault(name, {})
        if not isinstance(child, dict):
            raise SpecError(f"cannot set {key}: {name!r} is not a table")
        node = child
    node[last] = value


def load_benchmark(
    path: str | Path, overrides: list[str] | dict[str, Any] | None = None
) -> Benchmark:
    """Parse a benchmark TOML file (not yet checked against the loaded plugins).

    ``overrides`` are ``KEY=VALUE`` strings (:func:`apply_overrides`) or a mapping of
    dotted keys to values, applied before parsing.
    """
    path = Path(path)
    if not path.is_file():
        shipped = ", ".join(sorted(f.name for f in BENCHMARKS_DIR.glob("*.toml")))
        raise SpecError(
            f"benchmark file {str(path)!r} not found (paths are relative to the working "
            f"directory); the shipped ones are in {BENCHMARKS_DIR}: {shipped}"
        )
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path} is not valid TOML: {exc}") from None
    if isinstance(overrides, dict):
        for key, value in overrides.items():
            set_value(raw, key, value)
    else:
        apply_overrides(raw, overrides or [])
    return parse_benchmark(raw, default_name=path.stem)


def _table(raw: dict, key: str, where: str, allowed: set[str]) -> dict:
    value = raw.get(key)
    if not isinstance(value, dict):
        raise SpecError(
            f'{where}: missing table [{key}]; add it (docs/benchmarks.md, "Benchmark files", shows '
            "every table)"
        )
    unknown = set(value) - allowed
    if unknown:
        raise SpecError(
            f"{where}: unknown key(s) {sorted(unknown)} in [{key}]; allowed: {sorted(allowed)}"
        )
    return value


_TYPE_NAMES = {int: "an integer", str: "a string", dict: "a table", bool: "true or false"}


def _typed(value: Any, kind: type, what: str) -> Any:
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise SpecError(f"{what} must be {_TYPE_NAMES[kind]}, got {value!r}")
    return value


def parse_benchmark(raw: dict[str, Any], default_name: str = "benchmark") -> Benchmark:
    where = "benchmark"
    top = {"name", "seed", "device", "shard_size", "radii", "headline_radius", "dataset", "model",
           "certification", "methods"}  # fmt: skip
    unknown = set(raw) - top
    if unknown:
        raise SpecError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(top)}")
    data = _table(raw, "dataset", where, {"name", "test_every", "test_count"})
    model = _table(
        raw,
        "model",
        where,
        {"architecture", "trainer", "seed", "architecture_params", "trainer_params",
         "checkpoint", "format", "per_sigma", "training_sigma", "seeds"},
    )  # fmt: skip
    checkpoint = model.get("checkpoint")
    if checkpoint is not None and "architecture" not in model:
        fmt = model.get("format", "state_dict")
        if fmt == "state_dict":
            raise SpecError(
                '[model] checkpoint in format "state_dict" needs architecture = NAME (a state '
                "dict does not say which network it is; `idrs-bench plugins` lists them); "
                "format = \"cohen\" reads it from Cohen et al.'s and MACER's files, "
                'format = "torchscript" from a TorchScript file'
            )
    cert = raw.get("certification", {})
    allowed_cert = {"n0", "n", "alpha", "batch_size", "precision", "channels_last", "noise",
                    "cudnn", "sampling", "n_max", "rule", *FORWARD_OPTIONS}  # fmt: skip
    if set(cert) - allowed_cert:
        raise SpecError(
            f"{where}: unknown key(s) {sorted(set(cert) - allowed_cert)} in [certification]; "
            f"allowed: {sorted(allowed_cert)}"
        )
    methods = raw.get("methods")
    if not isinstance(methods, list) or not methods:
        raise SpecError(f"{where}: needs at least one [[methods]] entry with a name")
    method_configs = []
    for entry in methods:
        if not isinstance(entry, dict) or "name" not in entry:
            raise SpecError(f"{where}: every [[methods]] entry needs a name")
        if set(entry) - {"name", "settings"}:
            raise SpecError(
                f"method {entry['name']!r}: unknown key(s) {sorted(set(entry) - {'name', 'settings'})}"
            )
        settings = entry.get("settings", [{}])
        if not isinstance(settings, list) or not all(isinstance(s, dict) for s in settings):
            raise SpecError(f"method {entry['name']!r}: settings must be a list of tables")
        method_configs.append(MethodConfig(_typed(entry["name"], str, "method name"), settings))
    test_count = data.get("test_count")
    if isinstance(test_count, str) and test_count != "all":
        raise SpecError(f'dataset.test_count must be a number >= 1 or "all", got {test_count!r}')
    spec = Benchmark(
        name=_typed(raw.get("name", default_name), str, "name"),
        seed=_typed(raw.get("seed", 0), int, "seed"),
        device=_typed(raw.get("device", "auto"), str, "device"),
        shard_size=_typed(raw.get("shard_size", 32), int, "shard_size"),
        dataset=DataConfig(
            name=_typed(data.get("name"), str, "dataset.name"),
            test_every=_typed(data.get("test_every", 1), int, "dataset.test_every"),
            test_count=None
            if test_count in (None, "all")
            else _typed(test_count, int, "dataset.test_count"),
        ),
        model=ModelConfig(
            architecture=_typed(
                model.get("architecture", _default_architecture(checkpoint, model)),
                str,
                "model.architecture",
            ),
            trainer=_typed(
                model.get("trainer", "none" if checkpoint else None), str, "model.trainer"
            ),
            seed=_typed(model.get("seed", 0), int, "model.seed"),
            architecture_params=_typed(
                model.get("architecture_params", {}), dict, "model.architecture_params"
            ),
            trainer_params=_typed(model.get("trainer_params", {}), dict, "model.trainer_params"),
            checkpoint=None if checkpoint is None else _typed(checkpoint, str, "model.checkpoint"),
            format=_typed(model.get("format", "state_dict"), str, "model.format"),
        ),
        protocol=certification_protocol(cert, raw.get("radii", RADII)),
        methods=method_configs,
        radii=_radii(raw.get("radii", RADII)),
        headline_radius=raw.get("headline_radius"),
        model_axes=model_axes(model, method_configs),
    )
    if spec.headline_radius is not None and (
        not isinstance(spec.headline_radius, int | float) or spec.headline_radius < 0
    ):
        raise SpecError(f"headline_radius must be a number >= 0, got {spec.headline_radius!r}")
    for key, value in (("dataset.test_every", spec.dataset.test_every),
                       ("dataset.test_count", spec.dataset.test_count),
                       ("shard_size", spec.shard_size)):  # fmt: skip
        if value is not None and value < 1:
            hint = ' (or "all": every test_every-th point)' if key.endswith("count") else ""
            raise SpecError(f"{key} must be >= 1{hint}, got {value}")
    if not _DEVICE.fullmatch(spec.device):
        raise SpecError(f"device must be auto, cpu, cuda or cuda:N, got {spec.device!r}")
    if spec.model.format not in CHECKPOINT_FORMATS:
        raise SpecError(
            f"model.format {spec.model.format!r} is unknown; choose one of "
            f"{', '.join(CHECKPOINT_FORMATS)}"
        )
    if spec.model.checkpoint is None and "format" in model:
        raise SpecError("model.format needs model.checkpoint = PATH")
    return spec


def _default_architecture(checkpoint: Any, model: dict[str, Any]) -> str | None:
    """A checkpoint's architecture when the spec leaves it out: read from the file."""
    if checkpoint is None:
        return None
    return AUTO_ARCHITECTURE if model.get("format") == "cohen" else "torchscript"


def _radii(value: Any) -> tuple[float, ...]:
    if (
        not isinstance(value, list | tuple)
        or not value
        or not all(isinstance(r, int | float) and not isinstance(r, bool) and r >= 0 for r in value)
    ):
        raise SpecError(f"radii must be a non-empty list of numbers >= 0, got {value!r}")
    return tuple(sorted({float(r) for r in value}))


def certification_protocol(cert: dict[str, Any], radii: Any) -> CertificationProtocol:
    """The [certification] table; sequential sampling decides the benchmark's ``radii``
    (checked as given: a grid out of order is an error, not sorted silently), and its
    ``n_max`` must let an input certify at all (:func:`check_n_max`)."""
    sequential = cert.get("sampling") == "sequential"
    try:
        protocol = CertificationProtocol(**cert, **({"grid": radii} if sequential else {}))
    except TypeError as exc:
        raise SpecError(f"[certification]: {exc}") from None
    if sequential:
        from harness.mathematics.rules import check_n_max

        check_n_max(protocol)
    return protocol


def validate(spec: Benchmark, registry: Registry) -> CheckedBenchmark:
    """Check every name and parameter against the loaded plugins (before any work); the
    spec, marked checked."""
    registry.get("datasets", spec.dataset.name)
    checkpoint = spec.model.checkpoint
    from_file = checkpoint is not None and (
        spec.model.format == "torchscript" or spec.model.architecture == AUTO_ARCHITECTURE
    )
    if not from_file:
        model_spec = registry.get("models", spec.model.architecture)
        _check_keys(
            spec.model.architecture_params, model_spec.defaults, f"architecture {model_spec.name!r}"
        )
    if checkpoint is None:
        trainer = registry.get("trainers", spec.model.trainer)
        _check_keys(spec.model.trainer_params, trainer.defaults, f"trainer {trainer.name!r}")
    elif not Path(checkpoint).is_file():
        raise SpecError(f"model.checkpoint {checkpoint!r} not found (paths are relative to the "
                        "working directory)")  # fmt: skip
    for method in spec.methods:
        method_spec = registry.get("methods", method.name)
        registry.get("sigma_providers", method_spec.sigma_provider)
        registry.get("certifiers", method_spec.certifier)
        for setting in method.settings:
            _check_keys(setting, method_spec.defaults, f"method {method.name!r}")
            if method_spec.check is not None:
                try:
                    method_spec.check({**method_spec.defaults, **setting})
                except ParameterError as exc:
                    raise ParameterError(
                        f"method {method.name!r}, setting {setting_key(setting)}: {exc}"
                    ) from None
    return CheckedBenchmark(**{f.name: getattr(spec, f.name) for f in fields(spec)})


def check_data_root(data_root: str | None, dataset: str) -> None:
    """An explicit ``--data-root`` must be a folder (checked before anything is loaded)."""
    if data_root is not None and not Path(data_root).is_dir():
        raise DatasetMissingError(
            f"--data-root {data_root!r} is not a folder; it should hold the files of "
            f"dataset {dataset!r} (or leave --data-root out to use the default locations)"
        )


def _check_keys(given: dict[str, Any], known: dict[str, Any], owner: str) -> None:
    unknown = set(given) - set(known)
    if unknown:
        raise ParameterError(
            f"unknown parameter(s) {sorted(unknown)} for {owner}; known: {sorted(known) or 'none'}"
        )


def _sequence_fields(config: dict[str, Any]) -> dict[str, Any]:
    """A stored protocol, its grid a tuple again (JSON stores a list); a sequential run
    stored before the protocol recorded its rule used mixture-cs-v2."""
    protocol = dict(config["protocol"])
    if protocol.get("grid") is not None:
        protocol["grid"] = tuple(protocol["grid"])
    if protocol.get("sampling") == "sequential":
        protocol.setdefault("rule", LEGACY_SEQUENTIAL_RULE)
    return protocol


def benchmark_from_dict(config: dict[str, Any]) -> Benchmark:
    """Inverse of :meth:`Benchmark.to_dict` (a stored run's config)."""
    # a run stored before the protocol recorded its noise scheme (its precision) used
    # block-v1 (fp32)
    legacy = {"noise": LEGACY_NOISE, "precision": LEGACY_PRECISION}
    return Benchmark(
        name=config["name"],
        dataset=DataConfig(**config["dataset"]),
        model=ModelConfig(**config["model"]),
        protocol=CertificationProtocol(**{**legacy, **_sequence_fields(config)}),
        methods=[MethodConfig(**m) for m in config["methods"]],
        seed=config["seed"],
        device=config["device"],
        shard_size=config["shard_size"],
        radii=tuple(config.get("radii", RADII)),
        headline_radius=config.get("headline_radius"),
    )
