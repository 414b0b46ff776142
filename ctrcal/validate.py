"""The rule book: everything about a config that can be checked without data, in one pass.

:func:`load_config` reads the typed :class:`~ctrcal.config.Config`
(:func:`ctrcal.config.load.read_config`: unknown keys and wrong types stop it there), then runs
every registered check and raises one :class:`~ctrcal.core.errors.ConfigError` listing every
problem, each naming the file it came from (through ``extends`` and command-line overrides) and
the dotted key. ``ctrcal validate`` prints them one per line; ``ctrcal validate --data``
adds :func:`validate_data`. This module sits above every other layer, so it may ask any of
them; nothing below imports it (:func:`ctrcal.api.train` checks a config before training it).

Each rule is stated once, beside what it bounds, and this module only asks it:

* value bounds are tables of :mod:`ctrcal.core.constraints` (scikit-learn's
  ``_parameter_constraints``): :class:`~ctrcal.config.TrainConfig`,
  :class:`~ctrcal.config.SyntheticConfig` and :class:`~ctrcal.config.ReportConfig` carry
  their own; the ``features`` section is bounded by the pipeline it configures
  (:class:`ctrcal.preparation.features.FeaturePipeline`);
* the split fractions and which files a ``data`` section may name are
  :mod:`ctrcal.preparation.splits`' (:func:`~ctrcal.preparation.splits.check_fractions`,
  :func:`~ctrcal.preparation.splits.check_split_sources`), which preparing the data asks too;
  ``on_bad_row`` is :func:`ctrcal.preparation.parse.check_on_bad_row`;
* the model's arguments are its constructor's: the model is built on the ``meta`` device with
  a real :class:`~ctrcal.data.feature_map.FeatureMap` of the data's schema (tiny
  vocabularies), so it sees what it sees in training;
* the rules between report keys are the report plan's (:mod:`ctrcal.reports.shift.plan`),
  the workers' are the sweep's (:func:`ctrcal.sweep.sweep.check_workers`), the noise options'
  are :mod:`ctrcal.train.noise_options`'.

A **data-only** config sets nothing of the ``model``, ``train`` and ``report`` sections
(:data:`MODEL_SECTIONS`; through ``extends`` and overrides included): it describes data to
prepare (``ctrcal prepare --config``), and :func:`is_data_only` says so. Only its sections are
checked, the data and features checks (and the user's): its model is the default, which it
never asked for, and checking it would import torch, which costs more than preparing a small
file. ``ctrcal validate`` of a data-only config checks the same as ``ctrcal prepare --config``.

Messages name the file (or override) that set each key: the :class:`~ctrcal.config.Config`
records it (:meth:`~ctrcal.config.Config.source_of`, :meth:`~ctrcal.config.Config.where`).

Checks are pluggable, like norms, shifts and models: a check is a function
``check(cfg, problems)``; it reports with ``problems.add(key, message)`` or runs a raising
check under ``with problems.at(key):``. The built-in checks, one per section, are defined
below; a user adds one with :func:`register_check`. Checks read no data and touch no device.

Example::

    from ctrcal.validate import register_check

    @register_check("my_section")
    def _check_mine(cfg, problems):
        if cfg.train.batch_size % 64:
            problems.add("train.batch_size", "expected a multiple of 64")
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctrcal.core.constraints import Constraint, parameter_problems
from ctrcal.core.errors import ConfigError, ConfigProblems
from ctrcal.core.registry import Registry, normalize_name

if TYPE_CHECKING:
    from ctrcal.config import Config

__all__ = [
    "CHECKS",
    "MODEL_SECTIONS",
    "is_data_only",
    "load_config",
    "validate_data",
    "Problem",
    "Problems",
    "check_config",
    "register_check",
    "validate_config",
]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config: where (file, dotted key) and what."""

    source: str
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}: {self.key or '<top level>'}: {self.message}"


