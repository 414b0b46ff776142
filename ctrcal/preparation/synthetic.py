"""Synthetic Criteo-format data with a known click probability.

The generator writes the Kaggle dac ``train.txt`` layout (tab-separated, no header,
``label, I1..I13, C1..C26``) and, next to it, the true click probability of every row in
``<OUT>.prob.parquet`` (see :func:`prob_path`; columns ``prob`` float64 and ``label`` int8, in
row order). Models can then be measured against the physical limit: the oracle AUC / logloss
of the true probabilities on the sampled labels.

Marginals follow Criteo's dac data, scaled down:

* numerics are heavy-tailed integer counts (log-normal in ``log1p`` space, correlated through
  a shared latent activity factor) with dac's missing rate per field; ``I2`` can be negative;
* categoricals are Zipf-distributed 8-hex-digit hashes with dac's missing rate per field and
  dac's cardinality per field, capped at ``max_cardinality``;
* ~25 % of rows are clicks.

The click model is ``logit = b + numeric part + categorical part + interactions``. The numeric
part is a smooth function of ``z_j = (sign(x)·log1p(|x|) - m_j) / s_j`` -- the same sign-aware
log the feature pipeline applies, so the signal is there in the space a model reads, and
Gaussian noise on the (transformed) numerics destroys some of it. A missing numeric has its own
effect. Categorical values have random effects (larger for a few fields), and there are a
numeric x numeric, a numeric x categorical and a categorical x categorical interaction. The
intercept ``b`` is solved so that the mean click probability is ``positive_rate``.

**Drift** (``drift = d > 0``, off by default): Criteo rows are in time order, and so are these.
With ``u = row / (rows - 1)`` the position of a row in the file (0 first, 1 last), the log-scale
medians of the numerics move by ``d·u·shift_j``, a few categorical fields rotate which values
are popular (new ads replace old ones), and the click model's numeric slopes move by
``d·u·slope_j``; the true probability of every row is computed with its own ``u``, so it stays
exact, and a split by time (``data.split_order: time``) then meets a real, measurable shift with
an oracle. ``d = 1`` moves medians by about half a log-scale std and slopes by about their size
at the end of the file. ``d = 0`` writes exactly the rows of the generator without drift.
:func:`true_probability` recomputes the probability of written rows from their values and
position (an oracle for any rows, shifted ones included).

Everything is numpy-vectorised and deterministic by ``seed`` (rows are generated in chunks of
``CHUNK_ROWS`` with per-chunk child seeds, so the output does not depend on memory).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from ctrcal.core.criteo_schema import (
    CATEGORICAL_COLUMNS,
    LABEL,
    NUM_CATEGORICAL,
    NUM_NUMERIC,
    NUMERIC_COLUMNS,
)
from ctrcal.core.errors import DataError
from ctrcal.core.utils import atomic_path, remove_stale_temporaries

GENERATOR_VERSION = 1
CHUNK_ROWS = 500_000

# dac train.txt: fraction missing per field
NUMERIC_MISSING = (
    0.454,
    0.0,
    0.215,
    0.217,
    0.026,
    0.223,
    0.043,
    0.0005,
    0.043,
    0.454,
    0.043,
    0.765,
    0.217,
)
CATEGORICAL_MISSING = (
    0.0,
    0.0,
    0.034,
    0.034,
    0.0,
    0.121,
    0.0,
    0.0,
    0.0,
    0.0,
    0.0,
    0.034,
    0.0,
    0.0,
    0.0,
    0.034,
    0.0,
    0.0,
    0.44,
    0.44,
    0.034,
    0.763,
    0.0,
    0.034,
    0.44,
    0.44,
)
# dac train.txt: distinct values per categorical field
CATEGORICAL_CARDINALITY = (
    1460,
    583,
    10131227,
    2202608,
    305,
    24,
    12517,
    633,
    3,
    93145,
    5683,
    8351593,
    3194,
    27,
    14992,
    5461306,
    10,
    5652,
    2173,
    4,
    7046547,
    18,
    15,
    286181,
    105,
    142572,
)
# log1p-space location / scale of the counts (dac medians, rough spreads)
NUMERIC_LOG_MEDIAN = (0.7, 2.0, 1.9, 1.6, 7.9, 3.4, 1.4, 2.2, 3.7, 0.3, 0.7, 0.2, 1.6)
NUMERIC_LOG_SCALE = (0.9, 1.3, 1.3, 0.8, 2.0, 1.5, 1.2, 0.9, 1.2, 0.5, 0.7, 0.6, 0.9)
NUMERIC_LATENT_LOADING = (0.5, 0.3, 0.6, 0.4, 0.3, 0.5, 0.6, 0.3, 0.5, 0.4, 0.6, 0.3, 0.5)
I2_OFFSET = 1  # I2 = count - 1: negative values as in dac
DRIFT_FIELDS = (0, 3, 5, 13, 22)  # categorical fields whose popular values rotate with drift
DRIFT_ROTATION = 0.3  # at drift 1 the popularity ranks of those fields rotate by 30 % by the end


def prob_path(out: str | Path) -> Path:
    """Where the true click probabilities of a generated file live: ``<OUT>.prob.parquet``."""
    out = Path(out)
    return out.with_name(out.name + ".prob.parquet")


@dataclass
class ClickModel:
    """The random parameters of the click model (drawn once from the seed)."""

    numeric_linear: np.ndarray  # [13]
    numeric_curve: np.ndarray  # [13] weight of tanh(z)
    numeric_missing: np.ndarray  # [13] logit shift when missing
    numeric_center: np.ndarray  # [13] m_j of the sign-aware log
    numeric_scale: np.ndarray  # [13] s_j
    cat_effects: list[np.ndarray] = field(default_factory=list)  # per field [K + 1] (last: missing)
    cat_probs: list[np.ndarray] = field(default_factory=list)  # Zipf CDF per field [K]
    cat_hex: list[np.ndarray] = field(default_factory=list)  # per field [K] uint32 hash values
    num_cat_gain: np.ndarray = field(default_factory=lambda: np.zeros(1))  # I7 x C6 slope [K6+1]
    cat_pair: np.ndarray = field(default_factory=lambda: np.zeros((1, 1)))  # C9 x C17 [K9+1,K17+1]
    intercept: float = 0.0
    drift: float = 0.0  # d: how far distributions and click model move from first to last row
    drift_median: np.ndarray = field(default_factory=lambda: np.zeros(NUM_NUMERIC))  # [13]
    drift_slope: np.ndarray = field(default_factory=lambda: np.zeros(NUM_NUMERIC))  # [13]
    # per field: its values as written (8 hex digits), then a null for "missing"; made once
    _written: list[pl.Series] = field(default_factory=list, init=False, repr=False)

    def written_values(self, j: int) -> pl.Series:
        """[K + 1] strings of categorical field ``j``: value ``i``'s 8 hex digits at ``i``,
        null at ``K`` (missing)."""
        if not self._written:
            self._written.extend(
                pl.Series(_hex8(hexes)).append(pl.Series([None], dtype=pl.Utf8))
                for hexes in self.cat_hex
            )
        return self._written[j]

    def medians(self, u: np.ndarray) -> np.ndarray:
        """[N, 13] log1p-space medians of the numerics at positions ``u`` [N]."""
        return np.array(NUMERIC_LOG_MEDIAN) + self.drift * u[:, None] * self.drift_median

    def slopes(self, u: np.ndarray) -> np.ndarray:
        """[N, 13] numeric slopes of the click logit at positions ``u`` [N]."""
        return self.numeric_linear + self.drift * u[:, None] * self.drift_slope

    def rotation(self, j: int, u: np.ndarray) -> np.ndarray:
        """[N] how many ranks the popularity of categorical field ``j`` has rotated by."""
        if self.drift == 0 or j not in DRIFT_FIELDS:
            return np.zeros(len(u), dtype=np.int64)
        k = len(self.cat_probs[j])
        return np.floor(self.drift * DRIFT_ROTATION * u * k).astype(np.int64)


_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def _hex8(values: np.ndarray) -> np.ndarray:
    """uint32 [K] -> [K] strings of 8 lower-case hex digits (``"%08x"``), without a Python
    format call per value."""
    shifts = np.arange(28, -4, -4, dtype=np.uint32)
    nibbles = (values.astype(np.uint32)[:, None] >> shifts) & 0xF
    return _HEX_DIGITS[nibbles].view("S8").ravel().astype("U8")


def _cardinalities(max_cardinality: int) -> list[int]:
    return [max(2, min(c, max_cardinality)) for c in CATEGORICAL_CARDINALITY]


def make_click_model(seed: int, max_cardinality: int = 20_000, drift: float = 0.0) -> ClickModel:
    """Draw the click model's parameters (deterministic by ``seed``; ``drift`` >= 0)."""
    if not (0 <= drift < float("inf")):
        raise DataError(f"synthetic drift must be a finite number >= 0, got {drift!r}")
    rng = np.random.default_rng([seed, 0xC7C1])
    signs = rng.choice([-1.0, 1.0], size=NUM_NUMERIC)
    strength = np.array([0.45, 0.35, 0.3, 0.25, 0.4, 0.2, 0.45, 0.1, 0.3, 0.35, 0.3, 0.15, 0.25])
    linear = signs * strength
    curve = rng.normal(0.0, 0.25, NUM_NUMERIC)
    missing = rng.normal(0.0, 0.3, NUM_NUMERIC)
    center = np.array(NUMERIC_LOG_MEDIAN)
    scale = np.array(NUMERIC_LOG_SCALE)
    model = ClickModel(linear, curve, missing, center, scale)
    cat_sd = np.full(NUM_CATEGORICAL, 0.12)
    cat_sd[[0, 3, 5, 8, 13, 16, 19, 22]] = [0.35, 0.3, 0.4, 0.3, 0.35, 0.3, 0.4, 0.35]
    for j, k in enumerate(_cardinalities(max_cardinality)):
        exponent = 1.05 + 0.25 * rng.random()
        weights = 1.0 / np.arange(1, k + 1, dtype=np.float64) ** exponent
        cdf = np.cumsum(weights)
        model.cat_probs.append(cdf / cdf[-1])
        model.cat_effects.append(rng.normal(0.0, cat_sd[j], k + 1))
        hexes = np.unique(rng.integers(0, 2**32, size=int(k * 1.1) + 8, dtype=np.uint64))
        model.cat_hex.append(rng.permutation(hexes)[:k].astype(np.uint32))
    k6 = len(model.cat_probs[5])
    model.num_cat_gain = rng.normal(0.0, 0.3, k6 + 1)
    shape = (len(model.cat_probs[8]) + 1, len(model.cat_probs[16]) + 1)
    model.cat_pair = rng.normal(0.0, 0.4, shape)
    # drawn from their own stream, so that drift 0 leaves every other draw as it was
    drng = np.random.default_rng([seed, 0xD21F7])
    model.drift = float(drift)
    model.drift_median = drng.choice([-1.0, 1.0], NUM_NUMERIC) * 0.5 * np.array(NUMERIC_LOG_SCALE)
    model.drift_slope = drng.normal(0.0, 0.4, NUM_NUMERIC)
    return model


