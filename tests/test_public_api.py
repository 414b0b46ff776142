"""The curated top-level API: every exported name resolves, one name per job."""

from __future__ import annotations

import subprocess
import sys

import pytest

import ctrcal


def test_every_exported_name_resolves():
    for name in ctrcal.__all__:
        assert getattr(ctrcal, name) is not None, name


@pytest.mark.slow
def test_import_ctrcal_metrics_works_as_a_module():
    code = (
        "import torch, ctrcal.metrics\n"
        "from ctrcal import metrics\n"
        "assert ctrcal.metrics.ece is metrics.ece\n"
        "p = torch.tensor([0.1, 0.9, 0.8, 0.3]); y = torch.tensor([0.0, 1.0, 1.0, 0.0])\n"
        "assert float(ctrcal.metrics.auc(p, y)) == 1.0\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_the_jobs_are_the_functions_that_do_them():
    from ctrcal.api import prepare
    from ctrcal.data.feature_map import FeatureMap
    from ctrcal.models.build import create_model
    from ctrcal.shifts.builtin import CategoricalCorruption
    from ctrcal.train.evaluate import evaluate_run
    from ctrcal.train.results import Run

    assert ctrcal.prepare is prepare
    assert ctrcal.evaluate is evaluate_run and ctrcal.FeatureMap is FeatureMap
    assert ctrcal.CategoricalCorruption is CategoricalCorruption and ctrcal.Run is Run
    assert ctrcal.create_model is create_model


def test_ctrcal_train_checks_the_config_once_then_trains(monkeypatch):
    import ctrcal.train.trainer as trainer
    from ctrcal.config import Config
    from ctrcal.core.errors import ConfigError

    calls = []
    monkeypatch.setattr(trainer, "train", lambda *a: calls.append(a) or "result")
    cfg = Config()
    assert ctrcal.train(cfg, "data", "run", resume=True) == "result"
    assert calls == [(cfg, "data", "run", True)]
    cfg.train.device = "gpu7"
    with pytest.raises(ConfigError, match=r"train\.device"):
        ctrcal.train(cfg, "data", "run")
    assert len(calls) == 1  # a bad config never reaches the trainer


@pytest.mark.slow
def test_ctrcal_train_is_the_training_job_whatever_was_imported_first():
    code = (
        "import ctrcal\nassert callable(ctrcal.train)\nimport ctrcal.train.step\n"
        "assert callable(ctrcal.train) and ctrcal.train.step\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_one_model_factory():
    assert "create_model" in ctrcal.__all__ and "build_model" not in ctrcal.__all__
    assert not hasattr(ctrcal, "build_model")
    from ctrcal.models import masknet

    assert not hasattr(masknet, "build_model")
