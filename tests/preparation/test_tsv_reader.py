"""The C parse equals the polars parse on a chunk: the same columns value for value whatever
the thread count; anything else is handed back (None) to polars, whose errors name file and
line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ctrcal.api import prepare
from ctrcal.core.errors import DataError
from ctrcal.preparation import criteo, parse, tsv_reader
from ctrcal.preparation.parsed import ParsedChunk
from ctrcal.preparation.synthetic import generate_frame, write_criteo

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


def _chunk(path: Path) -> tuple[bytes, criteo.CriteoFormat]:
    fmt = criteo.detect_format(path, "auto")
    return path.read_bytes(), fmt


def _polars(path: Path) -> ParsedChunk:
    chunk, fmt = _chunk(path)
    return parse._polars(chunk, path, fmt, 0, "error")


def _native(path: Path, threads: int = 2) -> ParsedChunk | None:
    chunk, fmt = _chunk(path)
    return parse._native(chunk, fmt, 0, threads)


def _assert_same_chunk(a: ParsedChunk, b: ParsedChunk) -> None:
    for name in ("rows", "label", "numeric", "numeric_valid", "categorical", "categorical_valid"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        # a missing value's slot is 0 in both; numerics compare as float64 bits (-0 == 0)
        if x.dtype == np.float64 and name != "label":
            x, y = x + 0.0, y + 0.0
        np.testing.assert_array_equal(x, y, err_msg=name)
    assert a.records == b.records and a.bad == b.bad == 0


@pytest.mark.parametrize("layout", ["dac", "dac_test"])
def test_generated_chunk_equals_polars_for_any_thread_count(tmp_path, layout):
    frame = generate_frame(2_000, seed=5)[0]  # with missing numerics and categoricals
    path = write_criteo(frame, tmp_path / "train.txt", layout)
    want = _polars(path)
    assert not want.numeric_valid[0].all() and not want.categorical_valid[-1].all()
    for threads in (1, 2, 3, 7):
        got = _native(path, threads)
        assert got is not None and got.native
        _assert_same_chunk(got, want)


SPELLINGS = [
    "0",
    "-0",
    "7",
    "-7",
    "007",
    "-007",
    "12345678",
    "-12345678",
    "123456789",
    "99999999",
    "100000000",
    "1" * 17,
    "123456789012345678",
    "-999999999999999999",
    "",
]


def test_every_accepted_integer_spelling_reads_as_polars_reads_it(tmp_path):
    # each spelling in every integer field, and lengths 1..18 at the end of the file too
    rows = []
    for k, value in enumerate(SPELLINGS):
        for field in range(14):
            rows.append(_with(field, value if field else str(k % 2)))
    rows += [_with(13, "9" * n) for n in range(1, 19)]
    path = _write(tmp_path / "train.txt", rows, last=False)  # no newline after the last line
    got = _native(path, 2)
    assert got is not None
    _assert_same_chunk(got, _polars(path))
    assert got.numeric[-1, -18:].tolist() == [float(int("9" * n)) for n in range(1, 19)]


def test_upper_case_hashes_and_a_single_row(tmp_path):
    path = _write(tmp_path / "one.txt", [_with(20, "05DB9164")])
    got = _native(path)
    assert got is not None and len(got) == 1
    _assert_same_chunk(got, _polars(path))
    assert got.categorical[6, 0] == got.categorical[0, 0] == 0x05DB9164


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
    "label 2": [_with(0, "2")],
    "empty label": [_with(0, "")],
}


@pytest.mark.parametrize("layout", ["dac", "dac_test"])
def test_ragged_rows_read_as_polars_pads_them(tmp_path, layout):
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
        want = _polars(path)
        assert (want.categorical_valid[-1] == 0).sum() > 100
        for threads in (1, 2, 3, 7):
            got = _native(path, threads)
            assert got is not None
            _assert_same_chunk(got, want)


@pytest.mark.parametrize("case", NOT_CLEAN)
def test_anything_unusual_is_handed_back(tmp_path, case):
    rows = [GOOD] * 30 + NOT_CLEAN[case] + [GOOD] * 30
    path = _write(tmp_path / "train.txt", rows)
    for threads in (1, 2):
        assert _native(path, threads) is None


def test_crlf_is_handed_back(tmp_path):
    crlf = _write(tmp_path / "crlf.txt", [GOOD] * 5, end="\r\n")
    assert _native(crlf) is None
    assert len(_polars(crlf)) == 5


def test_handed_back_rows_keep_the_strict_errors(tmp_path):
    path = _write(tmp_path / "train.txt", [GOOD] * 20 + [_with(5, "1.5")] + [GOOD] * 5)
    assert _native(path) is None
    with pytest.raises(DataError, match=rf"{path}: line 21: malformed row: I5 is not an integer"):
        prepare([path], tmp_path / "p")