@dataclass
class SyntheticChunk:
    """Generated rows: raw counts (NaN = missing), category indices (-1 = missing), truth."""

    numeric: np.ndarray  # float64 [N, 13] integer counts, NaN = missing
    categorical: np.ndarray  # int64 [N, 26] index into the field's values, -1 = missing
    logit_wo_intercept: np.ndarray  # float64 [N]


def _draw_chunk(
    model: ClickModel, rows: int, rng: np.random.Generator, u: np.ndarray | None = None
) -> SyntheticChunk:
    """``rows`` rows at positions ``u`` [rows] in [0, 1] (only matters with drift)."""
    u = np.zeros(rows) if u is None else u
    latent = rng.standard_normal(rows)
    load = np.array(NUMERIC_LATENT_LOADING)
    eps = rng.standard_normal((rows, NUM_NUMERIC))
    g = latent[:, None] * load + eps * np.sqrt(1.0 - load**2)
    logcount = model.medians(u) + np.array(NUMERIC_LOG_SCALE) * g
    counts = np.floor(np.expm1(np.maximum(logcount, 0.0)))
    counts[:, 1] -= I2_OFFSET
    missing = rng.random((rows, NUM_NUMERIC)) < np.array(NUMERIC_MISSING)
    numeric = np.where(missing, np.nan, counts)

    cats = np.empty((rows, NUM_CATEGORICAL), dtype=np.int64)
    for j in range(NUM_CATEGORICAL):
        # Active users see different popular values in a few fields: categoricals correlate
        # with the numerics as in real logs.
        w = rng.random(rows)
        if j in (0, 4, 13):
            w = np.where(latent > 1.0, 1.0 - w * 0.5, w)
        k = len(model.cat_probs[j])
        rank = np.searchsorted(model.cat_probs[j], w, side="right").clip(0, k - 1)
        cats[:, j] = (rank + model.rotation(j, u)) % k
        cats[rng.random(rows) < CATEGORICAL_MISSING[j], j] = -1

    logit = _logit(model, numeric, cats, u)
    return SyntheticChunk(numeric, cats, logit)


