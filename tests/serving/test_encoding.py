"""The raw-row encoder checks its rows with ``prepare``'s own row checks: each value gets the
verdict and the words ``prepare`` gives it, in one line naming the row and the column."""

from __future__ import annotations

import re

import numpy as np
import polars as pl
import pytest

from ctrcal.api import prepare
from ctrcal.config import Config
from ctrcal.core.criteo_schema import CATEGORICAL_COLUMNS, LABEL, NUMERIC_COLUMNS
from ctrcal.core.errors import DataError
from ctrcal.data.schema import resolve_schema
from ctrcal.preparation import criteo, parse, schema_reader
from ctrcal.serving.encoding import RawRowEncoder

# a schema whose time column is a feature: its value is the model's last categorical field
TIMED = {
    "name": "timed",
    "label": "y",
    "numeric": ["n"],
    "categorical": ["c"],
    "time": "ts",
    "time_feature": "value",
}


@pytest.fixture(scope="module")
def timed_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("timed")
    rng = np.random.default_rng(0)
    rows = 400
    frame = pl.DataFrame(
        {
            "y": (rng.random(rows) < 0.3).astype(np.int64),
            "n": rng.normal(size=rows).round(3),
            "c": [f"v{k}" for k in rng.integers(0, 6, rows)],
            "ts": np.sort(rng.integers(100, 110, rows)),
        }
    )
    frame.write_csv(root / "timed.csv")
    cfg = Config()
    cfg.data.schema = TIMED
    cfg.features.min_count = 2
    return prepare([root / "timed.csv"], root / "data", cfg).out_dir


def _verdict(call) -> str | None:
    """None when ``call`` takes the row, else the words after 'malformed row: ' (file, line
    and advice left out); anything but a one-line DataError fails the test."""
    try:
        call()
    except DataError as exc:
        message = str(exc)
        assert "\n" not in message, message
        found = re.search(r"malformed row: (.*?)(?: \(use \S+ to drop them\))?$", message)
        assert found, message
        return found.group(1)
    return None


def _prepare_verdict(path, fmt) -> str | None:
    return _verdict(lambda: list(parse.iter_chunks(path, fmt, "error")))


def _serving_verdict(encoder, row) -> str | None:
    return _verdict(lambda: encoder.encode([row]))


CRITEO_CASES = [
    ("I1", "3.5", "I1 is not an integer (got '3.5')"),
    ("I1", " 3", "I1 is not an integer (got ' 3')"),
    ("I1", "nan", "I1 is not an integer (got 'nan')"),
    ("C1", " 1a", "C1 is not a hex value of at most 8 digits (got ' 1a')"),
    ("I1", "260.0", None),
    ("I2", "-1", None),
    ("C1", "1a", None),
    ("C1", "", None),
]


@pytest.mark.parametrize(("column", "value", "said"), CRITEO_CASES)
def test_a_criteo_value_gets_prepares_verdict_when_served(
    column, value, said, prepared_dir, tmp_path
):
    from ctrcal.preparation.synthetic import generate_frame, write_criteo

    frame, _ = generate_frame(1, seed=3)
    path = write_criteo(frame, tmp_path / "one.txt", "dac")
    fields = path.read_text().rstrip("\n").split("\t")
    names = [LABEL, *NUMERIC_COLUMNS, *CATEGORICAL_COLUMNS]
    fields[names.index(column)] = value
    path.write_text("\t".join(fields) + "\n")
    row = dict(zip(names, fields, strict=True))
    fmt = criteo.detect_format(path)
    assert _prepare_verdict(path, fmt) == said
    assert _serving_verdict(RawRowEncoder(prepared_dir), row) == said


TIMED_CASES = [
    ("ts", "yesterday", "ts is not an integer time (got 'yesterday')"),
    ("ts", "12.5", "ts is not an integer time (got '12.5')"),
    ("ts", "", "ts is not an integer time (empty)"),
    ("n", "x", "n is not a number (got 'x')"),
    ("ts", "105", None),
    ("n", " 3", None),
    ("c", " v1", None),
]


@pytest.mark.parametrize(("column", "value", "said"), TIMED_CASES)
def test_a_schema_value_gets_prepares_verdict_when_served(column, value, said, timed_dir, tmp_path):
    row = {"y": "1", "n": "0.5", "c": "v1", "ts": "104", column: value}
    path = tmp_path / "one.csv"
    path.write_text("y,n,c,ts\n" + ",".join(row[k] for k in ("y", "n", "c", "ts")) + "\n")
    fmt = schema_reader.detect(path, resolve_schema(TIMED))
    assert _prepare_verdict(path, fmt) == said
    assert _serving_verdict(RawRowEncoder(timed_dir), row) == said


def test_a_bad_row_is_one_line_naming_the_row_and_column(timed_dir):
    encoder = RawRowEncoder(timed_dir)
    good = {"n": "0.5", "c": "v1", "ts": "104"}
    cat, num = encoder.encode([good, {**good, "ts": 104, "n": None}])
    assert cat.shape == (2, 2) and np.isnan(num[1, 0]) and (cat[0] == cat[1]).all()
    with pytest.raises(DataError) as err:
        encoder.encode([good, {**good, "ts": "yesterday"}])
    assert (
        str(err.value) == "rows: row 1: malformed row: ts is not an integer time (got 'yesterday')"
    )
    with pytest.raises(DataError) as err:
        encoder.encode([good, None])
    assert str(err.value) == "rows: row 1: expected a mapping of column to value, got None"
    with pytest.raises(DataError) as err:
        encoder.encode(good)
    assert str(err.value) == "rows: expected a list of rows, got one row (a mapping); pass [row]"
    with pytest.raises(DataError) as err:
        encoder.encode([{"n": "1", "c": "v1"}])
    assert str(err.value) == "rows: row 0: no column 'ts' (the model reads n, c, ts)"
