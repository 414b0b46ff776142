"""What `train` refuses of the prepared data before anything is allocated, with the one line
`validate --data` gives: embedding tables above train.max_embedding_gib, a training shift with
nothing to act on, an original-space shift without original-space statistics, a data.layout
that would refuse the data's own files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

import ctrcal.data.table_size as table_size
from ctrcal.api import prepare
from ctrcal.cli import main
from ctrcal.config import Config

# the report's default shifts include Gaussian noise, which data without numerics cannot take
MODEL = (
    "model: {embedding_dim: 4, hidden_units: [8]}\n"
    "report: {shifts: [{name: categorical_corruption}]}\n"
)
TRAIN = "train: {epochs: 1, batch_size: 256, progress: false, num_threads: 1"


@pytest.fixture(scope="module")
def categorical_only(tmp_path_factory) -> Path:
    """Avazu-like data: categorical fields only, one of them capped into 10^9 hashed ids."""
    root = tmp_path_factory.mktemp("cats")
    k = pl.int_range(600, eager=True)
    frame = pl.DataFrame(
        {"y": (k % 4 == 0).cast(pl.Int64), "u": (k % 37).cast(pl.Utf8), "v": (k % 5).cast(pl.Utf8)}
    )
    frame.write_csv(root / "logs.csv")
    cfg = Config()
    cfg.data.schema = {"name": "team", "label": "y", "categorical": ["u", "v"]}
    cfg.features.min_count = 1
    prepare([root / "logs.csv"], root / "small", cfg)
    cfg.features.max_vocab = 10
    cfg.features.hash_buckets = 1_000_000_000
    prepare([root / "logs.csv"], root / "huge", cfg)
    return root


def _run(tmp_path, data: Path, text: str, capsys) -> tuple[list[int], list[str]]:
    """(exit codes, stderr) of validate --data and train of one config."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    codes, errs = [], []
    validate = ["validate", str(cfg), "--data", str(data)]
    train = ["train", str(cfg), "--data", str(data), "--out", str(tmp_path / "r")]
    for argv in (validate, train):
        capsys.readouterr()
        codes.append(main(argv))
        errs.append(capsys.readouterr().err)
    for err in errs:
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "r").exists()  # refused before anything was written
    return codes, errs


def test_tables_above_the_limit_are_refused_naming_key_and_size(
    categorical_only, tmp_path, capsys, monkeypatch
):
    huge = categorical_only / "huge"
    # the default limit: a quarter of this machine's memory (made 16 GiB here)
    monkeypatch.setattr(table_size, "machine_memory_bytes", lambda: 16 << 30)
    codes, errs = _run(tmp_path, huge, MODEL + TRAIN + "}\n", capsys)
    assert codes[0] != 0 and codes[1] != 0
    for err in errs:
        assert "train.max_embedding_gib: the embedding tables need 14.9 GiB" in err
        assert "above the limit of 4.0 GiB (a quarter of this machine's 16.0 GiB" in err
        assert "the largest is u with 1,000,000,013 rows" in err
    # raised above the size, the same data passes validate
    cfg = tmp_path / "ok.yaml"
    cfg.write_text(MODEL + TRAIN + ", max_embedding_gib: 16}\n")
    assert main(["validate", str(cfg), "--data", str(huge)]) == 0
    cfg.write_text(MODEL + TRAIN + ", max_embedding_gib: 14}\n")
    assert main(["validate", str(cfg), "--data", str(huge)]) != 0
    assert "above the limit of 14.0 GiB (as set)" in capsys.readouterr().err


@pytest.mark.parametrize("space", ["model", "original"])
def test_a_training_shift_with_nothing_to_act_on(categorical_only, tmp_path, capsys, space):
    text = (
        MODEL + TRAIN + f", train_shift: {{name: gaussian_numeric, intensity: 0.25, "
        f"space: {space}}}}}\n"
    )
    codes, errs = _run(tmp_path, categorical_only / "small", text, capsys)
    assert codes[0] != 0 and codes[1] != 0
    for err in errs:
        assert "train.train_shift: the shift gaussian_numeric perturbs numeric features" in err
        assert "space: model" not in err


def test_an_original_space_shift_without_its_statistics_names_the_key(
    prepared_dir, tmp_path, capsys
):
    old = tmp_path / "old"
    shutil.copytree(prepared_dir, old)
    path = old / "feature_map.json"
    fm = json.loads(path.read_text())
    for f in fm["features"]:  # as prepared before original-space statistics were stored
        f.pop("original_mean", None), f.pop("original_std", None)
    path.write_text(json.dumps(fm))
    text = MODEL + TRAIN + ", train_shift: {name: gaussian_numeric, intensity: 0.25}}\n"
    codes, errs = _run(tmp_path, old, text, capsys)
    assert codes[0] != 0 and codes[1] != 0
    for err in errs:
        assert "has no original-space numeric statistics" in err
        assert "or set space: model" in err and err.strip().endswith("train.train_shift.space]")


@pytest.fixture(scope="module")
def by_layout(criteo_files, tmp_path_factory) -> dict[str, Path]:
    """The dac and Criteo_x1 files prepared with the layout detected."""
    root = tmp_path_factory.mktemp("by_layout")
    cfg = Config()
    cfg.features.min_count = 2
    return {k: prepare([criteo_files[k]], root / k, cfg).out_dir for k in ("dac", "x1")}


@pytest.mark.parametrize(
    ("data", "layout", "found"),
    [("dac", "x1", "dac"), ("x1", "x4", "x1"), ("x1", "dac", "x1")],
)
def test_a_layout_the_datas_files_were_not_read_as_is_refused(
    by_layout, criteo_files, tmp_path, capsys, data, layout, found
):
    text = MODEL + TRAIN + f"}}\ndata: {{layout: {layout}}}\n"
    codes, errs = _run(tmp_path, by_layout[data], text, capsys)
    assert codes[0] != 0 and codes[1] != 0
    said = f"configured layout {layout!r} but the file was read as {found!r}"
    for err in errs:
        assert f"{by_layout[data]}: prepared from {criteo_files[data]}: {said}" in err, err
        assert err.strip().endswith(f"{tmp_path / 'c.yaml'}: data.layout]")


@pytest.mark.parametrize(("data", "layout"), [("dac", "auto"), ("dac", "dac"), ("x1", "x1")])
def test_the_layout_the_data_was_read_as_passes(by_layout, tmp_path, data, layout):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(MODEL + TRAIN + f"}}\ndata: {{layout: {layout}}}\n")
    assert main(["validate", str(cfg), "--data", str(by_layout[data])]) == 0


def test_predict_refuses_a_raw_file_in_the_same_words(criteo_files):
    from ctrcal.core.errors import DataError
    from ctrcal.preparation.criteo import detect_format

    with pytest.raises(DataError) as err:
        detect_format(criteo_files["dac"], "x1")
    assert (
        str(err.value)
        == f"{criteo_files['dac']}: configured layout 'x1' but the file looks like 'dac'"
    )
    assert detect_format(criteo_files["x1"], "x4").layout == "x4"  # a guess a config overrules