def _logit(
    model: ClickModel, numeric: np.ndarray, cats: np.ndarray, u: np.ndarray | None = None
) -> np.ndarray:
    """Click logit without the intercept for raw counts (NaN missing), category indices and
    positions ``u`` (only matters with drift)."""
    t = np.sign(numeric) * np.log1p(np.abs(numeric))
    z = (t - model.numeric_center) / model.numeric_scale
    isnan = np.isnan(z)
    zf = np.where(isnan, 0.0, z)
    linear = model.numeric_linear if u is None or model.drift == 0 else model.slopes(u)
    part = linear * zf + model.numeric_curve * np.tanh(1.5 * zf)
    part = np.where(isnan, model.numeric_missing, part)
    logit = part.sum(axis=1)
    # numeric x numeric: I1 and I5 reinforce each other; I6 has a sweet spot
    logit += 0.25 * zf[:, 0] * zf[:, 4] - 0.1 * zf[:, 5] ** 2
    for j in range(NUM_CATEGORICAL):
        logit += model.cat_effects[j][cats[:, j]]  # index -1 = the missing effect
    # numeric x categorical: the slope of I7 depends on C6
    logit += zf[:, 6] * model.num_cat_gain[cats[:, 5]]
    # categorical x categorical: C9 x C17
    logit += model.cat_pair[cats[:, 8], cats[:, 16]]
    return logit


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _solve_intercept(logit: np.ndarray, rate: float) -> float:
    lo, hi = -20.0, 20.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if _sigmoid(logit + mid).mean() < rate:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@functools.lru_cache(maxsize=8)
