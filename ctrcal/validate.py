"""The rule book: everything about a config that can be checked without data, in one pass.

:func:`load_config` reads the typed :class:`~ctrcal.config.Config`
(:func:`ctrcal.config.load.read_config`: unknown keys and wrong types stop it there), then runs
every registered check and raises one :class:`~ctrcal.core.errors.ConfigError` listing every
problem, each naming the file it came from (through ``extends`` and command-line overrides) and
the dotted key. ``ctrcal validate`` prints them one per line; ``ctrcal validate --data``
adds :func:`validate_data`. This module sits above every other layer, so it may ask any of
them; nothing below imports it (:func:`ctrcal.api.train` checks a config before training it).

Checks are pluggable, like norms, shifts and models: a check is a function
``check(cfg, problems)``; it reports with ``problems.add(key, message)`` or runs a raising
check under ``with problems.at(key):``. The built-in checks, one per section, are defined
below; a user adds one with :func:`register_check`. Checks read no data and touch no device;
the model check builds the model on the ``meta`` device, so its constructor (and each norm's)
is the one statement of which arguments and widths are valid; the report check calls the
function that plans the report, and the workers' rule is the sweep's
(:func:`ctrcal.sweep.sweep.check_workers`).

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
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctrcal.core.errors import ConfigError, ConfigProblems
from ctrcal.core.typed import require_int, require_number

if TYPE_CHECKING:
    from ctrcal.config import Config

__all__ = [
    "ConfigProblems",
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
    """What the checks found, with the file each key came from."""

    def __init__(self, cfg: Config, source: str) -> None:
        self.cfg = cfg
        self.source = source
        self._sources: dict[str, str] = getattr(cfg, "_key_sources", None) or {}
        self.items: list[Problem] = []

    def source_of(self, key: str) -> str:
        """The file (or override) that set ``key``, else the config's own source."""
        parts = key.replace("[", ".[").split(".")
        for n in range(len(parts), 0, -1):
            found = self._sources.get(".".join(parts[:n]).replace(".[", "["))
            if found:
                return found
        return self.source

    def add(self, key: str, message: str) -> None:
        """Record that ``key`` is wrong: ``message`` says what was expected and what came."""
        self.items.append(Problem(self.source_of(key), key, message))

    @contextlib.contextmanager
    def at(self, key: str) -> Iterator[None]:
        """Run a raising check; a ``ValueError`` (ConfigError included) becomes a problem."""
        try:
            yield
        except ValueError as exc:
            message = str(exc)
            if message.startswith(f"{self.source}: "):  # checks shared with run time name it
                message = message[len(self.source) + 2 :]
            named = _KEYED.match(message)
            if named and named.group(1).startswith(key):  # the check named a deeper key
                key, message = named.group(1), named.group(2)
            self.add(key, message)

    # -- common shapes of a check (the domains are ctrcal.core.typed's, as the models' are) ----

    def integer(self, key: str, value: Any, *, low: int) -> None:
        """``value`` must be an integer ``>= low``."""
        try:
            require_int(key, value, low=low)
        except ConfigError as exc:
            self.add(key, str(exc)[len(key) + 2 :])

    def number(self, key: str, value: Any, **domain: Any) -> None:
        """``value`` must be a finite number in the domain (see
        :func:`ctrcal.core.typed.require_number`)."""
        try:
            require_number(key, value, **domain)
        except ConfigError as exc:
            self.add(key, str(exc)[len(key) + 2 :])


# what torch.device accepts: a type and an optional index
_DEVICE = re.compile(r"^(auto|cpu|cuda|mps|xpu|meta|hpu|npu|privateuseone)(:\d+)?$")
# the fractions of data.split sum to 1 within this (0.7 + 0.2 + 0.1 is 0.9999999999999999)
_SPLIT_TOLERANCE = 1e-6


