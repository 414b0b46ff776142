"""prepare: splits, cache reuse and invalidation, atomic output, CLI."""

from __future__ import annotations

import json
import os

import polars as pl
import pytest

from ctrcal.api import prepare
from ctrcal.cli import main
from ctrcal.config import Config
from ctrcal.core.criteo_schema import CATEGORICAL_COLUMNS, LABEL, NUMERIC_COLUMNS
from ctrcal.core.errors import DataError
from ctrcal.data.feature_map import FEATURE_MAP_FILE, FeatureMap
from ctrcal.preparation import features as features_mod
from ctrcal.preparation.publish import is_prepared
from ctrcal.preparation.synthetic import generate


@pytest.fixture()
def raw(tmp_path):
    return generate(tmp_path / "train.txt", 3_000, seed=3).path


def _cfg(**features):
    cfg = Config()
    for k, v in features.items():
        setattr(cfg.features, k, v)
    return cfg


def test_split_schema_and_sizes(raw, tmp_path):
    res = prepare([raw], tmp_path / "p", _cfg(min_count=2))
    assert not res.reused and res.total_rows == 3_000
    assert 0.75 < res.rows["train"] / 3_000 < 0.85
    for split in ("train", "valid", "test"):
        df = pl.read_parquet(tmp_path / "p" / split)
        assert df.schema[LABEL] == pl.Float32
        assert all(df.schema[c] == pl.Float32 for c in NUMERIC_COLUMNS)
        assert all(df.schema[c] == pl.Int32 for c in CATEGORICAL_COLUMNS)
        assert df.height == res.rows[split]


def test_reuse_and_invalidation(raw, tmp_path):
    out = tmp_path / "p"
    first = prepare([raw], out, _cfg(min_count=2))
    stamp = (out / "train" / "part-00000.parquet").stat().st_mtime_ns
    again = prepare([raw], out, _cfg(min_count=2))
    assert again.reused and again.source_hash == first.source_hash
    assert "reused" in again.describe()
    assert (out / "train" / "part-00000.parquet").stat().st_mtime_ns == stamp
    # a config change invalidates
    changed = prepare([raw], out, _cfg(min_count=3))
    assert not changed.reused and changed.source_hash != first.source_hash
    # so does a different split seed
    cfg = _cfg(min_count=3)
    cfg.data.split_seed = 7
    assert not prepare([raw], out, cfg).reused
    # and a changed file (same config)
    with open(raw, "a") as fh:
        fh.write("1\t1" + "\t" * 38 + "\n")
    os.utime(raw, ns=(stamp, stamp + 10**9))
    res = prepare([raw], out, cfg)
    assert not res.reused and res.total_rows == 3_001


def test_parquet_compression_sets_the_codec_and_only_the_codec(raw, tmp_path):
    import pyarrow.parquet as pq

    plain = prepare([raw], tmp_path / "plain", _cfg(min_count=2))
    cfg = _cfg(min_count=2)
    cfg.data.parquet_compression = "lz4"
    packed = prepare([raw], tmp_path / "packed", cfg)
    assert packed.source_hash != plain.source_hash  # a changed codec is prepared again
    for out, codec in ((tmp_path / "plain", "UNCOMPRESSED"), (tmp_path / "packed", "LZ4")):
        meta = pq.ParquetFile(out / "train" / "part-00000.parquet").metadata
        got = {meta.row_group(0).column(i).compression for i in range(meta.num_columns)}
        assert got == {codec}
    for split in ("train", "valid", "test"):
        a = pl.read_parquet(tmp_path / "plain" / split)
        b = pl.read_parquet(tmp_path / "packed" / split)
        assert a.equals(b, null_equal=True) and a.height > 0
    assert (tmp_path / "plain" / "vocab.parquet").read_bytes() == (
        tmp_path / "packed" / "vocab.parquet"
    ).read_bytes()


def test_split_is_seeded(raw, tmp_path):
    a = prepare([raw], tmp_path / "a", _cfg(min_count=2))
    b = prepare([raw], tmp_path / "b", _cfg(min_count=2))
    assert a.rows == b.rows
    ta = pl.read_parquet(tmp_path / "a" / "test")
    tb = pl.read_parquet(tmp_path / "b" / "test")
    assert ta.equals(tb)


def test_interrupted_write_leaves_nothing_trusted(raw, tmp_path, monkeypatch):
    out = tmp_path / "p"
    good = prepare([raw], out, _cfg(min_count=2))

    def boom(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(features_mod.FeaturePipeline, "save", boom)
    with pytest.raises(KeyboardInterrupt):
        prepare([raw], out, _cfg(min_count=4))  # a new config, interrupted
    monkeypatch.undo()
    # the old complete result is still there and still matches the old config only
    assert is_prepared(out, good.source_hash)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".p.")] == []
    res = prepare([raw], out, _cfg(min_count=4))
    assert not res.reused
    # interrupted with no previous result: no directory at all
    monkeypatch.setattr(features_mod.FeaturePipeline, "save", boom)
    with pytest.raises(KeyboardInterrupt):
        prepare([raw], tmp_path / "fresh", _cfg(min_count=2))
    assert not (tmp_path / "fresh").exists()


def test_incomplete_dir_not_trusted(raw, tmp_path):
    out = tmp_path / "p"
    res = prepare([raw], out, _cfg(min_count=2))
    fm = json.loads((out / "feature_map.json").read_text())
    fm["complete"] = False
    (out / "feature_map.json").write_text(json.dumps(fm))
    assert not is_prepared(out, res.source_hash)
    assert not prepare([raw], out, _cfg(min_count=2)).reused