def calibrated_click_model(
    seed: int, positive_rate: float, max_cardinality: int, drift: float
) -> ClickModel:
    """:func:`make_click_model` with its intercept solved for ``positive_rate``; kept for the
    process (the pilot sample behind the intercept costs more than a small file's rows), and
    read-only for every caller."""
    model = make_click_model(seed, max_cardinality, drift)
    _calibrate(model, seed, positive_rate)
    return model


def _calibrate(model: ClickModel, seed: int, rate: float) -> None:
    """Set the intercept on a fixed pilot sample (spread over all positions) so the click rate
    is ``rate``."""
    n = 100_000
    pilot = _draw_chunk(model, n, np.random.default_rng([seed, 0x9110]), np.arange(n) / (n - 1))
    model.intercept = _solve_intercept(pilot.logit_wo_intercept, rate)


def _chunk_frame(model: ClickModel, chunk: SyntheticChunk, labels: np.ndarray) -> pl.DataFrame:
    """The dac columns of a chunk (label int8, I Int64 nullable, C hex strings nullable)."""
    cols: dict[str, pl.Series] = {LABEL: pl.Series(LABEL, labels.astype(np.int8))}
    for j, name in enumerate(NUMERIC_COLUMNS):
        v = chunk.numeric[:, j]
        s = pl.Series(name, np.nan_to_num(v, nan=0.0).astype(np.int64))
        cols[name] = s.scatter(np.flatnonzero(np.isnan(v)), None) if np.isnan(v).any() else s
    for j, name in enumerate(CATEGORICAL_COLUMNS):
        idx = chunk.categorical[:, j]
        missing = len(model.cat_hex[j])
        cols[name] = model.written_values(j).gather(np.where(idx < 0, missing, idx)).alias(name)
    return pl.DataFrame(cols)


