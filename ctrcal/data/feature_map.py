"""The feature map: what a model needs to know about prepared data (``feature_map.json``).

:class:`FeatureMap` is the read-only view of what
:class:`~ctrcal.preparation.features.FeaturePipeline` learned on the train split. Reading it
needs neither polars nor torch, so loading a run or a prepared directory (``ctrcal evaluate``,
a report) does not load the preparation stack.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctrcal.core.criteo_schema import check_layout
from ctrcal.core.errors import DataError
from ctrcal.data.numeric import NumericTransform

__all__ = [
    "FEATURE_MAP_FILE",
    "SCHEMA_VERSION",
    "FeatureMap",
    "check_prepared_layout",
    "load_feature_map",
]

SCHEMA_VERSION = 1
FEATURE_MAP_FILE = "feature_map.json"


@dataclass
class FeatureMap:
    """What a model needs to know about the encoded data (read from ``feature_map.json``).

    Attributes:
        categorical_fields: categorical column names, in the order of ``Batch.categorical``.
        vocab_sizes: per categorical field; ids are in ``[0, vocab_size)`` (reserved ids
            included).
        numeric_fields: numeric column names, in the order of ``Batch.numeric``.
        numeric_mean: train-split mean per numeric field in model-input space.
        numeric_std: train-split std per numeric field in model-input space (non-missing).
        numeric_original_mean / numeric_original_std: train-split mean / std per numeric field
            of the values as they stand in the input file (raw counts; the given values for
            Criteo_x1), or None for a feature map written before they were stored.
        numeric_missing_rate: fraction missing per numeric field in train.
        bucket_boundaries: per numeric field, sorted model-space boundaries (or None).
        numeric_transform: the transform applied (``log_standardize``, ...).
        layout: the source layout.
        splits: per split ``{"rows": n, "positive_rate": r}``.
        source_hash: hash of the sources' identity and the pipeline config.
        extra: everything else from the JSON (per-feature details, pipeline config).
        source: the file it was read from (for messages).

    :meth:`numeric_codec` gives the invertible numeric transform
    (:class:`~ctrcal.data.numeric.NumericTransform`: ``to_original`` / ``to_model``).
    """

    categorical_fields: list[str]
    vocab_sizes: list[int]
    numeric_fields: list[str]
    numeric_mean: list[float]
    numeric_std: list[float]
    numeric_missing_rate: list[float] = field(default_factory=list)
    bucket_boundaries: list[list[float]] | None = None
    numeric_transform: str = "log_standardize"
    layout: str | None = None
    splits: dict[str, dict[str, Any]] = field(default_factory=dict)
    source_hash: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    numeric_original_mean: list[float] | None = None
    numeric_original_std: list[float] | None = None
    source: str = "<feature map>"

    def numeric_codec(self) -> NumericTransform:
        """The stored numeric transform, invertible on a batch (see :mod:`ctrcal.data.numeric`)."""
        return NumericTransform.from_feature_map(self)

    @property
    def num_categorical(self) -> int:
        return len(self.categorical_fields)

    @property
    def num_numeric(self) -> int:
        return len(self.numeric_fields)

    @property
    def oov_ids(self) -> list[int]:
        """Per categorical field, the id of a value its vocabulary does not hold (the recorded
        id layout's ``oov``; a capped field hashes such values, and keeps this id unused).

        Raises:
            DataError: the feature map records no id layout (a placeholder).
        """
        oov = (self.extra.get("id_layout") or {}).get("oov")
        if oov is None:
            raise DataError(f"{self.source}: records no id layout (prepare the data again)")
        return [int(oov)] * self.num_categorical

    @classmethod
    def placeholder(
        cls,
        categorical_fields: list[str] | tuple[str, ...],
        numeric_fields: list[str] | tuple[str, ...],
        numeric_buckets: int = 0,
    ) -> FeatureMap:
        """A feature map of these fields with tiny vocabularies and unit statistics, for
        building a model before any data is prepared (the rule book's ``meta`` build): the
        same class, so a model reads the same attributes as in training.

        Args:
            numeric_buckets: as ``features.numeric_buckets``; >= 2 gives each numeric field
                ``numeric_buckets - 1`` boundaries.
        """
        numeric = list(numeric_fields)
        return cls(
            categorical_fields=list(categorical_fields),
            vocab_sizes=[2] * len(categorical_fields),
            numeric_fields=numeric,
            numeric_mean=[0.0] * len(numeric),
            numeric_std=[1.0] * len(numeric),
            numeric_missing_rate=[0.0] * len(numeric),
            bucket_boundaries=(
                [[float(b) for b in range(numeric_buckets - 1)] for _ in numeric]
                if numeric_buckets >= 2
                else None
            ),
            numeric_original_mean=[0.0] * len(numeric),
            numeric_original_std=[1.0] * len(numeric),
            source="<placeholder feature map>",
        )

    @classmethod
    def load(cls, path: str | Path) -> FeatureMap:
        """Read ``DIR/feature_map.json`` (``path`` may be the directory or the file)."""
        path = Path(path)
        file = path / FEATURE_MAP_FILE if path.is_dir() else path
        try:
            data = json.loads(file.read_text())
        except FileNotFoundError:
            raise DataError(
                f"{file}: no feature map (prepare the data first: ctrcal prepare ... --out DIR)"
            ) from None
        except (OSError, json.JSONDecodeError) as exc:
            raise DataError(f"{file}: unreadable feature map: {exc}") from None
        return cls.from_dict(data, str(file))

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>") -> FeatureMap:
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise DataError(
                f"{source}: feature map schema version {version!r}, expected {SCHEMA_VERSION} "
                "(prepare the data again)"
            )
        feats = data["features"]
        cats = [f for f in feats if f["kind"] == "categorical"]
        nums = [f for f in feats if f["kind"] == "numeric"]
        buckets = [f.get("bucket_boundaries") for f in nums]
        has_original = bool(nums) and all("original_std" in f for f in nums)
        return cls(
            categorical_fields=[f["name"] for f in cats],
            vocab_sizes=[int(f["vocab_size"]) for f in cats],
            numeric_fields=[f["name"] for f in nums],
            numeric_mean=[float(f["mean"]) for f in nums],
            numeric_std=[float(f["std"]) for f in nums],
            numeric_missing_rate=[float(f["missing_rate"]) for f in nums],
            bucket_boundaries=buckets if nums and all(b is not None for b in buckets) else None,
            numeric_transform=data["pipeline"]["numeric_transform"],
            layout=data.get("layout"),
            splits=data.get("splits", {}),
            source_hash=data.get("source_hash"),
            extra=data,
            numeric_original_mean=[float(f["original_mean"]) for f in nums]
            if has_original
            else None,
            numeric_original_std=[float(f["original_std"]) for f in nums] if has_original else None,
            source=source,
        )


def load_feature_map(path: str | Path) -> FeatureMap:
    """Shorthand for :meth:`FeatureMap.load`."""
    return FeatureMap.load(path)


def check_prepared_layout(cfg: Any, feature_map: Any, data_dir: Path) -> None:
    """``data.layout`` of ``cfg`` against each Criteo source of prepared data (its feature
    map's ``sources``), by :func:`~ctrcal.core.criteo_schema.check_layout`; data prepared by
    a schema, or a config with one, is read by its schema, not a layout.

    Raises:
        DataError: naming the data, the source, both layouts and the config's key.
    """
    configured = cfg.data.layout
    extra = feature_map.extra or {}
    if configured == "auto" or cfg.data.schema is not None or extra.get("schema"):
        return
    for source in extra.get("sources") or []:
        where = f"{data_dir}: prepared from {source['path']}"
        try:
            check_layout(configured, source["layout"], where, guessed=False)
        except DataError as exc:
            raise DataError(f"{exc} [{cfg.where('data.layout')}]") from None
