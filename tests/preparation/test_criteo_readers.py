"""Readers: every layout, the real samples, and rejection of non-Criteo files."""

from __future__ import annotations

import gzip

import polars as pl
import pytest
from parsed_rows import read_rows

from ctrcal.core.criteo_schema import CATEGORICAL_COLUMNS, COLUMNS, LABEL, NUMERIC_COLUMNS
from ctrcal.core.errors import DataError
from ctrcal.preparation.criteo import detect_format

EXPECTED_LAYOUT = {
    "dac": "dac",
    "dac_gz": "dac",
    "dac_test": "dac_test",
    "kaggle_csv": "kaggle_csv",
    "x4": "x4",
    "x1": "x1",
    "torchrec": "torchrec",
}


@pytest.fixture(scope="module")
def reference(criteo_files):
    return read_rows(criteo_files["dac"])


@pytest.mark.parametrize("name", sorted(EXPECTED_LAYOUT))
def test_layout_detected_and_typed(name, criteo_files, reference):
    path = criteo_files[name]
    assert detect_format(path).layout == EXPECTED_LAYOUT[name]
    df = read_rows(path)
    assert df.columns == list(COLUMNS)
    assert df.schema[LABEL] == pl.Float32
    assert all(df.schema[c] == pl.Float64 for c in NUMERIC_COLUMNS)
    assert all(df.schema[c] == pl.UInt32 for c in CATEGORICAL_COLUMNS)
    assert df.height == reference.height
    if name == "dac_test":
        assert df[LABEL].null_count() == df.height
    else:
        assert df[LABEL].equals(reference[LABEL])
    if name != "x1":  # x1 holds already-encoded values
        assert df.drop(LABEL).equals(reference.drop(LABEL))
    else:
        # same missing pattern; numerics scaled into [0, 1]
        for c in FEATURES_SAMPLE:
            assert df[c].null_count() == reference[c].null_count()
        assert df.select(pl.col(NUMERIC_COLUMNS).max()).max_horizontal()[0] <= 1.0


FEATURES_SAMPLE = ("I1", "I12", "C3", "C22")


def test_negative_and_float_written_integers(tmp_path):
    row = ["1", "-2", "260.0", *[""] * 11, "00018438", "623049e6", *["04e09220"] * 24]
    path = tmp_path / "t.txt"
    path.write_text("\t".join(row) + "\n")
    df = read_rows(path)
    assert df["I1"][0] == -2 and df["I2"][0] == 260.0 and df["I3"][0] is None
    assert df["C1"][0] == 0x18438 and df["C2"][0] == 0x623049E6


def test_forced_layout_conflict(criteo_files):
    with pytest.raises(DataError, match="looks like 'x4'"):
        detect_format(criteo_files["x4"], "dac")


# -- real samples ------------------------------------------------------------------------------


def test_sample_deepctr_csv(criteo_samples):
    path = criteo_samples / "criteo_sample.txt"
    assert detect_format(path).layout == "x4"
    df = read_rows(path)
    assert df.height == 200 and int(df[LABEL].sum()) == 49
    assert df["I2"].null_count() == 0 and df["I2"].min() < 0  # I2 is negative at times
    assert df["I3"][0] == 260.0  # written as 260.0 by pandas
    assert df["C1"][0] == 0x05DB9164  # leading zero kept


def test_sample_dac_train(criteo_samples):
    path = criteo_samples / "sample_train.txt"  # no trailing newline
    assert detect_format(path).layout == "dac"
    df = read_rows(path)
    assert df.height == 100 and int(df[LABEL].sum()) == 29


def test_sample_ragged_rows_padded(criteo_samples):
    path = criteo_samples / "sample_test.txt"
    assert detect_format(path).layout == "dac"
    df = read_rows(path)
    assert df.height == 100 and int(df[LABEL].sum()) == 36
    raw = path.read_text().split("\n")
    widths = [len(line.split("\t")) for line in raw if line]
    short = [i for i, w in enumerate(widths) if w < 40]
    assert len(short) == 39
    # fields beyond a short row's end are missing
    for i in short:
        for c in CATEGORICAL_COLUMNS[widths[i] - 14 :]:
            assert df[c][i] is None


# -- rejection -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            "timestamp\tuid\tcampaign\tconversion\tconversion_timestamp\tconversion_id\t"
            "attribution\tclick\tclick_pos\tclick_nb\tcost\tcpo\n1\t2\t3\t0\t-1\t-1\t0\t0\t-1\t-1"
            "\t0.1\t0.2\n",
            "Attribution",
        ),
        (
            "f0,f1,f2,f3,f4,f5,f6,f7,f8,f9,f10,f11,treatment,conversion,visit,exposure\n"
            + ",".join(["1.0"] * 16)
            + "\n",
            "Uplift",
        ),
        ("sepal_length,sepal_width,species\n5.1,3.5,setosa\n", "not a Criteo CTR header"),
        ("1\t2\t3\t4\t5\n", "found 5 tab-separated fields"),
        ("just some text without separators\n", "no tab or comma"),
        ("1,2,3,4\n", "comma-separated without a header"),
    ],
)
def test_rejects_non_criteo(tmp_path, text, match):
    path = tmp_path / "other.txt"
    path.write_text(text)
    with pytest.raises(DataError, match=match) as err:
        detect_format(path)
    assert str(path) in str(err.value) and "expected" in str(err.value)


def test_rejects_parquet_and_binary(tmp_path):
    pq = tmp_path / "x.parquet"
    pl.DataFrame({"a": [1]}).write_parquet(pq)
    with pytest.raises(DataError, match="parquet"):
        detect_format(pq)
    binary = tmp_path / "x.bin"
    binary.write_bytes(b"\x00\x01\x02" * 100)
    with pytest.raises(DataError, match="binary"):
        detect_format(binary)


def test_empty_missing_and_truncated(tmp_path, criteo_files):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(DataError, match="empty file"):
        read_rows(empty)
    with pytest.raises(DataError, match="no such file"):
        read_rows(tmp_path / "nope.txt")
    with pytest.raises(DataError, match="is a directory"):
        read_rows(tmp_path)
    data = criteo_files["dac_gz"].read_bytes()
    cut = tmp_path / "cut.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="cut.gz"):
        read_rows(cut)
    gz_empty = tmp_path / "empty.gz"
    with gzip.open(gz_empty, "wb"):
        pass
    with pytest.raises(DataError, match="empty file"):
        read_rows(gz_empty)
