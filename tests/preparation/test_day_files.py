"""Criteo 1TB's layout in small: 24 day files (plain and gzip), whole days by time, with a
per-field vocabulary cap whose overflow is hashed into a fixed number of ids."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from parsed_rows import read_rows

from ctrcal.api import prepare
from ctrcal.config import Config
from ctrcal.core.criteo_schema import CATEGORICAL_COLUMNS
from ctrcal.core.ids import NUM_RESERVED, OOV_ID
from ctrcal.data.feature_map import FeatureMap
from ctrcal.preparation.features import VOCAB_FILE, FeaturePipeline, hash_bucket
from ctrcal.preparation.fit_stats import FitStats
from ctrcal.preparation.synthetic import generate_frame, write_criteo

DAYS, ROWS_PER_DAY, CAP, BUCKETS = 24, 150, 20, 7


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    root = tmp_path_factory.mktemp("days")
    frame, _ = generate_frame(DAYS * ROWS_PER_DAY, seed=3)
    paths = []
    for d in range(DAYS):
        name = f"day_{d}.gz" if d % 3 == 0 else f"day_{d}"
        part = frame.slice(d * ROWS_PER_DAY, ROWS_PER_DAY)
        paths.append(write_criteo(part, root / name))
    return paths[::-1]  # given in any order: read in day order


def _cfg(max_vocab: int) -> Config:
    cfg = Config()
    cfg.data.split = [22, 1, 1]
    cfg.data.split_order = "time"
    cfg.features.min_count = 1
    cfg.features.max_vocab = max_vocab
    cfg.features.hash_buckets = BUCKETS
    return cfg


def test_day_files_with_a_vocabulary_cap(days, tmp_path):
    out = tmp_path / "p"
    res = prepare(days, out, _cfg(CAP))
    assert res.rows == {"train": 22 * ROWS_PER_DAY, "valid": ROWS_PER_DAY, "test": ROWS_PER_DAY}
    fmap = FeatureMap.load(out)
    uncapped = FeatureMap.load(prepare(days, tmp_path / "u", _cfg(0)).out_dir)
    capped = []
    for name, size, full in zip(
        fmap.categorical_fields, fmap.vocab_sizes, uncapped.vocab_sizes, strict=True
    ):
        if full > NUM_RESERVED + CAP:
            assert size == NUM_RESERVED + CAP + BUCKETS, name
            capped.append(name)
        else:
            assert size == full, name  # a field within the cap is untouched
    assert len(capped) >= 10
    text = res.describe(embedding_dim=16)
    assert f"capped at max_vocab {CAP}" in text and "embedding memory at dim" in text
    total = sum(fmap.vocab_sizes)
    assert f"{total:,} rows x 16 x 4 B" in text

    # the test day: kept values by their ids, every other value by its hash, never OOV
    test = pl.read_parquet(out / "test")
    raw = read_rows(days[0])  # day_23
    vocab = pl.read_parquet(out / VOCAB_FILE)
    for name in capped:
        ids, values = test[name].to_numpy(), raw[name]
        present = values.is_not_null().to_numpy()
        kept = vocab.filter(pl.col("field") == name)
        lookup = dict(zip(kept["value"].to_list(), kept["id"].to_list(), strict=True))
        v = values.fill_null(0).to_numpy()
        hashed = NUM_RESERVED + CAP + hash_bucket(v, BUCKETS)
        want = np.array([lookup.get(int(x), h) for x, h in zip(v, hashed, strict=True)])
        np.testing.assert_array_equal(ids[present], want[present])
        assert (ids[present] >= NUM_RESERVED + CAP).any() and not (ids == OOV_ID).any()
        assert ids.max() < NUM_RESERVED + CAP + BUCKETS


def test_cap_is_validated():
    from ctrcal.core.errors import DataError

    with pytest.raises(DataError, match="max_vocab"):
        FeaturePipeline(max_vocab=-1).fit_stats(FitStats(list(CATEGORICAL_COLUMNS), []))
