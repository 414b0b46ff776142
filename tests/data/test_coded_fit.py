"""The C column coding (fit and encoding through dense codes) against the reference ways: the
same tables, the same bytes, whatever the splits, thresholds, missing and unseen values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ctrcal.config import Config
from ctrcal.data import coded_fit, column_codes, criteo, fastpath, tsv_reader
from ctrcal.data.criteo import CATEGORICAL_COLUMNS
from ctrcal.data.prepare import SPLITS, prepare
from ctrcal.data.synthetic import generate_frame, write_criteo

pytestmark = pytest.mark.skipif(not column_codes.available(), reason="no C compiler")


# -- the kernel ------------------------------------------------------------------------------


def _reference(values, valid, train):
    """codes / distinct / train counts by numpy, in order of first appearance."""
    present = np.flatnonzero(valid)
    distinct, first, inverse = np.unique(values[present], return_index=True,
                                         return_inverse=True)  # fmt: skip
    rank = np.empty(len(distinct), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(distinct))
    codes = np.zeros(len(values), dtype=np.int32)
    codes[present] = rank[inverse] + 1
    ordered = np.empty_like(distinct)
    ordered[rank] = distinct
    counts = np.bincount(rank[inverse], weights=train[present], minlength=len(distinct))
    return codes, ordered, counts.astype(np.int64), int((train & ~valid.astype(bool)).sum())


@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
@pytest.mark.parametrize("distinct", [1, 50, 30_000])  # 30k: the table grows several times
def test_codes_and_counts_equal_numpy(dtype, distinct):
    rng = np.random.default_rng(distinct)
    n = 60_000
    pool = rng.integers(-(2**62), 2**62, distinct).astype(dtype)
    values = pool[rng.zipf(1.3, n) % distinct]
    valid = (rng.random(n) > 0.2).astype(np.uint8)
    values[valid == 0] = pool[0]  # a missing value's bytes do not matter
    train = (rng.random(n) < 0.7).astype(np.uint8)
    got = column_codes.code_column(values, valid, train)
    codes, ordered, counts, missing = _reference(values, valid, train.astype(bool))
    np.testing.assert_array_equal(got.codes, codes)
    np.testing.assert_array_equal(got.distinct, ordered)
    np.testing.assert_array_equal(got.train_counts, counts)
    assert got.train_missing == missing
    assert got.distinct.dtype == dtype


def test_dest_reorders_the_codes_and_gather_answers_missing():
    rng = np.random.default_rng(1)
    values = rng.integers(0, 40, 5_000).astype(np.int64)
    valid = (rng.random(5_000) > 0.1).astype(np.uint8)
    train = np.ones(5_000, dtype=np.uint8)
    perm = rng.permutation(5_000).astype(np.int32)
    plain = column_codes.code_column(values, valid, train)
    moved = column_codes.code_column(values, valid, train, dest=perm)
    np.testing.assert_array_equal(moved.codes[perm], plain.codes)
    answer = plain.gather(plain.distinct * 10, -1)
    np.testing.assert_array_equal(answer, np.where(valid == 1, values * 10, -1))
    ids = np.arange(len(plain.distinct), dtype=np.int32) + 3
    fresh = plain.gather(ids, np.int32(1))
    assert fresh.dtype == np.int32 and plain.codes is not None
    z = plain.distinct.astype(np.float32) / 7
    values_z = moved.gather(z, np.float32(np.nan))
    np.testing.assert_array_equal(moved.gather(z, np.float32(np.nan), reuse=True), values_z)
    assert moved.codes is None  # written over
    np.testing.assert_array_equal(fresh, np.where(valid == 1, ids[plain.codes - 1], 1))
    with pytest.raises(ValueError, match="outside"):
        column_codes.code_column(values, valid, train, dest=perm + 1)
    with pytest.raises(ValueError, match="shape"):
        column_codes.code_column(values, valid, train, dest=perm[:10])


# -- whole preparations: the coded way against the others ---------------------------------


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}  # fmt: skip


def _cfg(min_count: int, order: str = "random") -> Config:
    cfg = Config()
    cfg.features.min_count = min_count
    cfg.features.numeric_buckets = 5
    cfg.data.split_order = order
    return cfg


def _ways(inputs, tmp_path: Path, monkeypatch, cfg: Config) -> dict[str, Path]:
    """Prepare ``inputs`` the coded way (checked to be taken) and three reference ways: the C
    reader's frame with the polars fit, the polars reader, and the strict way."""
    calls = []
    real = coded_fit.fit
    with monkeypatch.context() as m:
        m.setattr(coded_fit, "fit", lambda *a, **k: calls.append(1) or real(*a, **k))
        coded = prepare(inputs, tmp_path / "coded", cfg).out_dir
    assert calls, "the coded way was not taken"
    out = {"coded": coded}
    with monkeypatch.context() as m:
        m.setattr(column_codes, "available", lambda: False)
        out["reader frame"] = prepare(inputs, tmp_path / "frame", cfg).out_dir
    with monkeypatch.context() as m:
        m.setenv(tsv_reader.ENV_SWITCH, "0")
        out["polars"] = prepare(inputs, tmp_path / "polars", cfg).out_dir
    with monkeypatch.context() as m:
        m.setattr(fastpath, "encode_fast", lambda *a, **k: False)
        out["strict"] = prepare(inputs, tmp_path / "strict", cfg).out_dir
    return out


