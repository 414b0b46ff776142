"""The in-memory fast path: integer keys from string memory, and the same output as the strict
path (and the chunked one) whatever it meets; malformed input still named by file and line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ctrcal.config import Config
from ctrcal.data import fastpath
from ctrcal.data.criteo import CATEGORICAL_COLUMNS, COLUMNS
from ctrcal.data.hexkeys import hex8_to_u32, key_expr, u32_to_hex8
from ctrcal.data.prepare import SPLITS, prepare
from ctrcal.data.synthetic import generate_frame, write_criteo
from ctrcal.errors import DataError

# -- keys ----------------------------------------------------------------------------------


def test_hex8_round_trip_matches_int_parsing():
    rng = np.random.default_rng(0)
    edge = np.array([0, 1, 0xFFFFFFFF, 0x0000ABCD, 0x9ABCDEF0], dtype=np.uint32)
    values = np.concatenate([rng.integers(0, 2**32, 5_000).astype(np.uint32), edge])
    texts = [f"{v:08x}" for v in values.tolist()]
    keys = np.array([int.from_bytes(t.encode(), "little") for t in texts], dtype=np.uint64)
    np.testing.assert_array_equal(u32_to_hex8(values), keys)
    decoded, valid, canonical = hex8_to_u32(keys)
    assert valid.all() and canonical.all()
    np.testing.assert_array_equal(decoded, [int(t, 16) for t in texts])
    upper = np.array([int.from_bytes(t.upper().encode(), "little") for t in texts],
                     dtype=np.uint64)  # fmt: skip
    decoded, valid, canonical = hex8_to_u32(upper)
    assert valid.all()
    np.testing.assert_array_equal(canonical, [t == t.upper() for t in texts])
    np.testing.assert_array_equal(decoded, values)


@pytest.mark.parametrize(
    "text", ["0000000G", "0000000g", "/0000000", ":0000000", "@0000000", "`0000000",
             "0000 000", "+0000000", "\x00" * 8, "é123456", "0x123456"],  # fmt: skip
)
def test_hex8_flags_anything_but_hex(text):
    raw = text.encode()
    assert len(raw) == 8
    _, valid, canonical = hex8_to_u32(np.array([int.from_bytes(raw, "little")], dtype=np.uint64))
    assert not valid[0] and not canonical[0]


def test_key_expr_on_chunked_sliced_columns_with_nulls():
    a = pl.Series("c", ["05db9164", None, "68fd1e64", "short", "", "0123456789abcdef"])
    b = pl.Series("c", [None, "ffffffff", "é1234567", "00000000", "abcdefghijkl"])
    series = pl.concat([a, b], rechunk=False)
    assert series.n_chunks() == 2
    for s in (series, series.slice(1, 8), series.slice(7)):
        got = s.to_frame().select(key_expr("c"))["c"].to_list()
        want = [int.from_bytes(v.encode(), "little") if v is not None and len(v.encode()) == 8
                else None for v in s.to_list()]  # fmt: skip
        assert got == want


# -- same output as the strict path ------------------------------------------------------


def _strict(monkeypatch):
    monkeypatch.setattr(fastpath, "encode_fast", lambda *a, **k: False)


def _same(a: Path, b: Path) -> None:
    fa = json.loads((a / "feature_map.json").read_text())
    fb = json.loads((b / "feature_map.json").read_text())
    for fm in (fa, fb):
        fm.pop("sources")  # the input files' names and identity differ between cases
        fm.pop("source_hash")
    assert fa == fb
    assert pl.read_parquet(a / "vocab.parquet").equals(pl.read_parquet(b / "vocab.parquet"))
    for split in SPLITS:
        x, y = pl.read_parquet(a / split), pl.read_parquet(b / split)
        assert x.schema == y.schema, split
        assert x.equals(y), split


def _cfg(min_count=2, buckets=4):
    cfg = Config()
    cfg.features.min_count = min_count
    cfg.features.numeric_buckets = buckets
    return cfg


def _write_rows(path: Path, rows: list[list[str]]) -> Path:
    path.write_text("".join("\t".join(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def frame():
    return generate_frame(3_000, seed=3)[0]


def _prepare_both(inputs, tmp_path, monkeypatch, cfg=None, expect_fast=True):
    cfg = cfg or _cfg()
    fast = prepare(inputs, tmp_path / "fast", cfg)
    assert fast.summary["fast_path"] is expect_fast
    chunked = prepare(inputs, tmp_path / "chunked", cfg, in_memory_bytes=0, chunk_bytes=100_000)
    with monkeypatch.context() as m:
        _strict(m)
        strict = prepare(inputs, tmp_path / "strict", cfg)
    assert strict.summary["fast_path"] is False
    _same(fast.out_dir, strict.out_dir)
    _same(fast.out_dir, chunked.out_dir)
    assert fast.rows == strict.rows == chunked.rows
    return fast


def test_fast_path_equals_strict_and_chunked(frame, tmp_path, monkeypatch):
    path = write_criteo(frame, tmp_path / "train.txt", "dac")
    res = _prepare_both([path], tmp_path, monkeypatch)
    assert res.total_rows == frame.height


def test_explicit_splits_and_unlabelled_test(frame, tmp_path, monkeypatch):
    paths = {
        "train": [write_criteo(frame.slice(0, 2_000), tmp_path / "a.txt", "dac"),
                  write_criteo(frame.slice(2_000, 400), tmp_path / "b.csv", "x4")],
        "valid": [write_criteo(frame.slice(2_400, 300), tmp_path / "v.csv", "kaggle_csv")],
        "test": [write_criteo(frame.slice(2_700), tmp_path / "t.txt", "dac_test")],
    }  # fmt: skip
    res = _prepare_both(paths, tmp_path, monkeypatch)
    assert res.rows == {"train": 2_400, "valid": 300, "test": 300}
    assert pl.read_parquet(res.out_dir / "test")["label"].null_count() == 300
    assert "test           300 rows, no labels (not scored" in res.describe()


def test_non_canonical_hex_columns_read_as_numbers(frame, tmp_path, monkeypatch):
    # upper case, short hashes and leading zeros spell the same values as Criteo's form
    every = pl.int_range(frame.height)
    odd = frame.with_columns(
        pl.when(every % 3 == 0).then(pl.col("C3").str.to_uppercase()).otherwise("C3").alias("C3"),
        pl.col("C5").str.strip_chars_start("0").replace("", "0"),
        pl.when(every % 2 == 0).then(pl.col("C9").str.slice(2)).otherwise("C9").alias("C9"),
    )
    canonical = frame.with_columns(
        pl.when(every % 2 == 0).then(pl.col("C9").str.slice(2).str.zfill(8))
        .otherwise("C9").alias("C9"),
    )  # fmt: skip
    a = write_criteo(odd, tmp_path / "odd.txt", "dac")
    b = write_criteo(canonical, tmp_path / "canonical.txt", "dac")
    res = _prepare_both([a], tmp_path, monkeypatch)
    ref = prepare([b], tmp_path / "ref", _cfg())
    _same(res.out_dir, ref.out_dir)


def test_wide_numeric_range_and_large_integers(frame, tmp_path, monkeypatch):
    big = frame.with_columns(
        (pl.col("I5") * 1_000_003 + 2**40).alias("I5"),
        pl.when(pl.int_range(frame.height) == 7).then(2**62).otherwise(pl.col("I6")).alias("I6"),
    )
    path = write_criteo(big, tmp_path / "train.txt", "dac")
    _prepare_both([path], tmp_path, monkeypatch)


def test_reruns_are_byte_identical(frame, tmp_path):
    # enough rows for the streaming parse to cut the text into several pieces
    path = write_criteo(pl.concat([frame] * 40), tmp_path / "train.txt", "dac")
    runs = [prepare([path], tmp_path / name, _cfg()) for name in ("a", "b")]
    assert all(r.summary["fast_path"] for r in runs)
    files = sorted(p.relative_to(runs[0].out_dir) for p in runs[0].out_dir.rglob("*.parquet"))
    assert len(files) == 4
    for rel in files:
        assert (runs[0].out_dir / rel).read_bytes() == (runs[1].out_dir / rel).read_bytes(), rel


def test_gzip_and_true_probabilities(tmp_path, monkeypatch):
    from ctrcal.data.synthetic import generate

    path = generate(tmp_path / "gen.txt", 2_000, seed=5).path
    gz = write_criteo(pl.read_csv(path, separator="\t", has_header=False, new_columns=COLUMNS,
                                  schema_overrides={c: pl.Utf8 for c in CATEGORICAL_COLUMNS}),
                      tmp_path / "day_1.gz", "dac")  # fmt: skip
    res = _prepare_both([path], tmp_path, monkeypatch)
    assert "oracle" in res.summary
    res = prepare([gz], tmp_path / "gz", _cfg())
    assert res.summary["fast_path"] and res.total_rows == 2_000


def test_real_dac_sample(criteo_samples, tmp_path, monkeypatch):
    res = _prepare_both([criteo_samples / "sample_train.txt"], tmp_path, monkeypatch,
                        _cfg(min_count=1))  # fmt: skip
    assert res.total_rows > 0


def test_decimal_numerics_take_the_strict_path(criteo_samples, tmp_path, monkeypatch):
    # the DeepCTR sample writes integers as 260.0: the integer read refuses, nothing is lost
    _prepare_both([criteo_samples / "criteo_sample.txt"], tmp_path, monkeypatch,
                  _cfg(min_count=1), expect_fast=False)  # fmt: skip


# -- malformed input: still an error naming file, line and column --------------------------

GOOD = ["0", "1", "-1", "260", *["3"] * 10, *["05db9164"] * 26]


def _with(index: int, value: str) -> list[str]:
    row = list(GOOD)
    row[index] = value
    return row


MALFORMED = [
    (_with(5, "inf"), "I5 is not an integer"),
    (_with(5, "nan"), "I5 is not an integer"),
    (_with(5, "1.5"), "I5 is not an integer"),
    (_with(5, "1e400"), "I5 is not an integer"),
    (_with(5, "x"), "I5 is not an integer"),
    (_with(0, "2"), "label is not 0 or 1"),
    (_with(0, "-1"), "label is not 0 or 1"),
    (_with(16, "zz0049e6"), "C3 is not a hex"),
    (_with(16, "05DB916G"), "C3 is not a hex"),
    (_with(16, "123456789"), "C3 is not a hex"),
    (_with(16, "12"), None),  # short hex is a value
    (GOOD + ["extra"], "more fields"),
]


@pytest.mark.parametrize(("row", "match"), MALFORMED, ids=[str(i) for i in range(len(MALFORMED))])
def test_malformed_rows_named_by_line(tmp_path, row, match):
    path = _write_rows(tmp_path / "train.txt", [GOOD] * 20 + [row] + [GOOD] * 5)
    if match is None:
        assert prepare([path], tmp_path / "p").total_rows == 26
        return
    with pytest.raises(DataError, match=rf"{path}: line 21: malformed row: {match}"):
        prepare([path], tmp_path / "p")
    res = prepare([path], tmp_path / "q", on_bad_row="skip")
    assert res.bad_rows == 1 and res.total_rows == 25


def test_malformed_hash_in_a_held_out_split(tmp_path):
    # the fit never counts the test rows: their values are checked when they are encoded
    train = _write_rows(tmp_path / "tr.txt", [GOOD] * 20)
    valid = _write_rows(tmp_path / "va.txt", [GOOD] * 5)
    test = _write_rows(tmp_path / "te.txt", [GOOD] * 3 + [_with(20, "0000000g")] + [GOOD])
    with pytest.raises(DataError, match=rf"{test}: line 4: malformed row: C7 is not a hex"):
        prepare({"train": [train], "valid": [valid], "test": [test]}, tmp_path / "p")


@pytest.mark.parametrize(
    ("value", "fast"),
    [("+5", True), ("05", True), ("-3", True), (" 7", True), ("", True),
     ("9223372036854775807", True), ("9223372036854775808", False), ("260.0", False)],
)  # fmt: skip
def test_integer_spellings_read_as_the_float_reader_reads_them(tmp_path, monkeypatch, value, fast):
    # what the integer reader accepts it reads as the float reader does; what it refuses
    # (beyond Int64, a decimal point) the float reader still takes
    rows = [_with(6, str(k % 7)) for k in range(30)]
    rows[17] = _with(6, value)
    path = _write_rows(tmp_path / "train.txt", rows)
    _prepare_both([path], tmp_path, monkeypatch, _cfg(min_count=1), expect_fast=fast)
