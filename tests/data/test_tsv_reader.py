"""The C reader of clean Criteo TSV files: the frame polars reads for the fast path, value for
value, whatever the thread count; anything else handed back (None) to polars and the strict
path, whose errors still name file and line; prepared output byte-identical either way."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ctrcal.data import column_codes, criteo, fastpath, tsv_reader
from ctrcal.data.prepare import prepare
from ctrcal.data.synthetic import generate_frame, write_criteo
from ctrcal.errors import DataError

pytestmark = pytest.mark.skipif(not tsv_reader.available(), reason="no C compiler here")

GOOD = ["0", "1", "-1", "260", *["3"] * 10, *["05db9164"] * 26]


def _with(index: int, value: str) -> list[str]:
    row = list(GOOD)
    row[index] = value
    return row


def _write(path: Path, rows: list[list[str]], end: str = "\n", last: bool = True) -> Path:
    text = end.join("\t".join(r) for r in rows)
    path.write_bytes((text + (end if last and rows else "")).encode())
    return path


class _Source:
    def __init__(self, path: Path) -> None:
        self.path = self.read_path = path
        self.fmt = criteo.detect_format(path, "auto")


def _polars(path: Path, monkeypatch) -> pl.DataFrame:
    """The fast path's frame as polars reads it (the C reader switched off)."""
    with monkeypatch.context() as m:
        m.setenv(tsv_reader.ENV_SWITCH, "0")
        return fastpath._parse([_Source(path)])[0]


def _native(path: Path, threads: int | None = None) -> pl.DataFrame | None:
    s = _Source(path)
    return tsv_reader.read_clean(s.read_path, s.fmt, threads=threads)


def _assert_same_frame(a: pl.DataFrame, b: pl.DataFrame) -> None:
    assert a.schema == b.schema
    assert a.equals(b, null_equal=True)


@pytest.mark.parametrize("layout", ["dac", "dac_test"])
def test_generated_file_equals_polars_for_any_thread_count(tmp_path, monkeypatch, layout):
    frame = generate_frame(2_000, seed=5)[0]  # with missing numerics and categoricals
    path = write_criteo(frame, tmp_path / "train.txt", layout)
    want = _polars(path, monkeypatch)
    assert want[criteo.NUMERIC_COLUMNS[0]].null_count() > 0
    assert want[criteo.CATEGORICAL_COLUMNS[-1]].null_count() > 0
    for threads in (1, 2, 3, 7):
        got = _native(path, threads)
        assert got is not None
        _assert_same_frame(got, want)


SPELLINGS = ["0", "-0", "7", "-7", "007", "-007", "12345678", "-12345678", "123456789",
             "99999999", "100000000", "1" * 17, "123456789012345678", "-999999999999999999",
             ""]  # fmt: skip


def test_every_accepted_integer_spelling_reads_as_polars_reads_it(tmp_path, monkeypatch):
    # each spelling in every integer field, and lengths 1..18 at the end of the file too
    rows = []
    for k, value in enumerate(SPELLINGS):
        for field in range(14):
            rows.append(_with(field, value if field else str(k % 2)))
    rows += [_with(13, "9" * n) for n in range(1, 19)]
    path = _write(tmp_path / "train.txt", rows, last=False)  # no newline after the last line
    got = _native(path, 2)
    assert got is not None
    _assert_same_frame(got, _polars(path, monkeypatch))
    assert got["I13"].to_list()[-18:] == [int("9" * n) for n in range(1, 19)]


def test_upper_case_hashes_and_a_single_row(tmp_path, monkeypatch):
    path = _write(tmp_path / "one.txt", [_with(20, "05DB9164")])
    got = _native(path)
    assert got is not None and got.height == 1
    _assert_same_frame(got, _polars(path, monkeypatch))


NOT_CLEAN = {
    "plus sign": [_with(5, "+5")],
    "space": [_with(5, " 7")],
    "19 digits": [_with(5, "1" * 19)],
    "lone minus": [_with(5, "-")],
    "decimal": [_with(5, "1.0")],
    "short hash": [_with(20, "12")],
    "long hash": [_with(20, "123456789")],
    "non-hex hash": [_with(20, "0000000g")],
    "extra field": [[*GOOD, "extra"]],
    "row ending in its integers": [GOOD[:10]],
    "row ending after its integers": [GOOD[:14]],
    "empty line": [GOOD, [], GOOD],
}


