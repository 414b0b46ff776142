"""The shape of a run's configuration: typed sections, plain data.

A config file is YAML whose top-level sections map onto the dataclasses below; this module
only defines them (it reads no file and calls no check). :func:`ctrcal.config.load.read_config`
reads a file into them strictly (torch-free): an unknown key, a value of the wrong type or a
missing required key raises :class:`~ctrcal.core.errors.ConfigError` naming the file, the dotted
key, what was expected and the closest valid key. :func:`ctrcal.load_config` (the rule book,
:mod:`ctrcal.validate`) also checks registry names (a norm, a model, ...) and values, and
builds the model on the ``meta`` device, so its constructor alone decides its arguments.

How files combine (:mod:`ctrcal.config.yaml_files`):

* ``extends: base.yaml`` (a path relative to the file, or a list of them) loads the base first
  and deep-merges this file over it: mappings merge key by key, anything else replaces.
* **Another model starts from its own defaults.** ``model: {name: dcnv2}`` over a base whose
  model is MaskNet (a ``model`` section without ``name`` is MaskNet) drops the base's MaskNet
  arguments; so does the override ``model.name=dcnv2``. The same holds for any mapping with a
  ``name`` (a norm spec ``{name: ..., <kwargs>}``).
* **Removing an inherited key:** ``key: !delete`` in a file, ``~section.key`` (or
  ``section.key=!delete``) on the command line. The key goes back to its default. ``null`` is
  a value, not a removal (``emb_norm: null`` is "no norm"). Removing a key that no base sets is
  an error.
* overrides ``section.key=value`` (from the command line) are applied last; the value is
  parsed as YAML, so ``train.lr=1e-4`` is a float and ``model.hidden_units=[64,64]`` a list.

Example::

    cfg = ctrcal.load_config("configs/demo.yaml", overrides=["train.epochs=2"])
    cfg.model.net_norm  # NormSpec(name='layernorm', kwargs={})

``base.yaml`` with a serial MaskNet, and a file that trains DCNv2 on the same data::

    extends: base.yaml
    model: {name: dcnv2, structure: stacked}   # MaskNet's hidden_units etc. are not inherited
    train:
      finetune_from: !delete                   # back to the default (None)

(In flow style a space must follow the tag: ``{finetune_from: !delete }``.)
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from ctrcal.core.constraints import Constraint, Interval, Matches, NotBlank
from ctrcal.core.criteo_schema import LAYOUTS
from ctrcal.core.norm_spec import NormSpec, parse_norm_spec

__all__ = [
    "DEFAULT_MODEL",
    "Config",
    "DataConfig",
    "FeaturesConfig",
    "ModelConfig",
    "ReportConfig",
    "ShiftConfig",
    "SyntheticConfig",
    "TrainConfig",
    "TrainShiftConfig",
    "VariantConfig",
    "config_to_dict",
    "dump_config",
]

# the model of a `model:` section without `name`
DEFAULT_MODEL = "masknet"

# ---------------------------------------------------------------------------------------------
# Special value types

# ``data.layout``: a Criteo layout of :mod:`ctrcal.core.criteo_schema`, or ``auto`` (detected)
LayoutName = Literal[("auto", *LAYOUTS)]  # type: ignore[valid-type]


# ---------------------------------------------------------------------------------------------
# Sections


@dataclass
class SyntheticConfig:
    """The embedded default dataset: Criteo-format rows with a known click probability."""

    rows: int = 200_000
    seed: int = 0
    drift: float = 0.0  # >= 0: distributions and click model change with the row index

    _parameter_constraints: ClassVar[dict[str, Constraint]] = {
        "drift": Interval(float, low=0.0),
        "rows": Interval(int, low=1),
    }


@dataclass
class DataConfig:
    """Where the raw data is and how it is split.

    ``inputs`` are raw Criteo files in any supported layout (split ``split`` ways with
    ``split_seed``: fractions that sum to 1, or whole-number proportions such as
    ``[22, 1, 1]`` days); alternatively ``train``/``valid``/``test`` name one file list each.
    With neither, ``synthetic`` data is generated. ``split_order``: ``random`` (seeded hash of
    each row) or ``time`` (train on the first rows, valid/test on the last; whole files for
    Criteo 1TB ``day_N`` inputs), see :mod:`ctrcal.preparation.splits`.

    ``parquet_compression`` is the codec of the prepared parts. They are a cache that training
    reads (every epoch, when it streams them), so the default stores them uncompressed: the
    fastest to write and to read. ``lz4``, ``snappy`` or ``zstd`` trade CPU for disk (lz4:
    about 0.7x the bytes on generated Criteo rows, most of the saving in the numeric columns;
    the categorical ids are dictionary-encoded either way).

    ``engine`` runs the preparation: ``local`` (this process's threads) or ``ray`` (a Ray task
    per input file; ``pip install 'ctrcal[ray]'``), on the Ray cluster at ``ray_address``
    (``HOST:PORT``, ``ray://HOST:PORT`` or ``auto``; None starts Ray on this machine). Both
    engines write the same prepared directory, byte for byte.
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
    parquet_compression: Literal["uncompressed", "lz4", "snappy", "zstd"] = "uncompressed"
    engine: Literal["local", "ray"] = "local"
    ray_address: str | None = None
    prepared_dir: str | None = None
    # a DatasetSchema: a built-in name (criteo, avazu), a YAML file or the schema inline
    # (ctrcal.data.schema); None reads Criteo files, their layout detected
    schema: str | dict[str, Any] | None = None


@dataclass
class FeaturesConfig:
    """The feature pipeline fitted on the train split.

    ``max_vocab`` (0 = no cap) caps each categorical field's kept values; a field with more
    hashes all but its most frequent ``max_vocab`` values into ``hash_buckets`` ids (see
    :mod:`ctrcal.preparation.features`), so that its embedding table fits a device.
    """

    min_count: int = 10
    numeric_transform: Literal["log_standardize", "standardize", "identity", "auto"] = "auto"
    numeric_buckets: int = 0
    max_vocab: int = 0
    hash_buckets: int = 1000


class ModelConfig:
    """``model:``: a model by ``name`` plus that model's own keyword arguments.

    ``name`` is a registered model (``masknet``, the default; ``dcnv2``; ``dnn``; or one added
    with :func:`ctrcal.register_model`) or an import path ``package.module:ClassName``; every
    other key is an argument of that model, bound against its constructor when the config is
    validated (see :mod:`ctrcal.models.registry`). Keys ending in ``_norm`` are norm specs.
    Arguments read as attributes (``cfg.model.net_norm``). Validation fills in the model's
    defaults, so a loaded config (and a run's snapshot) lists every argument the run used;
    before that, only the arguments set are known.
    """

    def __init__(self, name: str = DEFAULT_MODEL, **kwargs: Any) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "kwargs", {k: _model_arg(k, v) for k, v in kwargs.items()})

    name: str
    kwargs: dict[str, Any]

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__") or key in ("name", "kwargs"):
            raise AttributeError(key)
        if key in self.kwargs:
            return self.kwargs[key]
        raise AttributeError(
            f"model {self.name!r} has no argument {key!r} in this config "
            f"(set: {', '.join(self.kwargs) or 'none'}; a validated config, e.g. from "
            "ctrcal.load_config, lists the model's defaults too)"
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
        out = ModelConfig(self.name)
        object.__setattr__(out, "kwargs", copy.deepcopy(self.kwargs, memo))
        return out

    def get(self, key: str, default: Any = None) -> Any:
        """An argument's value, or ``default`` when the config does not set it."""
        return self.kwargs.get(key, default)

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some arguments changed (norm values parsed as norm specs)."""
        out = copy.deepcopy(self)
        for key, value in changes.items():
            setattr(out, key, value)
        return out

    def with_arguments(self, kwargs: dict[str, Any]) -> ModelConfig:
        """The same model with exactly these arguments (taken as they are)."""
        out = ModelConfig(self.name)
        object.__setattr__(out, "kwargs", dict(kwargs))
        return out

    def to_dict(self) -> dict[str, Any]:
        """``{name, <every argument>}`` (after validation: the model's defaults included)."""
        return {"name": self.name, **{k: config_to_dict(v) for k, v in self.kwargs.items()}}

    def describe(self) -> str:
        """``name`` plus its structural choice where it has one (e.g. ``masknet/serial``)."""
        for key in ("variant", "structure"):
            if isinstance(self.kwargs.get(key), str):
                return f"{self.name}/{self.kwargs[key]}"
        return self.name


def _model_arg(key: str, value: Any) -> Any:
    """A model argument set from Python: norm positions parsed as norm specs, except a class
    or factory (``nn.LayerNorm``, a partial), which a norm position takes as it is."""
    if key.endswith("_norm") and not (callable(value) and not isinstance(value, NormSpec)):
        return parse_norm_spec(value)
    return value


@dataclass
class TrainShiftConfig:
    """A registered shift applied to every training batch (``train.train_shift``).

    ``name`` is a shift of :mod:`ctrcal.shifts` that perturbs a batch
    (``gaussian_numeric``, ``categorical_corruption``), ``intensity`` its level (std units or
    a probability), ``space`` the ``gaussian_numeric`` space (``original``, the default, or
    ``model``). Fresh noise on every batch, validation and test batches untouched; see
    :mod:`ctrcal.train.noise`.
    """

    name: str
    intensity: float
    space: str | None = None


@dataclass
class TrainConfig:
    """The training loop (see :mod:`ctrcal.train.trainer`).

    ``emb_l2`` is an L2 penalty (emb_l2/2)*||W||^2 on the whole categorical embedding table
    (FuxiCTR's ``embedding_regularizer``). After each epoch the validation ``monitor``
    (``auc``, ``logloss`` or ``auc_logloss`` = AUC - logloss) decides: no improvement
    multiplies the LR by ``lr_factor`` (not below ``min_lr``), ``patience`` such epochs in a
    row stop training; the best epoch's weights are restored. ``lr_schedule`` (``constant``,
    ``linear``, ``cosine``) also decays the LR every step, to 0 at the last planned step
    (:data:`ctrcal.train.step.LR_SCHEDULES`); the plateau rule lowers what it decays.
    ``precision: auto`` is bf16
    autocast on CUDA, on a CPU bf16 where a start-up probe finds it faster and accurate
    (:mod:`ctrcal.train.precision`), fp32 elsewhere; scoring uses the training precision.
    ``finetune_from`` names a finished run directory whose best weights start this run, with
    its norms replaced by this config's.
    ``cpu_matmul`` picks the library of CPU float32 matrix products (``auto``: oneDNN where it
    keeps float32 accuracy, see :mod:`ctrcal.train.cpu_matmul`; ``default``: PyTorch's BLAS).
    Noise injection as a regulariser (:mod:`ctrcal.train.noise`): ``train_shift`` applies a
    registered shift to every training batch; ``weight_noise`` = η adds N(0, η) (variance η,
    std √η) to the dense weights for each step's forward and backward pass, restored before
    the optimizer step. ``max_embedding_gib`` caps the embedding tables' size (GiB of float32
    weights, see :mod:`ctrcal.data.table_size`; None: a quarter of the machine's memory): a
    larger table is refused before anything is allocated. Run tracking
    (:mod:`ctrcal.train.loggers`): ``loggers`` names ``tensorboard`` and/or ``mlflow``; step
    metrics every ``log_every`` steps; MLflow logs to ``tracking_uri`` (else
    ``MLFLOW_TRACKING_URI``, else ``RUN/mlruns``) in ``experiment``.
    """

    seed: int = 0
    epochs: int = 10
    batch_size: int = 4096
    eval_batch_size: int = 16384
    optimizer: Literal["adam", "adamw"] = "adam"
    lr: float = 1e-3
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
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
    train_shift: TrainShiftConfig | None = None
    weight_noise: float = 0.0
    max_embedding_gib: float | None = None
    loggers: list[Literal["tensorboard", "mlflow"]] = field(default_factory=list)
    log_every: int = 50
    tracking_uri: str | None = None
    experiment: str = "ctrcal"

    # the value bounds of this section (train_shift and weight_noise are
    # ctrcal.train.noise_options' rules, which a report variant shares)
    _parameter_constraints: ClassVar[dict[str, Constraint]] = {
        "seed": Interval(int, low=0),
        "epochs": Interval(int, low=1),
        "batch_size": Interval(int, low=1),
        "eval_batch_size": Interval(int, low=1),
        "patience": Interval(int, low=1),
        "num_threads": Interval(int, low=0),
        "lr": Interval(float, low=0.0, low_open=True),
        "min_lr": Interval(float, low=0.0),
        "lr_factor": Interval(float, low=0.0, high=1.0, low_open=True),
        "weight_decay": Interval(float, low=0.0),
        "emb_l2": Interval(float, low=0.0),
        "grad_clip": Interval(float, low=0.0),
        "max_embedding_gib": Interval(float, low=0.0, low_open=True, optional=True),
        # what torch.device accepts: a type and an optional index
        "device": Matches(
            r"(auto|cpu|cuda|mps|xpu|meta|hpu|npu|privateuseone)(:\d+)?",
            "auto, cpu, cuda or cuda:N",
        ),
        "finetune_from": NotBlank("a run directory"),
        "log_every": Interval(int, low=1),
    }


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
    such a spec (:func:`ctrcal.reports.shift.calibration_keys.calibration_spec`).
    ``train_shift`` and
    ``weight_noise`` train the variant with noise injection (they replace the ``train``
    section's keys of the same name for this variant's runs; see :class:`TrainConfig`).
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
    train_shift: TrainShiftConfig | None = None
    weight_noise: float | None = None


@dataclass
class ShiftConfig:
    """One shift of a report by registry name (see :mod:`ctrcal.shifts`).

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
    # score the drift monitor and the label-free estimators at every point against the clean
    # validation split (ctrcal.reports.shift.monitoring); off where a protocol asks only
    # which method is better
    monitor: bool = True
    # parallel sweeps (ctrcal.sweep.sweep): training runs at once, each in its own process;
    # 0 = one per device in `devices` (1 without them)
    workers: int = 0
    # where the workers train: [cuda:0, cuda:1], "cuda:0,cuda:1", or "auto" (every visible
    # GPU, else the CPU); empty = train.device (every visible GPU if that is auto, workers > 1)
    devices: list[str] | str = field(default_factory=list)
    # row-level analyses (ctrcal.reports.shift.row_level): the test period of a time-ordered split
    # (data.split_order: time) in this many consecutive windows, stale vs fresh calibrators
    # (0 = off); row-bootstrap replicates of the clean ECE/PCOC/AUC intervals (0 = off)
    windows: int = 0
    bootstrap: int = 0

    # the value bounds of this section; the rules between keys (variants, shifts, windows
    # need a time split) are the report plan's (ctrcal.reports.shift.plan)
    _parameter_constraints: ClassVar[dict[str, Constraint]] = {
        "seeds": Interval(int, low=1),
        "noise_seeds": Interval(int, low=1),
        "mix_fraction": Interval(float, low=0.0, high=1.0, low_open=True),
        "alpha": Interval(float, low=0.0, high=1.0, low_open=True, high_open=True),
        "power": Interval(float, low=0.0, high=1.0, low_open=True, high_open=True),
        "ece_bins": Interval(int, low=1),
        "field_min_count": Interval(int, low=1),
        "field_numeric_buckets": Interval(int, low=2, off=0, off_means="categoricals only"),
        "workers": Interval(int, low=0),  # 0 = one per device
        "windows": Interval(int, low=2, off=0),
        "bootstrap": Interval(int, low=2, off=0),
    }


@dataclass
class Config:
    """A whole run: data, features, model, training, report, and where outputs go."""

    data: DataConfig = field(default_factory=DataConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    out_dir: str = "outputs/run"

    # -- provenance: where each key came from, for messages (not part of the config's values)

    def set_provenance(self, origin: str, key_sources: dict[str, str] | None = None) -> Config:
        """Record where this config came from: ``origin`` (its file, ``<defaults>``) and
        ``key_sources`` (dotted key -> the file or command-line override that set it, through
        ``extends``). Returns ``self``."""
        self.__dict__["_origin"] = origin
        self.__dict__["_key_sources"] = dict(key_sources or {})
        return self

    def source_of(self, key: str = "") -> str:
        """The file (or override) that set ``key`` (``report.variants[1].mc_samples``) or the
        nearest section above it, else the config's own origin (``config`` when built in
        Python)."""
        sources: dict[str, str] = self.__dict__.get("_key_sources", {})
        parts = key.replace("[", ".[").split(".") if key else []
        for n in range(len(parts), 0, -1):
            found = sources.get(".".join(parts[:n]).replace(".[", "["))
            if found:
                return found
        return self.__dict__.get("_origin", "config")

    def sections_set(self) -> set[str]:
        """The top-level keys (``data``, ``model``, ...) that its files or overrides set;
        the others are defaults."""
        sources: dict[str, str] = self.__dict__.get("_key_sources", {})
        return {key.split(".")[0].split("[")[0] for key in sources}

    def sources(self) -> set[str]:
        """Every file or override this config names as a key's origin."""
        return {self.source_of(), *self.__dict__.get("_key_sources", {}).values()}

    def where(self, key: str) -> str:
        """``FILE: key``: how a message names a key (the file that set it first)."""
        return f"{self.source_of(key)}: {key}"


def config_to_dict(cfg: Any) -> Any:
    """A plain, YAML-safe mapping of a config (what :func:`ctrcal.config.load.config_from_dict`
    reads back)."""
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
    """The config as YAML text (a snapshot that :func:`ctrcal.load_config` reads back)."""
    import yaml

    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)
