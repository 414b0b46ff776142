"""A run survives a kill at any instant, refuses foreign checkpoints, and says what it skips."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from interrupt import assert_same_training, ctrcal_argv, kill_9_when, run, start, tiny_config

import ctrcal.train.trainer as trainer
from ctrcal.core.errors import CtrcalError, DataError
from ctrcal.train.checkpoint import load_checkpoint
from ctrcal.train.trainer import train


def test_kill_between_best_and_last_checkpoint_resumes_exactly(prepared_dir, tmp_path, monkeypatch):
    # patience 1: a replayed epoch that saw "no improvement" would cut the LR and stop
    cfg = tiny_config("train.epochs=3", "train.patience=1", "model.dropout=0.1")
    full = train(cfg, prepared_dir, tmp_path / "full")
    assert full.best_epoch >= 2, "needs an improving second epoch to test the window"

    real_save, calls = trainer.save_checkpoint, []

    def dies_before_last(path, payload):
        calls.append(path)
        if len(calls) == 2:  # epoch 2: best.pt has just been replaced, last.pt not yet
            raise KeyboardInterrupt
        real_save(path, payload)

    monkeypatch.setattr(trainer, "save_checkpoint", dies_before_last)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, prepared_dir, tmp_path / "cut")
    monkeypatch.setattr(trainer, "save_checkpoint", real_save)
    assert load_checkpoint(tmp_path / "cut" / "checkpoints" / "best.pt")["epoch"] == 2
    assert load_checkpoint(tmp_path / "cut" / "checkpoints" / "last.pt")["epoch"] == 1
    # what kills inside atomic writes leave: hidden temporaries, removed by the resume
    stale = [
        tmp_path / "cut" / ".metrics.jsonl.x1.tmp",
        tmp_path / "cut" / "checkpoints" / ".last.pt.x2.tmp",
        tmp_path / "cut" / "checkpoints" / "..next-best.pt.x3.tmp",
    ]
    for path in stale:
        path.write_bytes(b"half")
    train(cfg, prepared_dir, tmp_path / "cut", resume=True)
    assert not any(path.exists() for path in stale)
    assert_same_training(tmp_path / "full", tmp_path / "cut")


def _write_config(tmp_path: Path, prepared_dir: Path) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(
        "model: {embedding_dim: 4, hidden_units: [16], dropout: 0.1}\n"
        "train: {batch_size: 1024, eval_batch_size: 8192, epochs: 2, patience: 3, "
        "progress: false, num_threads: 1}\n"
        f"data: {{prepared_dir: {prepared_dir}}}\n"
    )
    return path


@pytest.mark.slow
def test_kill_9_at_several_moments_then_resume_equals_uninterrupted(prepared_dir, tmp_path):
    cfg = _write_config(tmp_path, prepared_dir)
    full = tmp_path / "full"
    run(ctrcal_argv("train", str(cfg), "--out", str(full)))
    # kill when these files appear: right at the start, after the first best, after an epoch
    moments = [None, "checkpoints/best.pt", "checkpoints/last.pt"]
    for i, marker in enumerate(moments):
        cut = tmp_path / f"cut{i}"
        proc = start(ctrcal_argv("train", str(cfg), "--out", str(cut)))
        kill_9_when(proc, None if marker is None else cut / marker)
        if marker is not None:
            # the kernel released the run's flock, not its file: the lock is free all the same
            assert (tmp_path / f".cut{i}.lock").exists()
        run(ctrcal_argv("train", str(cfg), "--out", str(cut), "--resume"))
        assert_same_training(full, cut)


def test_a_checkpoint_replaced_by_a_malicious_pickle_is_refused_unexecuted(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "last.pt"
    torch.save({"model": Evil()}, path)  # pickled, as an attacker would write it
    with pytest.raises(CtrcalError, match="unreadable checkpoint"):
        load_checkpoint(path)
    assert not marker.exists()


def _unlabelled_test_dir(criteo_files, tmp_path) -> Path:
    from ctrcal.api import prepare
    from ctrcal.config import Config

    cfg = Config()
    cfg.features.min_count = 1
    # the same rows in another file for valid: a file given as two splits is refused
    splits = {
        "train": [criteo_files["dac"]],
        "valid": [criteo_files["dac_gz"]],
        "test": [criteo_files["dac_test"]],
    }
    return prepare(splits, tmp_path / "prep", cfg).out_dir


def test_unlabelled_test_split_is_skipped_by_train_and_refused_by_evaluate(
    criteo_files, tmp_path, capsys
):
    from ctrcal.train.evaluate import evaluate_run

    data = _unlabelled_test_dir(criteo_files, tmp_path)
    res = train(tiny_config("train.epochs=1"), data, tmp_path / "run")
    assert res.test is None and (tmp_path / "run" / "result.json").exists()
    assert "test split has no labels" in capsys.readouterr().err
    again = train(tiny_config("train.epochs=1"), data, tmp_path / "run", resume=True)
    assert again.test is None
    with pytest.raises(DataError, match="no labels"):
        evaluate_run(tmp_path / "run", "test")
    assert set(evaluate_run(tmp_path / "run", "valid")) >= {"auc", "ece"}


def test_shift_report_on_an_unlabelled_test_split_refuses_before_training(criteo_files, tmp_path):
    from ctrcal.reports.shift.report import run_shift_report

    data = _unlabelled_test_dir(criteo_files, tmp_path)
    cfg = tiny_config("train.epochs=1", "report.seeds=1")
    with pytest.raises(DataError, match="no labels"):
        run_shift_report(cfg, tmp_path / "out", data, progress=False, log=lambda m: None)
    assert not (tmp_path / "out" / "runs").exists()