class Problems:
    """What the checks found, each naming the file that set its key
    (:meth:`~ctrcal.config.Config.source_of`)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.items: list[Problem] = []

    def add(self, key: str, message: str) -> None:
        """Record that ``key`` is wrong: ``message`` says what was expected and what came."""
        self.items.append(Problem(self.cfg.source_of(key), key, message))

    @contextlib.contextmanager
    def at(self, key: str) -> Iterator[None]:
        """Run a raising check; a ``ValueError`` (ConfigError included) becomes a problem."""
        try:
            yield
        except ValueError as exc:
            message = str(exc)
            # checks shared with run time name the file that set the key (Config.where)
            for source in sorted(self.cfg.sources(), key=len, reverse=True):
                if message.startswith(f"{source}: "):
                    message = message[len(source) + 2 :]
                    break
            named = _KEYED.match(message)
            if named and named.group(1).startswith(key):  # the check named a deeper key
                key, message = named.group(1), named.group(2)
            self.add(key, message)

    def bounded(self, prefix: str, obj: Any, constraints: Mapping[str, Constraint]) -> None:
        """Every parameter of ``obj`` (the config section at ``prefix``) outside the bound its
        ``_parameter_constraints`` table states."""
        for key, message in parameter_problems(obj, constraints, prefix):
            self.add(key, message)


def check_data(cfg: Config, problems: Problems) -> None:
    """The ``data`` section, by the rules of :mod:`ctrcal.preparation.splits` (split fractions,
    which files) and :mod:`ctrcal.data.schema`, and the bounds beside :class:`SyntheticConfig`."""
    from ctrcal.core.errors import DataError
    from ctrcal.data.schema import resolve_schema
    from ctrcal.preparation.splits import check_fractions, check_split_sources

    d = cfg.data
    problems.bounded("data.synthetic", d.synthetic, d.synthetic._parameter_constraints)
    with problems.at("data.split"):
        check_fractions(d.split)
    for key, message in check_split_sources(d):
        problems.add(key, message)
    if d.schema is not None:
        try:
            resolve_schema(d.schema)
        except DataError as exc:
            problems.add("data.schema", str(exc).removeprefix("data.schema: "))
    if d.engine != "local" or d.ray_address is not None:
        from ctrcal.preparation.engines import check_engine

        for key, message in check_engine(d):
            problems.add(key, message)


def check_features(cfg: Config, problems: Problems) -> None:
    """The ``features`` section, by the bounds of the pipeline it configures
    (:data:`ctrcal.data.feature_bounds.FEATURE_PARAMETER_CONSTRAINTS`)."""
    from ctrcal.data.feature_bounds import FEATURE_PARAMETER_CONSTRAINTS

    problems.bounded("features", cfg.features, FEATURE_PARAMETER_CONSTRAINTS)


# ---------------------------------------------------------------------------------------------
# The model: bound against its constructor, then built on the meta device


def check_model(cfg: Config, problems: Problems) -> None:
    """The model by name or import path, its arguments bound against its constructor and
    its defaults filled in; then the model is built on the ``meta`` device with its own norms
    and with each report variant's, and whatever a constructor refuses is reported at the key
    that caused it."""
    from ctrcal.models.registry import norm_positions

    before = len(problems.items)
    with problems.at("model"):
        cfg.model = _bind_model(cfg)
    if len(problems.items) > before:
        return  # unknown model or arguments: nothing below is meaningful
    m = cfg.model
    if m.get("numeric_embedding") == "bucket" and cfg.features.numeric_buckets < 2:
        problems.add(
            "model.numeric_embedding",
            "'bucket' needs features.numeric_buckets >= 2 (the boundaries come from there)",
        )
        return
    feature_map = _meta_feature_map(cfg)
    if not _builds(m.name, m.kwargs, feature_map, problems, "model"):
        return  # every variant would fail the same way
    positions = norm_positions(m.name)
    tried: list[Any] = []
    for i, variant in enumerate(cfg.report.variants):
        key = f"report.variants[{i}]"
        norms = {"net_norm": variant.net_norm}
        if variant.emb_norm is not None:
            if "emb_norm" not in positions:
                problems.add(
                    f"{key}.emb_norm",
                    f"model {m.name!r} has no emb_norm position (its norm positions: "
                    f"{', '.join(positions)})",
                )
                continue
            norms["emb_norm"] = variant.emb_norm
        if norms in tried:
            continue  # the same norms build the same model
        tried.append(norms)
        _builds(m.name, {**m.kwargs, **norms}, feature_map, problems, key, only=list(norms))


def _bind_model(cfg: Config) -> Any:
    """``cfg.model`` with its name resolved, arguments bound and the model's defaults in."""
    from ctrcal.models.registry import check_model_kwargs, model_defaults, with_defaults

    model = cfg.model

    def where(key: str) -> str:
        return cfg.where(f"model.{key}")

    try:
        model_defaults(model.name)
    except ConfigError as exc:
        raise ConfigError(f"model.name: {exc}") from None
    check_model_kwargs(model.name, model.kwargs, where)
    return model.with_arguments(with_defaults(model.name, model.kwargs))