def _assert_same(ways: dict[str, Path], identical_bytes: bool = True) -> None:
    coded = ways["coded"]
    for name, other in ways.items():
        for split in SPLITS:
            a, b = pl.read_parquet(coded / split), pl.read_parquet(other / split)
            assert a.schema == b.schema and a.equals(b), (name, split)
        assert pl.read_parquet(coded / "vocab.parquet").equals(
            pl.read_parquet(other / "vocab.parquet")), name
        if identical_bytes and name != "strict":
            # the strict way writes the same tables; the fast ways the same files
            want, got = _files(other), _files(coded)
            assert want.keys() == got.keys(), name
            for rel in want:
                assert want[rel] == got[rel], (name, rel)


@pytest.fixture(scope="module")
def frame() -> pl.DataFrame:
    return generate_frame(4_000, seed=11, max_cardinality=3_000)[0]


@pytest.mark.parametrize("min_count", [1, 2, 10])
@pytest.mark.parametrize("order", ["random", "time"])
def test_random_splits_equal_the_reference_ways(frame, tmp_path, monkeypatch, min_count, order):
    path = write_criteo(frame, tmp_path / "day.txt", "dac")
    ways = _ways([path], tmp_path, monkeypatch, _cfg(min_count, order))
    _assert_same(ways)
    test = pl.read_parquet(ways["coded"] / "test")
    ids = test.select(CATEGORICAL_COLUMNS).to_numpy()
    assert (ids == 1).any() and (ids == 2).any()  # missing and out-of-vocabulary values met
    assert test["I1"].null_count() > 0


def test_an_empty_split(frame, tmp_path, monkeypatch):
    cfg = _cfg(2)
    cfg.data.split = [0.9, 0.0, 0.1]
    path = write_criteo(frame.slice(0, 1_000), tmp_path / "day.txt", "dac")
    ways = _ways([path], tmp_path, monkeypatch, cfg)
    _assert_same(ways)
    assert pl.read_parquet(ways["coded"] / "valid").height == 0


def test_explicit_splits_with_unseen_values_and_an_unlabelled_test(frame, tmp_path,
                                                                   monkeypatch):  # fmt: skip
    # values only the held-out files carry, upper-case spellings of kept values, a value of
    # the test file only, a column missing everywhere in train
    rows = pl.int_range(pl.len())
    test = frame.slice(3_200).with_columns(
        pl.when(rows % 4 == 0).then(pl.lit("0badc0de")).otherwise("C2").alias("C2"),
        pl.col("C7").str.to_uppercase(),
    )
    train = frame.slice(0, 2_800).with_columns(pl.lit(None, pl.Utf8).alias("C26"))
    inputs = {
        "train": [write_criteo(train.slice(0, 2_000), tmp_path / "a.txt", "dac"),
                  write_criteo(train.slice(2_000), tmp_path / "b.txt", "dac")],
        "valid": [write_criteo(frame.slice(2_800, 400), tmp_path / "v.txt", "dac")],
        "test": [write_criteo(test, tmp_path / "t.txt", "dac_test")],
    }  # fmt: skip
    ways = _ways(inputs, tmp_path, monkeypatch, _cfg(3))
    _assert_same(ways)
    out = pl.read_parquet(ways["coded"] / "test")
    assert out["label"].null_count() == out.height
    assert (out["C2"] == 2).sum() >= out.height // 4  # the unseen value is OOV
    assert (out["C7"] > 2).any()  # upper case finds the kept lower-case value
    assert (pl.read_parquet(ways["coded"] / "train")["C26"] == 1).all()


