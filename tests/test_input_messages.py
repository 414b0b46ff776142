"""Bad input named by file, column and line or row, in one line, with no library warning: a
Latin-1 byte in a schema'd CSV split by time, a parquet file of no rows, and in
`calibration-report` a text time among numbers and a Latin-1 segment value."""

from __future__ import annotations

import warnings

import polars as pl
import pytest

from ctrcal.api import prepare
from ctrcal.cli import main
from ctrcal.config import Config
from ctrcal.core.errors import DataError


def _cfg() -> Config:
    cfg = Config()
    cfg.data.schema = {"name": "team", "label": "y", "categorical": ["site"], "time": "ts"}
    cfg.data.split_order = "time"
    cfg.features.min_count = 1
    return cfg


def test_a_latin1_byte_is_named_by_line_and_column(tmp_path):
    lines = ["y,site,ts"] + [f"{k % 2},s{k % 7},{k}" for k in range(6_000)]
    data = "\n".join(lines).encode() + b"\n"
    bad = f"{5000 % 2},s{5000 % 7},5000".encode()
    at = data.index(b"\n" + bad + b"\n") + 1  # line 5002: the header, then row 5001
    data = data[:at] + b"0,caf\xe9,5000" + data[at + len(bad) :]
    path = tmp_path / "logs.csv"
    path.write_bytes(data)
    with pytest.raises(DataError) as err:
        prepare([path], tmp_path / "p", _cfg())
    assert str(err.value) == (
        f"{path}: line 5002: not UTF-8 text (byte 0xe9 at character 6, "
        "column 'site'); save the file as UTF-8"
    )


def test_a_parquet_file_of_no_rows_is_named_empty(tmp_path):
    path = tmp_path / "part-0.parquet"
    pl.DataFrame(schema={"y": pl.Int64, "site": pl.Utf8, "ts": pl.Int64}).write_parquet(path)
    with pytest.raises(DataError, match=rf"^{path}: empty file \(a parquet file of 0 rows\)$"):
        prepare([path], tmp_path / "p", _cfg())


def _report(tmp_path, path, capsys, *extra: str) -> str:
    args = [
        "calibration-report",
        str(path),
        "--prob",
        "p",
        "--label",
        "y",
        *extra,
        "--out",
        str(tmp_path / "rep"),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a library warning would fail here, not print
        assert main(args) == 2  # bad input, not a failed gate
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err and str(path) in err, err
    assert not (tmp_path / "rep").exists()
    return err


def test_calibration_report_names_a_text_time_at_its_row(tmp_path, capsys):
    rows = [f"0.{k + 1},{k % 2},{100 + k}" for k in range(12)]
    rows[9] = "0.5,1,late"
    path = tmp_path / "preds.csv"
    path.write_text("p,y,hour\n" + "\n".join(rows) + "\n")
    err = _report(tmp_path, path, capsys, "--time", "hour")
    assert "column 'hour', row 10 (line 11): 'late' is neither a number nor a date" in err


def test_calibration_report_names_a_latin1_segment_by_line_and_column(tmp_path, capsys):
    rows = [f"0.{k + 1},{k % 2},s{k % 3}".encode() for k in range(12)]
    rows[6] = b"0.5,1,caf\xe9"
    path = tmp_path / "preds.csv"
    path.write_bytes(b"p,y,site\n" + b"\n".join(rows) + b"\n")
    err = _report(tmp_path, path, capsys, "--segments", "site")
    assert err.endswith(
        f"{path}: line 8: not UTF-8 text (byte 0xe9 at character 10, column "
        "'site'); save the file as UTF-8"
    )
