"""Run tracking: a tiny run's TensorBoard and MLflow logs, read back with each library's own
reader, hold the numbers of result.json; a missing extra is named by validate."""

from __future__ import annotations

import json
import math

import pytest
from forked_cli import free_port
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


def test_an_unreachable_tracking_server_is_refused_in_seconds():
    import time

    from ctrcal.core.errors import OutputError
    from ctrcal.train.loggers import check_tracking_server

    uri = f"http://127.0.0.1:{free_port()}"
    start = time.perf_counter()
    with pytest.raises(OutputError) as info:
        check_tracking_server(uri)
    assert time.perf_counter() - start < 10
    message = str(info.value)
    assert message.startswith(f"train.tracking_uri: the MLflow tracking server {uri} did not")
    assert "\n" not in message
    check_tracking_server("file:///nowhere/mlruns")  # a file store is not probed


def test_a_tracking_server_that_answers_passes_even_with_an_error_status():
    import http.server
    import threading

    from ctrcal.train.loggers import check_tracking_server

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(404)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        check_tracking_server(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()


def test_mlflow_with_an_unreachable_uri_fails_before_training(prepared_dir, tmp_path):
    pytest.importorskip("mlflow")
    from ctrcal.core.errors import OutputError

    uri = f"http://127.0.0.1:{free_port()}"
    cfg = tiny_config("train.loggers=[mlflow]", f"train.tracking_uri={uri}")
    with pytest.raises(OutputError, match=f"tracking server {uri} did not answer"):
        train(cfg, prepared_dir, tmp_path / "run")
    assert not (tmp_path / "run" / BEST).exists()
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # no epoch was trained


def test_a_tensorboard_folder_that_takes_no_file_is_one_line_before_training(
    prepared_dir, tmp_path
):
    pytest.importorskip("tensorboard")
    from ctrcal.core.errors import OutputError

    run = tmp_path / "run"
    run.mkdir()
    (run / "tensorboard").write_text("a file where the folder goes")
    with pytest.raises(OutputError) as info:
        train(tiny_config("train.loggers=[tensorboard]"), prepared_dir, run)
    message = str(info.value)
    assert message.startswith(f"train.loggers: tensorboard: {run / 'tensorboard'}: cannot")
    assert "b'" not in message and "\n" not in message
    assert not (run / "metrics.jsonl").exists()


def test_a_read_only_tensorboard_folder_is_named():
    import os
    import tempfile
    from pathlib import Path

    from ctrcal.core.errors import OutputError
    from ctrcal.train.loggers import _check_folder

    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "tensorboard"
        folder.mkdir()
        folder.chmod(0o500)
        try:
            with pytest.raises(OutputError, match="permission denied|read-only"):
                _check_folder(folder)
        finally:
            folder.chmod(0o700)


def test_a_logger_failing_at_the_end_keeps_the_checkpoint(prepared_dir, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from ctrcal.train import loggers

    def broken(self, checkpoint, status):
        raise RuntimeError("tracking server went away")

    monkeypatch.setattr(loggers._TensorBoard, "finish", broken)
    run = tmp_path / "run"
    with pytest.warns(RuntimeWarning, match="tensorboard failed .*went away"):
        train(tiny_config("train.loggers=[tensorboard]"), prepared_dir, run)
    assert (run / BEST).exists()
    assert json.loads((run / "result.json").read_text())["valid"]["auc"] > 0
