"""A user's own model (tests/models/tiny_user_model.py) through train -> resume -> evaluate
-> MC integration -> shift report, by import path and from Python."""

from __future__ import annotations

import json

import pytest
import torch

import ctrcal
from ctrcal.cli import main
from ctrcal.core.errors import ConfigError
from ctrcal.layers.mc_layernorm.module import MCLayerNorm
from ctrcal.train.evaluate import evaluate_run
from ctrcal.train.results import load_run
from ctrcal.train.trainer import train
from ctrcal.validate import load_config

TINY = [
    "model.name=tiny_user_model:TinyCTR",
    "model.hidden=8",
    "train.batch_size=1024",
    "train.eval_batch_size=8192",
    "train.epochs=2",
    "train.lr=0.005",
    "train.progress=false",
    "train.num_threads=1",
]


def _cfg(*extra: str):
    return load_config(None, [*TINY, *extra])


@pytest.mark.slow
def test_train_resume_evaluate_and_mc_on_a_user_model(prepared_dir, tmp_path):
    run = tmp_path / "run"
    cfg = _cfg("model.net_norm={name: mclayernorm, fraction: 0.5}")
    result = train(cfg, prepared_dir, run)
    assert result.valid["auc"] > 0.55  # it learned something
    loaded = load_run(run)
    assert isinstance(loaded, ctrcal.Run)
    model, saved = loaded.model, loaded.config
    assert loaded.feature_map.vocab_sizes and not model.training
    assert saved.model.name == "tiny_user_model:TinyCTR" and saved.model.hidden == 8
    assert sum(isinstance(m, MCLayerNorm) for m in model.modules()) == 2
    again = train(cfg, prepared_dir, run, resume=True)  # finished: returned as it is
    assert again.best_epoch == result.best_epoch
    one = evaluate_run(run, "test")
    mc = evaluate_run(run, "test", mc_samples=4)
    assert one["auc"] > 0.55 and mc["auc"] > 0.55 and mc != one  # MC passes sample


def test_cli_train_with_an_import_path_config(prepared_dir, tmp_path, capsys):
    cfg = tmp_path / "user.yaml"
    cfg.write_text("model: {name: tiny_user_model:TinyCTR, dim: 3}\n")
    code = main(
        ["train", str(cfg), "--data", str(prepared_dir), "--out", str(tmp_path / "r"), *TINY[2:]]
    )
    assert code == 0
    state = torch.load(tmp_path / "r/checkpoints/best.pt", weights_only=True)["model"]
    assert state["tables.0.weight"].shape[1] == 3  # the model's own keys, no wrapper's


def test_contract_errors_stop_the_cli_before_training(prepared_dir, tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("model: {name: tiny_user_model:WrongShape}\n")
    code = main(["train", str(cfg), "--data", str(prepared_dir), "--out", str(tmp_path / "r")])
    assert code == 2
    err = capsys.readouterr().err
    assert "forward returned shape [2, 1]" in err and "Traceback" not in err
    assert not (tmp_path / "r" / "checkpoints").exists()


@pytest.mark.slow
def test_shift_report_from_python_with_a_user_model_class(prepared_dir, tmp_path):
    from tiny_user_model import TinyCTR

    cfg = _cfg()
    cfg.report = load_config(
        None,
        [
            "report.seeds=2",
            "report.intensities=[0.0, 0.5]",
            "report.figures=false",
            "report.variants=[{name: layernorm, net_norm: layernorm}, "
            "{name: mclayernorm, net_norm: {name: mclayernorm, fraction: 0.5}}, "
            "{name: mclayernorm_mc, mc_samples: 3, from_variant: mclayernorm}, "
            "{name: layernorm_ts, temperature_scaling: true, from_variant: layernorm}]",
        ],
    ).report
    summary = ctrcal.shift_report(
        cfg,
        model=TinyCTR,
        model_kwargs={"hidden": 8},
        out_dir=tmp_path / "rep",
        data_dir=prepared_dir,
        progress=False,
    )
    assert isinstance(summary, ctrcal.ShiftReportSummary)
    assert set(summary.table["variant"]) == {
        "layernorm",
        "mclayernorm",
        "mclayernorm_mc",
        "layernorm_ts",
    }
    assert summary.verdict and (tmp_path / "rep" / "report.md").is_file()
    saved = json.loads((tmp_path / "rep/summary.json").read_text())["config"]["model"]
    assert saved == {"name": "tiny_user_model:TinyCTR", "dim": 4, "hidden": 8}
    mc_model = load_run(tmp_path / "rep/runs/mclayernorm/seed1")[0]
    assert sum(isinstance(m, MCLayerNorm) for m in mc_model.modules()) == 2
    # a second call reuses every finished run
    again = ctrcal.shift_report(
        cfg,
        model="tiny_user_model:TinyCTR",
        model_kwargs={"hidden": 8},
        out_dir=tmp_path / "rep",
        data_dir=prepared_dir,
        progress=False,
    )
    assert again.data["training"]["runs"] == {"reused": 4}


def test_shift_report_rejects_a_bad_model_before_training(tmp_path):
    with pytest.raises(ConfigError, match="not a torch.nn.Module"):
        ctrcal.shift_report(_cfg(), model="tiny_user_model:NotAModule", out_dir=tmp_path)
    assert not (tmp_path / "runs").exists()


def _as_written_through_the_adapter(path) -> None:
    """Rewrite a checkpoint as ctrcal wrote user-model runs when an adapter module wrapped
    them: every weight key prefixed ``model.``, and no mark saying the keys are the model's
    own."""
    payload = torch.load(path, weights_only=True)
    del payload["model_keys"]
    payload["model"] = {f"model.{k}": v for k, v in payload["model"].items()}
    torch.save(payload, path)


@pytest.mark.slow
def test_a_user_model_run_with_adapter_prefixed_keys_resumes_evaluates_and_finetunes(
    prepared_dir, tmp_path, monkeypatch
):
    import ctrcal.train.finetune as finetune
    import ctrcal.train.trainer as trainer

    cfg = _cfg("train.patience=5")
    full = train(cfg, prepared_dir, tmp_path / "full")
    # the same run interrupted right after its first epoch's checkpoints
    real_save = trainer.save_checkpoint

    def save_then_stop(path, payload):
        real_save(path, payload)
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "save_checkpoint", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, prepared_dir, tmp_path / "cut")
    monkeypatch.setattr(trainer, "save_checkpoint", real_save)
    for name in ("last.pt", "best.pt"):
        _as_written_through_the_adapter(tmp_path / "cut/checkpoints" / name)
    resumed = train(cfg, prepared_dir, tmp_path / "cut", resume=True)  # --resume
    assert [h["valid_auc"] for h in resumed.history] == [h["valid_auc"] for h in full.history]
    assert resumed.test == full.test
    # evaluate and load_run of a finished run written the old way
    before = evaluate_run(tmp_path / "full", "test")
    trained = load_run(tmp_path / "full").model.state_dict()
    _as_written_through_the_adapter(tmp_path / "full/checkpoints/best.pt")
    assert evaluate_run(tmp_path / "full", "test") == before
    # train.finetune_from starts from its weights (LayerNorm -> MC-LayerNorm keeps them all)
    ft = _cfg(
        f"train.finetune_from={tmp_path / 'full'}",
        "model.net_norm={name: mclayernorm, fraction: 0.5}",
    )
    start = finetune.finetune_model(ft, load_run(tmp_path / "full").feature_map, prepared_dir)
    assert start.state_dict().keys() == trained.keys()
    assert all(torch.equal(v, trained[k]) for k, v in start.state_dict().items())
