"""Explicit splits are kept as given (CLI options and config); pre-split files are not pooled
unless asked; the pipeline is fitted on train rows only."""

from __future__ import annotations

import polars as pl
import pytest

from ctrcal.api import prepare
from ctrcal.cli import main
from ctrcal.config import Config
from ctrcal.core.errors import DataError
from ctrcal.core.ids import MISSING_ID, OOV_ID
from ctrcal.data.feature_map import FeatureMap
from ctrcal.preparation.prepare import split_role
from ctrcal.preparation.synthetic import generate_frame, write_criteo


@pytest.fixture(scope="module")
def split_files(tmp_path_factory):
    """train.csv / valid.csv / test.csv (x4 layout) of 1,600 / 200 / 200 rows."""
    root = tmp_path_factory.mktemp("presplit")
    frame, _ = generate_frame(2_000, seed=7)
    parts = {"train": frame[:1600], "valid": frame[1600:1800], "test": frame[1800:]}
    return {k: write_criteo(v, root / f"{k}.csv", "x4") for k, v in parts.items()}


def _rows(out):
    return {s: v["rows"] for s, v in FeatureMap.load(out).splits.items()}


def test_cli_keeps_explicit_splits(split_files, tmp_path, capsys):
    out = tmp_path / "p"
    argv = ["prepare", "--out", str(out)]
    for k, path in split_files.items():
        argv += [f"--{k}", str(path)]
    assert main(argv) == 0
    assert _rows(out) == {"train": 1600, "valid": 200, "test": 200}
    assert FeatureMap.load(out).extra["split"] == "explicit"


def test_cli_refuses_to_resplit_presplit_files_unless_asked(split_files, tmp_path, capsys):
    files = [str(p) for p in split_files.values()]
    assert main(["prepare", *files, "--out", str(tmp_path / "p")]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--train/--valid/--test" in err and "--resplit" in err
    assert not (tmp_path / "p").exists()
    assert main(["prepare", *files, "--out", str(tmp_path / "q"), "--resplit"]) == 0
    assert sum(_rows(tmp_path / "q").values()) == 2000


def test_cli_honours_the_config_splits(split_files, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "data:\n"
        + "".join(f"  {k}: [{p}]\n" for k, p in split_files.items())
        + "features:\n  min_count: 1\n"
    )
    assert main(["prepare", "--config", str(cfg), "--out", str(tmp_path / "p")]) == 0
    assert _rows(tmp_path / "p") == {"train": 1600, "valid": 200, "test": 200}
    # files on the command line as well: ambiguous, said so instead of ignoring one of them
    assert (
        main(
            [
                "prepare",
                str(split_files["train"]),
                "--config",
                str(cfg),
                "--out",
                str(tmp_path / "q"),
            ]
        )
        == 2
    )
    assert "data names input files" in capsys.readouterr().err


def test_library_refuses_presplit_files_too(split_files, tmp_path):
    with pytest.raises(DataError, match="look like train/valid/test splits"):
        prepare(list(split_files.values()), tmp_path / "p")
    assert split_role(split_files["valid"]) == 1
    assert split_role(tmp_path / "day_3.gz") is None


def test_fit_uses_train_rows_only(tmp_path):
    frame, _ = generate_frame(300, seed=1)
    train = frame[:200].with_columns(pl.lit("00000aaa").alias("C1"))
    test = frame[200:].with_columns(
        pl.when(pl.int_range(pl.len()) < 50)
        .then(pl.lit("00000bbb"))
        .otherwise(pl.lit(None))
        .alias("C1")
    )
    # a numeric far outside the train range: it must not move the train statistics
    test = test.with_columns(pl.lit(10**9).alias("I5"))
    paths = {
        k: [write_criteo(f, tmp_path / f"{k}.txt")]
        for k, f in [("train", train), ("valid", frame[:1]), ("test", test)]
    }
    cfg = Config()
    cfg.features.min_count = 1
    out = prepare(paths, tmp_path / "p", cfg).out_dir
    enc = pl.read_parquet(out / "test")
    # 00000bbb was seen only in test: out of vocabulary; the rest of C1 is missing
    assert enc["C1"].head(50).to_list() == [OOV_ID] * 50
    assert enc["C1"].tail(50).to_list() == [MISSING_ID] * 50
    fmap = FeatureMap.load(out)
    assert fmap.vocab_sizes[0] == 3 + 1  # just 00000aaa
    assert fmap.extra["train_rows_fitted"] == 200
    i5 = pl.Series(train["I5"]).drop_nulls().cast(pl.Float64).to_numpy()
    j = fmap.numeric_fields.index("I5")
    assert fmap.numeric_original_mean[j] == pytest.approx(i5.mean(), rel=1e-12)
