"""Globs in data.inputs: expanded in sorted order, a pattern matching nothing refused by its
key, each file read and counted in the data identity once."""

from __future__ import annotations

import gzip

import polars as pl
import pytest

from ctrcal.api import prepare
from ctrcal.config import Config
from ctrcal.core.errors import DataError
from ctrcal.data.feature_map import FeatureMap


def _frame(rows: int = 600) -> pl.DataFrame:
    k = pl.int_range(rows, eager=True)
    return pl.DataFrame({"y": (k % 3 == 0).cast(pl.Int64), "u": (k % 17).cast(pl.Utf8), "ts": k})


def _cfg(inputs) -> Config:
    cfg = Config()
    cfg.data.schema = {"name": "team", "label": "y", "categorical": ["u"], "time": "ts"}
    cfg.data.split_order = "time"
    cfg.features.min_count = 1
    cfg.data.inputs = inputs
    return cfg


def test_globs_of_parquet_parts_and_csv_gz(tmp_path):
    frame = _frame()
    parts = tmp_path / "parts"
    parts.mkdir()
    for i in range(3):  # written out of order: the glob's order must not depend on it
        frame.slice(200 * (2 - i), 200).write_parquet(parts / f"part-{2 - i}.parquet")
    logs = tmp_path / "logs"
    logs.mkdir()
    for i in range(3):
        text = frame.slice(200 * i, 200).write_csv().encode()
        (logs / f"2026-11-0{i + 1}.csv.gz").write_bytes(gzip.compress(text))
    whole = tmp_path / "whole.csv"
    frame.write_csv(whole)

    ref = prepare(None, tmp_path / "ref", _cfg([str(whole)]))
    by_parts = prepare(None, tmp_path / "pq", _cfg([str(parts / "part-*.parquet")]))
    by_logs = prepare(None, tmp_path / "gz", _cfg([str(logs / "2026-11-*.csv.gz")]))
    for res in (by_parts, by_logs):
        assert res.rows == ref.rows and res.total_rows == 600
        assert pl.read_parquet(res.out_dir / "train").equals(pl.read_parquet(ref.out_dir / "train"))
    sources = FeatureMap.load(tmp_path / "pq").extra["sources"]
    assert [s["path"].rsplit("/", 1)[1] for s in sources] == [f"part-{i}.parquet" for i in range(3)]

    # a file named twice (a pattern and its path) is read once, and the identity is the same
    twice = [str(parts / "part-*.parquet"), str(parts / "part-1.parquet")]
    again = prepare(None, tmp_path / "pq", _cfg(twice))
    assert again.reused and again.source_hash == by_parts.source_hash
    assert again.total_rows == 600

    with pytest.raises(
        DataError, match=r"^data\.inputs\[1\]: '.*nothing-\*\.csv' matches no file$"
    ):
        prepare(None, tmp_path / "none", _cfg([str(whole), str(tmp_path / "nothing-*.csv")]))