def _meta_feature_map(cfg: Config) -> Any:
    """The config's data schema as a real :class:`~ctrcal.data.feature_map.FeatureMap` with
    tiny vocabularies (for meta builds): a model sees here what it sees in training."""
    from ctrcal.core.errors import DataError
    from ctrcal.data.feature_map import FeatureMap
    from ctrcal.data.schema import CRITEO, resolve_schema

    try:
        schema = resolve_schema(cfg.data.schema) or CRITEO
    except DataError:
        schema = CRITEO  # check_data names the schema's problem
    return FeatureMap.placeholder(
        schema.categorical_fields, schema.numeric, cfg.features.numeric_buckets
    )


def _builds(
    name: str,
    kwargs: dict[str, Any],
    feature_map: Any,
    problems: Problems,
    key: str,
    only: list[str] | None = None,
) -> bool:
    """Whether the model builds; if not, report the constructor's message at the key that
    caused it (a norm position when the model builds without that norm).

    Args:
        only: the norm positions the failure may be blamed on (default: every one).
    """
    from ctrcal.core.norm_spec import NormSpec, is_no_norm
    from ctrcal.models.registry import is_norm_key, resolve_model

    error = _construct(name, kwargs, feature_map)
    if error is None:
        return True
    params = resolve_model(name).parameters()
    norms = [
        k
        for k in (only if only is not None else kwargs)
        if is_norm_key(k) and not is_no_norm(kwargs[k])
    ]
    plain = dict(kwargs)
    for k in norms:  # the model without these norms (a foreign model's net_norm: dropped)
        if k in params:
            plain[k] = NormSpec("none")
        else:
            plain.pop(k)
    if norms and _construct(name, plain, feature_map) is None:
        for k in norms:
            alone = _construct(name, {**plain, k: kwargs[k]}, feature_map)
            if alone is not None:
                problems.add(f"{key}.{k}", alone)
                return False
    problems.add(*_blame(error, key, params))
    return False


_ARGUMENT = re.compile(r"^([A-Za-z_]\w*)((?:\[\d+\])*): (.*)$", re.S)


def _blame(message: str, key: str, params: dict[str, Any]) -> tuple[str, str]:
    """A constructor's ``arg[i]: message`` becomes ``model.arg[i]``; anything else ``key``."""
    found = _ARGUMENT.match(message)
    if found and found.group(1) in params and key == "model":
        return f"model.{found.group(1)}{found.group(2)}", found.group(3)
    return key, message


