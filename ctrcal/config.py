"""Typed, strict YAML configuration.

A config file is YAML (read with ``yaml.safe_load`` only) whose top-level sections map onto
the dataclasses below. Loading is strict: an unknown key, a value of the wrong type, a missing
required key or an unknown registry name (a norm, an optimizer, ...) raises
:class:`~ctrcal.errors.ConfigError` naming the file, the dotted key, what was expected and the
closest valid key.

Two conveniences:

* ``extends: base.yaml`` (a path relative to the file, or a list of them) loads the base first
  and deep-merges this file over it: mappings merge key by key, anything else replaces.
* overrides ``section.key=value`` (from the command line) are applied last; the value is
  parsed as YAML, so ``train.lr=1e-4`` is a float and ``model.hidden_units=[64,64]`` a list.

Example::

    cfg = load_config("configs/demo.yaml", overrides=["train.epochs=2"])
    cfg.model.net_norm  # NormSpec(name='layernorm', kwargs={})
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from ctrcal.data.criteo_schema import LAYOUTS
from ctrcal.errors import ConfigError
from ctrcal.layers.spec import NormSpec
from ctrcal.utils import closest

# ---------------------------------------------------------------------------------------------
# Special value types

# ``data.layout``: a Criteo layout of :mod:`ctrcal.data.criteo_schema`, or ``auto`` (detected)
LayoutName = Literal[("auto", *LAYOUTS)]  # type: ignore[valid-type]


# ---------------------------------------------------------------------------------------------
# Sections


@dataclass
class SyntheticConfig:
    """The embedded default dataset: Criteo-format rows with a known click probability."""

    rows: int = 200_000
    seed: int = 0
    drift: float = 0.0  # >= 0: distributions and click model change with the row index


@dataclass
class DataConfig:
    """Where the raw data is and how it is split.

    ``inputs`` are raw Criteo files in any supported layout (split ``split`` ways with
    ``split_seed``); alternatively ``train``/``valid``/``test`` name one file list each.
    With neither, ``synthetic`` data is generated. ``split_order``: ``random`` (seeded hash of
    each row) or ``time`` (train on the first rows, valid/test on the last; whole files for
    Criteo 1TB ``day_N`` inputs), see :mod:`ctrcal.data.splits`.
    """

    inputs: list[str] = field(default_factory=list)
    train: list[str] = field(default_factory=list)
    valid: list[str] = field(default_factory=list)
    test: list[str] = field(default_factory=list)
    layout: LayoutName = "auto"
    split: list[float] = field(default_factory=lambda: [0.8, 0.1, 0.1])
    split_seed: int = 2024
    split_order: Literal["random", "time"] = "random"
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    on_bad_row: Literal["error", "skip"] = "error"
    prepared_dir: str | None = None


@dataclass
class FeaturesConfig:
    """The feature pipeline fitted on the train split."""

    min_count: int = 10
    numeric_transform: Literal["log_standardize", "standardize", "identity", "auto"] = "auto"
    numeric_buckets: int = 0


class ModelConfig:
    """``model:``: a model by ``name`` plus that model's own keyword arguments.

    ``name`` is a registered model (``masknet``, the default; ``dcnv2``; ``dnn``; or one added
    with :func:`ctrcal.register_model`) or an import path ``package.module:ClassName``; every
    other key is an argument of that model, bound against its constructor by ``validate``
    (see :mod:`ctrcal.models.registry`). Keys ending in ``_norm`` are norm specs. Arguments
    read as attributes (``cfg.model.net_norm``); after validation the model's defaults are
    filled in, so a snapshot lists every argument the run used.
    """

    def __init__(self, name: str = "masknet", **kwargs: Any) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "kwargs", {k: _model_arg(k, v) for k, v in kwargs.items()})
        object.__setattr__(self, "sources", {})

    name: str
    kwargs: dict[str, Any]
    sources: dict[str, str]  # key -> the file (or override) it came from, for messages

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__") or key in ("name", "kwargs", "sources"):
            raise AttributeError(key)
        if key in self.kwargs:
            return self.kwargs[key]
        defaults = _model_defaults(self.name)
        if key in defaults:
            value = defaults[key]
            return _build_norm(value, f"model.{key}", "<defaults>") if key.endswith(
                "_norm"
            ) else value
        raise AttributeError(
            f"model {self.name!r} has no argument {key!r} in this config "
            f"(set: {', '.join(self.kwargs) or 'none'})"
        )

    def __setattr__(self, key: str, value: Any) -> None:
        if key == "name":
            object.__setattr__(self, "name", value)
        else:
            self.kwargs[key] = _model_arg(key, value)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ModelConfig)
            and self.name == other.name
            and self.kwargs == other.kwargs
        )

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"ModelConfig(name={self.name!r}{', ' if args else ''}{args})"

    def __deepcopy__(self, memo: dict[int, Any]) -> ModelConfig:
        import copy

        out = ModelConfig(self.name)
        object.__setattr__(out, "kwargs", copy.deepcopy(self.kwargs, memo))
        object.__setattr__(out, "sources", dict(self.sources))
        return out

    def get(self, key: str, default: Any = None) -> Any:
        """An argument's value, or ``default`` when the config does not set it."""
        return self.kwargs.get(key, default)

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some arguments changed (norm values parsed as norm specs)."""
        import copy

        out = copy.deepcopy(self)
        for key, value in changes.items():
            setattr(out, key, value)
        return out

    def to_dict(self) -> dict[str, Any]:
        """``{name, <every argument>}``: the model's defaults included, so a snapshot and the
        signature of a run do not depend on whether the config was validated."""
        args = {**_model_defaults(self.name), **self.kwargs}
        return {"name": self.name, **{k: config_to_dict(_model_arg(k, v)) for k, v in args.items()}}

    def describe(self) -> str:
        """``name`` plus its structural choice where it has one (e.g. ``masknet/serial``)."""
        for key in ("variant", "structure"):
            if isinstance(self.kwargs.get(key), str):
                return f"{self.name}/{self.kwargs[key]}"
        return self.name


@dataclass
class TrainConfig:
    """The training loop (see :mod:`ctrcal.train.trainer`).

    ``emb_l2`` is an L2 penalty (emb_l2/2)*||W||^2 on the whole categorical embedding table
    (FuxiCTR's ``embedding_regularizer``). After each epoch the validation ``monitor``
    (``auc``, ``logloss`` or ``auc_logloss`` = AUC - logloss) decides: no improvement
    multiplies the LR by ``lr_factor`` (not below ``min_lr``), ``patience`` such epochs in a
    row stop training; the best epoch's weights are restored. ``precision: auto`` is bf16
    autocast on CUDA and fp32 elsewhere. ``finetune_from`` names a finished run directory
    whose best weights start this run, with its norms replaced by this config's.
    ``cpu_matmul`` picks the library of CPU float32 matrix products (``auto``: oneDNN where it
    keeps float32 accuracy, see :mod:`ctrcal.train.cpu_matmul`; ``default``: PyTorch's BLAS).
    """

    seed: int = 0
    epochs: int = 10
    batch_size: int = 4096
    eval_batch_size: int = 16384
    optimizer: Literal["adam", "adamw"] = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    emb_l2: float = 0.0
    grad_clip: float = 10.0
    patience: int = 2
    lr_factor: float = 0.1
    min_lr: float = 1e-6
    monitor: Literal["auc", "logloss", "auc_logloss"] = "auc_logloss"
    device: str = "auto"
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    compile: bool = False
    data_mode: Literal["memory", "device", "stream", "auto"] = "auto"
    num_threads: int = 0
    cpu_matmul: Literal["auto", "default", "onednn"] = "auto"
    finetune_from: str | None = None
    progress: bool = True


@dataclass
class VariantConfig:
    """One arm of a shift report: a norm at the MaskBlock position and how to predict.

    ``from_variant`` reuses that variant's trained runs (its norms) and changes only the
    prediction: ``mc_samples`` > 0 averages that many MC-sampling passes (MC integration),
    ``temperature_scaling`` / ``platt_scaling`` fit a post-hoc calibration on clean validation
    predictions. ``mc_dropout`` keeps the model's dropout layers on during the
    ``mc_samples`` passes (MC-Dropout). ``ensemble: M`` (M >= 2) averages the probabilities of
    M runs trained with different seeds (a deep ensemble; replicate k uses the run of seed k
    plus M - 1 runs of seeds no other replicate uses). ``isotonic_calibration`` fits isotonic
    regression, ``field_calibration: C14`` a calibrator per value of that categorical field
    (``field_calibration_method`` platt or isotonic, shrunk toward the global one by
    n_v / (n_v + ``field_calibration_shrinkage``); see :mod:`ctrcal.calibration.field_aware`).
    ``calibration`` names any registered calibrator by one spec (``isotonic``,
    ``{name: field_aware, field: C14, method: platt}``); the four keys before it are read as
    such a spec (:func:`ctrcal.eval.calibration_keys.calibration_spec`).
    """

    name: str
    net_norm: NormSpec = field(default_factory=lambda: NormSpec("layernorm"))
    emb_norm: NormSpec | None = None
    mc_samples: int = 0
    mc_dropout: bool = False
    ensemble: int = 0
    temperature_scaling: bool = False
    platt_scaling: bool = False
    isotonic_calibration: bool = False
    field_calibration: str | None = None
    field_calibration_method: Literal["platt", "isotonic"] = "platt"
    field_calibration_shrinkage: float = 1000.0
    calibration: str | dict[str, Any] | None = None
    from_variant: str | None = None


@dataclass
class ShiftConfig:
    """One shift of a report by registry name (see :mod:`ctrcal.eval.shifts`).

    ``intensities`` is the shift's own grid (default: the shift's default grid; for
    ``gaussian_numeric`` ``report.intensities``); ``space`` (``gaussian_numeric`` only) is
    ``original`` (default: noise in units of the std of the values as they stand in the
    input file) or ``model`` (noise on the model-input values); ``label`` names the shift in
    tables when one kind appears twice.
    """

    name: str
    intensities: list[float] | None = None
    space: str | None = None
    label: str | None = None


@dataclass
class ReportConfig:
    """The shift-robustness protocol: variants x training seeds x noise seeds x intensities."""

    variants: list[VariantConfig] = field(
        default_factory=lambda: [
            VariantConfig("layernorm", NormSpec("layernorm")),
            VariantConfig("mclayernorm", NormSpec("mclayernorm", {"fraction": 0.8})),
            VariantConfig(
                "mclayernorm_mc",
                NormSpec("mclayernorm", {"fraction": 0.8}),
                mc_samples=10,
                from_variant="mclayernorm",
            ),
        ]
    )
    seeds: int = 3
    noise_seeds: int = 1
    intensities: list[float] = field(default_factory=lambda: [0.0, 0.0625, 0.125, 0.25, 0.5])
    # the shifts evaluated, each with its own intensity grid; empty = one gaussian_numeric
    # shift over `intensities`
    shifts: list[ShiftConfig] = field(default_factory=list)
    mix_fraction: float = 1.0
    split: Literal["valid", "test"] = "test"
    ece_bins: int = 15
    # the variant every other one is compared with (paired by training seed); None = the first
    baseline: str | None = None
    # family-wise error rate of the primary comparisons (every variant vs the baseline on AUC
    # and ECE at every intensity of every shift, Holm-adjusted together)
    alpha: float = 0.05
    # power at which the report states the smallest difference the design could detect
    power: float = 0.8
    figures: bool = True
    # Field-RCE/ECE of every field (categoricals and numerics in `field_numeric_buckets`
    # equal-mass buckets; 0 = categoricals only) and the multicalibration error per evaluation;
    # field values with fewer than `field_min_count` rows are pooled
    field_metrics: bool = True
    field_min_count: int = 100
    field_numeric_buckets: int = 10
    # parallel sweeps (ctrcal.eval.sweep): training runs at once, each in its own process;
    # 0 = one per device in `devices` (1 without them)
    workers: int = 0
    # where the workers train: [cuda:0, cuda:1], "cuda:0,cuda:1", or "auto" (every visible
    # GPU, else the CPU); empty = train.device (every visible GPU if that is auto, workers > 1)
    devices: list[str] | str = field(default_factory=list)


@dataclass
class Config:
    """A whole run: data, features, model, training, report, and where outputs go."""

    data: DataConfig = field(default_factory=DataConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    out_dir: str = "outputs/run"


# ---------------------------------------------------------------------------------------------
# Loading


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping with ``extends:`` resolved (no validation)."""
    return _load_with_extends(Path(path), ())


def _load_with_extends(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    path = path.resolve()
    if path in chain:
        loop = " -> ".join(str(p) for p in (*chain, path))
        raise ConfigError(f"{path}: 'extends' forms a cycle: {loop}")
    try:
        text = path.read_text()
    except OSError as exc:
        where = f"{chain[-1]}: extends" if chain else "config"
        raise ConfigError(f"{where}: cannot read {path}: {exc.strerror or exc}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}:{line}: invalid YAML: {problem}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    bases = raw.pop("extends", None)
    if bases is None:
        return _tag(raw, path)
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise ConfigError(f"{path}: 'extends' must be a path or a list of paths")
    merged: dict[str, Any] = {}
    for base in bases:
        merged = _deep_merge(merged, _load_with_extends(path.parent / base, (*chain, path)))
    return _deep_merge(merged, _tag(raw, path))


# Each mapping remembers which file its keys came from, so errors name the right file even
# through `extends`. The tag is a key no user can write in YAML by accident.
_SOURCE = "\0source"


def _tag(obj: Any, path: Path) -> Any:
    if isinstance(obj, dict):
        out = {k: _tag(v, path) for k, v in obj.items()}
        out[_SOURCE] = {k: str(path) for k in obj}
        return out
    if isinstance(obj, list):
        return [_tag(v, path) for v in obj]
    return obj


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if key == _SOURCE:
            out[_SOURCE] = {**base.get(_SOURCE, {}), **value}
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (value parsed as YAML) to a raw config mapping."""
    raw = dict(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected section.key=value")
        dotted, _, text = item.partition("=")
        keys = dotted.strip().split(".")
        if not all(keys):
            raise ConfigError(f"override {item!r}: empty key in {dotted!r}")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            raise ConfigError(f"override {item!r}: value is not valid YAML") from None
        node = raw
        for key in keys[:-1]:
            child = node.get(key)
            child = dict(child) if isinstance(child, dict) else {}
            node[key] = child
            node = child
        node[keys[-1]] = value
        node[_SOURCE] = {**node.get(_SOURCE, {}), keys[-1]: f"override {item!r}"}
    return raw


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    *,
    check_names: bool = True,
    skip_checks: Sequence[str] = (),
) -> Config:
    """Load, merge, override and validate a config file into a :class:`Config`.

    Args:
        path: YAML file; ``None`` starts from the defaults.
        overrides: ``section.key=value`` strings applied after the file.
        check_names: also run every data-free check (:mod:`ctrcal.validation`): registry
            names and arguments, value domains, the report plan.
        skip_checks: names of checks not to run (a run's snapshot skips ``report``).

    Raises:
        ConfigError: naming the file, the dotted key, what was expected and the closest key.
    """
    raw = load_yaml(path) if path is not None else {}
    raw = apply_overrides(raw, overrides or [])
    source = str(path) if path is not None else "<defaults>"
    cfg = _build(Config, raw, "", source)
    cfg._key_sources = _key_sources(raw)  # type: ignore[attr-defined]
    if check_names:
        validate_names(cfg, source, skip_checks)
    return cfg


def _key_sources(raw: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Dotted key -> the file (or override) that set it, from the tags of :func:`_tag`."""
    out: dict[str, str] = {}
    for key, where in raw.get(_SOURCE, {}).items():
        out[prefix + key] = where
    for key, value in raw.items():
        if key == _SOURCE:
            continue
        if isinstance(value, dict):
            out.update(_key_sources(value, f"{prefix}{key}."))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    out.update(_key_sources(item, f"{prefix}{key}[{i}]."))
    return out


def config_from_dict(
    data: dict[str, Any], source: str = "<dict>", skip_checks: Sequence[str] = ()
) -> Config:
    """Validate a plain mapping (e.g. a saved snapshot) into a :class:`Config`."""
    cfg = _build(Config, data, "", source)
    validate_names(cfg, source, skip_checks)
    return cfg


def validate_names(cfg: Config, source: str, skip: Sequence[str] = ()) -> None:
    """Run every data-free check (:mod:`ctrcal.validation`) but those named in ``skip``; one
    error lists all problems."""
    from ctrcal.validation import validate_config

    validate_config(cfg, source, skip)


def check_model_config(model: ModelConfig, source: str) -> ModelConfig:
    """Resolve ``model.name``, bind its arguments, fill in the model's defaults.

    Raises:
        ConfigError: an unknown model (closest name), an import path that does not resolve,
            a class that is not an ``nn.Module``, an unknown / mistyped / missing argument --
            each naming the file and the key.
    """
    from ctrcal.models.registry import check_model_kwargs, model_defaults

    def where(key: str) -> str:
        return f"{source}: model.{key}"  # ctrcal.validation names the file that set the key

    try:
        defaults = model_defaults(model.name)
    except ConfigError as exc:
        raise ConfigError(f"{where('name')}: {exc}") from None
    check_model_kwargs(model.name, model.kwargs, where)
    merged = {
        k: _build_norm(v, f"model.{k}", source) if k.endswith("_norm") else v
        for k, v in {**defaults, **model.kwargs}.items()
    }
    out = ModelConfig(model.name)
    object.__setattr__(out, "kwargs", merged)
    object.__setattr__(out, "sources", dict(model.sources))
    return out


def config_to_dict(cfg: Any) -> Any:
    """A plain, YAML-safe mapping of a config (inverse of :func:`config_from_dict`)."""
    if isinstance(cfg, NormSpec):
        return cfg.to_yaml()
    if isinstance(cfg, ModelConfig):
        return cfg.to_dict()
    if dataclasses.is_dataclass(cfg):
        return {f.name: config_to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, list):
        return [config_to_dict(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: config_to_dict(v) for k, v in cfg.items()}
    return cfg


def dump_config(cfg: Config) -> str:
    """The config as YAML text (a snapshot that :func:`load_config` reads back)."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


# ---------------------------------------------------------------------------------------------
# Typed construction


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is NormSpec:
        return "a norm name or {name: ..., <kwargs>}"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if origin is list:
        (item,) = typing.get_args(tp)
        return f"a list of {_describe(item)}"
    if origin is dict:
        return "a mapping"
    if tp is type(None):
        return "null"
    return {int: "an integer", float: "a number", bool: "true/false", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _fail(source: str, key: str, message: str) -> ConfigError:
    return ConfigError(f"{source}: {key or '<top level>'}: {message}")


def _build(tp: Any, value: Any, key: str, source: str) -> Any:
    origin = typing.get_origin(tp)

    if tp is Any:
        return _strip(value)
    if tp is NormSpec:
        return _build_norm(value, key, source)
    if tp is ModelConfig:
        return _build_model(value, key, source)
    if dataclasses.is_dataclass(tp):
        return _build_dataclass(tp, value, key, source)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _build(arg, value, key, source)
            except ConfigError as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        raise _fail(source, key, f"expected {_describe(tp)}, got {value!r}")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value in choices:
            return value
        hint = closest(str(value), [str(c) for c in choices])
        did = f"; did you mean {hint!r}?" if hint else ""
        raise _fail(
            source, key, f"got {value!r}, expected one of {', '.join(map(repr, choices))}{did}"
        )
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise _fail(source, key, f"expected {_describe(tp)}, got {type(value).__name__}")
        return [_build(item, v, f"{key}[{i}]", source) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise _fail(source, key, f"expected a mapping, got {type(value).__name__}")
        return _strip(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    else:  # pragma: no cover - a field type this module does not know is a programming error
        raise TypeError(f"unsupported config type {tp!r} at {key}")
    raise _fail(source, key, f"expected {_describe(tp)}, got {value!r} ({type(value).__name__})")


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != _SOURCE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _model_arg(key: str, value: Any) -> Any:
    """A model argument set from Python: norm positions parsed as norm specs, except a class
    or factory (``nn.LayerNorm``, a partial), which a norm position takes as it is."""
    if key.endswith("_norm") and not (callable(value) and not isinstance(value, NormSpec)):
        return _build_norm(value, f"model.{key}", "<python>")
    return value


def _model_defaults(name: str) -> dict[str, Any]:
    try:
        from ctrcal.models.registry import model_defaults

        return model_defaults(name)
    except (ImportError, ConfigError):
        return {}


def _build_model(value: Any, key: str, source: str) -> ModelConfig:
    if isinstance(value, ModelConfig):
        return value
    if value is None:
        value = {}
    if isinstance(value, str):  # `model: dcnv2` = that model with its defaults
        value = {"name": value}
    if not isinstance(value, dict):
        raise _fail(source, key, f"expected a mapping with 'name', got {value!r}")
    sources = value.get(_SOURCE, {})
    name = value.get("name", "masknet")
    if not isinstance(name, str) or not name.strip():
        raise _fail(sources.get("name", source), f"{key}.name",
                    f"expected a model name or 'package.module:Class', got {name!r}")  # fmt: skip
    kwargs: dict[str, Any] = {}
    for k, v in value.items():
        if k in (_SOURCE, "name"):
            continue
        if not isinstance(k, str) or not k.isidentifier():
            raise _fail(sources.get(k, source), f"{key}.{k}", "not a valid argument name")
        src = sources.get(k, source)
        kwargs[k] = _build_norm(v, f"{key}.{k}", src) if k.endswith("_norm") else _strip(v)
    out = ModelConfig(name)
    object.__setattr__(out, "kwargs", kwargs)
    object.__setattr__(out, "sources", {k: sources.get(k, source) for k in [*kwargs, "name"]})
    return out


def check_value(tp: Any, value: Any, where: str) -> None:
    """Check ``value`` against a model argument's annotation (types configs can express).

    ``Sequence[X]`` is read as a list of X; annotations this cannot express are not checked.

    Raises:
        ConfigError: ``where: expected ..., got ...``.
    """
    tp = _config_type(tp)
    if tp is None:
        return
    source, _, key = where.rpartition(": ")
    _build(tp, value, key, source or "config")


def _config_type(tp: Any) -> Any:
    import collections.abc

    origin = typing.get_origin(tp)
    if tp in (int, float, bool, str, type(None)) or tp is Any:
        return tp
    if origin is Literal:
        return tp
    if origin in (list, collections.abc.Sequence, tuple) and typing.get_args(tp):
        item = _config_type(typing.get_args(tp)[0])
        return list[item] if item is not None else None  # type: ignore[valid-type]
    if origin in (Union, types.UnionType):
        args = [_config_type(a) for a in typing.get_args(tp)]
        if any(a is None for a in args):
            return None
        return Union[tuple(args)]  # noqa: UP007 - built at run time
    return None


def _build_norm(value: Any, key: str, source: str) -> NormSpec:
    if isinstance(value, NormSpec):
        return value
    if value is None or value is False:
        return NormSpec("none")
    if isinstance(value, str):
        return NormSpec(value)
    if isinstance(value, dict):
        value = _strip(value)
        if "name" not in value or not isinstance(value["name"], str):
            raise _fail(source, key, "a norm mapping needs 'name: <norm>'")
        kwargs = {k: v for k, v in value.items() if k != "name"}
        return NormSpec(value["name"], kwargs)
    raise _fail(source, key, f"expected {_describe(NormSpec)}, got {value!r}")


def _build_dataclass(tp: Any, value: Any, key: str, source: str) -> Any:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise _fail(source, key, f"expected a mapping, got {type(value).__name__} {value!r}")
    sources = value.get(_SOURCE, {})
    hints = typing.get_type_hints(tp)
    fields = {f.name: f for f in dataclasses.fields(tp)}
    kwargs = {}
    for name, item in value.items():
        if name == _SOURCE:
            continue
        src = sources.get(name, source)
        sub = f"{key}.{name}" if key else str(name)
        if name not in fields:
            hint = closest(str(name), fields)
            did = f"; did you mean {hint!r}?" if hint else ""
            raise _fail(
                src, sub, f"unknown key{did} (valid keys: {', '.join(sorted(fields))})"
            )
        kwargs[name] = _build(hints[name], item, sub, src)
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and name not in kwargs:
            sub = f"{key}.{name}" if key else name
            raise _fail(source, sub, f"missing required key ({_describe(hints[name])})")
    return tp(**kwargs)
