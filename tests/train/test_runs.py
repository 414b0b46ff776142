"""ctrcal.train.runs: one answer to "is this the same run, on the same data?" for every caller."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ctrcal.cli import main
from ctrcal.config import Config, config_to_dict
from ctrcal.core.errors import ConfigError, DataError
from ctrcal.data.identity import data_identity
from ctrcal.train.evaluate import evaluate_run
from ctrcal.train.runs import (
    RUNTIME_KEYS,
    check_resumable,
    is_runtime_key,
    run_signature,
    run_state,
    signature_diff,
)
from ctrcal.train.trainer import train
from ctrcal.validate import load_config

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
    for key in (
        "train.compile",
        "data.prepared_dir",
        "train.device",
        "train.cpu_matmul",
        "report.seeds",
        "out_dir",
    ):
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
    from ctrcal.api import prepare

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
    # other seed, other sizes: evaluate refuses it too
    with pytest.raises(DataError, match="another feature map"):
        evaluate_run(run, "test", other)
    # the same data under another path is the same data
    copy = tmp_path / "copy"
    shutil.copytree(prepared_dir, copy)
    assert data_identity(copy) == data_identity(prepared_dir)
    train(_cfg(), copy, run, resume=True)


def _relabelled_copy(prepared_dir: Path, target: Path) -> Path:
    """The same files with two values of C1 trading ids: every size, row count and source
    hash equal, but id 3 and id 4 mean other values to a model trained on the original."""
    import polars as pl

    shutil.copytree(prepared_dir, target)
    vocab = pl.read_parquet(target / "vocab.parquet")
    swap = {3: 4, 4: 3}
    vocab = vocab.with_columns(
        pl.when(pl.col("field") == "C1").then(pl.col("id").replace(swap)).otherwise(pl.col("id"))
    ).sort("field", "id", maintain_order=True)
    vocab.write_parquet(target / "vocab.parquet")
    return target


def test_same_sizes_other_vocabulary_contents_are_refused_everywhere(
    started_run, prepared_dir, tmp_path, capsys
):
    from ctrcal.data.feature_map import FeatureMap
    from ctrcal.data.identity import feature_identity, short
    from ctrcal.train.finetune import finetune_model

    other = _relabelled_copy(prepared_dir, tmp_path / "other")
    assert FeatureMap.load(other).vocab_sizes == FeatureMap.load(prepared_dir).vocab_sizes
    assert feature_identity(other) != feature_identity(prepared_dir)
    assert data_identity(other) != data_identity(prepared_dir)
    run = tmp_path / "run"
    shutil.copytree(started_run, run)
    both = (short(feature_identity(other)), short(feature_identity(prepared_dir)))
    # evaluate --data
    with pytest.raises(DataError, match="another feature map") as refused:
        evaluate_run(run, "test", other)
    assert all(identity in str(refused.value) for identity in both)
    assert main(["evaluate", str(run), "--data", str(other)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and both[0] in err and both[1] in err
    # resume, and the report's reuse of a run
    assert run_state(_cfg(), other, run) == "stale"
    with pytest.raises(DataError, match="not the data the run was trained on") as refused:
        train(_cfg(), other, run, resume=True)
    assert short(data_identity(other)) in str(refused.value)
    assert short(data_identity(prepared_dir)) in str(refused.value)
    # fine-tuning from the run
    cfg = _cfg(f"train.finetune_from={run}")
    with pytest.raises(DataError, match="another feature map"):
        finetune_model(cfg, FeatureMap.load(other), other)
    with pytest.raises(DataError, match="another feature map"):
        train(cfg, other, tmp_path / "tuned")
    # the run's own data is accepted everywhere
    assert set(evaluate_run(run, "valid", prepared_dir)) >= {"auc", "ece"}
    finetune_model(cfg, FeatureMap.load(prepared_dir), prepared_dir)


def test_the_identity_is_the_content_not_the_file(prepared_dir, tmp_path):
    import pyarrow.parquet as pq

    from ctrcal.data.identity import feature_identity

    copy = tmp_path / "copy"
    shutil.copytree(prepared_dir, copy)
    table = pq.read_table(copy / "vocab.parquet")
    pq.write_table(table, copy / "vocab.parquet", row_group_size=1000, compression="gzip")
    assert feature_identity(copy) == feature_identity(prepared_dir)
    # where the rows came from is not what the ids mean
    fm = json.loads((copy / "feature_map.json").read_text())
    fm["sources"] = [{"path": "/elsewhere/train.txt", "layout": "dac", "split": "split"}]
    (copy / "feature_map.json").write_text(json.dumps(fm))
    assert feature_identity(copy) == feature_identity(prepared_dir)
    fm["features"][0]["transform_scale"] *= 2  # another transform is another encoding
    (copy / "feature_map.json").write_text(json.dumps(fm))
    assert feature_identity(copy) != feature_identity(prepared_dir)


def test_a_run_records_both_identities(started_run, prepared_dir):
    from ctrcal.data.identity import feature_identity

    recorded = json.loads((started_run / "data.json").read_text())
    assert recorded["data_identity"] == data_identity(prepared_dir)
    assert recorded["feature_identity"] == feature_identity(prepared_dir)


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


def test_string_vocabularies_hash_by_content(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ctrcal.data.identity import feature_identity

    def prepared(name, values, row_group_size=None):
        d = tmp_path / name
        d.mkdir()
        (d / "feature_map.json").write_text(
            json.dumps({"features": [{"name": "C1", "kind": "categorical", "vocab_size": 6}]})
        )
        table = pa.table(
            {"field": ["C1"] * 3, "value": values, "id": [3, 4, 5], "count": [9, 5, 2]}
        )
        pq.write_table(table, d / "vocab.parquet", row_group_size=row_group_size)
        return feature_identity(d)

    base = prepared("a", ["x", None, "zz"])
    assert prepared("b", ["x", None, "zz"], row_group_size=1) == base
    assert prepared("c", ["x", "", "zz"]) != base  # a missing value is not an empty one
    assert prepared("d", ["xz", None, "z"]) != base  # the same bytes split otherwise


def test_a_run_without_recorded_identities_is_never_matched_silently(
    started_run, prepared_dir, tmp_path
):
    run = tmp_path / "run"
    shutil.copytree(started_run, run)
    data = json.loads((run / "data.json").read_text())
    for key in ("data_identity", "feature_identity"):
        data.pop(key)
    (run / "data.json").write_text(json.dumps(data))  # as an earlier ctrcal wrote it
    assert run_state(_cfg(), prepared_dir, run) == "stale"  # a report trains it again
    with pytest.raises(DataError, match="records no identity"):
        evaluate_run(run, "valid", prepared_dir)
    with pytest.raises(DataError, match="records no identity"):
        check_resumable(run, _cfg(), prepared_dir)


def test_evaluate_predict_and_export_open_a_run_by_one_route(monkeypatch, tmp_path):
    import ctrcal.train.results as results
    from ctrcal.serving.export import export_run
    from ctrcal.serving.predict import predict_run

    class Opened(Exception):
        pass

    def open_run(run_dir, what, data_dir=None, **kwargs):
        raise Opened(what)

    monkeypatch.setattr(results, "open_run", open_run)
    calls = {
        "evaluate": lambda: evaluate_run(tmp_path / "run", "test"),
        "predict": lambda: predict_run(tmp_path / "run", tmp_path / "p.parquet"),
        "export": lambda: export_run(tmp_path / "run", tmp_path / "m.pt2", "pt2"),
    }
    for what, call in calls.items():
        with pytest.raises(Opened, match=f"^{what}$"):
            call()


def test_open_run_checks_everything_before_the_model_and_keeps_the_callers_rng(
    started_run, prepared_dir, tmp_path, monkeypatch
):
    import torch

    import ctrcal.train.results as results
    from ctrcal.train.results import open_run

    other = _relabelled_copy(prepared_dir, tmp_path / "other")
    loaded = []
    real_load = results.load_run
    monkeypatch.setattr(results, "load_run", lambda d: loaded.append(d) or real_load(d))
    with pytest.raises(DataError, match="another feature map"):
        open_run(started_run, "evaluate", other)
    checked = []

    def check(data_dir, feature_map):
        checked.append(feature_map.vocab_sizes)
        raise DataError("the test split is empty")

    with pytest.raises(DataError, match="the test split is empty"):
        open_run(started_run, "evaluate", check=check)
    assert checked and loaded == []  # the caller's check ran, the model was never built
    with pytest.raises(ConfigError, match="no MC-LayerNorm layer"):
        open_run(started_run, "predict", mc_samples=3)
    torch.manual_seed(11)
    want = torch.rand(3)
    torch.manual_seed(11)
    run = open_run(started_run, "evaluate")
    assert torch.equal(torch.rand(3), want)  # building the model drew nothing from it
    assert not run.model.training and run.device == torch.device("cpu")
    assert run.data_dir == prepared_dir and run.config.model.embedding_dim == 4
