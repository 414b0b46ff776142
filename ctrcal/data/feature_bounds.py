"""The bounds of :class:`~ctrcal.preparation.features.FeaturePipeline`'s parameters: their one
statement. The pipeline checks itself against them and the rule book checks a config's
``features`` section against them; they live apart from the pipeline so that the rule book
reads them without loading polars (``train`` and ``evaluate`` never need it)."""

from __future__ import annotations

from ctrcal.core.constraints import Constraint, Interval

__all__ = ["FEATURE_PARAMETER_CONSTRAINTS"]

FEATURE_PARAMETER_CONSTRAINTS: dict[str, Constraint] = {
    "min_count": Interval(int, low=1),
    "max_vocab": Interval(int, low=0),  # 0 = no cap
    "hash_buckets": Interval(int, low=1),
    "numeric_buckets": Interval(int, low=2, off=0),
}
