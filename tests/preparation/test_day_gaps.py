"""Whole days by time: whole-number splits count days, a gap in the day numbering names the
missing day, a truncated day file is named (not the split), and the summary says which days
went where."""

from __future__ import annotations

import gzip

import pytest

from ctrcal.api import prepare
from ctrcal.config import Config
from ctrcal.core.errors import DataError
from ctrcal.preparation.synthetic import generate_frame, write_criteo

ROWS = 120
# the day files are written once: the module runs on one worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("day_gaps")


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    root = tmp_path_factory.mktemp("gap_days")
    frame, _ = generate_frame(5 * ROWS, seed=7)
    return [write_criteo(frame.slice(d * ROWS, ROWS), root / f"day_{d}") for d in range(5)]


def _cfg(split) -> Config:
    cfg = Config()
    cfg.data.split = list(split)
    cfg.data.split_order = "time"
    cfg.features.min_count = 1
    return cfg


def test_whole_numbers_count_days_and_the_summary_says_where_they_went(days, tmp_path):
    res = prepare(days[:4], tmp_path / "p", _cfg([2, 1, 1]))
    assert res.rows == {"train": 2 * ROWS, "valid": ROWS, "test": ROWS}
    assert "whole days: train day_0-day_1, valid day_2, test day_3" in res.describe()
    with pytest.raises(DataError, match=r"data\.split \[2, 1, 1\] counts days .* 4 days, but 5"):
        prepare(days, tmp_path / "q", _cfg([2, 1, 1]))


@pytest.mark.parametrize("split", [(2, 1, 1), (0.5, 0.25, 0.25)])
def test_a_missing_day_is_named(days, tmp_path, split):
    given = [days[0], days[1], days[3], days[4]]
    missing = days[2].parent / "day_2"
    with pytest.raises(
        DataError,
        match=rf"^{missing}: missing; the day files given run from "
        r"day_0 to day_4",
    ):
        prepare(given, tmp_path / "p", _cfg(split))
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("split", [(1, 1, 1), (0.6, 0.2, 0.2)])
def test_a_truncated_day_is_named(days, tmp_path, split):
    big = write_criteo(generate_frame(1_000, seed=8)[0], tmp_path / "big.txt")
    whole = gzip.compress(big.read_bytes())  # past what detection reads (64 KiB of text)
    # cut where the last four bytes, read as gzip's size trailer, claim a big day: by its
    # middle byte day_1 would then take the valid share too
    end = next(
        k
        for k in range(len(whole) * 3 // 4, len(whole))
        if int.from_bytes(whole[k - 4 : k], "little") > 1000 * len(whole)
    )
    cut = tmp_path / "day_1.gz"
    cut.write_bytes(whole[:end])
    with pytest.raises(DataError, match=rf"^{cut}: corrupt or truncated gzip file"):
        prepare([days[0], cut, days[2]], tmp_path / "p", _cfg(split))