def _construct(name: str, kwargs: dict[str, Any], feature_map: Any) -> str | None:
    """Build the model on the ``meta`` device; None, or the constructor's one-line refusal.

    A constructor that cannot run on ``meta`` (it reads tensor values) is built on the CPU.
    """
    import torch

    from ctrcal.models.build import create_model
    from ctrcal.models.registry import resolve_model

    label = f"model: {resolve_model(name).name}: "  # create_model's; the key says it already
    for device in ("meta", "cpu"):
        try:
            with torch.device(device), _skip_init(device == "meta"):
                create_model(name, feature_map, check=False, **kwargs)
            return None
        except (ValueError, TypeError) as exc:  # ConfigError included: a refused argument
            return _one_line(exc, label)
        except (NotImplementedError, RuntimeError) as exc:
            if device == "cpu":
                return _one_line(exc, label)
    return None  # pragma: no cover - the loop returns


@functools.cache
def _init_functions() -> frozenset[Any]:
    import torch

    names = [n for n in dir(torch.nn.init) if n.endswith("_") and not n.startswith("_")]
    inits = {getattr(torch.nn.init, n) for n in names}
    tensor = torch.Tensor
    return frozenset(inits | {tensor.normal_, tensor.uniform_, tensor.fill_, tensor.zero_})


