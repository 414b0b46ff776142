"""The one row validator: each column kind's good and bad values, the one-line message for the
first malformed row (lines or parquet rows), and skipping with a count."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ctrcal.core.errors import DataError
from ctrcal.preparation.coder import string_keys
from ctrcal.preparation.row_check import EXTRA, Column, RowCheck

PATH = Path("data/in.csv")


def _check(columns, on_bad_row="error", **kw) -> RowCheck:
    return RowCheck(PATH, "team", tuple(columns), on_bad_row, **kw)


def _frame(**cols) -> pl.DataFrame:
    return pl.DataFrame({k: pl.Series(k, v, dtype=pl.Utf8) for k, v in cols.items()})


def _one(column: Column, value: str | None, blanks: bool = True):
    """The chunk of one row holding ``value`` in ``column`` (beside a good label)."""
    columns = [Column("y", "label")] + ([column] if column.name != "y" else [])
    cols = {"y": [value if column.name == "y" else "1"]}
    if column.name != "y":
        cols[column.name] = [value]
    return _check(columns, blanks=blanks).chunk(_frame(**cols), 0)


GOOD = [
    (Column("y", "label"), "1", ("label", 1.0)),
    (Column("y", "label"), " 0 ", ("label", 0.0)),
    (Column("y", "label"), "1.0", ("label", 1.0)),
    (Column("n", "integer"), "260.0", ("numeric", 260.0)),
    (Column("n", "integer"), "-7", ("numeric", -7.0)),
    (Column("n", "number"), "0.25", ("numeric", 0.25)),
    (Column("n", "number"), " 1e3 ", ("numeric", 1000.0)),
    (Column("c", "hex"), "05db9164", ("categorical", 0x05DB9164)),
    (Column("c", "hex"), "FFFFFFFF", ("categorical", 0xFFFFFFFF)),
    (Column("c", "hex"), "12", ("categorical", 0x12)),
    (Column("c", "decimal"), "00123", ("categorical", 123)),
    (Column("c", "string"), "ad 7", ("categorical", None)),
    (Column("t", "time"), " 26010112 ", ("time", 26010112)),
]


@pytest.mark.parametrize(
    ("column", "value", "want"), GOOD, ids=[f"{c.kind}:{v}" for c, v, _ in GOOD]
)
def test_a_good_value_of_each_kind_is_typed(column, value, want):
    chunk = _one(column, value)
    assert len(chunk) == 1 and chunk.bad == 0 and chunk.records == 1
    where, expected = want
    if where == "label":
        assert chunk.label.dtype == np.float64 and chunk.label[0] == expected
    elif where == "numeric":
        assert chunk.numeric.dtype == np.float64 and chunk.numeric[0, 0] == expected
        assert chunk.numeric_valid[0, 0] == 1
    elif where == "categorical":
        if expected is None:  # a string: its key, XXH64 of the text
            expected = string_keys([value])[0]
        # hex and decimal ids are 32-bit, as the C reader gives them; strings' keys 64-bit
        width = np.uint64 if column.kind == "string" else np.uint32
        assert chunk.categorical.dtype == width and chunk.categorical[0, 0] == expected
        assert chunk.categorical_valid[0, 0] == 1
    else:
        assert chunk.time.dtype == np.int64 and chunk.time[0] == expected


BAD = [
    (Column("y", "label"), "2", "y is not 0 or 1 (got '2')"),
    (Column("y", "label"), None, "y is not 0 or 1 (empty)"),
    (Column("y", "label"), "yes", "y is not 0 or 1 (got 'yes')"),
    (Column("y", "label"), "0.999999999", "y is not 0 or 1 (got '0.999999999')"),
    (Column("n", "integer"), "2.5", "n is not an integer (got '2.5')"),
    (Column("n", "integer"), "inf", "n is not an integer (got 'inf')"),
    (Column("n", "integer"), "1e400", "n is not an integer (got '1e400')"),
    (Column("n", "integer"), "x", "n is not an integer (got 'x')"),
    (Column("n", "number"), "nan", "n is not a number (got 'nan')"),
    (Column("n", "number"), "-inf", "n is not a number (got '-inf')"),
    (Column("n", "number"), " ", "n is not a number (got ' ')"),
    (Column("c", "hex"), "123456789", "c is not a hex value of at most 8 digits (got '123456789')"),
    (Column("c", "hex"), "0000000g", "c is not a hex value of at most 8 digits (got '0000000g')"),
    (Column("c", "hex"), " 05db9164", "c is not a hex value of at most 8 digits (got ' 05db9164')"),
    (Column("c", "decimal"), "abc", "c is not a decimal id (got 'abc')"),
    (Column("c", "decimal"), "4294967296", "c is not a decimal id (got '4294967296')"),
    (Column("t", "time"), "1.5", "t is not an integer time (got '1.5')"),
    (Column("t", "time"), None, "t is not an integer time (empty)"),
]


@pytest.mark.parametrize(("column", "value", "message"), BAD, ids=[m for _, _, m in BAD])
def test_a_bad_value_of_each_kind_is_named(column, value, message):
    with pytest.raises(DataError) as err:
        _one(column, value)
    assert str(err.value) == (
        f"{PATH}: line 1: malformed row: {message} (use on_bad_row=skip to drop them)"
    )


def test_missing_values_are_missing_and_strings_never_bad():
    columns = [Column(n, k) for n, k in (("n", "integer"), ("x", "number"), ("h", "hex"))]
    columns += [Column("d", "decimal"), Column("s", "string")]
    chunk = _check(columns).chunk(_frame(n=[None], x=[None], h=[None], d=[None], s=[None]), 0)
    assert chunk.bad == 0 and np.isnan(chunk.label[0])  # no label column: NaN
    assert chunk.numeric_valid.tolist() == [[0], [0]] and chunk.numeric.tolist() == [[0], [0]]
    assert chunk.categorical_valid.tolist() == [[0], [0], [0]]
    odd = _check([Column("s", "string")]).chunk(_frame(s=["", " ", 'é,\t"x"']), 0)
    assert odd.bad == 0 and odd.categorical_valid.tolist() == [[1, 1, 1]]


def test_blanks_make_a_number_bad_only_where_the_layout_says():
    assert _one(Column("n", "integer"), " 3", blanks=True).numeric[0, 0] == 3.0
    with pytest.raises(DataError, match=r"n is not an integer \(got ' 3'\)"):
        _one(Column("n", "integer"), " 3", blanks=False)
    assert _one(Column("y", "label"), " 1", blanks=False).label[0] == 1.0


def test_a_row_with_too_many_fields():
    frame = _frame(y=["1", "0"], n=["3", "4"], **{EXTRA: [None, "x"]})
    check = _check([Column("y", "label"), Column("n", "integer")], fields=3, header_lines=1)
    with pytest.raises(DataError) as err:
        check.chunk(frame, 0)
    assert str(err.value) == (
        f"{PATH}: line 3: malformed row: more fields than the team layout's 3 "
        "(use on_bad_row=skip to drop them)"
    )
    # its fields are not checked: the too-many-fields check names the row first
    bad_too = _frame(y=["7"], n=["x"], **{EXTRA: ["x"]})
    with pytest.raises(DataError, match="more fields than"):
        check.chunk(bad_too, 0)


def test_the_first_bad_row_and_its_first_bad_column_are_named_with_a_count():
    columns = [Column("y", "label"), Column("n", "integer"), Column("c", "hex")]
    frame = _frame(
        y=["1", "0", "1", "1", "2"],
        n=["1", "1", "x", "1", "1"],
        c=["ab", "ab", "zz", "zz", "ab"],
    )
    with pytest.raises(DataError) as err:
        _check(columns, header_lines=1).chunk(frame, 1000)
    # record 1002 is line 1004 (a header line); its integer is checked before its hash
    assert str(err.value) == (
        f"{PATH}: line 1004: malformed row: n is not an integer (got 'x'); 2 more malformed "
        "rows in the 1,005 rows read so far (use on_bad_row=skip to drop them)"
    )


def test_skip_drops_and_counts_keeping_each_rows_record_index():
    columns = [Column("y", "label"), Column("n", "number"), Column("t", "time", "hour_of_day")]
    frame = _frame(
        y=["1", "5", "0", "1"], n=["2", "3", "x", None], t=["2601011", "7", "8", "26010123"]
    )
    chunk = _check(columns, on_bad_row="skip").chunk(frame, 10)
    assert chunk.records == 4 and chunk.bad == 2 and len(chunk) == 2
    assert chunk.rows.tolist() == [10, 13] and chunk.rows.dtype == np.int64
    assert chunk.label.tolist() == [1.0, 1.0]
    assert chunk.numeric.tolist() == [[2.0, 0.0]] and chunk.numeric_valid.tolist() == [[1, 0]]
    assert chunk.time.tolist() == [2601011, 26010123]
    # the time's hour of day is the last categorical field
    assert chunk.categorical.tolist() == [[11, 23]] and chunk.categorical_valid.tolist() == [[1, 1]]


def test_parquet_counts_rows_and_reads_typed_columns():
    frame = pl.DataFrame(
        {
            "y": pl.Series([1, 0, 3], dtype=pl.Int64),
            "n": [0.5, None, 1.0],
            "h": pl.Series([0x05DB9164, None, 7], dtype=pl.Int64),
            "s": pl.Series([42, 43, 44], dtype=pl.Int64),
            "t": pl.Series([1, 2, 3], dtype=pl.Int32),
        }
    )
    columns = [Column("y", "label"), Column("n", "number"), Column("h", "hex")]
    columns += [Column("s", "string"), Column("t", "time", "value")]
    check = RowCheck(Path("p.parquet"), "team parquet", tuple(columns), "error", unit="row")
    with pytest.raises(DataError) as err:
        check.chunk(frame, 0)
    assert str(err.value) == (
        "p.parquet: row 3: malformed row: y is not 0 or 1 (got 3) "
        "(use on_bad_row=skip to drop them)"
    )
    chunk = check.chunk(frame.head(2), 0)
    assert chunk.categorical[0].tolist() == [0x05DB9164, 0] and chunk.categorical_valid[0, 1] == 0
    # an integer column of string categoricals is keyed by its decimal text, as in a CSV
    text = _check([Column("s", "string")]).chunk(_frame(s=["42", "43"]), 0)
    assert chunk.categorical[1].tolist() == text.categorical[0].tolist()
    assert chunk.categorical[2].tolist() == [1, 2] and chunk.time.tolist() == [1, 2]


def test_what_polars_cannot_read_is_one_line():
    raw = pl.scan_csv(b'a\n"1\n', has_header=True, schema={"a": pl.Utf8})  # an open quote
    with pytest.raises(DataError, match=rf"^{PATH}: cannot read as team data: "):
        _check([Column("a", "number")]).chunk(raw, 0)
    floats = pl.DataFrame({"h": [1.5]})  # never truncated to an id
    with pytest.raises(DataError, match=rf"^{PATH}: column 'h' holds Float64 values; hex "):
        _check([Column("h", "hex")]).chunk(floats, 0)
