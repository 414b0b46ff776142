"""ParquetCTRData: memory, device and stream modes give the same rows as Batches."""

from __future__ import annotations

import shutil

import pyarrow.parquet as pq
import pytest
import torch

from ctrcal.core.batch import Batch
from ctrcal.core.errors import DataError
from ctrcal.data.loader import ParquetCTRData


def _rows(batches):
    cat = torch.cat([b.categorical for b in batches])
    num = torch.cat([b.numeric for b in batches])
    lab = torch.cat([b.label for b in batches])
    return cat, num, lab


def _sorted_key(cat, num, lab):
    # an order-free fingerprint of the rows
    key = torch.cat(
        [cat.double(), torch.nan_to_num(num.double(), nan=-99.0), lab.double()[:, None]], dim=1
    )
    return sorted(map(tuple, key.tolist()))


@pytest.fixture(scope="module")
def small_groups(prepared_dir, tmp_path_factory):
    """A copy of the prepared data whose valid split has many small row groups."""
    root = tmp_path_factory.mktemp("groups") / "data"
    shutil.copytree(prepared_dir, root)
    path = next((root / "valid").glob("*.parquet"))
    table = pq.read_table(path)
    pq.write_table(table, path, row_group_size=300)
    return root


def test_memory_plain_order_and_dtypes(prepared_dir):
    data = ParquetCTRData(prepared_dir, "test")
    batches = list(data.batches(1000))
    assert all(isinstance(b, Batch) for b in batches)
    assert [len(b) for b in batches[:-1]] == [1000] * (len(batches) - 1)
    b = batches[0]
    assert b.categorical.dtype == torch.int64 and b.numeric.dtype == torch.float32
    assert b.label.dtype == torch.float32
    whole = data.all()
    cat, num, lab = _rows(batches)
    assert torch.equal(cat, whole.categorical) and torch.equal(lab, whole.label)
    assert torch.equal(torch.isnan(num), torch.isnan(whole.numeric))


def test_shuffle_seeded_and_complete(prepared_dir):
    data = ParquetCTRData(prepared_dir, "valid")
    a = _rows(list(data.batches(256, shuffle=True, seed=1)))
    b = _rows(list(data.batches(256, shuffle=True, seed=1)))
    c = _rows(list(data.batches(256, shuffle=True, seed=2)))
    assert torch.equal(a[0], b[0])
    assert not torch.equal(a[0], c[0])
    whole = data.all()
    assert _sorted_key(*a) == _sorted_key(whole.categorical, whole.numeric, whole.label)


def test_drop_last(prepared_dir):
    data = ParquetCTRData(prepared_dir, "valid")
    sizes = [len(b) for b in data.batches(1000, shuffle=True, seed=0, drop_last=True)]
    assert sizes == [1000] * (len(data) // 1000)


def test_device_mode_cpu(prepared_dir):
    data = ParquetCTRData(prepared_dir, "test", mode="device", device="cpu")
    b = next(data.batches(64, shuffle=True, seed=0))
    assert b.categorical.device.type == "cpu" and len(b) == 64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_mode_cuda(prepared_dir):
    data = ParquetCTRData(prepared_dir, "test", mode="device", device="cuda")
    b = next(data.batches(64, shuffle=True, seed=0))
    assert b.categorical.is_cuda and b.categorical.dtype == torch.int64


def test_stream_matches_memory(small_groups):
    mem = ParquetCTRData(small_groups, "valid")
    stream = ParquetCTRData(small_groups, "valid", mode="stream", buffer_rows=700)
    assert len(stream) == len(mem)
    plain = _rows(list(stream.batches(128)))
    whole = mem.all()
    assert torch.equal(plain[0], whole.categorical)
    shuffled = list(stream.batches(128, shuffle=True, seed=0))
    assert all(len(b) == 128 for b in shuffled[:-1])
    s = _rows(shuffled)
    assert not torch.equal(s[0], whole.categorical)
    assert _sorted_key(*s) == _sorted_key(whole.categorical, whole.numeric, whole.label)
    again = _rows(list(stream.batches(128, shuffle=True, seed=0)))
    assert torch.equal(s[0], again[0])
    dropped = [len(b) for b in stream.batches(128, shuffle=True, seed=0, drop_last=True)]
    assert sum(dropped) == len(mem) - len(mem) % 128
    assert len(stream.all()) == len(mem)


def test_errors(prepared_dir, tmp_path):
    with pytest.raises(DataError, match="unknown data mode"):
        ParquetCTRData(prepared_dir, "test", mode="gpu")
    with pytest.raises(DataError, match="no 'holdout' split"):
        ParquetCTRData(prepared_dir, "holdout")
    with pytest.raises(DataError, match="no feature map"):
        ParquetCTRData(tmp_path, "train")
    with pytest.raises(DataError, match="batch_size"):
        next(ParquetCTRData(prepared_dir, "test").batches(0))