def check_data(cfg: Config, problems: Problems) -> None:
    d = cfg.data
    problems.number("data.synthetic.drift", d.synthetic.drift, low=0.0)
    fr = d.split
    if len(fr) != 3 or any(not (f >= 0) for f in fr) or not fr[0] > 0:
        problems.add(
            "data.split",
            f"expected three fractions >= 0 with train > 0 (train, valid, test), got {fr}",
        )
    elif not all(float(f).is_integer() for f in fr) and not math.isclose(
        sum(fr), 1.0, rel_tol=0.0, abs_tol=_SPLIT_TOLERANCE
    ):  # whole numbers are proportions (22 days : 1 : 1); fractions must add up
        problems.add(
            "data.split",
            f"the fractions (train, valid, test) must sum to 1, got {fr} (sum {sum(fr):g}); "
            "or give whole-number proportions such as [8, 1, 1]",
        )
    explicit = bool(d.train or d.valid or d.test)
    if d.split_order == "time" and explicit:
        problems.add(
            "data.split_order",
            "'time' splits data.inputs (or synthetic data); data.train/valid/test are explicit "
            "splits and are kept as given",
        )
    if explicit and d.inputs:
        problems.add(
            "data.inputs",
            "give either inputs (split by data.split) or train/valid/test files, not both",
        )
    if explicit and not d.train:
        problems.add("data.train", "train files are needed when valid or test files are given")
    problems.integer("data.synthetic.rows", d.synthetic.rows, low=1)
    if d.schema is not None:
        from ctrcal.core.errors import DataError
        from ctrcal.data.schema import resolve_schema

        try:
            resolve_schema(d.schema)
        except DataError as exc:
            problems.add("data.schema", str(exc).removeprefix("data.schema: "))


def check_features(cfg: Config, problems: Problems) -> None:
    f = cfg.features
    problems.integer("features.min_count", f.min_count, low=1)
    problems.integer("features.max_vocab", f.max_vocab, low=0)
    problems.integer("features.hash_buckets", f.hash_buckets, low=1)
    if f.numeric_buckets < 0 or f.numeric_buckets == 1:
        problems.add(
            "features.numeric_buckets", f"expected 0 (off) or >= 2, got {f.numeric_buckets}"
        )


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
        cfg.model = _bind_model(cfg, problems.source)
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


def _bind_model(cfg: Config, source: str) -> Any:
    """``cfg.model`` with its name resolved, arguments bound and the model's defaults in."""
    from ctrcal.models.registry import check_model_kwargs, model_defaults, with_defaults

    model = cfg.model

    def where(key: str) -> str:
        return f"{source}: model.{key}"  # Problems names the file that set the key

    try:
        model_defaults(model.name)
    except ConfigError as exc:
        raise ConfigError(f"model.name: {exc}") from None
    check_model_kwargs(model.name, model.kwargs, where)
    return model.with_arguments(with_defaults(model.name, model.kwargs))


def _meta_feature_map(cfg: Config) -> Any:
    """A feature map of the config's data schema with tiny vocabularies (for meta builds)."""
    from types import SimpleNamespace

    from ctrcal.core.errors import DataError
    from ctrcal.data.schema import CRITEO, resolve_schema

    try:
        schema = resolve_schema(cfg.data.schema) or CRITEO
    except DataError:
        schema = CRITEO  # check_data names the schema's problem
    categorical, numeric = schema.categorical_fields, schema.numeric
    buckets = cfg.features.numeric_buckets
    return SimpleNamespace(
        vocab_sizes=[2] * len(categorical),
        categorical_fields=list(categorical),
        numeric_fields=list(numeric),
        bucket_boundaries=(
            [[float(b) for b in range(buckets - 1)] for _ in numeric] if buckets >= 2 else None
        ),  # fmt: skip
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
        k for k in (only if only is not None else kwargs)
        if is_norm_key(k) and not is_no_norm(kwargs[k])
    ]  # fmt: skip
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
    t = cfg.train
    problems.integer("train.seed", t.seed, low=0)
    problems.integer("train.epochs", t.epochs, low=1)
    problems.integer("train.batch_size", t.batch_size, low=1)
    problems.integer("train.eval_batch_size", t.eval_batch_size, low=1)
    problems.integer("train.patience", t.patience, low=1)
    problems.integer("train.num_threads", t.num_threads, low=0)
    problems.number("train.lr", t.lr, low=0.0, low_open=True)
    problems.number("train.min_lr", t.min_lr, low=0.0)
    problems.number("train.lr_factor", t.lr_factor, low=0.0, high=1.0, low_open=True)
    problems.number("train.weight_decay", t.weight_decay, low=0.0)
    problems.number("train.emb_l2", t.emb_l2, low=0.0)
    problems.number("train.grad_clip", t.grad_clip, low=0.0)
    if t.max_embedding_gib is not None:
        problems.number("train.max_embedding_gib", t.max_embedding_gib, low=0.0, low_open=True)
    if not _DEVICE.match(t.device.strip()):
        problems.add("train.device", f"expected auto, cpu, cuda or cuda:N, got {t.device!r}")
    if t.finetune_from is not None and not t.finetune_from.strip():
        problems.add("train.finetune_from", "expected a run directory, got an empty string")
    problems.integer("train.log_every", t.log_every, low=1)
    from ctrcal.train.loggers import missing_logger_extras

    for missing in missing_logger_extras(t.loggers):
        problems.add("train.loggers", missing)
    from ctrcal.train.noise_options import check_train_shift, check_weight_noise

    with problems.at("train"):
        check_weight_noise(t.weight_noise, "train")
    with problems.at("train"):
        check_train_shift(t.train_shift, "train")


