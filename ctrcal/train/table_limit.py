"""The embedding tables' size limit (``train.max_embedding_gib``), checked from the feature map
and the config before anything is allocated: by ``ctrcal validate --data`` and at the start of
``train``. The size rule itself is :mod:`ctrcal.data.table_size`."""

from __future__ import annotations

from typing import Any

from ctrcal.core.errors import ConfigError
from ctrcal.data import table_size
from ctrcal.models.registry import model_defaults

__all__ = ["check_table_size", "model_embedding_dim"]


def model_embedding_dim(model_cfg: Any) -> int | None:
    """The model's ``embedding_dim`` as configured, else its default (None for a model
    without one)."""
    dim = model_cfg.get("embedding_dim")
    if dim is None:
        try:
            dim = model_defaults(model_cfg.name).get("embedding_dim")
        except Exception:  # noqa: BLE001 - a model that cannot be resolved has no dimension
            return None
    return dim if isinstance(dim, int) and not isinstance(dim, bool) else None


def check_table_size(cfg: Any, feature_map: Any) -> None:
    """Refuse embedding tables above ``train.max_embedding_gib`` (default: a quarter of the
    machine's memory).

    Args:
        cfg: the :class:`~ctrcal.config.Config` (its ``model`` and ``train`` sections; the
            message names the file that set the key).
        feature_map: the prepared data's :class:`~ctrcal.data.feature_map.FeatureMap`.

    Raises:
        ConfigError: one line naming the key, the size, the limit and the largest table.
    """
    dim = model_embedding_dim(cfg.model)
    if not dim:
        return
    bucket = cfg.model.get("numeric_embedding") == "bucket"
    rows = table_size.embedding_rows(
        feature_map.vocab_sizes, feature_map.bucket_boundaries if bucket else None
    )
    size = table_size.embedding_bytes(rows, dim)
    limit_gib = cfg.train.max_embedding_gib
    if limit_gib is None:
        memory = table_size.machine_memory_bytes()
        if memory is None:
            return
        limit = int(memory * table_size.MEMORY_FRACTION)
        how = f"a quarter of this machine's {memory / 2**30:,.1f} GiB, the default"
    else:
        limit = int(float(limit_gib) * 2**30)
        how = "as set"
    if size <= limit:
        return
    largest = ""
    sizes = feature_map.vocab_sizes
    if sizes:
        k = max(range(len(sizes)), key=lambda j: sizes[j])
        largest = f"; the largest is {feature_map.categorical_fields[k]} with {sizes[k]:,} rows"
    raise ConfigError(
        f"{cfg.where('train.max_embedding_gib')}: the embedding tables need "
        f"{size / 2**30:,.1f} GiB "
        f"({rows:,} rows x model.embedding_dim {dim} x 4 B{largest}), above the limit of "
        f"{limit / 2**30:,.1f} GiB ({how}); lower features.max_vocab, features.hash_buckets "
        "or model.embedding_dim, or raise train.max_embedding_gib"
    )
