"""String categoricals keep their full 64-bit keys from parse to vocabulary: two strings whose
keys agree in their low 32 bits stay two feature values."""

from __future__ import annotations

import numpy as np
import polars as pl

from ctrcal.api import prepare
from ctrcal.config import Config
from ctrcal.data.feature_map import FeatureMap

# Found by brute force: the keys of "u0" .. "u299999" (XXH64, as coder.string_keys gives them)
# sorted by their low 32 bits; these two are the first adjacent pair with equal low halves.
PAIR = ("u223327", "u260522")
KEYS = (0x284C1EEF8867A1C1, 0x8772DEE68867A1C1)


def test_the_pair_shares_its_low_32_bits_only():
    from ctrcal.preparation.coder import string_keys

    a, b = string_keys(list(PAIR))
    assert (int(a), int(b)) == KEYS
    assert a != b and (a & 0xFFFFFFFF) == (b & 0xFFFFFFFF)


def test_strings_whose_keys_share_32_bits_get_their_own_ids(tmp_path):
    # one value always clicked, the other never: merged, they would share one id at a 50% rate
    values = [PAIR[0]] * 30 + [PAIR[1]] * 30 + ["other"] * 40
    clicks = [1] * 30 + [0] * 30 + [1, 0] * 20
    data = tmp_path / "logs.csv"
    pl.DataFrame({"y": clicks, "u": values}).write_csv(data)
    cfg = Config()
    cfg.data.schema = {"name": "team", "label": "y", "categorical": ["u"]}
    cfg.data.split = [1.0, 0.0, 0.0]
    cfg.features.min_count = 1
    prepare([data], tmp_path / "p", cfg)
    assert FeatureMap.load(tmp_path / "p").vocab_sizes == [3 + 3]
    vocab = pl.read_parquet(tmp_path / "p" / "vocab.parquet")
    assert vocab.height == 3 and vocab["count"].sort().to_list() == [30, 30, 40]
    train = pl.read_parquet(tmp_path / "p" / "train")
    rates = train.group_by("u").agg(pl.col("label").mean(), pl.len()).sort("u")
    by_id = {r["u"]: (r["label"], r["len"]) for r in rates.iter_rows(named=True)}
    assert sorted(by_id.values()) == [(0.0, 30), (0.5, 40), (1.0, 30)]
    # every id the vocabulary gives is used by the rows
    assert set(by_id) == set(vocab["id"].to_list())
    assert np.array_equal(np.sort(vocab["id"].to_numpy()), np.arange(3, 6))
