"""Stream mode: background reading across files and row groups, early stop, errors."""

from __future__ import annotations

import shutil
import threading
import time

import pyarrow.parquet as pq
import pytest
import torch

from ctrcal.core.errors import DataError
from ctrcal.data.loader import ParquetCTRData


def _rows(batches):
    return tuple(
        torch.cat(t)
        for t in zip(*((b.categorical, b.numeric, b.label) for b in batches), strict=True)
    )


def _key(cat, num, lab):
    key = torch.cat(
        [cat.double(), torch.nan_to_num(num.double(), nan=-99.0), lab.double()[:, None]], dim=1
    )
    return sorted(map(tuple, key.tolist()))


@pytest.fixture(scope="module")
def two_files(prepared_dir, tmp_path_factory):
    """The prepared data with its valid split cut into two files of uneven row groups."""
    root = tmp_path_factory.mktemp("two_files") / "data"
    shutil.copytree(prepared_dir, root)
    path = next((root / "valid").glob("*.parquet"))
    table = pq.read_table(path)
    path.unlink()
    cut = table.num_rows // 3
    pq.write_table(table.slice(0, cut), root / "valid" / "part-00000.parquet", row_group_size=250)
    pq.write_table(table.slice(cut), root / "valid" / "part-00001.parquet", row_group_size=333)
    return root


def _stream_threads():
    return [t for t in threading.enumerate() if t.name == "ctrcal-stream"]


def test_in_order_across_files_and_groups(two_files):
    whole = ParquetCTRData(two_files, "valid").all()
    stream = ParquetCTRData(two_files, "valid", mode="stream", buffer_rows=500)
    batches = list(stream.batches(100))
    assert [len(b) for b in batches[:-1]] == [100] * (len(batches) - 1)
    cat, num, lab = _rows(batches)
    assert torch.equal(cat, whole.categorical) and torch.equal(lab, whole.label)
    assert torch.equal(torch.isnan(num), torch.isnan(whole.numeric))
    assert all(b.categorical.is_contiguous() and b.numeric.is_contiguous() for b in batches)


@pytest.mark.parametrize("buffer_rows", [64, 900, 1 << 20])
def test_shuffled_blocks_complete_and_seeded(two_files, buffer_rows):
    whole = ParquetCTRData(two_files, "valid").all()
    stream = ParquetCTRData(two_files, "valid", mode="stream", buffer_rows=buffer_rows)
    a = _rows(list(stream.batches(128, shuffle=True, seed=5)))
    assert _key(*a) == _key(whole.categorical, whole.numeric, whole.label)
    assert not torch.equal(a[0], whole.categorical)
    assert torch.equal(a[0], _rows(list(stream.batches(128, shuffle=True, seed=5)))[0])
    assert not torch.equal(a[0], _rows(list(stream.batches(128, shuffle=True, seed=6)))[0])
    sizes = [len(b) for b in stream.batches(128, shuffle=True, seed=5, drop_last=True)]
    assert sizes == [128] * (len(whole) // 128)


def test_unseeded_shuffle_follows_torch_seed(two_files):
    stream = ParquetCTRData(two_files, "valid", mode="stream", buffer_rows=500)
    torch.manual_seed(3)
    a = _rows(list(stream.batches(256, shuffle=True)))[0]
    torch.manual_seed(3)
    b = _rows(list(stream.batches(256, shuffle=True)))[0]
    assert torch.equal(a, b)


def test_stopping_early_ends_the_reader_thread(two_files):
    stream = ParquetCTRData(two_files, "valid", mode="stream", buffer_rows=300, prefetch=1)
    it = stream.batches(10, shuffle=True, seed=0)
    next(it)
    assert _stream_threads()
    it.close()
    deadline = time.monotonic() + 5
    while _stream_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _stream_threads()


def test_read_error_reaches_the_consumer(two_files, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(two_files, root)
    stream = ParquetCTRData(root, "valid", mode="stream", buffer_rows=300)
    second = root / "valid" / "part-00001.parquet"
    data = second.read_bytes()
    footer = int.from_bytes(data[-8:-4], "little") + 8
    # the footer (schema, row groups) intact, the pages destroyed: the thread's read fails
    second.write_bytes(data[:4] + b"\0" * (len(data) - 4 - footer) + data[-footer:])
    with pytest.raises(DataError, match="valid: reading parquet failed"):
        for _ in stream.batches(100):
            pass
    assert not _stream_threads() or all(not t.is_alive() for t in _stream_threads())


def test_bad_stream_settings(prepared_dir):
    with pytest.raises(DataError, match="buffer_rows and prefetch"):
        ParquetCTRData(prepared_dir, "valid", mode="stream", prefetch=0)