@dataclass
class SynthResult:
    """What :func:`generate` wrote and the oracle's scores."""

    path: Path
    prob_path: Path
    rows: int
    positive_rate: float
    oracle_auc: float
    oracle_logloss: float
    seconds: float


def oracle_metrics(prob: np.ndarray, label: np.ndarray) -> tuple[float, float]:
    """AUC and logloss of the true probabilities on the sampled labels."""
    # the package's own numpy metrics: scikit-learn's import (with scipy's) costs more than
    # generating or preparing a small file
    from ctrcal.metrics import auc, logloss

    return auc(prob, label), logloss(prob, label)


def positions(rows: int, start: int = 0, count: int | None = None) -> np.ndarray:
    """Positions ``u`` in [0, 1] of rows ``start .. start + count`` of a ``rows``-row file."""
    count = rows - start if count is None else count
    return (start + np.arange(count, dtype=np.float64)) / max(rows - 1, 1)


def generate(
    out: str | Path,
    rows: int,
    seed: int = 0,
    positive_rate: float = 0.25,
    max_cardinality: int = 20_000,
    drift: float = 0.0,
) -> SynthResult:
    """Write ``rows`` synthetic rows in the dac layout to ``out`` and their true probabilities.

    Args:
        out: the TSV file to write (dac ``train.txt`` layout); probabilities go to
            :func:`prob_path` ``(out)``.
        rows: number of rows.
        seed: everything is deterministic by this seed.
        positive_rate: target click rate (the intercept is solved for it).
        max_cardinality: cap on each categorical field's number of distinct values.
        drift: >= 0; how far feature distributions and the click model move from the first
            row to the last (see the module docstring; 0 = stationary).

    Returns:
        :class:`SynthResult` with the oracle AUC / logloss.
    """
    if rows <= 0:
        raise DataError(f"synthetic rows must be positive, got {rows}")
    start = time.perf_counter()
    out = Path(out)
    # a killed run left its temporaries beside the target: one writer per target at a time
    remove_stale_temporaries(out.parent, [out.name, prob_path(out).name])
    model = calibrated_click_model(seed, positive_rate, max_cardinality, drift)
    n_chunks = -(-rows // CHUNK_ROWS)
    children = np.random.SeedSequence([seed, 0xDA7A]).spawn(n_chunks)
    probs = []
    labels = []
    with atomic_path(out) as tmp, open(tmp, "wb") as fh:
        for c in range(n_chunks):
            n = min(CHUNK_ROWS, rows - c * CHUNK_ROWS)
            rng = np.random.default_rng(children[c])
            chunk = _draw_chunk(model, n, rng, positions(rows, c * CHUNK_ROWS, n))
            p = _sigmoid(chunk.logit_wo_intercept + model.intercept)
            y = (rng.random(n) < p).astype(np.int8)
            _chunk_frame(model, chunk, y).write_csv(
                fh, separator="\t", include_header=False, null_value="", quote_style="never"
            )
            probs.append(p)
            labels.append(y)
    prob = np.concatenate(probs)
    label = np.concatenate(labels)
    ppath = prob_path(out)
    with atomic_path(ppath) as tmp:
        pl.DataFrame({"prob": prob, "label": label}).write_parquet(tmp)
    auc, ll = oracle_metrics(prob, label)
    return SynthResult(out, ppath, rows, float(label.mean()), auc, ll, time.perf_counter() - start)


def generate_frame(
    rows: int,
    seed: int = 0,
    positive_rate: float = 0.25,
    max_cardinality: int = 20_000,
    drift: float = 0.0,
) -> tuple[pl.DataFrame, np.ndarray]:
    """In-memory variant of :func:`generate` (one chunk): the dac columns and true probs.

    Returns:
        (frame with ``label`` int8, ``I1..I13`` Int64 (null = missing), ``C1..C26`` hex
        strings (null = missing); prob float64 [N]).
    """
    model = calibrated_click_model(seed, positive_rate, max_cardinality, drift)
    rng = np.random.default_rng([seed, 0xDA7A, 1])
    chunk = _draw_chunk(model, rows, rng, positions(rows))
    p = _sigmoid(chunk.logit_wo_intercept + model.intercept)
    y = (rng.random(rows) < p).astype(np.int8)
    return _chunk_frame(model, chunk, y), p


def true_probability(
    frame: pl.DataFrame,
    u: np.ndarray,
    seed: int = 0,
    positive_rate: float = 0.25,
    max_cardinality: int = 20_000,
    drift: float = 0.0,
) -> np.ndarray:
    """The true click probability of rows of the generator with these parameters.

    Args:
        frame: dac columns ``I1..I13`` (numbers, null = missing; any real value, e.g. shifted)
            and ``C1..C26`` (the hex strings written, or their uint32 values as
            :func:`~ctrcal.preparation.parse.iter_chunks` parses them; null = missing).
        u: [N] position of each row in its file (see :func:`positions`).
        seed / positive_rate / max_cardinality / drift: as given to :func:`generate`.

    Returns:
        float64 [N].

    Raises:
        DataError: a categorical value the generator never produces.
    """
    model = calibrated_click_model(seed, positive_rate, max_cardinality, drift)
    numeric = frame.select(pl.col(NUMERIC_COLUMNS).cast(pl.Float64).fill_null(float("nan")))
    cats = np.empty((frame.height, NUM_CATEGORICAL), dtype=np.int64)
    for j, name in enumerate(CATEGORICAL_COLUMNS):
        col = frame[name]
        if col.dtype == pl.Utf8:
            col = col.str.to_integer(base=16, dtype=pl.UInt32, strict=False)
        col = col.cast(pl.UInt32)
        index = col.replace_strict(
            pl.Series(model.cat_hex[j]),
            pl.Series(np.arange(len(model.cat_hex[j]))),
            default=-2,
            return_dtype=pl.Int64,
        )
        idx = np.where(col.is_null().to_numpy(), -1, index.fill_null(-1).to_numpy())
        if (idx == -2).any():
            raise DataError(f"{name}: values the generator with seed {seed} never produces")
        cats[:, j] = idx
    logit = _logit(model, numeric.to_numpy(), cats, np.asarray(u, dtype=np.float64))
    return _sigmoid(logit + model.intercept)


def write_criteo(frame: pl.DataFrame, path: str | Path, layout: str = "dac") -> Path:
    """Write a dac-column frame (as from :func:`generate_frame`) in another Criteo layout.

    Layouts are those of :mod:`ctrcal.preparation.criteo`: ``dac``, ``dac_test`` (no label),
    ``kaggle_csv`` (``Id,Label,...``), ``x4`` (``Label,...`` CSV), ``x1`` (numerics scaled to
    [0, 1], categoricals decimal ids), ``torchrec`` (``label,int_0..,cat_0..`` CSV). A path
    ending in ``.gz`` is gzip-compressed. Used by tests and benchmarks.
    """
    import gzip

    path = Path(path)
    sep, header = ",", True
    df = frame
    if layout == "dac":
        sep, header = "\t", False
    elif layout == "dac_test":
        sep, header = "\t", False
        df = df.drop(LABEL)
    elif layout == "kaggle_csv":
        df = df.rename({LABEL: "Label"}).select(
            pl.int_range(10_000_000, 10_000_000 + pl.len()).alias("Id"), pl.all()
        )
    elif layout == "x4":
        df = df.rename({LABEL: "Label"})
    elif layout == "x1":
        scaled = [
            (
                pl.col(c).cast(pl.Float64).clip(lower_bound=0).log1p()
                / pl.col(c).cast(pl.Float64).clip(lower_bound=0).log1p().max()
            )
            .round(6)
            .alias(c)
            for c in NUMERIC_COLUMNS
        ]
        ids = [pl.col(c).rank("dense").cast(pl.Int64).alias(c) for c in CATEGORICAL_COLUMNS]
        df = df.with_columns(*scaled, *ids)
    elif layout == "torchrec":
        names = {f"I{i + 1}": f"int_{i}" for i in range(NUM_NUMERIC)}
        names.update({f"C{i + 1}": f"cat_{i}" for i in range(NUM_CATEGORICAL)})
        df = df.rename(names)
    else:
        raise DataError(f"unknown layout {layout!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wb", compresslevel=1) as fh:
            df.write_csv(
                fh, separator=sep, include_header=header, null_value="", quote_style="never"
            )
    else:
        df.write_csv(path, separator=sep, include_header=header, null_value="", quote_style="never")
    return path