def test_refuses_to_replace_foreign_directory(raw, tmp_path):
    foreign = tmp_path / "project"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("precious")
    with pytest.raises(DataError, match="not a prepared data directory"):
        prepare([raw], foreign)
    assert (foreign / "keep.txt").read_text() == "precious"


def test_explicit_splits(criteo_files, tmp_path):
    cfg = _cfg(min_count=1)
    cfg.data.train = [str(criteo_files["dac"]), str(criteo_files["dac_gz"])]
    cfg.data.valid = [str(criteo_files["x4"])]
    cfg.data.test = [str(criteo_files["dac_test"])]
    out = prepare(None, tmp_path / "p", cfg).out_dir
    fm = FeatureMap.load(out)
    assert fm.splits["train"]["rows"] == 2_000
    assert fm.splits["valid"]["rows"] == 1_000
    test = pl.read_parquet(out / "test")
    assert test.height == 1_000 and test[LABEL].null_count() == 1_000


def test_x1_uses_identity(criteo_files, tmp_path):
    out = prepare([criteo_files["x1"]], tmp_path / "p", _cfg(min_count=1))
    fm = FeatureMap.load(out.out_dir)
    assert fm.numeric_transform == "identity"
    df = pl.read_parquet(out.out_dir / "train")
    assert df.select(pl.col(NUMERIC_COLUMNS).max()).max_horizontal()[0] <= 1.0


def test_mixing_x1_and_raw_rejected(criteo_files, tmp_path):
    with pytest.raises(DataError, match="cannot mix"):
        prepare([criteo_files["x1"], criteo_files["dac"]], tmp_path / "p")


def test_real_samples_same_schema(criteo_samples, tmp_path):
    schemas = []
    for name in ("criteo_sample.txt", "sample_train.txt", "sample_test.txt"):
        out = tmp_path / name
        res = prepare([criteo_samples / name], out, _cfg(min_count=1))
        assert res.total_rows in (100, 200)
        schemas.append(pl.read_parquet_schema(next((out / "train").glob("*.parquet"))))
        fm = FeatureMap.load(out)
        assert len(fm.vocab_sizes) == 26
    assert schemas[0] == schemas[1] == schemas[2]
    pooled = sorted(criteo_samples.glob("*.txt"))
    # sample_train/sample_test are named as splits: pooling them must be asked for.
    with pytest.raises(DataError, match="look like train/valid/test splits"):
        prepare(pooled, tmp_path / "all")
    assert not (tmp_path / "all" / "feature_map.json").exists()
    res = prepare(pooled, tmp_path / "all", resplit=True)
    assert res.total_rows == 400


def test_cli_prepare_and_synth(tmp_path, capsys):
    raw = tmp_path / "syn.txt"
    assert main(["synth", str(raw), "--rows", "2000", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "oracle" in out and "AUC" in out
    assert (tmp_path / "syn.txt.prob.parquet").exists()
    assert main(["prepare", str(raw), "--out", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "rows/s" in out and "train" in out and "oracle" in out
    assert main(["prepare", str(raw), "--out", str(tmp_path / "p")]) == 0
    assert "reused" in capsys.readouterr().out
    bad = tmp_path / "bad.txt"
    bad.write_text("hello\n")
    assert main(["prepare", str(bad), "--out", str(tmp_path / "q")]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "q").exists()


def test_non_numeric_value_skipped_in_prepare(raw, tmp_path):
    lines = raw.read_text().splitlines()
    fields = lines[10].split("\t")
    fields[3] = "n/a"
    lines[10] = "\t".join(fields)
    bad = tmp_path / "bad.txt"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"line 11: malformed row: I3 is not an integer"):
        prepare([bad], tmp_path / "p", _cfg(min_count=2))
    res = prepare([bad], tmp_path / "q", _cfg(min_count=2), on_bad_row="skip")
    assert res.bad_rows == 1 and res.total_rows == 2_999


@pytest.mark.slow
def test_synthetic_from_config_reused_until_changed(tmp_path):
    from ctrcal.api import prepare

    cfg = _cfg(min_count=2)
    cfg.data.synthetic.rows = 2_000
    first = prepare(None, tmp_path / "p", cfg)
    assert not first.reused and first.total_rows == 2_000
    assert prepare(None, tmp_path / "p", cfg).reused
    cfg.data.synthetic.seed = 1
    assert not prepare(None, tmp_path / "p", cfg).reused
    fm = FeatureMap.load(tmp_path / "p")
    assert fm.extra["synthetic"]["seed"] == 1 and "oracle" in fm.extra
    assert "true_prob" in pl.read_parquet_schema(tmp_path / "p" / "test" / "part-00000.parquet")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]  # no generated raw file left


@pytest.mark.slow
def test_synthetic_preparations_are_byte_identical(tmp_path):
    """Generated data is written to a temporary file: its path must not reach the outputs."""
    from ctrcal.api import prepare

    cfg = _cfg(min_count=2)
    cfg.data.synthetic.rows = 1_500
    for name in ("a", "b"):
        prepare(None, tmp_path / name, cfg)
    a = tmp_path / "a"
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files and FEATURE_MAP_FILE in {p.name for p in files}
    for rel in files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
