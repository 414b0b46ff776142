"""Rough edges of reading and writing data: a UTF-8 byte order mark, bytes that are not
UTF-8, a truncated prepared part, the temporary file of a killed ``ctrcal synth``."""

from __future__ import annotations

import shutil
import time

import polars as pl
import pytest
from interrupt import ctrcal_argv, kill_9, start
from parsed_rows import read_rows

from ctrcal.api import prepare
from ctrcal.cli import main
from ctrcal.core.errors import DataError
from ctrcal.data.loader import ParquetCTRData
from ctrcal.preparation.chunks import BOM, iter_text_chunks
from ctrcal.preparation.criteo import detect_format


@pytest.mark.parametrize("layout", ["x4", "dac"])
def test_a_utf8_byte_order_mark_is_skipped(criteo_files, tmp_path, layout):
    plain = criteo_files[layout]
    marked = tmp_path / f"bom_{plain.name}"
    marked.write_bytes(BOM + plain.read_bytes())
    assert detect_format(marked).layout == layout
    assert read_rows(marked).equals(read_rows(plain))
    res = prepare([marked], tmp_path / "p")
    assert res.total_rows == 1_000


def test_bytes_that_are_not_utf8_are_named_by_line(criteo_files, tmp_path):
    lines = criteo_files["dac"].read_bytes().splitlines(keepends=True)
    lines[402] = lines[402].replace(b"\t", b"\t\xff\xfe", 1)
    path = tmp_path / "train.txt"
    path.write_bytes(b"".join(lines))
    with pytest.raises(DataError, match=rf"{path}: line 403: not UTF-8 text \(byte 0xff"):
        prepare([path], tmp_path / "p", on_bad_row="skip")
    assert not (tmp_path / "p").exists()


def test_chunks_are_whole_lines_of_the_file(tmp_path):
    text = b"".join(b"%d\t" % i + b"x" * (i % 97) + b"\n" for i in range(3_000))
    text += b"y" * 50_000 + b"\n" + b"last line without a newline"  # a line longer than a chunk
    path = tmp_path / "t.txt"
    path.write_bytes(BOM + text)
    for size in (1, 100, 4_096, 1 << 20):
        chunks = [bytes(c) for c in iter_text_chunks(path, size)]
        assert b"".join(chunks) == text
        assert all(c.endswith(b"\n") for c in chunks[:-1])


def test_a_truncated_part_is_named_by_its_file(prepared_dir, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(prepared_dir, data)
    part = sorted((data / "valid").glob("*.parquet"))[0]
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    for mode in ("memory", "stream"):
        with pytest.raises(DataError, match=rf"{part}: unreadable parquet"):
            ParquetCTRData(data, "valid", mode=mode)


@pytest.mark.slow
def test_a_killed_synth_leaves_no_temporary_behind(tmp_path):
    out = tmp_path / "train.txt"
    proc = start(ctrcal_argv("synth", str(out), "--rows", "3000000"))
    deadline = time.time() + 120
    while not list(tmp_path.glob(".train.txt.*.tmp")) and time.time() < deadline:
        assert proc.poll() is None
        time.sleep(0.01)
    kill_9(proc)
    assert list(tmp_path.glob(".*.tmp"))  # the kill left its temporary
    # the next synth runs in this process: the same command, and its click model (seed 0) is
    # likely calibrated here already, where a new process calibrates it again (about 0.5 s)
    assert main(["synth", str(out), "--rows", "500"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.txt", "train.txt.prob.parquet"]
    assert pl.read_parquet(out.with_name("train.txt.prob.parquet")).height == 500


def test_a_full_disk_while_writing_names_the_output_and_the_cause(
    criteo_files, tmp_path, monkeypatch
):
    from ctrcal.preparation import write

    def full(path, columns, block, compression):  # a part file's write, in the writer's thread
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(write, "write_part", full)
    out = tmp_path / "p"
    with pytest.raises(DataError, match=rf"{out}: cannot write the prepared data: No space left"):
        prepare([criteo_files["dac"]], out)
    assert not out.exists() and not list(tmp_path.glob(".p.*"))
