"""The training loop: learning, schedule, run directory, resume, fine-tuning, CLI."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from interrupt import interrupt_training_at_step
from torch import nn

import ctrcal.train.trainer as trainer
from ctrcal.cli import main
from ctrcal.core.errors import ConfigError, CtrcalError
from ctrcal.data.loader import ParquetCTRData
from ctrcal.layers.mc_layernorm.module import MCLayerNorm
from ctrcal.train import evaluate, finetune, splits, step
from ctrcal.train.predict import predict_logits
from ctrcal.train.results import load_run
from ctrcal.train.trainer import train
from ctrcal.validate import load_config

TINY = [
    "model.embedding_dim=4",
    "model.hidden_units=[16]",
    "model.reduction_ratio=0.5",
    "train.batch_size=2048",
    "train.eval_batch_size=8192",
    "train.epochs=2",
    "train.progress=false",
    "train.num_threads=1",
]
TIMING = ("rows_per_s", "seconds")


def _cfg(*overrides: str):
    return load_config(None, [*TINY, *overrides])


@pytest.fixture(scope="module")
def ln_run(prepared_dir, tmp_path_factory):
    """A finished 2-epoch LayerNorm run (shared, read-only)."""
    run = tmp_path_factory.mktemp("ln_run") / "run"
    return run, train(_cfg(), prepared_dir, run)


def test_tiny_run_learns_and_writes_its_run_directory(ln_run):
    run, res = ln_run
    assert res.valid["auc"] > 0.65 and res.test["auc"] > 0.65  # chance is 0.5
    assert res.best_epoch in (1, 2) and res.epochs_completed == 2
    assert res.oracle["auc"] > res.test["auc"] - 0.02  # synthetic data: the true probabilities
    for name in (
        "config.yaml",
        "feature_map.json",
        "data.json",
        "metrics.jsonl",
        "result.json",
        "checkpoints/best.pt",
        "checkpoints/last.pt",
    ):
        assert (run / name).is_file(), name
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["epoch"] for x in lines] == [1, 2]
    assert {"train_loss", "valid_auc", "valid_logloss", "lr", "rows_per_s"} <= set(lines[0])
    assert lines[1]["train_loss"] < lines[0]["train_loss"]
    saved = json.loads((run / "result.json").read_text())
    assert saved["best_epoch"] == res.best_epoch and saved["test"]["ece"] >= 0
    assert load_config(run / "config.yaml").model.hidden_units == [16]


def test_checkpoints_load_with_weights_only(ln_run):
    run, _ = ln_run
    best = torch.load(run / "checkpoints/best.pt", weights_only=True)
    last = torch.load(run / "checkpoints/last.pt", weights_only=True)
    assert set(best) >= {"model", "epoch", "metrics"}
    assert set(last) >= {"model", "optimizer", "epoch", "rng", "history"}
    assert last["epoch"] == 2


def test_load_run_restores_the_best_model(ln_run, prepared_dir):
    run, res = ln_run
    model, cfg, fm = load_run(run)
    assert not model.training and cfg.train.seed == 0
    assert fm.vocab_sizes == ParquetCTRData(prepared_dir, "test").feature_map.vocab_sizes
    from ctrcal.metrics import auc

    test = ParquetCTRData(prepared_dir, "test")
    logits = predict_logits(model, test, 4096, "cpu")
    # (training evaluated with its own fp32 matmul library: equal up to summation order)
    assert auc(torch.sigmoid(logits), test.all().label) == pytest.approx(res.test["auc"], abs=1e-4)


def test_existing_run_needs_resume(ln_run, prepared_dir):
    run, res = ln_run
    with pytest.raises(CtrcalError, match="already holds a run"):
        train(_cfg(), prepared_dir, run)
    again = train(_cfg(), prepared_dir, run, resume=True)  # finished: returned as it is
    assert again.history == res.history and again.model is not None
    with pytest.raises(ConfigError, match="train.lr"):
        train(_cfg("train.lr=0.01"), prepared_dir, run, resume=True)


def _strip(history):
    return [{k: v for k, v in h.items() if k not in TIMING} for h in history]


def test_resume_after_interruption_matches_an_uninterrupted_run(
    prepared_dir, tmp_path, monkeypatch
):
    # dropout and MC-LayerNorm both draw from the RNG, so its state must survive the restart
    cfg = _cfg(
        "train.epochs=3",
        "train.patience=5",
        "model.dropout=0.2",
        "model.net_norm=mclayernorm",
        "train.emb_l2=1e-4",
    )
    full = train(cfg, prepared_dir, tmp_path / "full")

    # step 12: in the middle of the second epoch (8 steps per epoch)
    interrupt_training_at_step(monkeypatch, 12, lambda: train(cfg, prepared_dir, tmp_path / "cut"))
    assert not (tmp_path / "cut" / "result.json").exists()
    resumed = train(cfg, prepared_dir, tmp_path / "cut", resume=True)

    assert _strip(resumed.history) == _strip(full.history)
    assert resumed.test == full.test
    a = torch.load(tmp_path / "full/checkpoints/best.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "cut/checkpoints/best.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "aucs, stop_after, best, lrs",
    [
        # improve, improve, bad (x0.1), bad (x0.1, floor) -> stop at patience 2
        ([0.6, 0.7, 0.65, 0.66, 0.9], 4, 2, [1e-3, 1e-3, 1e-3, 1e-4]),
        # an improvement resets the count of bad epochs
        ([0.6, 0.55, 0.7, 0.65, 0.64, 0.9], 5, 3, [1e-3, 1e-3, 1e-4, 1e-4, 1e-5]),
    ],
)
def test_plateau_schedule_early_stopping_and_best_weights(
    aucs, stop_after, best, lrs, prepared_dir, tmp_path, monkeypatch
):
    script = iter(aucs)
    monkeypatch.setattr(
        trainer,
        "valid_metrics",
        lambda logits, labels: {"auc": next(script), "logloss": 0.5, "ece": 0.01, "pcoc": 1.0},
    )
    cfg = _cfg(
        f"train.epochs={len(aucs)}",
        "train.batch_size=8192",
        "train.monitor=auc",
        "train.min_lr=5e-6",
    )
    res = train(cfg, prepared_dir, tmp_path / "run")
    assert res.epochs_completed == stop_after and res.stopped_early
    assert res.best_epoch == best and res.valid["auc"] == aucs[best - 1]
    assert [h["lr"] for h in res.history] == pytest.approx(lrs)
    last = torch.load(tmp_path / "run/checkpoints/last.pt", weights_only=True)
    assert last["optimizer"]["param_groups"][0]["lr"] == pytest.approx(max(lrs[-1] * 0.1, 5e-6))
    best_state = torch.load(tmp_path / "run/checkpoints/best.pt", weights_only=True)["model"]
    restored = res.model.state_dict()
    assert all(torch.equal(restored[k], best_state[k]) for k in best_state)
    assert not all(torch.equal(last["model"][k], best_state[k]) for k in best_state)


def test_monitor_values():
    assert evaluate.monitor_value("auc", 0.8, 0.4) == 0.8
    assert evaluate.monitor_value("logloss", 0.8, 0.4) == -0.4
    assert evaluate.monitor_value("auc_logloss", 0.8, 0.4) == pytest.approx(0.4)
    assert evaluate.monitor_value("auc", math.nan, 0.4) == -math.inf


def test_emb_l2_is_the_gradient_of_half_lambda_squared_norm_of_the_whole_table():
    from ctrcal.core.batch import Batch
    from ctrcal.models.masknet import MaskNet

    lam = 0.5
    batch = Batch(torch.zeros(4, 2, dtype=torch.long), torch.randn(4, 3), torch.ones(4))
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(MaskNet([6, 4], 3, 4, hidden_units=[8]))
    a, b = models
    opt_a = torch.optim.SGD(a.parameters(), lr=1.0)
    ctx = step.StepContext(
        a, a, opt_a, list(a.parameters()), step.embedding_tables(a), lam, 0.0, "cpu", None
    )
    step.train_step(ctx, batch)
    opt_b = torch.optim.SGD(b.parameters(), lr=1.0)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(b(batch.inputs()), batch.label)
    (loss + lam / 2 * b.embedding.table.weight.square().sum()).backward()
    opt_b.step()
    torch.testing.assert_close(a.embedding.table.weight, b.embedding.table.weight)
    # rows no batch used shrink too: the penalty covers the whole table
    unused = a.embedding.offsets[0] + 5
    torch.testing.assert_close(
        a.embedding.table.weight[unused], models[1].embedding.table.weight[unused]
    )


def test_a_training_step_calls_the_model_with_the_batch_but_not_its_labels():
    from ctrcal.core.batch import Batch
    from ctrcal.models.masknet import MaskNet

    model = MaskNet([6, 4], 3, 4, hidden_units=[8])
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(args))
    ctx = step.StepContext(
        model,
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        list(model.parameters()),
        [],
        0.0,
        0.0,
        "cpu",
        None,
    )
    batch = Batch(torch.zeros(4, 2, dtype=torch.long), torch.randn(4, 3), torch.ones(4))
    step.train_step(ctx, batch)
    [(given,)] = seen
    assert given.label is None  # a model never sees labels
    assert given.categorical is batch.categorical and given.numeric is batch.numeric


def test_finetune_swaps_norms_and_starts_from_the_source_weights(ln_run, prepared_dir, tmp_path):
    src, _ = ln_run
    cfg = _cfg(
        "model.net_norm={name: mclayernorm, fraction: 0.5}",
        f"train.finetune_from={src}",
        "train.epochs=1",
        "train.lr=1e-4",
    )
    fm = ParquetCTRData(prepared_dir, "valid").feature_map
    start = finetune.finetune_model(cfg, fm, prepared_dir)
    assert all(type(b.norm) is MCLayerNorm and b.norm.fraction == 0.5 for b in start.blocks)
    source, _, _ = load_run(src)
    src_state = source.state_dict()
    assert all(torch.equal(v, src_state[k]) for k, v in start.state_dict().items())

    train(cfg, prepared_dir, tmp_path / "ft")
    tuned, tuned_cfg, _ = load_run(tmp_path / "ft")
    assert all(type(b.norm) is MCLayerNorm for b in tuned.blocks)
    assert tuned_cfg.train.finetune_from == str(src)


@pytest.mark.parametrize(
    "model",
    [
        [
            "model.name=dcnv2",
            "model.structure=stacked",
            "model.num_cross_layers=1",
            "model.stacked_dnn_hidden_units=[8, 8]",
        ],
        ["model.name=dnn", "model.hidden_units=[8, 8]"],
    ],
    ids=["dcnv2", "dnn"],
)
def test_finetune_swaps_the_norms_of_any_model(model, prepared_dir, tmp_path):
    def _cfg(*overrides):
        tiny = [o for o in TINY if not o.startswith("model.")]
        return load_config(None, [*tiny, "model.embedding_dim=4", *overrides])

    norms = ["model.emb_norm=layernorm", "model.net_norm=layernorm"]
    src = tmp_path / "src"
    train(_cfg(*model, *norms, "train.epochs=1"), prepared_dir, src)
    source, _, fm = load_run(src)
    mc = "{name: mclayernorm, fraction: 0.75}"
    cfg = _cfg(*model, f"model.emb_norm={mc}", f"model.net_norm={mc}", f"train.finetune_from={src}")
    start = finetune.finetune_model(cfg, fm, prepared_dir)
    kinds = [type(m) for m in start.modules() if isinstance(m, nn.LayerNorm)]
    assert kinds and all(k is MCLayerNorm for k in kinds)  # every position swapped
    assert sum(isinstance(m, MCLayerNorm) for m in start.emb_norm.modules()) == len(
        fm.vocab_sizes
    ) + len(fm.numeric_fields)
    src_state = source.state_dict()
    assert start.state_dict().keys() == src_state.keys()
    assert all(torch.equal(v, src_state[k]) for k, v in start.state_dict().items())
    # the architecture must otherwise match: another tower width is refused
    wider = [a.replace("[8, 8]", "[8, 16]") for a in model]
    with pytest.raises(ConfigError, match="architecture differs"):
        finetune.finetune_model(
            _cfg(*wider, *norms, f"train.finetune_from={src}"), fm, prepared_dir
        )
    # and the model itself must be the same
    other = ["model.name=masknet"] if "dnn" in model[0] else ["model.name=dnn"]
    with pytest.raises(ConfigError, match="swaps norms within one model"):
        finetune.finetune_model(_cfg(*other, f"train.finetune_from={src}"), fm, prepared_dir)


def test_finetune_rejects_another_architecture(ln_run, prepared_dir):
    src, _ = ln_run
    fm = ParquetCTRData(prepared_dir, "valid").feature_map
    cfg = _cfg("model.hidden_units=[8]", f"train.finetune_from={src}")
    with pytest.raises(ConfigError, match="architecture"):
        finetune.finetune_model(cfg, fm, prepared_dir)
    cfg = _cfg("model.emb_norm=layernorm", f"train.finetune_from={src}")
    with pytest.raises(ConfigError, match="emb_norm"):
        finetune.finetune_model(cfg, fm, prepared_dir)


PARALLEL = ["model.variant=parallel", "model.block_dim=8", "model.mlp_hidden_units=[8]"]


@pytest.mark.parametrize(
    "extra",
    [["train.precision=bf16"], ["train.data_mode=stream"], [*PARALLEL, "train.optimizer=adamw"]],
)
def test_other_modes_train(extra, prepared_dir, tmp_path):
    res = train(_cfg("train.epochs=1", *extra), prepared_dir, tmp_path / "run")
    assert res.valid["auc"] > 0.6 and math.isfinite(res.history[0]["train_loss"])


def test_cli_train_and_evaluate(prepared_dir, tmp_path, capsys):
    cfg_path = tmp_path / "tiny.yaml"
    cfg_path.write_text(yaml.safe_dump({"model": {"net_norm": "mclayernorm"}}))
    run = tmp_path / "run"
    # the documented order: CONFIG, options, then the key=value overrides
    args = [
        "train",
        str(cfg_path),
        "--data",
        str(prepared_dir),
        "--out",
        str(run),
        *TINY,
        "train.epochs=1",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "valid: AUC" in out and "test:" in out
    assert main(args) == 1  # exists, no --resume: one line, no traceback
    err = capsys.readouterr().err
    assert "already holds a run" in err and len(err.strip().splitlines()) == 1
    assert main([*args[:1], "--resume", *args[1:]]) == 0
    capsys.readouterr()

    assert main(["evaluate", str(run), "--split", "valid"]) == 0
    out = capsys.readouterr().out
    assert "AUC" in out and "logloss" in out and "ECE" in out
    assert main(["evaluate", str(run), "--mc-samples", "3"]) == 0
    assert "MC average of 3" in capsys.readouterr().out


def test_cli_train_prepares_the_configured_data(tmp_path, capsys):
    cfg_path = tmp_path / "synthetic.yaml"
    cfg_path.write_text(
        yaml.safe_dump(
            {
                "out_dir": str(tmp_path / "out"),
                "data": {"synthetic": {"rows": 3000, "seed": 1}},
                "features": {"min_count": 2},
            }
        )
    )
    assert main(["train", str(cfg_path), *TINY, "train.epochs=1"]) == 0
    assert (tmp_path / "out" / "data" / "feature_map.json").is_file()
    assert (tmp_path / "out" / "result.json").is_file()


def _pair_of_models():
    from ctrcal.models.masknet import MaskNet

    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(MaskNet([50, 30], 3, 4, hidden_units=[8]))
    return models


def _batches():
    from ctrcal.core.batch import Batch

    g = torch.Generator().manual_seed(1)
    return [
        Batch(
            torch.randint(0, 30, (16, 2), generator=g),
            torch.randn(16, 3, generator=g),
            (torch.rand(16, generator=g) < 0.3).float(),
        )
        for _ in range(3)
    ]


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_sparse_table_gradients_give_the_same_training_as_dense(optimizer):
    cfg = _cfg(f"train.optimizer={optimizer}", "train.emb_l2=1e-2", "train.grad_clip=0.5")
    states = []
    for model, sparse in zip(_pair_of_models(), (False, True), strict=True):
        opt = step.make_optimizer(model, cfg.train)
        ctx = step.make_step_context(
            model, opt, cfg.train, torch.device("cpu"), None, sparse_tables=sparse
        )
        # the table's backward adds its rows into a dense .grad kept across steps
        assert model.embedding.grad_in_place is sparse
        for batch in _batches():
            step.train_step(ctx, batch)
        assert not model.embedding.table.weight.grad.is_sparse
        states.append(model.state_dict())
    for k in states[0]:
        torch.testing.assert_close(states[0][k], states[1][k])


def test_adam_applies_emb_l2_as_the_l2_gradient_of_the_whole_table():
    cfg = _cfg("train.optimizer=adam", "train.emb_l2=0.1", "train.grad_clip=0")
    a, b = _pair_of_models()
    opt_a = step.make_optimizer(a, cfg.train)
    assert opt_a.param_groups[1]["weight_decay"] == 0.1
    ctx = step.make_step_context(a, opt_a, cfg.train, torch.device("cpu"), None)
    assert ctx.emb_l2 == 0.0  # the optimizer adds it, not the step
    opt_b = torch.optim.Adam(b.parameters(), lr=cfg.train.lr)
    for batch in _batches():
        step.train_step(ctx, batch)
        opt_b.zero_grad()
        logits = b(batch.inputs())
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.label)
        (loss + 0.05 * b.embedding.table.weight.square().sum()).backward()
        opt_b.step()
    torch.testing.assert_close(a.embedding.table.weight, b.embedding.table.weight)


def test_trained_model_is_handed_back_dense_and_without_grads(ln_run):
    _, res = ln_run
    assert res.model.embedding.table.sparse is False
    assert res.model.embedding.grad_in_place is False
    assert all(p.grad is None for p in res.model.parameters())


def test_auto_data_mode_keeps_splits_on_the_gpu_only_when_they_fit(monkeypatch):
    from types import SimpleNamespace

    fm = SimpleNamespace(
        splits={"train": {"rows": 1000}, "valid": {"rows": 100}},
        vocab_sizes=[5] * 3,
        numeric_fields=["a"],
    )
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10**6, 10**7))
    assert splits.resolve_data_mode("auto", cuda, fm) == "device"  # 1100 rows * 20 B
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10**4, 10**7))
    assert splits.resolve_data_mode("auto", cuda, fm) == "memory"
    assert splits.resolve_data_mode("auto", torch.device("cpu"), fm) == "memory"
    assert splits.resolve_data_mode("stream", cuda, fm) == "stream"


def test_resume_ignores_the_report_section_but_not_training_keys(ln_run, prepared_dir):
    run, res = ln_run
    again = train(
        _cfg("report.seeds=7", "report.intensities=[0.0, 0.5]"), prepared_dir, run, resume=True
    )
    assert again.best_epoch == res.best_epoch
    with pytest.raises(ConfigError, match=r"train\.lr"):
        train(_cfg("train.lr=0.5"), prepared_dir, run, resume=True)


@pytest.mark.slow
def test_compiled_training_on_cpu_matches_eager(prepared_dir, tmp_path):
    """``train.compile: true`` (inductor, one graph) trains the model eager mode trains: same
    validation scores and weights up to float reordering (dropout off: compiled graphs draw
    their own masks)."""
    from ctrcal.layers.kernels.cpu_kernels import cpu_kernels

    if cpu_kernels() is None:
        pytest.skip("no C compiler: inductor cannot build CPU code here")
    common = ("train.epochs=1", "model.dropout=0")
    eager = train(_cfg(*common), prepared_dir, tmp_path / "eager")
    compiled = train(_cfg(*common, "train.compile=true"), prepared_dir, tmp_path / "compiled")
    assert compiled.valid["auc"] == pytest.approx(eager.valid["auc"], abs=1e-4)
    assert compiled.valid["logloss"] == pytest.approx(eager.valid["logloss"], rel=1e-4)
    # Adam divides by the gradient's running RMS, so rows whose gradients are nearly zero
    # amplify float reordering up to about lr per step; every other weight agrees closely
    for (name, a), b in zip(
        eager.model.state_dict().items(), compiled.model.state_dict().values(), strict=True
    ):
        diff = (a.float() - b.float()).abs()
        assert diff.max() <= 5e-3, name
        assert (diff > 1e-4).float().mean() < 0.01, name


def test_evaluate_names_what_is_wrong_with_the_run_directory(ln_run, tmp_path, capsys):
    run, _ = ln_run
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    started = tmp_path / "started"
    started.mkdir()
    shutil.copy(run / "config.yaml", started / "config.yaml")
    cases = {
        tmp_path / "nope": "no such run directory",
        tmp_path / "file": "not a directory",
        tmp_path / "empty": "not a run directory (no config.yaml)",
        started: "no trained weights yet",
    }
    for path, message in cases.items():
        assert main(["evaluate", str(path)]) == 1
        err = capsys.readouterr().err
        assert message in err and str(path) in err and len(err.strip().splitlines()) == 1
    # killed between moving best.pt aside and writing the new one: the previous best serves
    only_prev = tmp_path / "only_prev"
    shutil.copytree(run, only_prev)
    (only_prev / "checkpoints" / "best.pt").rename(only_prev / "checkpoints" / "best.prev.pt")
    assert main(["evaluate", str(only_prev), "--split", "valid"]) == 0
    assert "AUC" in capsys.readouterr().out
    # MC passes of a model without MC layers would all be equal: refused, not averaged
    assert main(["evaluate", str(run), "--mc-samples", "4"]) == 2
    err = capsys.readouterr().err
    assert "no MC-LayerNorm layer" in err and len(err.strip().splitlines()) == 1


def test_wrong_paths_and_configs_answer_before_anything_is_written(tmp_path, capsys):
    """A typo is one line on stderr and no run directory."""
    from ctrcal.cli import main

    good = tmp_path / "good.yaml"
    good.write_text("train: {epochs: 1}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {batch_size: 0}\n")
    nope = str(tmp_path / "nope")
    calls = [
        (["evaluate", nope], 1, "no such run directory"),
        (["train", str(bad), "--out", nope], 2, "train.batch_size"),
        (["train", str(good), "--data", nope, "--out", nope], 1, "not a prepared data directory"),
        (["shift-report", str(bad), "--out", nope], 2, "train.batch_size"),
        (["shift-report", str(good), "--data", nope], 1, "not a prepared data directory"),
    ]
    for argv, status, message in calls:
        assert main(argv) == status
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert not Path(nope).exists()  # nothing written for a refused command