def _skip_init(active: bool) -> Any:
    """A scope in which parameter initialisation does nothing (a meta tensor has no values
    to set; torch's reference kernels for them would also import its compiler, seconds)."""
    if not active:
        return contextlib.nullcontext()
    from torch.overrides import TorchFunctionMode

    inits = _init_functions()

    class SkipInit(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in inits:
                target = args[0] if args else kwargs.get("tensor")
                if getattr(target, "is_meta", False):
                    return target
            return func(*args, **kwargs)

    return SkipInit()


def _one_line(exc: BaseException, label: str) -> str:
    text = str(exc).strip()
    text = text[len(label) :] if text.startswith(label) else text
    return text.splitlines()[0] if text else type(exc).__name__


# ---------------------------------------------------------------------------------------------
# Training and the report


def check_train(cfg: Config, problems: Problems) -> None:
    """The ``train`` section: the bounds beside :class:`~ctrcal.config.TrainConfig`, and the
    noise options' rules (:mod:`ctrcal.train.noise_options`, shared with report variants)."""
    from ctrcal.train.noise_options import check_train_shift, check_weight_noise

    t = cfg.train
    problems.bounded("train", t, t._parameter_constraints)
    with problems.at("train"):
        check_weight_noise(t.weight_noise, "train")
    with problems.at("train"):
        check_train_shift(t.train_shift, "train")
    from ctrcal.train.loggers import missing_logger_extras

    for missing in missing_logger_extras(t.loggers):  # the loggers' packages are installed
        problems.add("train.loggers", missing)


def check_report(cfg: Config, problems: Problems) -> None:
    from ctrcal.reports.shift.calibration_keys import missing_packages
    from ctrcal.reports.shift.plan import check_report as plan_report
    from ctrcal.sweep.sweep import check_workers

    missing = missing_packages(cfg)
    for key, message in missing:  # one line per package
        problems.add(key, message)
    if missing:
        return  # the report's checks build its calibrators, which need those packages
    before = len(problems.items)
    problems.bounded("report", cfg.report, cfg.report._parameter_constraints)
    if len(problems.items) > before:
        return  # the plan checks these bounds too and would stop at the first of them
    with problems.at("report"):
        plan_report(cfg)
    with problems.at("report"):
        check_workers(cfg)


# "report.variants[2].mc_samples: expected ..." -> the key and the message
_KEYED = re.compile(r"^([A-Za-z_][\w\[\]]*(?:\.[\w\[\]]+)*): (.*)$", re.S)

CheckFn = Callable[["Config", Problems], None]
CHECKS: Registry[CheckFn] = Registry("config check")
"""Every check by name, in the order they run: the built-ins, one per section, then the user's."""
for _check in (check_data, check_features, check_model, check_train, check_report):
    CHECKS.register(_check.__name__.removeprefix("check_"), _check)
del _check


def register_check(name: str, fn: CheckFn | None = None, *, overwrite: bool = False) -> Any:
    """Register ``fn(cfg, problems)`` under ``name``; usable as a decorator.

    Raises:
        ValueError: ``name`` is taken (by another function) and ``overwrite`` is False.
    """
    if fn is None:
        return lambda f: register_check(name, f, overwrite=overwrite)
    again = CHECKS.find(name) is fn  # registering the same function twice changes nothing
    return CHECKS.register(name, fn, overwrite=overwrite or again)


def check_config(cfg: Config, skip: Sequence[str] = ()) -> list[Problem]:
    """Every problem the registered checks (except those named in ``skip``) find in ``cfg``,
    each naming the file that set its key (the config's provenance)."""
    problems = Problems(cfg)
    skipped = {normalize_name(name) for name in skip}
    for name, fn in CHECKS.items():
        if normalize_name(name) not in skipped:
            fn(cfg, problems)
    return problems.items


# the sections whose checks need the model (and torch): a config that sets none is data-only
MODEL_SECTIONS = ("model", "train", "report")


def is_data_only(cfg: Config) -> bool:
    """Whether ``cfg``'s files and overrides set nothing of :data:`MODEL_SECTIONS` (a config of
    data to prepare; module docstring): its checks are then ``validate_config(cfg,
    skip=MODEL_SECTIONS)``."""
    return not cfg.sections_set() & set(MODEL_SECTIONS)


def validate_config(cfg: Config, skip: Sequence[str] = ()) -> None:
    """Raise one :class:`ConfigError` listing every problem of ``cfg`` (nothing if valid).

    Args:
        skip: names of checks not to run (the trainer skips ``report``: a run is the same
            whatever report it belongs to).
    """
    problems = check_config(cfg, skip)
    if problems:
        raise ConfigProblems(problems)


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    *,
    check_names: bool = True,
    skip_checks: Sequence[str] = (),
) -> Config:
    """Read, merge, override and validate a config file into a :class:`Config`.

    :func:`ctrcal.config.load.read_config` reads it (unknown keys and wrong types stop it
    there), the model's defaults are filled in, then every check runs.

    Args:
        path: YAML file; ``None`` starts from the defaults.
        overrides: ``section.key=value`` strings (or ``~section.key``) applied after the file.
        check_names: also run every data-free check: registry names, the model built on the
            ``meta`` device, value domains, the report plan.
        skip_checks: names of checks not to run.

    Raises:
        ConfigError: naming the file, the dotted key, what was expected and the closest key.
    """
    from ctrcal.config.load import read_config
    from ctrcal.train.runs import with_model_defaults

    cfg = with_model_defaults(read_config(path, overrides))
    if check_names:
        validate_config(cfg, skip_checks)
    return cfg


def validate_data(cfg: Config, data_dir: Path) -> None:
    """What ``ctrcal validate --data`` adds: every shift the config evaluates or trains under
    can apply to that prepared data (its feature kinds, original-space statistics), its
    ``data.layout`` reads the data's sources, and the model's embedding tables fit
    ``train.max_embedding_gib``.

    Raises:
        DataError: naming the config's file and key, the shift and the data.
        ConfigError: tables above the limit, naming the key and the size.
    """
    from ctrcal.data.feature_map import FeatureMap, check_prepared_layout
    from ctrcal.reports.shift.jobs import check_data_for_shifts
    from ctrcal.reports.shift.plan import plan_shifts
    from ctrcal.shifts.data_check import check_training_data
    from ctrcal.train.table_limit import check_table_size

    feature_map = FeatureMap.load(data_dir)
    check_data_for_shifts(plan_shifts(cfg), feature_map, data_dir, cfg)
    check_training_data(cfg, feature_map, data_dir)
    check_prepared_layout(cfg, feature_map, data_dir)
    check_table_size(cfg, feature_map)
