"""The built-in config checks (see :mod:`ctrcal.validation`): data-free, torch-free.

One function per section. Rules that training itself also needs (MC-LayerNorm's subset size,
the report plan, the sweep's workers) are not restated here: the check calls the function
that owns the rule.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ctrcal.validation import Problems, register_check

if TYPE_CHECKING:
    from ctrcal.config import Config

# what torch.device accepts, without importing torch: a type and an optional index
_DEVICE = re.compile(r"^(auto|cpu|cuda|mps|xpu|meta|hpu|npu|privateuseone)(:\d+)?$")


@register_check("data")
def check_data(cfg: Config, problems: Problems) -> None:
    d = cfg.data
    problems.number("data.synthetic.drift", d.synthetic.drift, low=0.0)
    fr = d.split
    if len(fr) != 3 or any(not (f >= 0) for f in fr) or not fr[0] > 0:
        problems.add(
            "data.split",
            f"expected three fractions >= 0 with train > 0 (train, valid, test), got {fr}",
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


@register_check("features")
def check_features(cfg: Config, problems: Problems) -> None:
    f = cfg.features
    problems.integer("features.min_count", f.min_count, low=1)
    problems.integer("features.max_vocab", f.max_vocab, low=0)
    problems.integer("features.hash_buckets", f.hash_buckets, low=1)
    if f.numeric_buckets < 0 or f.numeric_buckets == 1:
        problems.add(
            "features.numeric_buckets", f"expected 0 (off) or >= 2, got {f.numeric_buckets}"
        )


def masknet_norm_widths(cfg: Config) -> dict[str, list[int]]:
    """The widths the norms of a MaskNet normalise, per position (``emb_norm``, ``net_norm``).

    ``emb_norm`` is one norm per field over the embedding dimension D; ``net_norm`` sits in
    every MaskBlock, over that block's output width.
    """
    m = cfg.model
    blocks = list(m.hidden_units) if m.variant == "serial" else [m.block_dim] * m.num_blocks
    return {"emb_norm": [m.embedding_dim], "net_norm": blocks}


def _registered_name(cfg: Config) -> str:
    """The registry's name of the config's model (``MaskNet`` and ``masknet`` alike)."""
    from ctrcal.models.registry import resolve_model

    return resolve_model(cfg.model.name).name


def model_norm_widths(cfg: Config) -> dict[str, list[int | None]]:
    """Per norm position, the widths its layers normalise (None where not known)."""
    m = cfg.model
    name = _registered_name(cfg)
    if name == "masknet":
        return dict(masknet_norm_widths(cfg))
    if name == "dnn":
        return {"emb_norm": [m.embedding_dim], "net_norm": list(m.hidden_units)}
    if name == "dcnv2":
        deep = []
        if m.structure in ("stacked", "stacked_parallel"):
            deep += list(m.stacked_dnn_hidden_units)
        if m.structure in ("parallel", "stacked_parallel"):
            deep += list(m.parallel_dnn_hidden_units)
        return {"emb_norm": [m.embedding_dim], "net_norm": deep}
    return {key: [None] for key in m.kwargs if key.endswith("_norm")} | {"net_norm": [None]}


def _check_masknet(cfg: Config, problems: Problems) -> None:
    m = cfg.model
    if m.variant == "serial":
        if not m.hidden_units:
            problems.add("model.hidden_units", "a serial MaskNet needs at least one block width")
        for i, units in enumerate(m.hidden_units):
            problems.integer(f"model.hidden_units[{i}]", units, low=1)
    else:
        problems.integer("model.num_blocks", m.num_blocks, low=1)
        problems.integer("model.block_dim", m.block_dim, low=1)
        for i, units in enumerate(m.mlp_hidden_units):
            problems.integer(f"model.mlp_hidden_units[{i}]", units, low=1)
    problems.number("model.reduction_ratio", m.reduction_ratio, low=0.0, low_open=True)


@register_check("model")
def check_model(cfg: Config, problems: Problems) -> None:
    """The model by name or import path, its arguments bound against its constructor, its
    norms at every position. ctrcal's own models are checked from their source (no torch);
    a model named by an import path is imported (the user's package, and torch with it)."""
    from ctrcal.config import check_model_config

    before = len(problems.items)
    with problems.at("model"):
        cfg.model = check_model_config(cfg.model, problems.source)
    if len(problems.items) > before:
        return  # unknown model or arguments: nothing below is meaningful
    m = cfg.model
    name = _registered_name(cfg)
    if name == "masknet":
        _check_masknet(cfg, problems)
    builtin = name in ("masknet", "dnn", "dcnv2")
    if builtin:
        problems.integer("model.embedding_dim", m.embedding_dim, low=1)
        problems.number("model.dropout", m.dropout, low=0.0, high=1.0, high_open=True)
        problems.number("model.embedding_init_std", m.embedding_init_std, low=0.0, low_open=True)
        if m.numeric_embedding == "bucket" and cfg.features.numeric_buckets < 2:
            problems.add(
                "model.numeric_embedding",
                "'bucket' needs features.numeric_buckets >= 2 (the boundaries come from there)",
            )
    widths = model_norm_widths(cfg)
    for key, spec in m.kwargs.items():
        if key.endswith("_norm") and not callable(spec):
            problems.norm(f"model.{key}", spec, widths.get(key, [None]))
    from ctrcal.models.registry import norm_positions

    positions = norm_positions(m.name)
    for i, variant in enumerate(cfg.report.variants):
        problems.norm(f"report.variants[{i}].net_norm", variant.net_norm, widths["net_norm"])
        if variant.emb_norm is not None:
            if "emb_norm" not in positions:
                problems.add(
                    f"report.variants[{i}].emb_norm",
                    f"model {m.name!r} has no emb_norm position (its norm positions: "
                    f"{', '.join(positions)})",
                )
            else:
                problems.norm(
                    f"report.variants[{i}].emb_norm", variant.emb_norm, widths["emb_norm"]
                )


@register_check("train")
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


@register_check("report")
def check_report(cfg: Config, problems: Problems) -> None:
    from ctrcal.eval.plan import check_report
    from ctrcal.eval.sweep import check_workers

    with problems.at("report"):
        check_report(cfg, problems.source)
    with problems.at("report"):
        check_workers(cfg, problems.source)
