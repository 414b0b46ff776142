"""Input drift of an analysis file against a reference, thresholded by the reference itself.

A label-free estimate is only as good as its assumption, and its assumption breaks when the
inputs move. This module measures how far they moved, chunk by chunk, and says when that is
more than the reference's own chunk-to-chunk variation allows (NannyML's approach):

* **univariate, per feature**: the Jensen–Shannon distance (base 2, in [0, 1]) between the
  chunk's histogram and the reference's. A numeric feature is binned on the reference's
  quantiles (``bins`` bins, equal edges merged) plus a bin for missing values; a categorical
  feature on its ``max_categories`` most frequent reference values, one bin for the other
  reference values, one for missing values and one for **unseen** values (never in the
  reference), whose fraction is reported as well.
* **multivariate**: a domain classifier (scikit-learn's ``HistGradientBoostingClassifier``)
  tells the chunk's rows from as many reference rows, two-fold cross-fitted; the AUC of its
  out-of-fold scores is the drift score (0.5: indistinguishable). Numeric features enter as
  they are, a categorical one as the reference frequency of its value (unseen: 0). Its
  out-of-fold scores of the reference rows are the density ratios of importance weighting
  (:attr:`ChunkDrift.density_ratio`).

**Thresholds** come from the reference cut into chunks of the same size: each reference
chunk is scored against the rest of the reference (its histogram removed from the reference's;
a value found only in that chunk counts as unseen; the domain classifier trained against
reference rows outside it). Under the null (an analysis chunk drawn like the reference) a
score is one more draw of those values, so the threshold is the upper bound of a one-sided
prediction interval, ``mean + t · sd · sqrt(1 + 1/R)`` over the R reference scores, at level
``1 − alarm_rate / m``: Bonferroni over the ``m`` scores of a chunk (every feature and the
multivariate score), so that a clean chunk raises any alarm with probability at most about
``alarm_rate`` (exactly so where the reference scores are normal; the Jensen–Shannon distance,
a square root of a nearly chi-square divergence, is close to normal).

**Trust** (:func:`trusted`): an estimate of a chunk is trusted only when no score of that
chunk alarms. Every label-free estimator assumes something a drift can break, and no
drift score tells a harmless shift from a harmful one, so any alarm withdraws the trust.

A chunk is a run of consecutive rows (in time order where the file has a time column); the
analysis is cut into ``rows // chunk_rows`` near-equal chunks (each at least ``chunk_rows``
rows), the reference likewise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ctrcal.metrics._registry import declare_metric

__all__ = [
    "MIN_CHUNK_ROWS",
    "MIN_REFERENCE_CHUNKS",
    "TRUST_RULE",
    "ChunkDrift",
    "DriftMonitor",
    "DriftScore",
    "chunk_bounds",
    "feature_kind",
    "js_distance",
    "trusted",
]

MIN_CHUNK_ROWS = 200  # fewer rows: a histogram of 10+ bins and a 2-fold classifier are noise
MIN_REFERENCE_CHUNKS = 10  # fewer reference chunks cannot estimate a threshold's spread
MAX_THRESHOLD_CHUNKS = 20  # reference chunks the domain classifier is refitted on (cost)
UNIVARIATE, MULTIVARIATE = "jensen_shannon", "domain_classifier"

TRUST_RULE = (
    "an estimate of a chunk is trusted only when none of the chunk's drift scores (any "
    "feature's Jensen–Shannon distance, the domain classifier's AUC) exceeds its threshold"
)


def feature_kind(values: np.ndarray) -> str:
    """``"numeric"`` for a floating-point column, ``"categorical"`` for anything else
    (integers, text, booleans): the one rule by which a feature column is binned."""
    return "numeric" if np.asarray(values).dtype.kind == "f" else "categorical"


def js_distance(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Jensen–Shannon distance (base 2) between histograms along the last axis.

    Args:
        p, q: [..., k] counts or probabilities (each row normalised here), broadcastable.

    Returns:
        [...] distances in [0, 1]; 0 for equal distributions.
    """
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    p = p / np.maximum(p.sum(axis=-1, keepdims=True), 1e-300)
    q = q / np.maximum(q.sum(axis=-1, keepdims=True), 1e-300)
    m = 0.5 * (p + q)

    def kl(a: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(a > 0, a * np.log2(a / np.where(m > 0, m, 1.0)), 0.0)
        return t.sum(axis=-1)

    return np.sqrt(np.clip(0.5 * (kl(p) + kl(q)), 0.0, 1.0))


def chunk_bounds(rows: int, chunk_rows: int) -> np.ndarray:
    """[C+1] row offsets of ``max(1, rows // chunk_rows)`` near-equal consecutive chunks."""
    count = max(1, rows // chunk_rows)
    return np.linspace(0, rows, count + 1).round().astype(np.int64)


@dataclass(frozen=True)
class DriftScore:
    """One drift score of one chunk: ``feature`` is None for the multivariate method."""

    chunk: int
    method: str
    feature: str | None
    value: float
    threshold: float
    unseen: float | None = None  # categorical only: the fraction of unseen values

    @property
    def alarm(self) -> bool:
        return bool(self.value > self.threshold)

    def as_dict(self) -> dict[str, Any]:
        out = {
            "chunk": self.chunk,
            "method": self.method,
            "feature": self.feature,
            "value": self.value,
            "threshold": self.threshold,
            "alarm": self.alarm,
        }
        if self.unseen is not None:
            out["unseen"] = self.unseen
        return out


@dataclass(frozen=True)
class ChunkDrift:
    """Every drift score of one analysis chunk.

    Attributes:
        chunk: its index; ``start``/``stop`` its rows.
        scores: univariate scores (one per feature) and the multivariate one.
        reference_rows: [r] indices of the reference rows the domain classifier saw.
        density_ratio: [r] P(chunk | x) / P(reference | x) of those rows from the
            classifier's out-of-fold scores (class sizes equal), unclipped.
    """

    chunk: int
    start: int
    stop: int
    scores: list[DriftScore]
    reference_rows: np.ndarray = field(repr=False)
    density_ratio: np.ndarray = field(repr=False)

    @property
    def alarm(self) -> bool:
        return any(s.alarm for s in self.scores)

    @property
    def trusted(self) -> bool:
        return trusted(self.scores)


def trusted(scores: list[DriftScore]) -> bool:
    """The trust rule (:data:`TRUST_RULE`): no score of the chunk alarms."""
    return not any(s.alarm for s in scores)


def _threshold(values: np.ndarray, level: float) -> float:
    """Upper bound of the one-sided prediction interval at ``level`` for one more draw."""
    from scipy.special import stdtrit  # scipy comes with scikit-learn

    v = values[np.isfinite(values)]
    r = v.size
    t = float(stdtrit(r - 1, level))
    return float(v.mean() + t * v.std(ddof=1) * np.sqrt(1.0 + 1.0 / r))


class DriftMonitor:
    """Drift of analysis chunks against a reference (module docstring); fit / transform.

    Args:
        chunk_rows: rows per chunk (the analysis has ``rows // chunk_rows`` chunks).
        alarm_rate: the false-alarm rate per clean chunk, all scores together.
        bins: quantile bins of a numeric feature.
        max_categories: most frequent reference values a categorical feature keeps apart.
        classifier_rows: rows of each side the domain classifier sees at most (a chunk and
            the reference are subsampled to it).
        seed: seeds the subsamples and the classifier.
    """

    def __init__(
        self,
        chunk_rows: int,
        *,
        alarm_rate: float = 0.05,
        bins: int = 10,
        max_categories: int = 50,
        classifier_rows: int = 5_000,
        seed: int = 0,
    ) -> None:
        self.chunk_rows = chunk_rows
        self.alarm_rate = alarm_rate
        self.bins = bins
        self.max_categories = max_categories
        self.classifier_rows = classifier_rows
        self.seed = seed

    # -- fit -------------------------------------------------------------------------------

    def fit(self, reference: Mapping[str, Any]) -> DriftMonitor:
        """Learn bins, categories and thresholds from ``reference`` (name -> [n] values).

        Raises:
            ValueError: no features, columns of different lengths, a feature without any
                value, or a reference too small for ``chunk_rows`` (fewer than
                :data:`MIN_REFERENCE_CHUNKS` chunks) or chunks below :data:`MIN_CHUNK_ROWS`.
        """
        if not 0.0 < self.alarm_rate < 1.0:
            raise ValueError(f"alarm_rate: expected a rate in (0, 1), got {self.alarm_rate!r}")
        cols = _columns(reference, "reference")
        n = _rows(cols, "reference")
        if self.chunk_rows < MIN_CHUNK_ROWS:
            raise ValueError(
                f"chunks of {self.chunk_rows:,} rows are too small for a drift threshold "
                f"(at least {MIN_CHUNK_ROWS:,})"
            )
        if n // self.chunk_rows < MIN_REFERENCE_CHUNKS:
            raise ValueError(
                f"chunks of {self.chunk_rows:,} rows are too large for their threshold: the "
                f"reference's {n:,} rows make {n // self.chunk_rows} chunk(s), and a threshold "
                f"needs at least {MIN_REFERENCE_CHUNKS} (use chunks of at most "
                f"{n // MIN_REFERENCE_CHUNKS:,} rows, or a larger reference)"
            )
        self.features_ = list(cols)
        self.kinds_ = {k: feature_kind(v) for k, v in cols.items()}
        self.rows_ = n
        self.edges_: dict[str, np.ndarray] = {}
        self.categories_: dict[str, np.ndarray] = {}
        self.values_: dict[str, np.ndarray] = {}
        self.frequencies_: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        bounds = chunk_bounds(n, self.chunk_rows)
        chunk_of = np.repeat(np.arange(bounds.size - 1), np.diff(bounds))
        self.n_bins_: dict[str, int] = {}
        self.reference_counts_: dict[str, np.ndarray] = {}
        reference_js: dict[str, np.ndarray] = {}
        for name, v in cols.items():
            codes = self._fit_feature(name, v)
            k = self.n_bins_[name]
            per_chunk = np.bincount(chunk_of * k + codes, minlength=(bounds.size - 1) * k)
            per_chunk = per_chunk.reshape(-1, k)
            total = per_chunk.sum(axis=0)
            self.reference_counts_[name] = total
            if self.kinds_[name] == "categorical":
                per_chunk = self._unseen_in_rest(name, v, chunk_of, per_chunk)
            reference_js[name] = js_distance(per_chunk, total[None, :] - per_chunk)
        self.tests_ = len(self.features_) + 1
        level = 1.0 - self.alarm_rate / self.tests_
        self.reference_scores_ = reference_js
        self.thresholds_ = {k: _threshold(v, level) for k, v in reference_js.items()}
        rng = np.random.default_rng(self.seed)
        # half the reference counts the categorical values the classifier reads, the other
        # half is what it compares: rows of the counting half would be told by their rare
        # values, which are never unseen to themselves
        counting = rng.random(n) < 0.5
        self._count_values(cols, counting)
        self.matrix_ = self._matrix(cols)
        self.compared_ = np.flatnonzero(~counting)
        picks = np.linspace(0, bounds.size - 2, min(MAX_THRESHOLD_CHUNKS, bounds.size - 1))
        aucs = []
        for c in np.unique(picks.round().astype(np.int64)):
            here = (self.compared_ >= bounds[c]) & (self.compared_ < bounds[c + 1])
            a = self._sample(self.compared_[here], rng)
            rest = self.compared_[~here]
            b = np.sort(rng.choice(rest, size=min(a.size, rest.size), replace=False))
            aucs.append(self._classify(self.matrix_[a], self.matrix_[b], rng)[0])
        self.reference_scores_[MULTIVARIATE] = np.asarray(aucs)
        self.thresholds_[MULTIVARIATE] = _threshold(np.asarray(aucs), level)
        return self

    def _fit_feature(self, name: str, v: np.ndarray) -> np.ndarray:
        """Learn one feature's bins; its reference codes."""
        if self.kinds_[name] == "numeric":
            x = v.astype(np.float64, copy=False)
            finite = x[np.isfinite(x)]
            q = np.quantile(finite, np.arange(1, self.bins) / self.bins)
            self.edges_[name] = np.unique(q)
            self.n_bins_[name] = self.edges_[name].size + 2  # + the top bin + missing
        else:
            values, _, counts = _factorize(v)
            order = np.argsort(-counts, kind="stable")[: self.max_categories]
            keep = values[np.sort(order)]
            self.categories_[name] = keep
            self.values_[name] = values
            self.n_bins_[name] = keep.size + 3  # + other + missing + unseen
        return self._codes(name, v)

    def _codes(self, name: str, v: np.ndarray) -> np.ndarray:
        """[n] bin of each value of a feature (the last bins: missing, and for a categorical
        one other, missing, unseen)."""
        k = self.n_bins_[name]
        if self.kinds_[name] == "numeric":
            x = v.astype(np.float64, copy=False)
            codes = np.searchsorted(self.edges_[name], x, side="left")
            codes[~np.isfinite(x)] = k - 1
            return codes
        keep = self.categories_[name]
        known = self.values_[name]
        missing = _missing(v)
        codes = np.full(v.shape[0], k - 3, dtype=np.int64)  # other
        val = v[~missing]
        pos = np.clip(np.searchsorted(keep, val), 0, max(keep.size - 1, 0))
        hit = keep[pos] == val if keep.size else np.zeros(val.shape, dtype=bool)
        seen_pos = np.clip(np.searchsorted(known, val), 0, known.size - 1)
        seen = known[seen_pos] == val
        inner = np.where(hit, pos, np.where(seen, k - 3, k - 1))
        codes[~missing] = inner
        codes[missing] = k - 2
        return codes

    def _unseen_in_rest(
        self, name: str, v: np.ndarray, chunk_of: np.ndarray, per_chunk: np.ndarray
    ) -> np.ndarray:
        """Reference chunk histograms with the rows whose value occurs in no other chunk moved
        to the unseen bin (against the rest of the reference they are unseen)."""
        missing = _missing(v)
        _, inverse, counts = _factorize(v)
        k = self.n_bins_[name]
        pair = chunk_of.astype(np.int64) * (counts.size + 1) + inverse
        _, pair_inv, pair_counts = np.unique(pair, return_inverse=True, return_counts=True)
        total = np.append(counts, 0)[inverse]  # a missing value's total: never equal
        only_here = (pair_counts[pair_inv.reshape(-1)] == total) & ~missing
        if not only_here.any():
            return per_chunk
        codes = self._codes(name, v)[only_here]
        out = per_chunk.copy()
        moved = np.bincount(chunk_of[only_here] * k + codes, minlength=per_chunk.size).reshape(
            per_chunk.shape
        )
        out -= moved
        out[:, k - 1] += moved.sum(axis=1)
        return out

    def _count_values(self, cols: Mapping[str, np.ndarray], rows: np.ndarray) -> None:
        """Learn each categorical value's frequency among the reference's ``rows``."""
        for name, v in cols.items():
            if self.kinds_[name] == "categorical":
                values, _, counts = _factorize(v[rows])
                self.frequencies_[name] = (values, counts / max(int(rows.sum()), 1))

    def _matrix(self, cols: Mapping[str, np.ndarray]) -> np.ndarray:
        """[n, F] float32 inputs of the domain classifier: numerics as they are (NaN kept),
        a categorical value as its frequency in the reference's counting half (never seen
        there: 0; missing: NaN)."""
        n = _rows(cols, "analysis")
        out = np.empty((n, len(self.features_)), dtype=np.float32)
        for j, name in enumerate(self.features_):
            v = cols[name]
            if self.kinds_[name] == "numeric":
                out[:, j] = v.astype(np.float64, copy=False)
                continue
            known, freq = self.frequencies_[name]
            missing = _missing(v)
            col = np.full(n, np.nan, dtype=np.float32)
            val = v[~missing]
            pos = np.clip(np.searchsorted(known, val), 0, known.size - 1)
            col[~missing] = np.where(known[pos] == val, freq[pos], 0.0)
            out[:, j] = col
        return out

    def _sample(self, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if rows.size <= self.classifier_rows:
            return rows
        return np.sort(rng.choice(rows, size=self.classifier_rows, replace=False))

    def _classify(
        self, a: np.ndarray, b: np.ndarray, rng: np.random.Generator
    ) -> tuple[float, np.ndarray]:
        """(cross-fitted AUC of telling ``a`` from ``b``, out-of-fold P(a | x) of ``b``'s rows)."""
        from sklearn.ensemble import HistGradientBoostingClassifier
        from threadpoolctl import threadpool_limits

        from ctrcal.metrics._metrics import auc

        x = np.concatenate([a, b])
        y = np.concatenate([np.ones(a.shape[0]), np.zeros(b.shape[0])])
        fold = rng.permutation(x.shape[0]) % 2
        score = np.empty(x.shape[0])
        for k in (0, 1):
            model = HistGradientBoostingClassifier(
                max_iter=30,
                learning_rate=0.15,
                max_leaf_nodes=15,
                max_bins=64,
                min_samples_leaf=40,
                early_stopping=False,
                random_state=int(rng.integers(2**31)),
            )
            # one thread: these fits are small, and OpenMP's threads waiting on a busy
            # machine cost them 10-50x
            with threadpool_limits(1):
                model.fit(x[fold != k], y[fold != k])
                score[fold == k] = model.predict_proba(x[fold == k])[:, 1]
        return auc(score, y), score[a.shape[0] :]

    # -- transform -------------------------------------------------------------------------

    def transform(self, analysis: Mapping[str, Any]) -> list[ChunkDrift]:
        """Every drift score of every analysis chunk.

        Raises:
            ValueError: features other than the reference's, columns of different lengths,
                a feature without any value, or fewer rows than one chunk.
        """
        cols = _columns(analysis, "analysis")
        if list(cols) != self.features_:
            extra = sorted(set(cols) - set(self.features_))
            lacking = sorted(set(self.features_) - set(cols))
            raise ValueError(
                "the analysis and the reference have different feature columns"
                + (f"; only in the analysis: {', '.join(extra)}" if extra else "")
                + (f"; only in the reference: {', '.join(lacking)}" if lacking else "")
                + ("; same columns in another order" if not extra and not lacking else "")
            )
        for name in self.features_:
            if feature_kind(cols[name]) != self.kinds_[name]:
                raise ValueError(
                    f"feature {name!r} is {self.kinds_[name]} in the reference and "
                    f"{feature_kind(cols[name])} in the analysis"
                )
        n = _rows(cols, "analysis")
        if n < self.chunk_rows:
            raise ValueError(
                f"the analysis has {n:,} rows, fewer than one chunk of {self.chunk_rows:,}"
            )
        bounds = chunk_bounds(n, self.chunk_rows)
        chunks = bounds.size - 1
        chunk_of = np.repeat(np.arange(chunks), np.diff(bounds))
        scores: list[list[DriftScore]] = [[] for _ in range(chunks)]
        for name in self.features_:
            codes = self._codes(name, cols[name])
            k = self.n_bins_[name]
            hist = np.bincount(chunk_of * k + codes, minlength=chunks * k).reshape(chunks, k)
            js = js_distance(hist, self.reference_counts_[name][None, :])
            categorical = self.kinds_[name] == "categorical"
            unseen = hist[:, k - 1] / hist.sum(axis=1) if categorical else None
            for c in range(chunks):
                scores[c].append(
                    DriftScore(
                        c,
                        UNIVARIATE,
                        name,
                        float(js[c]),
                        self.thresholds_[name],
                        None if unseen is None else float(unseen[c]),
                    )
                )
        matrix = self._matrix(cols)
        rng = np.random.default_rng(self.seed + 1)
        out = []
        for c in range(chunks):
            a = self._sample(np.arange(bounds[c], bounds[c + 1]), rng)
            pool = self.compared_
            b = np.sort(rng.choice(pool, size=min(a.size, pool.size), replace=False))
            value, q = self._classify(matrix[a], self.matrix_[b], rng)
            q = np.clip(q, 1e-6, 1.0 - 1e-6)
            scores[c].append(
                DriftScore(c, MULTIVARIATE, None, value, self.thresholds_[MULTIVARIATE])
            )
            ratio = q / (1.0 - q) * (b.size / a.size)
            out.append(ChunkDrift(c, int(bounds[c]), int(bounds[c + 1]), scores[c], b, ratio))
        return out


def _missing(v: np.ndarray) -> np.ndarray:
    if v.dtype.kind == "f":
        return np.isnan(v)
    if v.dtype.kind == "O":
        return np.asarray([x is None or (isinstance(x, float) and x != x) for x in v], bool)
    return np.zeros(v.shape[0], dtype=bool)


def _factorize(v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sorted distinct present values, [n] index of each row's value (missing: the count
    of values), count of each value)."""
    missing = _missing(v)
    present = v[~missing]
    if present.dtype.kind == "O":
        present = present.astype(str)
    values, inv, counts = np.unique(present, return_inverse=True, return_counts=True)
    inverse = np.full(v.shape[0], values.size, dtype=np.int64)
    inverse[~missing] = inv.reshape(-1)
    return values, inverse, counts


def _columns(features: Mapping[str, Any], what: str) -> dict[str, np.ndarray]:
    if not features:
        raise ValueError(f"the {what} has no feature columns")
    out = {}
    for name, values in features.items():
        v = np.asarray(values)
        if v.dtype.kind == "O":
            missing = _missing(v)
            v = v.copy()
            v[~missing] = v[~missing].astype(str)
        if _missing(v).all():
            raise ValueError(f"feature {name!r} has no value in the {what} (all missing)")
        out[str(name)] = v
    return out


def _rows(cols: Mapping[str, np.ndarray], what: str) -> int:
    lengths = {v.shape[0] for v in cols.values()}
    if len(lengths) != 1:
        raise ValueError(f"the {what}'s feature columns have different lengths")
    return lengths.pop()


declare_metric(
    UNIVARIATE,
    label="Jensen–Shannon distance",
    definition="Jensen–Shannon distance (base 2, 0–1) between a chunk's histogram of one "
    "feature and the reference's (numeric: the reference's quantile bins + missing; "
    "categorical: its most frequent values + other + missing + unseen).",
    better="lower",
    computed_by="DriftMonitor",
    kind="drift",
    section="drift",
    bounds=(0.0, 1.0),
)
declare_metric(
    MULTIVARIATE,
    label="domain classifier AUC",
    definition="AUC of a domain classifier (gradient-boosted trees, two-fold cross-fitted) "
    "telling a chunk's rows from as many reference rows; 0.5: indistinguishable.",
    better="lower",
    computed_by="DriftMonitor",
    kind="drift",
    section="drift",
    bounds=(0.0, 1.0),
)
declare_metric(
    "unseen",
    label="unseen values",
    definition="fraction of a chunk's rows whose categorical value never occurs in the reference.",
    better="lower",
    computed_by="DriftMonitor",
    kind="drift",
    section="drift",
    bounds=(0.0, 1.0),
)
