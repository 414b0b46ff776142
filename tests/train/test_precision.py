"""The run's precision: bf16 steps against fp32, float32 master weights, ``auto``'s probe, and
scoring in the precision a run trained in."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

import ctrcal.metrics as M
import ctrcal.train.trainer as trainer
from ctrcal.core.batch import Batch
from ctrcal.models.masknet import MaskNet
from ctrcal.serving.predict import predict_run
from ctrcal.train import precision, step
from ctrcal.train.evaluate import evaluate_run
from ctrcal.train.predict import predict_split
from ctrcal.train.results import run_precision
from ctrcal.validate import load_config

BF16 = torch.bfloat16


def _masknet(norm: str = "layernorm") -> MaskNet:
    torch.manual_seed(0)
    return MaskNet([60, 40, 20], 3, 8, hidden_units=[64, 64], reduction_ratio=0.5, net_norm=norm)


def _batch(seed: int = 1, rows: int = 256) -> Batch:
    g = torch.Generator().manual_seed(seed)
    return Batch(
        torch.stack([torch.randint(0, v, (rows,), generator=g) for v in (60, 40, 20)], 1),
        torch.randn(rows, 3, generator=g),
        (torch.rand(rows, generator=g) < 0.3).float(),
    )


def _context(model: nn.Module, dtype: torch.dtype | None) -> step.StepContext:
    cfg = load_config(None, ["train.emb_l2=1e-4", "train.lr=1e-3"])
    opt = step.make_optimizer(model, cfg.train)
    return step.make_step_context(model, opt, cfg.train, torch.device("cpu"), dtype)


@pytest.mark.parametrize("norm", ["layernorm", "mclayernorm"])
def test_bf16_steps_follow_fp32_steps_and_keep_float32_master_weights(norm):
    runs = {}
    for dtype in (None, BF16):
        model = _masknet(norm)
        ctx = _context(model, dtype)
        torch.manual_seed(5)  # the same MC-LayerNorm subsets in both
        loss = float(step.train_step(ctx, _batch()))
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        losses = [loss] + [float(step.train_step(ctx, _batch(s))) for s in range(2, 4)]
        runs[dtype] = (model, ctx, losses, grads)
    (_, _, l32, g32), (m16, ctx16, l16, g16) = runs[None], runs[BF16]
    # bf16 operands round to 8 bits: the losses agree to about 1e-2 relative, and the first
    # step's gradients point the same way
    torch.testing.assert_close(torch.tensor(l16), torch.tensor(l32), rtol=2e-2, atol=0)
    assert float(torch.nn.functional.cosine_similarity(g16, g32, dim=0)) > 0.99
    for name, p in m16.named_parameters():
        assert p.dtype == torch.float32, name  # the master weights stay float32
    for state in ctx16.optimizer.state.values():
        assert all(v.dtype == torch.float32 for v in state.values() if v.is_floating_point())


def test_a_bf16_step_runs_the_model_under_bf16_autocast():
    seen = []
    model = _masknet()
    model.register_forward_pre_hook(
        lambda m, args: (
            seen.append(torch.get_autocast_dtype("cpu"))
            if torch.is_autocast_enabled("cpu")
            else seen.append(None)
        )
    )
    step.train_step(_context(model, BF16), _batch())
    step.train_step(_context(_masknet(), None), _batch())
    assert seen == [BF16]


def _probe(pays: bool) -> precision.Bf16Probe:
    return precision.Bf16Probe(1.0, 0.5 if pays else 2.0, 1e-3, pays)


def _tiny(*overrides: str):
    return load_config(
        None,
        [
            "model.embedding_dim=4",
            "model.hidden_units=[16]",
            "train.progress=false",
            "train.num_threads=1",
            "train.device=cpu",
            *overrides,
        ],
    )


def _auto_is_bf16(monkeypatch) -> None:
    """``auto`` resolves to bf16 on a CPU with bf16 units, the tiny test model timed too."""
    monkeypatch.setattr(trainer, "cpu_bf16_probe", lambda model, batch: _probe(True))
    monkeypatch.setattr(trainer, "bf16_may_pay", lambda model: True)
    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: ["AMX-BF16"])


@pytest.mark.parametrize("pays", [False, True])
def test_auto_follows_the_probe_on_a_cpu(monkeypatch, pays):
    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: ["AMX-BF16"])
    cpu = torch.device("cpu")
    assert precision.resolve_precision("auto", cpu, lambda: _probe(pays)) == (
        BF16 if pays else None
    )
    assert precision.resolve_precision("auto", cpu) is None  # no probe: float32

    def never():
        raise AssertionError("a stated precision or a GPU does not probe")

    assert precision.resolve_precision("fp32", cpu, never) is None
    assert precision.resolve_precision("bf16", cpu, never) == BF16
    assert precision.resolve_precision("auto", torch.device("cuda"), never) == BF16
    assert precision.resolve_precision("auto", torch.device("meta"), never) is None


def test_auto_is_fp32_without_a_probe_on_a_cpu_without_bf16_units(monkeypatch):
    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: [])

    def never():
        raise AssertionError("no bf16 units: nothing to probe")

    assert precision.resolve_precision("auto", torch.device("cpu"), never) is None
    assert precision.resolve_precision("bf16", torch.device("cpu"), never) == BF16


def test_the_probe_leaves_the_rng_and_the_gradients_alone():
    model = _masknet("mclayernorm")
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    probe = precision.cpu_bf16_probe(model, _batch(), repeats=1)
    assert torch.equal(torch.rand(3), expected)
    assert all(p.grad is None for p in model.parameters())
    assert probe.fp32_s > 0 and probe.bf16_s > 0
    assert probe.error < precision.BF16_TOLERANCE


def test_the_probe_needs_accuracy(monkeypatch):
    real = precision._forward_backward

    def off_by(model, batch, params, bf16):
        out = real(model, batch, params, bf16)
        return out * 1.5 if bf16 else out

    monkeypatch.setattr(precision, "_forward_backward", off_by)
    probe = precision.cpu_bf16_probe(_masknet(), _batch(), repeats=1)
    assert probe.error > precision.BF16_TOLERANCE and not probe.pays


class _Recorder(nn.Module):
    """Logits from a linear layer; records the autocast dtype of every forward."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 1)
        self.mc_sampling = False  # an MC layer as predict_split finds one
        self.seen: list[torch.dtype | None] = []

    def forward(self, batch: Batch) -> torch.Tensor:
        on = torch.is_autocast_enabled("cpu")
        self.seen.append(torch.get_autocast_dtype("cpu") if on else None)
        return self.linear(batch.numeric).reshape(-1)