def check_report(cfg: Config, problems: Problems) -> None:
    from ctrcal.reports.shift.calibration_keys import missing_packages
    from ctrcal.reports.shift.plan import check_report as plan_report
    from ctrcal.sweep.sweep import check_workers

    missing = missing_packages(cfg)
    for key, message in missing:  # one line per package
        problems.add(key, message)
    if missing:
        return  # the report's checks build its calibrators, which need those packages
    with problems.at("report"):
        plan_report(cfg, problems.source)
    with problems.at("report"):
        check_workers(cfg, problems.source)


# "report.variants[2].mc_samples: expected ..." -> the key and the message
_KEYED = re.compile(r"^([A-Za-z_][\w\[\]]*(?:\.[\w\[\]]+)*): (.*)$", re.S)

CheckFn = Callable[["Config", Problems], None]
# the built-in checks, one per section, in the order they run
_CHECKS: dict[str, CheckFn] = {
    "data": check_data,
    "features": check_features,
    "model": check_model,
    "train": check_train,
    "report": check_report,
}


def register_check(name: str, fn: CheckFn | None = None, *, overwrite: bool = False) -> Any:
    """Register ``fn(cfg, problems)`` under ``name``; usable as a decorator.

    Raises:
        ValueError: ``name`` is taken and ``overwrite`` is False.
    """
    if fn is None:
        return lambda f: register_check(name, f, overwrite=overwrite)
    if name in _CHECKS and not overwrite and _CHECKS[name] is not fn:
        raise ValueError(f"config check {name!r} is already registered (pass overwrite=True)")
    _CHECKS[name] = fn
    return fn


def check_config(
    cfg: Config, source: str = "config", skip: Sequence[str] = ()
) -> list[Problem]:
    """Every problem the registered checks (except those named in ``skip``) find in ``cfg``."""
    problems = Problems(cfg, source)
    for name, fn in _CHECKS.items():
        if name not in skip:
            fn(cfg, problems)
    return problems.items


def validate_config(cfg: Config, source: str = "config", skip: Sequence[str] = ()) -> None:
    """Raise one :class:`ConfigError` listing every problem of ``cfg`` (nothing if valid).

    Args:
        skip: names of checks not to run (the trainer skips ``report``: a run is the same
            whatever report it belongs to).
    """
    problems = check_config(cfg, source, skip)
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
        source = str(path) if path is not None else "<defaults>"
        validate_config(cfg, source, skip_checks)
    return cfg


def validate_data(cfg: Config, data_dir: Path, source: str) -> None:
    """What ``ctrcal validate --data`` adds: every shift the config evaluates or trains under
    can apply to that prepared data (its feature kinds, original-space statistics), and the
    model's embedding tables fit ``train.max_embedding_gib``.

    Raises:
        DataError: naming the config's file and key, the shift and the data.
        ConfigError: tables above the limit, naming the key and the size.
    """
    from ctrcal.data.feature_map import FeatureMap
    from ctrcal.reports.shift.jobs import check_data_for_shifts
    from ctrcal.reports.shift.plan import plan_shifts
    from ctrcal.shifts.data_check import check_training_data
    from ctrcal.train.table_limit import check_table_size

    feature_map = FeatureMap.load(data_dir)
    check_data_for_shifts(plan_shifts(cfg, source), feature_map, data_dir, source)
    check_training_data(cfg, feature_map, data_dir, source)
    check_table_size(cfg, feature_map, source)
