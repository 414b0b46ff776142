"""Split assignment: data.split_order time (rows and whole day files), config checks."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from ctrcal.api import prepare
from ctrcal.config import Config
from ctrcal.core.errors import ConfigError, DataError
from ctrcal.data.feature_map import FeatureMap
from ctrcal.preparation.splits import SplitPlan, count_records
from ctrcal.preparation.synthetic import generate_frame, write_criteo
from ctrcal.validate import load_config


def _cfg(order="time", split=(0.8, 0.1, 0.1)):
    cfg = Config()
    cfg.features.min_count = 1
    cfg.data.split_order = order
    cfg.data.split = list(split)
    return cfg


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    frame, _ = generate_frame(1_000, seed=4)
    return write_criteo(frame, tmp_path_factory.mktemp("time") / "train.txt")


def _explicit(tmp_path, parts, name="e"):
    """The splits prepared from ``parts`` (``{split: [paths]}``) as given: the same train rows
    fit the same vocabularies and statistics, so a split made of the same rows encodes the
    same (every split is checked against this independent route)."""
    out = prepare(parts, tmp_path / name, _cfg()).out_dir
    return {s: pl.read_parquet(out / s) for s in parts}


def test_time_split_trains_on_the_first_rows(raw, tmp_path):
    out = tmp_path / "p"
    res = prepare([raw], out, _cfg(), chunk_bytes=1 << 14)
    assert res.rows == {"train": 800, "valid": 100, "test": 100}
    lines = raw.read_bytes().splitlines(keepends=True)
    parts = {}
    for name, rows in [
        ("train", slice(0, 800)),
        ("valid", slice(800, 900)),
        ("test", slice(900, 1000)),
    ]:
        parts[name] = [tmp_path / f"{name}.txt"]
        parts[name][0].write_bytes(b"".join(lines[rows]))
    want = _explicit(tmp_path, parts)
    for name in parts:
        assert pl.read_parquet(out / name).equals(want[name]), name
    fmap = FeatureMap.load(out)
    assert fmap.extra["split"] == {"order": "time", "fractions": [0.8, 0.1, 0.1]}


def test_time_split_cuts_do_not_move_when_bad_rows_are_skipped(raw, tmp_path):
    lines = raw.read_bytes().splitlines(keepends=True)
    lines[10] = b"2" + lines[10][1:]  # label 2: malformed, in the train part
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"".join(lines))
    res = prepare([bad], tmp_path / "p", _cfg(), on_bad_row="skip")
    assert res.rows == {"train": 799, "valid": 100, "test": 100}


def test_time_split_of_day_files_takes_whole_days_in_day_order(tmp_path):
    frame, _ = generate_frame(800, seed=5)
    paths = [write_criteo(frame[200 * d : 200 * (d + 1)], tmp_path / f"day_{d}") for d in range(4)]
    shuffled = [paths[2], paths[0], paths[3], paths[1]]
    out = tmp_path / "p"
    res = prepare(shuffled, out, _cfg(split=(2, 1, 1)))
    assert res.rows == {"train": 400, "valid": 200, "test": 200}
    want = _explicit(tmp_path, {"train": paths[:2], "valid": [paths[2]], "test": [paths[3]]})
    assert pl.read_parquet(out / "valid").equals(want["valid"])
    assert pl.read_parquet(out / "test").equals(want["test"])
    with pytest.raises(DataError, match="whole day files"):
        prepare(paths[:3], tmp_path / "q", _cfg(split=(0.98, 0.01, 0.01)))


def test_random_split_stays_the_default(raw, tmp_path):
    res = prepare([raw], tmp_path / "p", _cfg(order="random"))
    assert FeatureMap.load(tmp_path / "p").extra["split"]["order"] == "random"
    assert res.rows["train"] != 800  # a seeded hash, not the first rows
    assert sum(res.rows.values()) == 1000


def test_count_records_matches_the_reader(tmp_path):
    p = tmp_path / "x.txt"
    p.write_bytes(b"1\ta\n\n0\tb\n1\tc")  # a blank line is a record; an unterminated last one too
    assert count_records(p) == 4
    assert count_records(p, header_lines=1) == 3


def test_config_checks(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("data:\n  split_order: time\n  train: [a]\n  valid: [b]\n  test: [c]\n")
    with pytest.raises(ConfigError, match="data.split_order"):
        load_config(cfg)
    cfg.write_text("data:\n  split_order: chronological\n")
    with pytest.raises(ConfigError, match="split_order"):
        load_config(cfg)
    cfg.write_text("data:\n  synthetic: {drift: -1}\n")
    with pytest.raises(ConfigError, match="data.synthetic.drift"):
        load_config(cfg)
    cfg.write_text("data:\n  split_order: time\n  synthetic: {drift: 0.5}\n")
    assert load_config(cfg).data.synthetic.drift == 0.5


@pytest.mark.slow
def test_drifting_synthetic_data_split_by_time(tmp_path):
    from ctrcal.api import prepare

    cfg = _cfg()
    cfg.data.synthetic.rows = 3_000
    cfg.data.synthetic.drift = 1.0
    res = prepare(None, tmp_path / "p", cfg)
    fmap = FeatureMap.load(tmp_path / "p")
    assert fmap.extra["synthetic"]["drift"] == 1.0
    assert res.rows == {"train": 2400, "valid": 300, "test": 300}
    assert "test" in fmap.extra["oracle"]
    cfg.data.synthetic.drift = 0.0
    assert not prepare(None, tmp_path / "p", cfg).reused  # drift is part of the identity


def test_random_split_codes_are_pinned():
    # the hash fixes which row goes where, so a prepared directory means the same rows on any
    # machine and version: these codes are those of the first release of the random split
    plan = SplitPlan("random", fractions=[0.5, 0.25, 0.25], seed=7)
    file = np.array([0] * 20 + [3] * 20, dtype=np.uint16)
    codes = plan.codes(file, np.arange(40, dtype=np.uint32))
    assert "".join(map(str, codes)) == "0100020022202120012002211100110211021010"
    plan = SplitPlan("random", fractions=[0.8, 0.1, 0.1], seed=2**40 + 3)
    rows = np.array([0, 1, 2**32 - 1, 123456789, 4000000000], dtype=np.uint32)
    files = np.array([0, 1, 2, 65535, 7], dtype=np.uint16)
    assert plan.codes(files, rows).tolist() == [1, 1, 1, 0, 0]


def test_time_and_explicit_split_codes():
    plan = SplitPlan("time", fractions=[0.8, 0.1, 0.1], offsets=[0, 100], total=1000)
    codes = plan.codes(np.array([0, 0, 1, 1, 1, 1]), np.array([0, 99, 699, 700, 799, 899]))
    assert codes.tolist() == [0, 0, 0, 1, 1, 2]
    explicit = SplitPlan("explicit", file_split=[0, 2, 1])
    codes = explicit.codes(np.array([0, 1, 2, 1]), np.zeros(4, dtype=np.uint32))
    assert codes.tolist() == [0, 2, 1, 2]
