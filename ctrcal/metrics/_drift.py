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
* **pooled over the categorical features**: the unseen-value rate, the fraction of a chunk's
  present categorical values (all features together) that never occur in the reference. A
  per-feature histogram spends one bin of 50+ on unseen values and shares the Bonferroni
  budget with every other feature; values the reference never saw, spread thinly over many
  features (a corruption, a new release of ids), move this one number most.
* **multivariate**: a domain classifier (scikit-learn's ``HistGradientBoostingClassifier``)
  tells the chunk's rows from as many reference rows: fitted on a random half of them, its
  AUC on the other half is the drift score (0.5: indistinguishable). Numeric features enter as
  they are, a categorical one as the reference frequency of its value (unseen: 0). Its
  scores of the reference rows it was not fitted on (every row of the reference's pool but
  its own training half) are the density ratios of importance weighting
  (:attr:`ChunkDrift.density_ratio`). One fit on half the rows, not two cross-fitted: half
  the cost, for an AUC measured on half the rows (its spread, and with it the threshold's
  margin, about 1.4x wider).

**Thresholds** come from the reference cut into chunks of the same size: each reference
chunk is scored against the rest of the reference (its histogram removed from the reference's;
a value found only in that chunk counts as unseen, in its feature's histogram and in the
unseen-value rate; the domain classifier trained against reference rows outside it). Under
the null (an analysis chunk drawn like the reference) a score is one more draw of those
values, so the threshold is the upper bound of a one-sided prediction interval,
``mean + t · sd · sqrt(1 + 1/R)`` over the R reference scores, at level ``1 − alarm_rate / m``:
Bonferroni over the ``m`` scores of a chunk (every feature, the unseen-value rate and the
classifier), so that a clean chunk raises any alarm with probability at most about
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

MIN_CHUNK_ROWS = 200  # fewer rows: a histogram of 10+ bins and a classifier are noise
MIN_REFERENCE_CHUNKS = 10  # fewer reference chunks cannot estimate a threshold's spread
MAX_THRESHOLD_CHUNKS = 20  # reference chunks the domain classifier is refitted on (cost)
UNIVARIATE, MULTIVARIATE = "jensen_shannon", "domain_classifier"
UNSEEN = "unseen_rate"  # pooled over every categorical feature: one score per chunk
TREE_BINS = 32  # bins of each of the domain classifier's inputs
QUANTILE_ROWS = 200_000  # rows a numeric feature's bin edges are taken from, at most

TRUST_RULE = (
    "an estimate of a chunk is trusted only when none of the chunk's drift scores (any "
    "feature's Jensen–Shannon distance, the unseen-value rate over the categorical features, "
    "the domain classifier's AUC) exceeds its threshold"
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
        scores: univariate scores (one per feature), the unseen-value rate (with
            categorical features) and the domain classifier's AUC.
        reference_rows: [r] indices of the reference rows the domain classifier scored
            without having been fitted on them.
        density_ratio: [r] P(chunk | x) / P(reference | x) of those rows from the
            classifier's scores (corrected for its training's class sizes), unclipped.
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
        classifier_rows: int = 3_000,
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
        self.vocab_: dict[str, _Vocab] = {}
        self.bin_of_value_: dict[str, np.ndarray] = {}
        self.frequencies_: dict[str, np.ndarray] = {}
        self.n_bins_: dict[str, int] = {}
        self.reference_counts_: dict[str, np.ndarray] = {}
        self.tree_edges_: dict[str, np.ndarray] = {}
        bounds = chunk_bounds(n, self.chunk_rows)
        rng = np.random.default_rng(self.seed)
        # half the reference counts the categorical values the classifier reads, the other
        # half is what it compares: rows of the counting half would be told by their rare
        # values, which are never unseen to themselves
        counting = rng.random(n) < 0.5
        compared = np.flatnonzero(~counting)
        counted = np.flatnonzero(counting)  # taking rows by number: 6x faster than by mask
        # the rows the classifier reads: each threshold chunk's sample against as many rows
        # of the rest, and the pool the analysis chunks are compared with
        picks = np.linspace(0, bounds.size - 2, min(MAX_THRESHOLD_CHUNKS, bounds.size - 1))
        pairs = []
        for c in np.unique(picks.round().astype(np.int64)):
            lo, hi = np.searchsorted(compared, bounds[c : c + 2])  # compared is increasing
            a = self._sample(compared[lo:hi], rng)
            rest = np.concatenate([compared[:lo], compared[hi:]])
            pairs.append((a, np.sort(rng.choice(rest, size=min(a.size, rest.size), replace=False))))
        pool = min(compared.size, 2 * self.classifier_rows)
        self.pool_ = np.sort(rng.choice(compared, size=pool, replace=False))
        rows = np.unique(np.concatenate([self.pool_, *(np.concatenate(p) for p in pairs)]))
        matrix = np.empty((rows.size, len(self.features_)), dtype=np.float32)
        reference_js: dict[str, np.ndarray] = {}
        unseen = np.zeros(bounds.size - 1)
        present = np.zeros(bounds.size - 1)
        for j, (name, v) in enumerate(cols.items()):
            index = self._fit_feature(name, v, counted)
            column = self._column(name, v[rows], None if index is None else index[rows])
            finite = column[np.isfinite(column)]
            # the classifier reads ranks only: cut once here into its 32 bins, instead of
            # at each of its fits
            self.tree_edges_[name] = np.unique(
                np.quantile(finite, np.arange(1, TREE_BINS) / TREE_BINS) if finite.size else []
            )
            matrix[:, j] = self._tree_bins(name, column)
            k = self.n_bins_[name]
            per_chunk = self._histograms(name, v, index, bounds)
            total = per_chunk.sum(axis=0)
            self.reference_counts_[name] = total
            if index is not None:
                per_chunk = self._unseen_in_rest(name, index, bounds, per_chunk)
                unseen += per_chunk[:, k - 1]
                present += per_chunk.sum(axis=1) - per_chunk[:, k - 2]
            reference_js[name] = js_distance(per_chunk, total[None, :] - per_chunk)
        self.categorical_ = [k for k in self.features_ if self.kinds_[k] == "categorical"]
        if self.categorical_:
            reference_js[UNSEEN] = unseen / np.maximum(present, 1.0)
        self.tests_ = len(reference_js) + 1
        level = 1.0 - self.alarm_rate / self.tests_
        self.reference_scores_ = reference_js
        self.thresholds_ = {k: _threshold(v, level) for k, v in reference_js.items()}
        self.pool_matrix_ = matrix[np.searchsorted(rows, self.pool_)]
        aucs = []
        with _one_thread():
            for a, b in pairs:
                x_a, x_b = matrix[np.searchsorted(rows, a)], matrix[np.searchsorted(rows, b)]
                aucs.append(self._classify(x_a, x_b, rng).auc)
        self.reference_scores_[MULTIVARIATE] = np.asarray(aucs)
        self.thresholds_[MULTIVARIATE] = _threshold(np.asarray(aucs), level)
        return self

    def _fit_feature(self, name: str, v: np.ndarray, counted: np.ndarray) -> np.ndarray | None:
        """Learn one feature's bins (and a categorical one's values: returns their index of
        every reference row, -2 where missing); ``counted``: the rows of the counting half."""
        if self.kinds_[name] == "numeric":
            x = v.astype(np.float64, copy=False)
            finite = x[np.isfinite(x)]
            if finite.size > QUANTILE_ROWS:  # deciles of 200k rows are the file's to < 0.3 %
                finite = finite[:: finite.size // QUANTILE_ROWS]
            q = np.quantile(finite, np.arange(1, self.bins) / self.bins)
            self.edges_[name] = np.unique(q)
            self.n_bins_[name] = self.edges_[name].size + 2  # + the top bin + missing
            return None
        vocab = self.vocab_[name] = _Vocab(v)
        index = vocab.index(v)
        top = _top(vocab.counts, self.max_categories)
        k = top.size
        # a value's bin at its index (its own among the top ones, else other), missing (-2)
        # and unseen (-1) in the last two slots: binning is one gather of the indices
        bin_of_value = np.full(vocab.size + 2, k, dtype=np.int64)
        bin_of_value[top] = np.arange(k)
        bin_of_value[-2:] = (k + 1, k + 2)
        self.bin_of_value_[name] = bin_of_value
        self.n_bins_[name] = k + 3  # + other + missing + unseen
        half = index[counted]
        if half.size and half.min() < 0:
            half = half[half >= 0]
        freq = np.bincount(half, minlength=vocab.size) / max(counted.size, 1)
        # the classifier's input by the same gather: missing NaN, never in the reference 0
        self.frequencies_[name] = np.concatenate([freq, [np.nan, 0.0]]).astype(np.float32)
        return index

    def _histograms(
        self, name: str, v: np.ndarray, index: np.ndarray | None, bounds: np.ndarray
    ) -> np.ndarray:
        """[C, k] counts of each chunk's rows per bin of one feature (the last bins: missing,
        and for a categorical one other, missing, unseen).

        Args:
            v: [n] the feature's values.
            index: [n] a categorical feature's value indices (:meth:`_Vocab.index`), None
                for a numeric one.
            bounds: [C+1] the chunks' row offsets.
        """
        k = self.n_bins_[name]
        out = np.empty((bounds.size - 1, k), dtype=np.int64)
        if index is not None:
            codes = self.bin_of_value_[name][index]
            for c in range(bounds.size - 1):
                out[c] = np.bincount(codes[bounds[c] : bounds[c + 1]], minlength=k)
            return out
        edges = self.edges_[name]
        for c in range(bounds.size - 1):
            # a value's bin is the first whose upper edge is >= it: sorted, a chunk's bins are
            # counted by a search per edge instead of one per row (several times cheaper)
            s = np.sort(v[bounds[c] : bounds[c + 1]]).astype(np.float64, copy=False)
            below = np.searchsorted(s, -np.inf, side="right")  # -inf (NaN sorts last)
            finite = np.searchsorted(s, np.inf, side="left")  # below + finite rows
            at = np.searchsorted(s, edges, side="right")
            out[c, :-1] = np.diff(np.concatenate([[below], at, [finite]]))
            out[c, -1] = s.size - (finite - below)
        return out

    def _column(self, name: str, v: np.ndarray, index: np.ndarray | None) -> np.ndarray:
        """The domain classifier's input of one feature: a numeric as it is (NaN kept), a
        categorical value as its frequency in the reference's counting half (never seen in
        the reference: 0; missing: NaN)."""
        if index is None:
            return v.astype(np.float32)
        return self.frequencies_[name][index]

    def _tree_bins(self, name: str, column: np.ndarray) -> np.ndarray:
        """A classifier input as its bin among the reference's quantiles (NaN kept)."""
        out = np.searchsorted(self.tree_edges_[name], column).astype(np.float32)
        out[np.isnan(column)] = np.nan
        return out

    def _unseen_in_rest(
        self, name: str, index: np.ndarray, bounds: np.ndarray, per_chunk: np.ndarray
    ) -> np.ndarray:
        """Reference chunk histograms with the rows whose value occurs in no other chunk moved
        to the unseen bin (against the rest of the reference they are unseen)."""
        k = self.n_bins_[name]
        vocab = self.vocab_[name]
        chunks = bounds.size - 1
        # each value's first and last chunk: every chunk writes its number at its rows'
        # indices, backwards for the first, forwards for the last (all rows of a chunk write
        # the same number, so repeated indices need no order); missing rows (-2) write into
        # a spare slot
        first = np.full(vocab.size + 2, chunks, dtype=np.int32)
        last = np.full(vocab.size + 2, -1, dtype=np.int32)
        for c in reversed(range(chunks)):
            first[index[bounds[c] : bounds[c + 1]]] = c
        for c in range(chunks):
            last[index[bounds[c] : bounds[c + 1]]] = c
        one = np.flatnonzero(first[:-2] == last[:-2])
        if not one.size:
            return per_chunk
        # all rows of such a value lie in its chunk, in its bin: counted per value, not row
        cell = first[one].astype(np.int64) * k + self.bin_of_value_[name][one]
        moved = np.bincount(cell, weights=vocab.counts[one], minlength=per_chunk.size)
        moved = moved.astype(np.int64).reshape(per_chunk.shape)  # exact: counts < 2**53
        out = per_chunk - moved
        out[:, k - 1] += moved.sum(axis=1)
        return out

    def _sample(self, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if rows.size <= self.classifier_rows:
            return rows
        return np.sort(rng.choice(rows, size=self.classifier_rows, replace=False))

    def _classify(self, a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> _Split:
        """A classifier telling ``a`` from ``b``, fitted on a random half of the rows; its
        AUC on the other half."""
        from sklearn.ensemble import HistGradientBoostingClassifier

        from ctrcal.metrics._metrics import auc

        x = np.concatenate([a, b])
        y = np.concatenate([np.ones(a.shape[0]), np.zeros(b.shape[0])])
        train = rng.permutation(x.shape[0]) % 2 == 0
        model = HistGradientBoostingClassifier(
            max_iter=20,
            learning_rate=0.2,
            max_leaf_nodes=8,
            max_bins=TREE_BINS,
            min_samples_leaf=40,
            early_stopping=False,
            random_state=int(rng.integers(2**31)),
        )
        model.fit(x[train], y[train])
        held = model.predict_proba(x[~train])[:, 1]
        odds = float(y[train].sum()) / max(float((1.0 - y[train]).sum()), 1.0)
        return _Split(auc(held, y[~train]), model, train[a.shape[0] :], odds)

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
        scores: list[list[DriftScore]] = [[] for _ in range(chunks)]
        rng = np.random.default_rng(self.seed + 1)
        samples = [self._sample(np.arange(bounds[c], bounds[c + 1]), rng) for c in range(chunks)]
        rows = np.concatenate(samples)  # increasing: chunk after chunk
        matrix = np.empty((rows.size, len(self.features_)), dtype=np.float32)
        unseen_count = np.zeros(chunks)
        present = np.zeros(chunks)
        for j, name in enumerate(self.features_):
            v = cols[name]
            index = self.vocab_[name].index(v) if name in self.vocab_ else None
            sample = None if index is None else index[rows]
            matrix[:, j] = self._tree_bins(name, self._column(name, v[rows], sample))
            k = self.n_bins_[name]
            hist = self._histograms(name, v, index, bounds)
            js = js_distance(hist, self.reference_counts_[name][None, :])
            categorical = self.kinds_[name] == "categorical"
            unseen = hist[:, k - 1] / hist.sum(axis=1) if categorical else None
            if categorical:
                unseen_count += hist[:, k - 1]
                present += hist.sum(axis=1) - hist[:, k - 2]
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
        if self.categorical_:
            rate = unseen_count / np.maximum(present, 1.0)
            for c in range(chunks):
                scores[c].append(
                    DriftScore(c, UNSEEN, None, float(rate[c]), self.thresholds_[UNSEEN])
                )
        out = []
        with _one_thread():
            for c, a in enumerate(samples):
                pick = np.sort(
                    rng.choice(self.pool_.size, size=min(a.size, self.pool_.size), replace=False)
                )
                split = self._classify(
                    matrix[np.searchsorted(rows, a)], self.pool_matrix_[pick], rng
                )
                scores[c].append(
                    DriftScore(c, MULTIVARIATE, None, split.auc, self.thresholds_[MULTIVARIATE])
                )
                # density ratios of every pool row the classifier was not fitted on
                held = np.ones(self.pool_.size, dtype=bool)
                held[pick[split.trained]] = False
                q = split.model.predict_proba(self.pool_matrix_[held])[:, 1]
                q = np.clip(q, 1e-6, 1.0 - 1e-6)
                ratio = q / (1.0 - q) / split.odds
                chunk = ChunkDrift(
                    c, int(bounds[c]), int(bounds[c + 1]), scores[c], self.pool_[held], ratio
                )
                out.append(chunk)
        return out


@dataclass(frozen=True)
class _Split:
    """A domain classifier fitted on half the rows: its AUC on the other half, the model,
    which of the ``b`` rows it was fitted on, and its training odds (a rows per b row)."""

    auc: float
    model: Any
    trained: np.ndarray
    odds: float


def _one_thread() -> Any:
    """One thread for the domain classifier's fits: they are small, and OpenMP's threads
    waiting on a busy machine cost them 10-50x (entered once around all of them: each entry
    inspects the loaded libraries, so scikit-learn's OpenMP runtime is loaded first)."""
    import importlib

    from threadpoolctl import threadpool_limits

    importlib.import_module("sklearn.ensemble")
    return threadpool_limits(1)


def _top(counts: np.ndarray, k: int) -> np.ndarray:
    """Increasing indices of the ``k`` largest counts, ties to the lowest index (a stable
    sort's choice, by a partition instead of sorting every value)."""
    if counts.size <= k:
        return np.arange(counts.size)
    kth = np.partition(counts, counts.size - k)[counts.size - k]
    above = np.flatnonzero(counts > kth)
    tied = np.flatnonzero(counts == kth)[: k - above.size]
    return np.sort(np.concatenate([above, tied]))


def _missing(v: np.ndarray) -> np.ndarray:
    if v.dtype.kind == "f":
        return np.isnan(v)
    if v.dtype.kind == "O":
        return np.asarray([x is None or (isinstance(x, float) and x != x) for x in v], bool)
    return np.zeros(v.shape[0], dtype=bool)


class _Vocab:
    """The distinct present values of a categorical reference column, how often each occurs
    (``counts``), and each value's index among them: by a dense table for small non-negative
    integers (ids), else by a search."""

    def __init__(self, v: np.ndarray) -> None:
        present = v[~_missing(v)] if v.dtype.kind in "fO" else v  # nothing else is missing
        self.dense: np.ndarray | None = None
        if present.dtype.kind in "iu" and present.size and present.min() >= 0:
            top = int(present.max())
            if top < max(4 * present.size, 1 << 16):
                counts = np.bincount(present, minlength=top + 1)
                self.values = np.flatnonzero(counts)
                self.counts = counts[self.values]
                # one slot past the largest id, -1, where every larger id is clipped to
                self.dense = np.full(top + 2, -1, dtype=np.int64)
                self.dense[self.values] = np.arange(self.values.size)
                return
        self.values, self.counts = np.unique(
            present.astype(str) if present.dtype.kind == "O" else present, return_counts=True
        )

    @property
    def size(self) -> int:
        return int(self.values.size)

    def index(self, v: np.ndarray) -> np.ndarray:
        """[n] index of each value (-1: never in the reference, -2: missing)."""
        if self.dense is not None and v.dtype.kind == "i" and v.size and v.min() >= 0:
            return np.take(self.dense, v, mode="clip")  # ids: none missing, one gather
        if self.dense is not None and v.dtype.kind in "iu":
            inside = (v >= 0) & (v < self.dense.size)
            return np.where(inside, self.dense[np.where(inside, v, 0)], -1)
        missing = _missing(v)
        out = np.full(v.shape[0], -2, dtype=np.int64)
        val = v[~missing]
        if self.dense is not None and val.dtype.kind in "iu":
            inside = (val >= 0) & (val < self.dense.size)
            found = np.full(val.shape[0], -1, dtype=np.int64)
            found[inside] = self.dense[val[inside]]
        elif self.dense is not None and val.dtype.kind != "f":
            found = np.full(val.shape[0], -1, dtype=np.int64)  # text against integer ids
        else:
            if val.dtype.kind == "O":
                val = val.astype(str)
            pos = np.clip(np.searchsorted(self.values, val), 0, max(self.size - 1, 0))
            found = np.where(self.values[pos] == val, pos, -1) if self.size else pos * 0 - 1
        out[~missing] = found
        return out


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
    definition="AUC of a domain classifier (gradient-boosted trees) telling a chunk's rows "
    "from as many reference rows, fitted on half of them and measured on the other half; "
    "0.5: indistinguishable.",
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
declare_metric(
    UNSEEN,
    label="unseen-value rate",
    definition="fraction of a chunk's present categorical values, over every categorical "
    "feature, that never occur in the reference (a reference chunk: in the rest of it).",
    better="lower",
    computed_by="DriftMonitor",
    kind="drift",
    section="drift",
    bounds=(0.0, 1.0),
)
declare_metric(
    "drift_alarm",
    label="chunks alarmed",
    definition="fraction of an evaluated split's chunks where any drift score exceeds its "
    "threshold (the estimates of those chunks are not trusted).",
    better="lower",
    computed_by="ShiftMonitor",
    kind="drift",
    section="drift",
    bounds=(0.0, 1.0),
)
declare_metric(
    "drift_features",
    label="features alarmed",
    definition="features whose Jensen–Shannon distance exceeds its threshold, per chunk "
    "on average.",
    better="lower",
    computed_by="ShiftMonitor",
    kind="drift",
    section="drift",
)
