"""ctrcal.runs: one answer to "is this the same run, on the same data?" for every caller."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ctrcal.cli import main
from ctrcal.config import Config, config_to_dict
from ctrcal.config_load import load_config
from ctrcal.errors import ConfigError, DataError
from ctrcal.runs import (
    RUNTIME_KEYS,
    check_resumable,
    data_identity,
    is_runtime_key,
    run_signature,
    run_state,
    signature_diff,
)
from ctrcal.train.trainer import train

TINY = [
    "model.embedding_dim=4",
    "model.hidden_units=[16]",
    "train.batch_size=4096",
    "train.eval_batch_size=8192",
    "train.epochs=1",
    "train.progress=false",
    "train.num_threads=1",
]


def _cfg(*overrides: str) -> Config:
    return load_config(None, [*TINY, *overrides])


def test_runtime_keys_are_real_keys_and_cover_what_does_not_change_training():
    keys = set(run_signature(Config())) | {
        k for k in _all_keys(config_to_dict(Config())) if is_runtime_key(k)
    }
    for key in RUNTIME_KEYS:
        assert key.endswith(".") or key in keys, f"{key} is not a config key"
    for key in ("train.compile", "data.prepared_dir", "train.device", "train.cpu_matmul",
                "report.seeds", "out_dir"):  # fmt: skip
        assert is_runtime_key(key), key
    for key in ("train.epochs", "train.lr", "model.net_norm", "data.split_seed", "train.seed"):
        assert not is_runtime_key(key), key


def _all_keys(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict) and v:
            yield from _all_keys(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


def test_signature_diff_names_the_keys():
    a, b = _cfg(), _cfg("train.lr=0.01", "train.compile=true", "report.seeds=7")
    assert [k for k, _, _ in signature_diff(a, b)] == ["train.lr"]


@pytest.fixture(scope="module")
def started_run(prepared_dir, tmp_path_factory):
    """A run trained for one epoch whose result.json was lost: resumable."""
    run = tmp_path_factory.mktemp("runs") / "run"
    train(_cfg(), prepared_dir, run)
    (run / "result.json").unlink()
    return run


@pytest.mark.parametrize(
    "override", ["train.compile=true", "data.prepared_dir=/elsewhere", "report.seeds=9"]
)
def test_sweep_and_trainer_agree_on_runtime_keys(started_run, prepared_dir, override):
    cfg = _cfg(override)
    assert run_state(cfg, prepared_dir, started_run) == "started"  # the sweep would resume
    check_resumable(started_run, cfg, prepared_dir)  # and the trainer agrees


def test_resume_with_a_runtime_key_changed(started_run, prepared_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(started_run, run)
    cfg = _cfg("data.prepared_dir=/elsewhere", "train.eval_batch_size=1000")
    train(cfg, prepared_dir, run, resume=True)
    assert run_state(cfg, prepared_dir, run) == "finished"


def test_a_changed_epoch_count_is_another_run(started_run, prepared_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(started_run, run)
    cfg = _cfg("train.epochs=2")
    assert run_state(cfg, prepared_dir, run) == "stale"
    with pytest.raises(ConfigError, match="train.epochs"):
        train(cfg, prepared_dir, run, resume=True)


def test_resume_on_other_data_is_refused(started_run, prepared_dir, tmp_path):
    from ctrcal.data.prepare import prepare

    other_cfg = Config()
    other_cfg.data.synthetic.rows = 20_000
    other_cfg.data.synthetic.seed = 1  # same layout and widths, other rows
    other_cfg.features.min_count = 5
    other = prepare(None, tmp_path / "other", other_cfg).out_dir
    assert data_identity(other) != data_identity(prepared_dir)
    run = tmp_path / "run"
    shutil.copytree(started_run, run)
    assert run_state(_cfg(), other, run) == "stale"
    with pytest.raises(DataError, match="not the data the run was trained on"):
        train(_cfg(), other, run, resume=True)
    # the same data under another path is the same data
    copy = tmp_path / "copy"
    shutil.copytree(prepared_dir, copy)
    assert data_identity(copy) == data_identity(prepared_dir)
    train(_cfg(), copy, run, resume=True)


def test_debug_before_the_subcommand_is_kept(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train: {epochs: 1}\n")
    args = ["train", str(cfg), "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "r")]
    assert main(["--debug", *args]) != 0
    assert "Traceback" in capsys.readouterr().err
    assert main(args) != 0
    assert "Traceback" not in capsys.readouterr().err


def test_train_without_data_prepares_under_its_run_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "data: {synthetic: {rows: 3000}}\nfeatures: {min_count: 2}\n"
        "model: {embedding_dim: 4, hidden_units: [8]}\n"
        "train: {epochs: 1, batch_size: 1024, progress: false, num_threads: 1}\n"
        "out_dir: default_out\n"
    )
    run = tmp_path / "myrun"
    assert main(["train", str(cfg), "--out", str(run)]) == 0
    assert (run / "data" / "feature_map.json").is_file()
    assert (run / "result.json").is_file()
    assert not Path("default_out").exists()