def test_upper_case_train_values_are_counted_with_lower_case(frame, tmp_path, monkeypatch):
    rows = pl.int_range(pl.len())
    mixed = frame.with_columns(
        pl.when(rows % 2 == 0).then(pl.col("C3").str.to_uppercase()).otherwise("C3").alias("C3")
    )
    path = write_criteo(mixed, tmp_path / "train.txt", "dac")
    _assert_same(_ways([path], tmp_path, monkeypatch, _cfg(2)))


def test_integers_sharing_a_float64_are_counted_together(frame, tmp_path, monkeypatch):
    rows = pl.int_range(pl.len())
    big = frame.with_columns(
        pl.when(rows % 3 == 0).then(2**55).when(rows % 3 == 1).then(2**55 + 1)
        .otherwise(pl.col("I7")).alias("I7"),
        pl.when(rows % 5 == 0).then(-(2**56) - 1).otherwise(pl.col("I8")).alias("I8"),
    )  # fmt: skip
    path = write_criteo(big, tmp_path / "train.txt", "dac")
    seen = {}
    real = coded_fit.FitStats.add_counts

    def add_counts(self, name, counts, nulls):
        seen.setdefault(name, counts)  # the first way prepared is the coded one
        return real(self, name, counts, nulls)

    with monkeypatch.context() as m:
        m.setattr(coded_fit.FitStats, "add_counts", add_counts)
        _assert_same(_ways([path], tmp_path, monkeypatch, _cfg(2)))
    # the histogram the statistics come from has one row per float64 value, as everywhere
    for name in ("I7", "I8"):
        assert seen[name]["value"].is_unique().all(), name
    assert seen["I7"].filter(pl.col("value") == float(2**55))["count"].item() > 1_000


def test_real_dac_samples(criteo_samples, tmp_path, monkeypatch):
    source = criteo_samples / "sample_train.txt"  # Kaggle's layout, no newline at the end
    _assert_same(_ways([source], tmp_path / "pooled", monkeypatch, _cfg(1)))
    # the same real rows cut into explicit splits, the last file without its label column
    lines = source.read_bytes().split(b"\n")
    tmp_path.joinpath("cut").mkdir()
    cut = {name: tmp_path / "cut" / f"{name}.txt" for name in SPLITS}
    cut["train"].write_bytes(b"\n".join(lines[:70]) + b"\n")
    cut["valid"].write_bytes(b"\n".join(lines[70:85]))
    cut["test"].write_bytes(b"\n".join(line.split(b"\t", 1)[1] for line in lines[85:]))
    inputs = {name: [path] for name, path in cut.items()}
    _assert_same(_ways(inputs, tmp_path / "explicit", monkeypatch, _cfg(2)))


def test_real_ragged_samples(criteo_samples, tmp_path, monkeypatch):
    # 39 of its 100 rows end two or three hash fields early: read by the C reader, the same
    # bytes every way
    source = criteo_samples / "sample_test.txt"
    assert tsv_reader.read_clean(source, criteo.detect_format(source, "auto")) is not None
    _assert_same(_ways([source], tmp_path / "pooled", monkeypatch, _cfg(1)))


def test_nullable_series_marks_nulls_without_copying():
    values = np.arange(6, dtype=np.float32)
    series = tsv_reader.nullable_series("x", values, np.array([1, 0, 1, 1, 0, 1], dtype=bool))
    assert series.dtype == pl.Float32 and series.to_list() == [0, None, 2, 3, None, 5]
    plain = tsv_reader.nullable_series("y", values.astype(np.uint64))
    assert plain.dtype == pl.UInt64 and plain.null_count() == 0
    ids = np.array([3, 4], dtype=np.int32)
    shared = tsv_reader.nullable_series("z", ids)
    ids[0] = 9  # the column is a view of the array
    assert shared.to_list() == [9, 4]
