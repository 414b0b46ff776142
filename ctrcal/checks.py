"""The built-in config checks (listed in :mod:`ctrcal.validation`): one function per section.

Rules that training itself also needs are not restated here: the model check builds the model
on the ``meta`` device (no memory, no data), so the constructors -- the model's and every
norm's -- decide which arguments and widths are valid; the report check calls the function
that plans the report.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
from typing import TYPE_CHECKING, Any

from ctrcal.errors import ConfigError

if TYPE_CHECKING:
    from ctrcal.config import Config
    from ctrcal.validation import Problems

__all__ = [
    "check_data",
    "check_features",
    "check_model",
    "check_report",
    "check_train",
    "check_workers",
    "device_list",
]

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
        from ctrcal.data.schema import resolve_schema
        from ctrcal.errors import DataError

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

    from ctrcal.data.schema import CRITEO, resolve_schema
    from ctrcal.errors import DataError

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
            [[float(b) for b in range(buckets - 1)] for _ in numeric]
            if buckets >= 2 else None
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
    from ctrcal.layers.spec import NormSpec, is_no_norm
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
    if not _DEVICE.match(t.device.strip()):
        problems.add("train.device", f"expected auto, cpu, cuda or cuda:N, got {t.device!r}")
    if t.finetune_from is not None and not t.finetune_from.strip():
        problems.add("train.finetune_from", "expected a run directory, got an empty string")
    from ctrcal.train.noise_options import check_train_shift, check_weight_noise

    with problems.at("train"):
        check_weight_noise(t.weight_noise, "train")
    with problems.at("train"):
        check_train_shift(t.train_shift, "train")


def device_list(value: Any) -> list[str]:
    """``report.devices`` as a list: ``[cuda:0, cuda:1]`` or ``"cuda:0,cuda:1"``."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    return [str(d).strip() for d in items if str(d).strip()]


def check_workers(cfg: Config, source: str = "config") -> None:
    """Check ``report.workers`` / ``report.devices`` (which devices exist is asked at run
    time, by the sweep).

    Raises:
        ConfigError: naming the key and what was expected.
    """
    r = cfg.report
    if r.workers < 0:
        raise ConfigError(
            f"{source}: report.workers: expected 0 (one per device) or more, got {r.workers}"
        )
    devices = device_list(r.devices)
    if "auto" in devices and len(devices) > 1:
        raise ConfigError(
            f"{source}: report.devices: 'auto' stands alone (every visible GPU), got {devices}"
        )


def check_report(cfg: Config, problems: Problems) -> None:
    from ctrcal.eval.calibration_keys import missing_packages
    from ctrcal.eval.plan import check_report as plan_report

    missing = missing_packages(cfg)
    for key, message in missing:  # one line per package
        problems.add(key, message)
    if missing:
        return  # the report's checks build its calibrators, which need those packages
    with problems.at("report"):
        plan_report(cfg, problems.source)
    with problems.at("report"):
        check_workers(cfg, problems.source)
