"""Run tracking: a tiny run's TensorBoard and MLflow logs, read back with each library's own
reader, hold the numbers of result.json; a missing extra is named by validate."""

from __future__ import annotations

import json
import math

import pytest
from interrupt import tiny_config

from ctrcal.train.runs import BEST
from ctrcal.train.trainer import train


def _history(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def logged_run(prepared_dir, tmp_path_factory):
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    run = tmp_path_factory.mktemp("logged") / "run"
    cfg = tiny_config(
        "train.epochs=2",
        "train.loggers=[tensorboard, mlflow]",
        "train.log_every=2",
        "train.experiment=tiny",
    )
    train(cfg, prepared_dir, run)
    return run


def test_tensorboard_holds_the_numbers_of_result_json(logged_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logged_run / "tensorboard"))
    acc.Reload()
    history = _history(logged_run)
    for key in ("auc", "logloss", "ece", "pcoc"):
        events = acc.Scalars(f"valid/{key}")
        assert [e.step for e in events] == [1, 2]
        for event, epoch in zip(events, history, strict=True):
            assert event.value == pytest.approx(epoch[f"valid_{key}"], rel=1e-6)
    steps = acc.Scalars("train/loss")
    assert len(steps) >= 2 and all(math.isfinite(e.value) for e in steps)
    assert [e.step for e in steps] == sorted({e.step for e in steps})  # one global step axis
    assert acc.Scalars("train/lr")[0].value == pytest.approx(history[0]["lr"])
    assert all(e.value > 0 for e in acc.Scalars("train/rows_per_s"))
    result = json.loads((logged_run / "result.json").read_text())
    best = history[result["best_epoch"] - 1]
    assert best["valid_auc"] == pytest.approx(result["valid"]["auc"])


def test_mlflow_holds_the_numbers_params_and_checkpoint(logged_run):
    from mlflow.tracking import MlflowClient

    client = MlflowClient((logged_run / "mlruns").resolve().as_uri())
    exp = client.get_experiment_by_name("tiny")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED"
    history = _history(logged_run)
    for key in ("auc", "logloss", "ece", "pcoc"):
        values = client.get_metric_history(run.info.run_id, f"valid_{key}")
        got = [m.value for m in sorted(values, key=lambda m: m.step)]
        assert got == pytest.approx([h[f"valid_{key}"] for h in history], rel=1e-9)
    assert run.data.params["train.batch_size"] == "2048"
    assert run.data.params["model.embedding_dim"] == "4"
    assert run.data.tags["checkpoint"] == str(logged_run / BEST)
    assert client.get_metric_history(run.info.run_id, "train_rows_per_s")


def test_validate_names_a_missing_extra(monkeypatch):
    from ctrcal.core.errors import ConfigError
    from ctrcal.train import loggers

    monkeypatch.setattr(loggers.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"pip install 'ctrcal\[mlflow\]'"):
        tiny_config("train.loggers=[mlflow]")
