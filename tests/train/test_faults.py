"""What an unlucky operator meets while training: a full or read-only disk, a second `train`
into the same directory, a validation split without a click, a moved data directory."""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from forked_cli import ForkedCommand
from interrupt import assert_same_training, child_env, kill_9, tiny_config

import ctrcal.train.trainer as trainer
from ctrcal.cli import main
from ctrcal.core.errors import OutputError
from ctrcal.train.checkpoint import load_checkpoint
from ctrcal.train.results import epoch_tradeoff, read_result
from ctrcal.train.trainer import train


def _config_file(tmp_path: Path, prepared_dir: Path, epochs: int = 2) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(
        "model: {embedding_dim: 4, hidden_units: [16], dropout: 0.1}\n"
        f"train: {{batch_size: 1024, eval_batch_size: 8192, epochs: {epochs}, patience: 5, "
        "progress: false, num_threads: 1}\n"
        f"data: {{prepared_dir: {prepared_dir}}}\n"
    )
    return path


def _strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---------------------------------------------------------------------------------------------
# A full or read-only disk


def test_a_full_disk_at_a_checkpoint_is_one_line_keeps_the_last_one_and_resumes_exactly(
    prepared_dir, tmp_path, monkeypatch, capsys
):
    cfg = _config_file(tmp_path, prepared_dir, epochs=3)
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main(["train", str(cfg), "--out", str(full)]) == 0
    capsys.readouterr()

    real_save, saves = torch.save, []

    def disk_fills_at_the_second_last_pt(payload, f, *args, **kwargs):
        if ".last.pt." in getattr(f, "name", ""):
            saves.append(f.name)
            if len(saves) == 2:  # epoch 2: the kernel's own ENOSPC, from /dev/full
                with open("/dev/full", "wb") as disk:
                    return real_save(payload, disk, *args, **kwargs)
        return real_save(payload, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_fills_at_the_second_last_pt)
    assert main(["train", str(cfg), "--out", str(cut)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert str(cut / "checkpoints" / "last.pt") in line and "no space left" in line
    # the previous checkpoint is intact and nothing half-written is left
    assert load_checkpoint(cut / "checkpoints" / "last.pt")["epoch"] == 1
    assert not [p for p in (cut / "checkpoints").iterdir() if p.name.endswith(".tmp")]
    monkeypatch.setattr(torch, "save", real_save)  # space freed
    assert main(["train", str(cfg), "--out", str(cut), "--resume"]) == 0
    assert_same_training(full, cut)


def test_a_read_only_run_directory_is_one_line(prepared_dir, tmp_path, monkeypatch, capsys):
    # running as root defeats chmod, so the file system's answer is simulated
    cfg = _config_file(tmp_path, prepared_dir)
    run = tmp_path / "ro" / "run"
    real_mkdir = Path.mkdir

    def read_only(self, *args, **kwargs):
        if self == run:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    assert main(["train", str(cfg), "--out", str(run)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert f"{run}: cannot write: read-only file system" in line


def test_a_forbidden_result_file_is_one_line_and_resume_finishes(
    prepared_dir, tmp_path, monkeypatch
):
    run = tmp_path / "run"
    real_write = Path.write_text

    def forbidden(self, text, *args, **kwargs):
        if self.name.startswith(".result.json."):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real_write(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", forbidden)
    with pytest.raises(OutputError) as failed:
        train(tiny_config("train.epochs=1"), prepared_dir, run)
    assert str(failed.value) == f"{run / 'result.json'}: cannot write: permission denied"
    monkeypatch.setattr(Path, "write_text", real_write)
    res = train(tiny_config("train.epochs=1"), prepared_dir, run, resume=True)
    assert read_result(run).test == res.test and res.epochs_completed == 1


# ---------------------------------------------------------------------------------------------
# One writer per run directory


@pytest.mark.slow
def test_a_second_train_into_the_same_out_is_refused_naming_the_first(
    prepared_dir, tmp_path, capsys
):
    cfg = _config_file(tmp_path, prepared_dir, epochs=2)
    run = tmp_path / "run"
    lock = tmp_path / ".run.lock"
    first = ForkedCommand(["train", str(cfg), "--out", str(run)], child_env())
    try:
        # frozen while it holds the lock and has recorded itself in it
        deadline = time.monotonic() + 120
        while not (lock.exists() and lock.read_text()) and time.monotonic() < deadline:
            assert first.poll() is None, first.output()[1]
            time.sleep(0.01)
        first.send_signal(signal.SIGSTOP)
        assert main(["train", str(cfg), "--out", str(run)]) == 1
        line = _one_line(capsys.readouterr().err)
        assert "another 'ctrcal train'" in line and f"pid {first.pid} on " in line
        assert str(run) in line
        # and so is a --resume: the directory is being written
        assert main(["train", str(cfg), "--out", str(run), "--resume"]) == 1
        capsys.readouterr()
        first.send_signal(signal.SIGCONT)
        assert first.wait(timeout=300) == 0  # the first run was not disturbed
    finally:
        if first.poll() is None:
            kill_9(first)
    assert (run / "result.json").is_file() and not lock.exists()


# ---------------------------------------------------------------------------------------------
# A validation split with a single class


@pytest.fixture(scope="module")
def no_click_valid(criteo_frame, tmp_path_factory) -> Path:
    """Prepared data whose valid split has no click (train and test have both classes)."""
    from ctrcal.api import prepare
    from ctrcal.config import Config
    from ctrcal.preparation.synthetic import write_criteo

    frame, _ = criteo_frame
    root = tmp_path_factory.mktemp("no_click")
    label = frame.columns[0]
    files = {
        "train": write_criteo(frame, root / "train.txt", "dac"),
        "valid": write_criteo(frame.filter(frame[label] == 0), root / "valid.txt", "dac"),
        "test": write_criteo(frame, root / "test.txt", "dac"),
    }
    cfg = Config()
    cfg.features.min_count = 1
    return prepare({k: [v] for k, v in files.items()}, root / "data", cfg).out_dir


def test_a_valid_split_without_a_click_monitors_logloss_says_so_and_writes_valid_json(
    no_click_valid, tmp_path, capsys
):
    run = tmp_path / "run"
    config = tmp_path / "c.yaml"
    config.write_text(
        "model: {embedding_dim: 4, hidden_units: [8]}\n"
        "train: {epochs: 2, batch_size: 256, progress: false, num_threads: 1, "
        "monitor: auc_logloss}\n"
    )
    assert main(["train", str(config), "--data", str(no_click_valid), "--out", str(run)]) == 0
    out = capsys.readouterr()
    assert "valid has no clicks" in out.err and "falls back to logloss" in out.out
    result = _strict_json((run / "result.json").read_text())
    assert result["best_epoch"] >= 1 and result["monitor"] == "logloss"
    assert result["valid"]["auc"] is None and result["valid"]["logloss"] > 0
    for line in (run / "metrics.jsonl").read_text().splitlines():
        assert _strict_json(line)["valid_auc"] is None
    assert (run / "checkpoints" / "best.pt").is_file()
    # the run is usable: evaluate and --resume find its weights
    assert main(["evaluate", str(run)]) == 0
    assert (
        main(["train", str(config), "--data", str(no_click_valid), "--out", str(run), "--resume"])
        == 0
    )


def test_json_of_a_split_without_a_click_is_strict(no_click_valid, tmp_path, capsys):
    run = tmp_path / "run"
    train(tiny_config("train.epochs=1", "train.monitor=logloss"), no_click_valid, run)
    assert "falls back" not in capsys.readouterr().err  # logloss was asked for
    history = _strict_json((run / "result.json").read_text())["history"]
    assert history[0]["valid_auc"] is None and history[0]["valid_pcoc"] is None


# ---------------------------------------------------------------------------------------------
# A moved data directory


def test_evaluate_suggests_data_when_the_run_data_has_moved(prepared_dir, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(prepared_dir, data)
    run = tmp_path / "run"
    train(tiny_config("train.epochs=1"), data, run)
    moved = data.rename(tmp_path / "moved")
    assert main(["evaluate", str(run)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert str(data) in line and "--data" in line and "moved" in line
    assert main(["evaluate", str(run), "--data", str(moved)]) == 0


# ---------------------------------------------------------------------------------------------
# Which epoch to keep


def test_every_epoch_has_valid_metrics_and_the_monitor_trade_off_is_said(
    prepared_dir, tmp_path, monkeypatch, capsys
):
    # the AUC improves in epoch 2 while logloss and ECE get worse: auc keeps epoch 2
    script = iter(
        [
            {"auc": 0.70, "logloss": 0.45, "ece": 0.012, "pcoc": 1.02},
            {"auc": 0.72, "logloss": 0.46, "ece": 0.033, "pcoc": 1.14},
        ]
    )
    monkeypatch.setattr(trainer, "valid_metrics", lambda logits, labels: next(script))
    config = tmp_path / "c.yaml"
    config.write_text(
        "model: {embedding_dim: 4, hidden_units: [8]}\n"
        "train: {epochs: 2, batch_size: 4096, progress: false, num_threads: 1, "
        "monitor: auc}\n"
    )
    run = tmp_path / "run"
    assert main(["train", str(config), "--data", str(prepared_dir), "--out", str(run)]) == 0
    out = capsys.readouterr().out
    result = _strict_json((run / "result.json").read_text())
    assert result["best_epoch"] == 2
    assert result["epoch_choice"] == (
        "train.monitor auc kept epoch 2, whose validation logloss 0.4600 is worse than "
        "epoch 1's 0.4500 and whose ECE 0.0330 is worse than epoch 1's 0.0120"
    )
    assert result["epoch_choice"] in out
    lines = out.splitlines()
    table = lines.index("epoch  valid AUC  logloss   ECE      PCOC")
    assert lines[table + 1].split() == ["1", "0.7000", "0.4500", "0.0120", "1.0200"]
    assert lines[table + 2].split() == ["*", "2", "0.7200", "0.4600", "0.0330", "1.1400"]


def test_real_epochs_record_finite_validation_metrics(prepared_dir, tmp_path):
    res = train(tiny_config("train.epochs=2"), prepared_dir, tmp_path / "run")
    saved = _strict_json((tmp_path / "run" / "result.json").read_text())
    assert len(saved["history"]) == 2
    for h in saved["history"]:
        for key in ("valid_auc", "valid_logloss", "valid_ece", "valid_pcoc"):
            assert math.isfinite(h[key]), key
    assert set(res.valid) >= {"auc", "logloss", "ece", "pcoc"}


def test_epoch_tradeoff_is_silent_when_the_kept_epoch_is_best_everywhere():
    history = [
        {"epoch": 1, "valid_logloss": 0.47, "valid_ece": 0.02},
        {"epoch": 2, "valid_logloss": 0.45, "valid_ece": 0.01},
        {"epoch": 3, "valid_logloss": None, "valid_ece": 0.005},
    ]
    assert epoch_tradeoff(history[:2], 2, "auc") is None
    # an undefined metric is no evidence; a lower ECE elsewhere is
    assert epoch_tradeoff(history, 2, "logloss") == (
        "train.monitor logloss kept epoch 2, whose validation ECE 0.0100 is worse than "
        "epoch 3's 0.0050"
    )
    # a result.json written before the monitor was recorded still says it
    assert epoch_tradeoff(history, 2, "").startswith("the monitored metric kept epoch 2, whose")