@pytest.mark.parametrize("dtype", [None, BF16])
@pytest.mark.parametrize("mc_samples", [0, 3])
def test_predictions_compute_in_the_precision_asked(dtype, mc_samples):
    model = _Recorder()
    pred = predict_split([model], _batch(), batch_size=100, mc_samples=mc_samples, precision=dtype)
    assert model.seen and set(model.seen) == {dtype}
    assert pred.probs.shape == (256,)


def test_training_scores_in_its_precision(monkeypatch, prepared_dir, tmp_path):
    seen = []
    real_predict, real_score = trainer.predict_split, trainer.score_split

    def predict(*args, **kwargs):
        seen.append(("valid", kwargs.get("precision")))
        return real_predict(*args, **kwargs)

    def score(*args, **kwargs):
        seen.append(("test", kwargs.get("precision")))
        return real_score(*args, **kwargs)

    monkeypatch.setattr(trainer, "predict_split", predict)
    monkeypatch.setattr(trainer, "score_split", score)
    _auto_is_bf16(monkeypatch)
    cfg = _tiny("train.epochs=1")  # precision auto, which the probe above makes bf16

    trainer.train(cfg, prepared_dir, tmp_path / "run")
    assert seen == [("valid", BF16), ("test", BF16)]
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["precision"] == "bf16"


def test_a_run_is_scored_later_in_the_precision_it_was_trained_in(
    monkeypatch, prepared_dir, tmp_path
):
    """evaluate and predict read the recorded precision instead of probing again, so a run
    whose auto resolved to bf16 gives the same numbers in train, evaluate and predict."""
    _auto_is_bf16(monkeypatch)
    cfg = _tiny("train.epochs=1")
    run = tmp_path / "run"
    trained = trainer.train(cfg, prepared_dir, run)
    # a probe at scoring time would now say fp32: nothing may ask it
    monkeypatch.setattr(trainer, "cpu_bf16_probe", lambda model, batch: _probe(False))
    monkeypatch.setattr(precision, "cpu_bf16_probe", lambda model, batch: _probe(False))
    assert run_precision(run, cfg, torch.device("cpu")) == BF16
    evaluated = evaluate_run(run, "test", device="cpu")
    assert evaluated["auc"] == trained.test["auc"]
    predict_run(run, tmp_path / "p.parquet", split="test", device="cpu")
    preds = pq.read_table(tmp_path / "p.parquet").to_pandas()
    assert M.auc(preds["prob"], preds["label"]) == pytest.approx(evaluated["auc"], abs=1e-12)
    # a run without the record (an older one) is scored as its config resolves without a probe
    result = json.loads((run / "result.json").read_text())
    del result["precision"]
    (run / "result.json").write_text(json.dumps(result))
    assert run_precision(run, cfg, torch.device("cpu")) is None


def test_a_small_model_stays_fp32_without_being_timed(monkeypatch, prepared_dir, tmp_path):
    """Below BF16_MIN_DENSE_WEIGHTS auto does not time the model: its runs are fp32 whatever
    the machine's load."""
    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: ["AMX-BF16"])

    def never(model, batch):
        raise AssertionError("a model this small is not timed")

    monkeypatch.setattr(trainer, "cpu_bf16_probe", never)
    model = _masknet()
    assert precision.dense_weights(model) < precision.BF16_MIN_DENSE_WEIGHTS
    assert not precision.bf16_may_pay(model)
    assert precision.bf16_may_pay(
        MaskNet([60, 40, 20], 3, 16, hidden_units=[400, 400, 400], reduction_ratio=1.0)
    )
    result = trainer.train(_tiny("train.epochs=1"), prepared_dir, tmp_path / "run")
    assert result.precision == "fp32"


def test_a_resumed_run_keeps_the_precision_it_had(monkeypatch, prepared_dir, tmp_path):
    _auto_is_bf16(monkeypatch)
    run = tmp_path / "run"
    trainer.train(_tiny("train.epochs=1", "train.patience=5"), prepared_dir, run)
    # the probe would now say fp32: a resumed run must not switch precision halfway
    monkeypatch.setattr(trainer, "cpu_bf16_probe", lambda model, batch: _probe(False))
    resumed = trainer.train(
        _tiny("train.epochs=1", "train.patience=5"), prepared_dir, run, resume=True
    )
    assert resumed.epochs_completed == 1 and resumed.precision == "bf16"
