"""train.lr_schedule: the LR of every step, its interplay with the plateau rule, and resume."""

from __future__ import annotations

import math

import pytest
import torch
from interrupt import assert_same_training, interrupt_training_at_step, tiny_config

import ctrcal.train.trainer as trainer
from ctrcal.core.errors import ConfigError
from ctrcal.train.step import LR_SCHEDULES, set_scheduled_lr
from ctrcal.train.trainer import train


def _record_lrs(monkeypatch) -> list[float]:
    """The dense group's LR at every optimizer step of the runs that follow."""
    seen, real_step = [], trainer.train_step

    def recording(ctx, batch):
        seen.append(ctx.optimizer.param_groups[0]["lr"])
        return real_step(ctx, batch)

    monkeypatch.setattr(trainer, "train_step", recording)
    return seen


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_every_step_gets_the_schedules_lr_down_to_zero_at_the_end(schedule):
    group = {"params": [torch.nn.Parameter(torch.zeros(1))], "base_lr": 0.01}
    optimizer = torch.optim.Adam([group], lr=0.01)
    lrs = []
    for step in range(5):
        set_scheduled_lr(optimizer, schedule, step, 5)
        lrs.append(optimizer.param_groups[0]["lr"])
    expected = {
        "linear": [0.01, 0.008, 0.006, 0.004, 0.002],
        "cosine": [0.01 * 0.5 * (1 + math.cos(math.pi * k / 5)) for k in range(5)],
    }[schedule]
    assert lrs == pytest.approx(expected)
    assert all(a > b for a, b in zip(lrs, lrs[1:], strict=False))
    assert LR_SCHEDULES[schedule](1.0) == pytest.approx(0.0)


def test_a_linear_run_decays_over_all_epochs_and_the_plateau_rule_lowers_what_it_decays(
    prepared_dir, tmp_path, monkeypatch
):
    seen = _record_lrs(monkeypatch)
    # epoch 2 scores worse than epoch 1: one bad epoch, so epoch 3 runs at lr_factor × the decay
    scores = iter([1.0, 0.0, 2.0])
    monkeypatch.setattr(trainer, "monitor_value", lambda *args: next(scores))
    cfg = tiny_config(
        "train.epochs=3", "train.patience=5", "train.lr=0.01", "train.lr_factor=0.1",
        "train.lr_schedule=linear",
    )  # fmt: skip
    result = train(cfg, prepared_dir, tmp_path / "run")
    total = len(seen)
    per_epoch = total // 3
    assert total == 3 * per_epoch and per_epoch >= 2
    factor = [1.0] * (2 * per_epoch) + [0.1] * per_epoch
    expected = [0.01 * f * (1 - k / total) for k, f in enumerate(factor)]
    assert seen == pytest.approx(expected, rel=1e-12)
    # the history's LR is each epoch's first step's
    assert [h["lr"] for h in result.history] == pytest.approx(
        [expected[0], expected[per_epoch], expected[2 * per_epoch]]
    )


def test_the_constant_schedule_is_the_plateau_rule_alone(prepared_dir, tmp_path, monkeypatch):
    seen = _record_lrs(monkeypatch)
    scores = iter([1.0, 0.0, 2.0])  # epoch 2 is bad: epoch 3 runs at lr × lr_factor
    monkeypatch.setattr(trainer, "monitor_value", lambda *args: next(scores))
    cfg = tiny_config("train.epochs=3", "train.patience=5", "train.lr=0.01")
    train(cfg, prepared_dir, tmp_path / "run")
    third = len(seen) // 3
    assert seen == pytest.approx([0.01] * (2 * third) + [0.001] * third, rel=1e-12)


def test_an_interrupted_decaying_run_resumes_bit_for_bit(prepared_dir, tmp_path, monkeypatch):
    cfg = tiny_config("train.epochs=3", "train.patience=5", "train.lr_schedule=cosine")
    train(cfg, prepared_dir, tmp_path / "full")
    # Ctrl-C in the middle of the second epoch: the resume replays it from last.pt's LR state
    interrupt_training_at_step(monkeypatch, 12, lambda: train(cfg, prepared_dir, tmp_path / "cut"))
    train(cfg, prepared_dir, tmp_path / "cut", resume=True)
    assert_same_training(tmp_path / "full", tmp_path / "cut")


def test_an_unknown_schedule_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="lr_schedule"):
        tiny_config("train.lr_schedule=step")
