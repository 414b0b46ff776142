"""The feature pipeline: train counts -> vocabularies and numeric statistics; the feature map.

:class:`FeaturePipeline` is fitted on the train split only; the prepare job
(:mod:`ctrcal.preparation.encode`) asks it the code of each distinct value and writes the
encoded columns the loader reads:

* ``label`` float32 (null when the source has no labels);
* ``I1..I13`` float32 in *model-input space*, null = missing. The default transform
  (``log_standardize``) is the sign-aware log ``t = sign(x)·log1p(|x|)`` followed by
  ``(t - mean) / std`` with the train split's mean and std of ``t``; ``standardize`` skips the
  log; ``identity`` keeps the values (Criteo_x1, already scaled). ``auto`` means identity for
  Criteo_x1 and ``log_standardize`` otherwise (see :func:`resolve_numeric_transform`);
* ``C1..C26`` int32 field-local ids with this layout::

      0 = PAD_ID      padding, never produced by the data (free for sequence models)
      1 = MISSING_ID  the value was missing
      2 = OOV_ID      seen fewer than ``min_count`` times in train, or never seen
      3 ...           kept values, ordered by train frequency (most frequent first; ties by
                      the value), so ``vocab_size = 3 + number of kept values``
      3 + K ...       with ``max_vocab = K``, for a field with more than K values seen at least
                      ``min_count`` times: the K most frequent keep their ids and every other
                      value (rarer, beyond the cap, or never seen) takes one of ``hash_buckets``
                      ids by a fixed hash of the value (as DLRM caps its tables), so
                      ``vocab_size = 3 + K + hash_buckets``; a field within the cap is as above

Fitting reads exact counts (:class:`FitStats`): per categorical field the count of each
value, per numeric field the count of each distinct raw value (a histogram: Criteo numerics
are integer counts). They can be accumulated chunk by chunk and merged, so a train split
larger than memory fits to exactly the state of fitting it at once -- the same vocabularies,
and a mean, std and quantile boundaries computed from the same histogram.

The learned state (vocabularies and numeric statistics) is saved as ``feature_map.json``
(human-readable: schema version, per-feature kind, vocabulary size, statistics, the hash of the
sources and pipeline config) plus ``vocab.parquet`` (the kept values and their ids).
:class:`FeatureMap` is the read-only view models and the shift module use; its
``numeric_std`` is each feature's train-split standard deviation in model-input space
(after the transform, over non-missing values); ``numeric_original_mean`` /
``numeric_original_std`` are the same statistics of the values as they stand in the input file
(original space), and :meth:`FeatureMap.numeric_codec` maps batches between the two spaces
(:mod:`ctrcal.data.numeric`).
"""

from __future__ import annotations

import math
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import polars as pl

from ctrcal.core.constraints import Constraint, check_parameters
from ctrcal.core.criteo_schema import CATEGORICAL_COLUMNS, LABEL, NUMERIC_COLUMNS
from ctrcal.core.errors import DataError
from ctrcal.core.ids import MISSING_ID, NUM_RESERVED, OOV_ID, PAD_ID
from ctrcal.core.utils import atomic_path, write_json_atomic
from ctrcal.data.feature_bounds import FEATURE_PARAMETER_CONSTRAINTS
from ctrcal.data.feature_map import FEATURE_MAP_FILE, SCHEMA_VERSION, FeatureMap
from ctrcal.preparation.coder import check_string_hash
from ctrcal.preparation.fit_stats import FitStats, weighted_moments, weighted_quantiles
from ctrcal.preparation.lookup import ValueIndex

VOCAB_FILE = "vocab.parquet"


NUMERIC_TRANSFORMS = ("log_standardize", "standardize", "identity")


def resolve_numeric_transform(name: str, layout: str | None) -> str:
    """``auto`` -> ``identity`` for Criteo_x1 (already scaled), else ``log_standardize``."""
    if name == "auto":
        return "identity" if layout == "x1" else "log_standardize"
    if name not in NUMERIC_TRANSFORMS:
        raise DataError(
            f"unknown numeric transform {name!r} (valid: auto, {', '.join(NUMERIC_TRANSFORMS)})"
        )
    return name


# ---------------------------------------------------------------------------------------------
# Pipeline


def _signed_log(x: np.ndarray) -> np.ndarray:
    """``sign(x) * log1p(|x|)`` (float64; NaN stays NaN)."""
    t = np.log1p(np.abs(x))
    return np.copysign(t, x, out=t)


