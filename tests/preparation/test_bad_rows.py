"""Malformed rows: an error naming file and line by default, or skipped and counted."""

from __future__ import annotations

import pytest
from parsed_rows import read_rows

from ctrcal.api import prepare
from ctrcal.core.errors import DataError

GOOD = ["0", "1", "-1", "260.0", *["3"] * 10, *["05db9164"] * 26]


def _write(path, rows, header=None, sep="\t"):
    lines = ([header] if header else []) + [sep.join(r) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def _with(index, value):
    row = list(GOOD)
    row[index] = value
    return row


BAD_CASES = [
    (GOOD + ["extra"], "more fields"),
    (_with(0, "2"), "label is not 0 or 1"),
    (_with(0, ""), "label is not 0 or 1"),
    (_with(2, "abc"), "I2 is not an integer"),
    (_with(3, "2.5"), "I3 is not an integer"),
    (_with(14, "zz0049e6"), "C1 is not a hex"),
    (_with(20, "123456789"), "C7 is not a hex"),
]


@pytest.mark.parametrize(("row", "match"), BAD_CASES, ids=[m for _, m in BAD_CASES])
def test_error_names_file_and_line(tmp_path, row, match):
    path = _write(tmp_path / "train.txt", [GOOD, GOOD, row, GOOD])
    with pytest.raises(DataError, match=match) as err:
        read_rows(path)
    assert f"{path}: line 3:" in str(err.value)


def test_line_counts_the_header(tmp_path):
    header = ",".join(["label", *[f"I{i}" for i in range(1, 14)], *[f"C{i}" for i in range(1, 27)]])
    path = _write(tmp_path / "x4.csv", [GOOD, _with(5, "x")], header=header, sep=",")
    with pytest.raises(DataError, match=r"line 3: malformed row: I5 is not an integer \(got 'x'\)"):
        read_rows(path)


def test_skip_drops_and_counts(tmp_path):
    rows = [GOOD] * 30 + [case for case, _ in BAD_CASES]
    path = _write(tmp_path / "train.txt", rows)
    assert read_rows(path, on_bad_row="skip").height == 30
    out = tmp_path / "prep"
    with pytest.raises(DataError, match="line 31"):
        prepare([path], out)
    assert not out.exists()  # no partial output
    assert not list(tmp_path.glob(".prep.*"))  # and no temporary left behind
    res = prepare([path], out, on_bad_row="skip")
    assert res.bad_rows == len(BAD_CASES)
    assert res.total_rows == 30
    assert "skipped 7 malformed rows" in res.describe()


def test_all_rows_bad(tmp_path):
    path = _write(tmp_path / "train.txt", [_with(0, "7")] * 3)
    with pytest.raises(DataError, match="train split is empty"):
        prepare([path], tmp_path / "prep", on_bad_row="skip")


def test_unlabelled_file_cannot_train(criteo_files, tmp_path):
    with pytest.raises(DataError, match="has no labels"):
        prepare([criteo_files["dac_test"]], tmp_path / "prep")


def test_prepare_truncated_gzip_and_empty_leave_nothing(criteo_files, tmp_path):
    data = criteo_files["dac_gz"].read_bytes()
    cut = tmp_path / "day_1.gz"
    cut.write_bytes(data[: len(data) // 2])
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    for path, match in ((cut, "truncated gzip"), (empty, "empty file")):
        out = tmp_path / f"out_{path.stem}"
        with pytest.raises(DataError, match=match):
            prepare([path], out)
        assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["day_1.gz", "empty.txt"]


NON_FINITE = ["inf", "nan", "-inf", "NaN", "Infinity", "1e400"]


@pytest.mark.parametrize("value", NON_FINITE)
def test_non_finite_integer_fields_are_malformed(tmp_path, value):
    path = _write(tmp_path / "train.txt", [GOOD, GOOD, _with(4, value), GOOD])
    with pytest.raises(DataError, match=rf"{path}: line 3: malformed row: I4 is not an integer"):
        read_rows(path)


def test_prepare_rejects_or_skips_non_finite_numerics(tmp_path):
    rows = [GOOD] * 20 + [_with(4, v) for v in NON_FINITE] + [_with(2, "260.0")]
    path = _write(tmp_path / "train.txt", rows)
    with pytest.raises(DataError, match="line 21: malformed row: I4 is not an integer"):
        prepare([path], tmp_path / "p")
    res = prepare([path], tmp_path / "q", on_bad_row="skip")
    assert res.bad_rows == len(NON_FINITE) and res.total_rows == 21


def test_one_row_files(tmp_path):
    one = [_with(30, "")]  # C17 missing: a field without a single value in train
    paths = {s: [_write(tmp_path / f"{s}.txt", one)] for s in ("train", "valid", "test")}
    res = prepare(paths, tmp_path / "p")
    assert res.rows == {"train": 1, "valid": 1, "test": 1}
    from ctrcal.config import Config

    cfg = Config()
    cfg.data.split = [1, 0, 0]
    res = prepare(paths["train"], tmp_path / "q", cfg)
    assert res.rows == {"train": 1, "valid": 0, "test": 0}
    text = res.describe()
    assert "valid            0 rows, empty" in text and "nan" not in text


GOOD_INT = ["0", "1", "-1", "260", *["3"] * 10, *["05db9164"] * 26]  # every chunk C-readable
MALFORMED = [
    (5, "inf", "I5 is not an integer"),
    (5, "nan", "I5 is not an integer"),
    (5, "1.5", "I5 is not an integer"),
    (5, "1e400", "I5 is not an integer"),
    (5, "x", "I5 is not an integer"),
    (0, "2", "label is not 0 or 1"),
    (0, "-1", "label is not 0 or 1"),
    (16, "zz0049e6", "C3 is not a hex"),
    (16, "05DB916G", "C3 is not a hex"),
    (16, "123456789", "C3 is not a hex"),
    (16, "12", None),  # short hex is a value
    (40, "extra", "more fields"),
]


@pytest.mark.parametrize(
    ("index", "value", "match"), MALFORMED, ids=[str(i) for i in range(len(MALFORMED))]
)
def test_malformed_rows_named_by_line(tmp_path, index, value, match):
    row = list(GOOD_INT) + ([value] if index == len(GOOD_INT) else [])
    row[index] = value
    path = _write(tmp_path / "train.txt", [GOOD_INT] * 20 + [row] + [GOOD_INT] * 5)
    if match is None:
        assert prepare([path], tmp_path / "p").total_rows == 26
        return
    with pytest.raises(DataError, match=rf"{path}: line 21: malformed row: {match}"):
        prepare([path], tmp_path / "p")
    res = prepare([path], tmp_path / "q", on_bad_row="skip")
    assert res.bad_rows == 1 and res.total_rows == 25


def test_malformed_hash_in_a_held_out_split(tmp_path):
    bad = list(GOOD_INT)
    bad[20] = "0000000g"
    train = _write(tmp_path / "tr.txt", [GOOD_INT] * 20)
    valid = _write(tmp_path / "va.txt", [GOOD_INT] * 5)
    test = _write(tmp_path / "te.txt", [GOOD_INT] * 3 + [bad] + [GOOD_INT])
    with pytest.raises(DataError, match=rf"{test}: line 4: malformed row: C7 is not a hex"):
        prepare({"train": [train], "valid": [valid], "test": [test]}, tmp_path / "p")


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_non_finite_criteo_x1_number_is_named_not_a_traceback(tmp_path, value):
    header = ",".join(["label", *[f"I{i}" for i in range(1, 14)], *[f"C{i}" for i in range(1, 27)]])
    good = ["1", *["0.25"] * 13, *["123"] * 26]
    bad = list(good)
    bad[3] = value
    path = _write(tmp_path / "x1.csv", [good, bad, good], header, ",")
    with pytest.raises(
        DataError, match=rf"line 3: malformed row: I3 is not a number \(got '{value}'\)"
    ):
        read_rows(path)
    assert read_rows(path, on_bad_row="skip")["C1"].to_list() == [123, 123]  # decimal ids