@pytest.mark.parametrize("layout", ["dac", "dac_test"])
def test_ragged_rows_read_as_polars_pads_them(tmp_path, monkeypatch, layout):
    """Rows that end within their hash fields (published samples drop trailing empty fields):
    the missing fields are missing, as in the general reader, also on a last line without a
    newline and at a chunk boundary of every thread count."""
    good = GOOD if layout == "dac" else GOOD[1:]
    ints = len(good) - 26
    rows = [good[: ints + 1 + k % 26] if k % 3 else good for k in range(300)]
    rows[5] = good[: ints + 1][:-1] + [""]  # the first hash field empty, nothing after it
    rows.append(good[:-2])
    for last in (True, False):
        path = _write(tmp_path / f"ragged_{last}.txt", rows, last=last)
        assert criteo.detect_format(path, "auto").layout == layout
        want = _polars(path, monkeypatch)
        assert want[criteo.CATEGORICAL_COLUMNS[-1]].null_count() > 100
        for threads in (1, 2, 3, 7):
            got = _native(path, threads)
            assert got is not None
            _assert_same_frame(got, want)


@pytest.mark.parametrize("case", NOT_CLEAN)
def test_anything_unusual_is_handed_back(tmp_path, case):
    rows = [GOOD] * 30 + NOT_CLEAN[case] + [GOOD] * 30
    path = _write(tmp_path / "train.txt", rows)
    for threads in (1, 2):
        assert _native(path, threads) is None


def test_crlf_and_empty_files_are_handed_back(tmp_path, monkeypatch):
    crlf = _write(tmp_path / "crlf.txt", [GOOD] * 5, end="\r\n")
    assert _native(crlf) is None
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert tsv_reader.read_clean(empty, criteo.detect_format(crlf, "auto")) is None


def test_handed_back_rows_keep_the_strict_errors(tmp_path):
    path = _write(tmp_path / "train.txt", [GOOD] * 20 + [_with(5, "1.5")] + [GOOD] * 5)
    assert _native(path) is None
    with pytest.raises(DataError, match=rf"{path}: line 21: malformed row: I5 is not an integer"):
        prepare([path], tmp_path / "p")


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}  # fmt: skip


def _prepared(path: Path, out: Path, monkeypatch, switch: str, threads: int = 2) -> dict:
    with monkeypatch.context() as m:
        m.setenv(tsv_reader.ENV_SWITCH, switch)
        m.setattr(tsv_reader.pl, "thread_pool_size", lambda: threads)
        res = prepare([path], out)
    assert res.summary["fast_path"] is True
    files = _files(res.out_dir)
    assert "feature_map.json" in files and len(files) > 3
    files.pop("summary.json", None)  # timings
    return files


def test_prepared_bytes_equal_with_and_without_the_c_reader(tmp_path, monkeypatch):
    frame = generate_frame(3_000, seed=9)[0]
    path = write_criteo(frame, tmp_path / "train.txt", "dac")
    calls = []
    real = tsv_reader.read_clean_columns
    monkeypatch.setattr(tsv_reader, "read_clean_columns",
                        lambda *a, **k: calls.append(1) or real(*a, **k))  # fmt: skip
    off = _prepared(path, tmp_path / "off", monkeypatch, "0")
    one = _prepared(path, tmp_path / "one", monkeypatch, "1", threads=1)
    two = _prepared(path, tmp_path / "two", monkeypatch, "1", threads=2)
    assert calls  # the fast path asked the C reader
    assert off.keys() == one.keys() == two.keys()
    for name in off:
        assert off[name] == one[name] == two[name], name


def test_without_a_compiler_polars_reads_the_file(tmp_path, monkeypatch):
    frame = generate_frame(500, seed=2)[0]
    path = write_criteo(frame, tmp_path / "train.txt", "dac")
    want = _prepared(path, tmp_path / "with", monkeypatch, "1")
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr("ctrcal.cbuild._cache_dir", lambda: tmp_path / "empty-cache")
    libraries = (tsv_reader._LIBRARY, column_codes._LIBRARY)
    try:
        for lib in libraries:
            lib.forget()
        assert not tsv_reader.available() and not column_codes.available()
        assert all("no-such-compiler" in lib.error for lib in libraries)
        assert _native(path) is None
        assert _prepared(path, tmp_path / "without", monkeypatch, "1") == want
    finally:
        for lib in libraries:  # the next test builds (or loads the cached build) again
            lib.forget()


def test_columns_outlive_the_file(tmp_path):
    # the memory map closes once parsed: the columns returned own their memory
    path = write_criteo(generate_frame(300, seed=1)[0], tmp_path / "t.txt", "dac")
    got = _native(path, 2)
    assert got is not None
    path.unlink()
    assert np.isfinite(got["I1"].fill_null(0).to_numpy()).all()