class FeaturePipeline:
    """Fit vocabularies and numeric statistics on train; answer each distinct value's code.

    Args:
        min_count: keep a categorical value seen at least this many times in train.
        numeric_transform: ``log_standardize``, ``standardize`` or ``identity`` (resolve
            ``auto`` first with :func:`resolve_numeric_transform`).
        numeric_buckets: when > 0, also store ``numeric_buckets - 1`` quantile boundaries per
            numeric field (model-input space) for bucketised embeddings.
        max_vocab: when > 0, at most this many kept values per categorical field; a field with
            more hashes every value but its ``max_vocab`` most frequent into
            ``hash_buckets`` ids (see the module docstring).
        hash_buckets: the number of hashed ids of a capped field.
        categorical_fields / numeric_fields: the columns to encode.

    The prepare job (:mod:`ctrcal.preparation.encode`) counts the train split's distinct
    values chunk by chunk into a :class:`FitStats`, calls :meth:`fit_stats`, asks
    :meth:`categorical_ids` and the numeric transform once per distinct value, and gathers the
    answers for every row of every split; serving (:mod:`ctrcal.serving`) reloads the fitted
    state with :meth:`load` and encodes raw rows the same way.

    ``_parameter_constraints`` holds the bounds of the numeric parameters, the one statement
    of them: the rule book checks a config's ``features`` section against it.
    """

    _parameter_constraints: ClassVar[dict[str, Constraint]] = FEATURE_PARAMETER_CONSTRAINTS

    def __init__(
        self,
        min_count: int = 10,
        numeric_transform: str = "log_standardize",
        numeric_buckets: int = 0,
        categorical_fields: tuple[str, ...] | list[str] = CATEGORICAL_COLUMNS,
        numeric_fields: tuple[str, ...] | list[str] = NUMERIC_COLUMNS,
        max_vocab: int = 0,
        hash_buckets: int = 1000,
    ) -> None:
        self.min_count = min_count
        self.numeric_transform = numeric_transform
        self.numeric_buckets = numeric_buckets
        self.max_vocab = max_vocab
        self.hash_buckets = hash_buckets
        self.categorical_fields = list(categorical_fields)
        self.numeric_fields = list(numeric_fields)

    # -- config ---------------------------------------------------------------------------

    def get_params(self) -> dict[str, Any]:
        return {
            "min_count": self.min_count,
            "numeric_transform": self.numeric_transform,
            "numeric_buckets": self.numeric_buckets,
            "categorical_fields": self.categorical_fields,
            "numeric_fields": self.numeric_fields,
            "max_vocab": self.max_vocab,
            "hash_buckets": self.hash_buckets,
        }

    def _check_params(self) -> None:
        if self.numeric_transform not in NUMERIC_TRANSFORMS:
            raise DataError(
                f"numeric_transform must be one of {', '.join(NUMERIC_TRANSFORMS)} "
                f"(resolve 'auto' first), got {self.numeric_transform!r}"
            )
        check_parameters(self, self._parameter_constraints, DataError)

    # -- numeric expressions --------------------------------------------------------------

    def _pre(self, x: np.ndarray) -> np.ndarray:
        """[N] float64 raw values -> the values before standardisation (a new float64 array)."""
        if self.numeric_transform == "log_standardize":
            return _signed_log(x)
        return np.array(x, dtype=np.float64)

    def _model_values(self, x: np.ndarray, j: int) -> np.ndarray:
        """[N] float64 raw values of numeric field ``j`` (NaN = missing) -> [N] float32
        model-input values (NaN where missing). The one definition of the numeric encoding:
        the encoded columns and the bucket boundaries both come from it."""
        t = self._pre(x)
        t -= self.center_[j]
        t /= self.scale_[j]
        return t.astype(np.float32)

    # -- fit ------------------------------------------------------------------------------

    def fit_stats(self, stats: FitStats, executor: Executor | None = None) -> FeaturePipeline:
        """Learn the state from exact train statistics accumulated chunk by chunk.

        Since the statistics are exact counts, any chunking of the same rows gives the same
        fitted state, bit for bit. With an ``executor``, the fields are fitted side by side on
        its threads (the state does not depend on it).
        """
        self._check_params()
        rows = stats.rows
        if rows == 0:
            raise DataError("cannot fit the feature pipeline on an empty train split")
        run = executor.map if executor is not None else map
        self.rows_ = rows
        self.vocab_ = {}
        self.hashed_ = {}
        self.distinct_ = {}
        self.categorical_missing_rate_ = {}
        kept_by_field = run(self._kept, (stats.counts(n) for n in self.categorical_fields))
        for name, (distinct, kept) in zip(self.categorical_fields, kept_by_field, strict=True):
            self.distinct_[name] = distinct
            capped = 0 < self.max_vocab < kept.height
            self.hashed_[name] = self.hash_buckets if capped else 0
            if capped:
                kept = kept.head(self.max_vocab)
            self.vocab_[name] = kept
            self.categorical_missing_rate_[name] = stats.nulls[name] / rows
        mean, std = [], []
        self.original_mean_, self.original_std_ = [], []
        moments = run(self._moments, (stats.counts(n) for n in self.numeric_fields))
        for m, s, original_m, original_s in moments:
            mean.append(m)
            std.append(s)
            self.original_mean_.append(original_m)
            self.original_std_.append(original_s)
        if self.numeric_transform == "identity":
            self.center_ = [0.0] * len(self.numeric_fields)
            self.scale_ = [1.0] * len(self.numeric_fields)
        else:
            self.center_ = mean
            self.scale_ = [_positive(v) for v in std]
        # Model-input space is an affine map of the statistics above, so its mean and std
        # follow without another pass: z = (t - center) / scale.
        self.numeric_mean_ = [
            (m - c) / k for m, c, k in zip(mean, self.center_, self.scale_, strict=True)
        ]
        self.numeric_std_ = [v / k for v, k in zip(std, self.scale_, strict=True)]
        self.numeric_missing_rate_ = [stats.nulls[n] / rows for n in self.numeric_fields]
        self._fit_buckets(stats)
        return self

    def _kept(self, counts: pl.DataFrame) -> tuple[int, pl.DataFrame]:
        """A categorical field's number of distinct train values and its values seen at least
        ``min_count`` times, most frequent first (ties by value), with their ids."""
        kept = (
            counts.lazy()
            .filter(pl.col("count") >= self.min_count)
            .sort(["count", "value"], descending=[True, False])
            .with_columns((pl.int_range(pl.len(), dtype=pl.Int32) + NUM_RESERVED).alias("id"))
            .collect()
        )
        return counts.height, kept

    def _moments(self, counts: pl.DataFrame) -> tuple[float, float, float, float]:
        """A numeric field's mean and std before standardisation, then of its raw values."""
        raw, t, c = self._histogram(counts)
        return (*weighted_moments(t, c), *weighted_moments(raw, c))

    def _histogram(self, counts: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(raw value, pre-standardisation value t, count) per distinct raw value, in raw-value
        order."""
        counts = counts.sort("value")
        raw = counts["value"].cast(pl.Float64).to_numpy().astype(np.float64)
        c = counts["count"].to_numpy().astype(np.float64)
        return raw, self._pre(raw), c

    def _fit_buckets(self, stats: FitStats) -> None:
        """Quantile boundaries of the encoded train numerics (model-input space).

        Computed exactly from the value histogram: the quantiles of the float32 model-input
        values with linear interpolation between order statistics.
        """
        qs = [k / self.numeric_buckets for k in range(1, self.numeric_buckets)]
        if not qs:
            self.bucket_boundaries_ = None
            return
        self.bucket_boundaries_ = []
        for j, name in enumerate(self.numeric_fields):
            counts = stats.counts(name)
            raw = counts["value"].cast(pl.Float64).to_numpy()
            z = self._model_values(raw, j).astype(np.float64)
            c = counts["count"].to_numpy().astype(np.int64)
            self.bucket_boundaries_.append(weighted_quantiles(z, c, qs))

    def _check_fitted(self) -> None:
        if not hasattr(self, "vocab_"):
            raise DataError(
                "FeaturePipeline is not fitted: call fit_stats(stats) or load(dir) first"
            )

    # -- encoding (the prepare job gathers these answers per distinct value) --------------

    def categorical_ids(self, name: str, values: np.ndarray) -> np.ndarray:
        """[K] int32 ids of field ``name``'s values ([K] integers): a kept value's id, else
        :data:`OOV_ID`, or in a capped field the value's hashed id. The pipeline asks it once
        per distinct value and gathers the answers."""
        ids = self._index(name).lookup(values, OOV_ID)
        buckets = self.hashed_.get(name, 0)
        if buckets:
            other = np.flatnonzero(ids == OOV_ID)
            first = NUM_RESERVED + self.vocab_[name].height
            ids[other] = first + hash_bucket(values[other], buckets)
        return ids

    def _index(self, name: str) -> ValueIndex:
        """The :class:`ValueIndex` of a field's vocabulary (built once per fitted state)."""
        cache = self.__dict__.setdefault("_indexes", {})
        vocab = self.vocab_[name]
        held = cache.get(name)
        if held is None or held[0] is not vocab:
            held = (vocab, ValueIndex(vocab["value"].to_numpy(), vocab["id"].to_numpy()))
            cache[name] = held
        return held[1]

    # -- state ----------------------------------------------------------------------------

    @property
    def vocab_sizes_(self) -> list[int]:
        return [
            NUM_RESERVED + self.vocab_[n].height + self.hashed_.get(n, 0)
            for n in self.categorical_fields
        ]

    def to_dict(self) -> dict[str, Any]:
        """The JSON body of ``feature_map.json`` (without sources and splits)."""
        self._check_fitted()
        features = []
        for j, name in enumerate(self.numeric_fields):
            entry = {
                "name": name,
                "kind": "numeric",
                "dtype": "float32",
                "mean": self.numeric_mean_[j],
                "std": self.numeric_std_[j],
                "missing_rate": self.numeric_missing_rate_[j],
                "transform_center": self.center_[j],
                "transform_scale": self.scale_[j],
            }
            if self.original_std_ is not None:
                entry["original_mean"] = self.original_mean_[j]
                entry["original_std"] = self.original_std_[j]
            if self.bucket_boundaries_ is not None:
                entry["bucket_boundaries"] = self.bucket_boundaries_[j]
            features.append(entry)
        for name, size in zip(self.categorical_fields, self.vocab_sizes_, strict=True):
            features.append(
                {
                    "name": name,
                    "kind": "categorical",
                    "dtype": "int32",
                    "vocab_size": size,
                    "hashed_ids": self.hashed_.get(name, 0),
                    "distinct_in_train": self.distinct_[name],
                    "missing_rate": self.categorical_missing_rate_[name],
                }
            )
        return {
            "schema_version": SCHEMA_VERSION,
            "label": LABEL,
            "pipeline": self.get_params(),
            "id_layout": {
                "padding": PAD_ID,
                "missing": MISSING_ID,
                "oov": OOV_ID,
                "first_value": NUM_RESERVED,
                "order": "train frequency, descending",
            },
            "train_rows_fitted": self.rows_,
            "features": features,
        }

    def save(self, directory: str | Path, extra: dict[str, Any] | None = None) -> Path:
        """Write ``feature_map.json`` and ``vocab.parquet`` into ``directory`` (atomically)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        frames = [
            self.vocab_[n].select(
                pl.lit(n).alias("field"), pl.col("value"), pl.col("id"), pl.col("count")
            )
            for n in self.categorical_fields
        ]
        # a field of 64-bit keys widens the others' uint32 values (equal numbers, one column)
        vocab = pl.concat(frames, how="vertical_relaxed") if frames else pl.DataFrame()
        with atomic_path(directory / VOCAB_FILE) as tmp:
            vocab.write_parquet(tmp)
        body = {**self.to_dict(), **(extra or {})}
        write_json_atomic(directory / FEATURE_MAP_FILE, body)
        return directory / FEATURE_MAP_FILE

    @classmethod
    def load(cls, directory: str | Path) -> FeaturePipeline:
        """Rebuild a fitted pipeline from a prepared directory."""
        directory = Path(directory)
        fmap = FeatureMap.load(directory)
        # its vocabulary's string keys are only good for the hash that made them
        check_string_hash(fmap.extra, str(directory / FEATURE_MAP_FILE))
        params = fmap.extra["pipeline"]
        pipe = cls(**params)
        try:
            vocab = pl.read_parquet(directory / VOCAB_FILE)
        except (OSError, pl.exceptions.PolarsError) as exc:
            raise DataError(f"{directory / VOCAB_FILE}: unreadable vocabulary: {exc}") from None
        nums = [f for f in fmap.extra["features"] if f["kind"] == "numeric"]
        cats = [f for f in fmap.extra["features"] if f["kind"] == "categorical"]
        pipe.rows_ = fmap.extra.get("train_rows_fitted", 0)
        pipe.center_ = [f["transform_center"] for f in nums]
        pipe.scale_ = [f["transform_scale"] for f in nums]
        pipe.numeric_mean_ = [f["mean"] for f in nums]
        pipe.numeric_std_ = [f["std"] for f in nums]
        pipe.original_mean_ = fmap.numeric_original_mean
        pipe.original_std_ = fmap.numeric_original_std
        pipe.numeric_missing_rate_ = [f["missing_rate"] for f in nums]
        pipe.bucket_boundaries_ = fmap.bucket_boundaries
        pipe.distinct_ = {f["name"]: f["distinct_in_train"] for f in cats}
        pipe.hashed_ = {f["name"]: f.get("hashed_ids", 0) for f in cats}
        pipe.categorical_missing_rate_ = {f["name"]: f["missing_rate"] for f in cats}
        pipe.vocab_ = {
            n: vocab.filter(pl.col("field") == n).select("value", "count", "id").sort("id")
            for n in pipe.categorical_fields
        }
        return pipe


def hash_bucket(values: np.ndarray, buckets: int) -> np.ndarray:
    """[K] int32 bucket in ``[0, buckets)`` of each integer value: the top 32 bits of a
    Fibonacci hash (fixed, so a value lands in the same bucket in every split and run)."""
    v = np.asarray(values).astype(np.uint64)
    with np.errstate(over="ignore"):
        mixed = (v * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(32)
    return (mixed % np.uint64(buckets)).astype(np.int32)


def _positive(v: float | None) -> float:
    # a constant (or all-missing) column: divide by 1 instead of 0
    return float(v) if v is not None and math.isfinite(v) and v > 0 else 1.0
