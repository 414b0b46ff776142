"""Noise-injection training: a shift on the training batches, Gaussian noise on the weights."""

from __future__ import annotations

import pytest
import torch
from interrupt import interrupt_training_at_step

import ctrcal.train.trainer as trainer
from ctrcal.cli import main
from ctrcal.config import TrainShiftConfig
from ctrcal.core.batch import Batch
from ctrcal.core.errors import ConfigError
from ctrcal.data.feature_map import FeatureMap
from ctrcal.train import step
from ctrcal.train.noise import TrainShift
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
    # the model calls recorded here are the training and scoring steps alone: auto's start-up
    # probe (on CPUs with bf16 units) would add forward passes of its own
    "train.precision=fp32",
]
GAUSS = "train.train_shift={name: gaussian_numeric, intensity: 0.5, space: model}"


def _cfg(*overrides: str):
    return load_config(None, [*TINY, *overrides])


def _inputs(args, kwargs):
    """(categorical, numeric) of a model call (models take ``forward(batch)``)."""
    batch = args[0] if args else next(iter(kwargs.values()))
    return batch.categorical, batch.numeric


def _record_inputs(monkeypatch):
    """Every model call's (training?, categorical, numeric), in order."""
    calls: list[tuple[bool, torch.Tensor, torch.Tensor]] = []
    real = trainer.create_model

    def create(*a, **k):
        model = real(*a, **k)

        def hook(module, args, kwargs):
            cat, num = _inputs(args, kwargs)
            calls.append((module.training, cat.clone(), num.clone()))

        model.register_forward_pre_hook(hook, with_kwargs=True)
        return model

    monkeypatch.setattr(trainer, "create_model", create)
    return calls


def _split(calls, training):
    return [(c, n) for t, c, n in calls if t is training]


# ---------------------------------------------------------------------------------------------
# Config keys and validate


@pytest.mark.parametrize(
    ("override", "key", "words"),
    [
        (
            "train.train_shift={name: gausian_numeric, intensity: 0.1}",
            "train.train_shift.name",
            ["did you mean 'gaussian_numeric'"],
        ),
        (
            "train.train_shift={name: gaussian_numeric, intensity: -0.1}",
            "train.train_shift.intensity",
            [">= 0", "-0.1"],
        ),
        (
            "train.train_shift={name: categorical_corruption, intensity: 1.5}",
            "train.train_shift.intensity",
            ["<= 1"],
        ),
        (
            "train.train_shift={name: temporal, intensity: 1}",
            "train.train_shift.name",
            ["not noise on a batch"],
        ),
        (
            "train.train_shift={name: gaussian_numeric, intensity: 0.1, space: raw}",
            "train.train_shift.space",
            ["'original', 'model'"],
        ),
        (
            "train.train_shift={name: categorical_corruption, intensity: 0.1, space: model}",
            "train.train_shift.space",
            ["no option"],
        ),
        (
            "train.train_shift={name: gaussian_numeric, intensty: 0.1}",
            "train.train_shift.intensty",
            ["did you mean 'intensity'"],
        ),
        ("train.train_shift={name: gaussian_numeric}", "train.train_shift.intensity", ["missing"]),
        ("train.weight_noise=-0.01", "train.weight_noise", [">= 0", "-0.01"]),
        ("train.weight_noise=.nan", "train.weight_noise", ["nan"]),
    ],
)
def test_validate_names_the_noise_key_and_what_is_wrong(tmp_path, capsys, override, key, words):
    path = tmp_path / "c.yaml"
    path.write_text("train: {epochs: 1}\n")
    assert main(["validate", str(path), override]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert key in err[0] and all(w in err[0] for w in words), err


@pytest.mark.parametrize(
    ("variant", "key", "word"),
    [
        (
            "{name: tn, train_shift: {name: nosuch, intensity: 0.1}}",
            "report.variants[1].train_shift.name",
            "unknown shift",
        ),
        (
            "{name: tn, train_shift: {name: gaussian_numeric, intensity: -1}}",
            "report.variants[1].train_shift.intensity",
            ">= 0",
        ),
        ("{name: wn, weight_noise: -1e-3}", "report.variants[1].weight_noise", ">= 0"),
        ("{name: wn, weight_noise: 1e-3, from_variant: ln}", "report.variants[1]", "from_variant"),
    ],
)
def test_validate_checks_the_noise_keys_of_report_variants(tmp_path, capsys, variant, key, word):
    path = tmp_path / "c.yaml"
    path.write_text(f"train: {{epochs: 1}}\nreport:\n  variants: [{{name: ln}}, {variant}]\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0] and word in err[0], err


def test_noise_keys_load_strictly_and_reach_the_variants_training_config():
    from ctrcal.reports.shift.plan import plan_variants, variant_train_config

    cfg = load_config(
        None,
        [
            "train.weight_noise=1e-4",
            "report.variants=[{name: ln}, {name: tn, train_shift: {name: categorical_corruption, "
            "intensity: 0.2}}, {name: wn, weight_noise: 0.0}]",
        ],
    )
    plans = {p.name: p for p in plan_variants(cfg)}
    ln = variant_train_config(cfg, plans["ln"], 1).train
    tn = variant_train_config(cfg, plans["tn"], 1).train
    wn = variant_train_config(cfg, plans["wn"], 1).train
    # a variant without the keys trains with the train section's, like every other train key
    assert (ln.train_shift, ln.weight_noise, ln.seed) == (None, 1e-4, 1)
    assert tn.train_shift == TrainShiftConfig("categorical_corruption", 0.2)
    assert tn.weight_noise == 1e-4
    assert (wn.train_shift, wn.weight_noise) == (None, 0.0)  # 0 switches it off for wn
    with pytest.raises(ConfigError, match="train.train_shift.name"):
        load_config(None, ["train.train_shift={name: nosuch, intensity: 0.1}"])


# ---------------------------------------------------------------------------------------------
# The training shift


def _batch(rows=4096, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Batch(
        torch.randint(3, 9, (rows, 26), generator=g),
        torch.randn(rows, 13, generator=g),
        (torch.rand(rows, generator=g) < 0.3).float(),
    )


def test_training_shift_is_fresh_per_batch_and_seeded_by_torchs_generator(prepared_dir):
    fm = FeatureMap.load(prepared_dir)
    shift = TrainShift(TrainShiftConfig("gaussian_numeric", 0.5, "model"), fm)
    clean = _batch()

    def epoch(seed):
        torch.manual_seed(seed)
        shift.start_epoch()
        return [shift(clean).numeric for _ in range(2)]

    a, b, c = epoch(0), epoch(0), epoch(1)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))  # same seed, same noise
    assert not torch.equal(a[0], a[1])  # fresh noise on every batch
    assert not torch.equal(a[0], c[0])  # another seed, other noise
    # N(0, (0.5 sigma_j)^2) on feature j, sigma_j its train-split std in model space
    noise = (a[0] - clean.numeric) / torch.tensor(fm.numeric_std)
    assert noise.std(0).tolist() == pytest.approx([0.5] * 13, rel=0.1)
    assert torch.equal(clean.numeric, _batch().numeric)  # the input batch is not modified


def test_categorical_training_shift_replaces_ids_at_its_rate(prepared_dir):
    fm = FeatureMap.load(prepared_dir)
    shift = TrainShift(TrainShiftConfig("categorical_corruption", 0.4), fm)
    clean = _batch()
    torch.manual_seed(0)
    shift.start_epoch()
    out = shift(clean)
    changed = (out.categorical != clean.categorical).float().mean().item()
    assert 0.25 < changed < 0.42  # p = 0.4, less the draws that land on the same id
    assert torch.equal(out.numeric, clean.numeric) and torch.equal(out.label, clean.label)


@pytest.mark.parametrize(
    "override",
    [
        GAUSS,
        "train.train_shift={name: gaussian_numeric, intensity: 0.25}",
        "train.train_shift={name: categorical_corruption, intensity: 0.3}",
    ],
)
def test_training_batches_are_shifted_and_evaluation_batches_are_not(
    override, prepared_dir, tmp_path, monkeypatch
):
    calls = _record_inputs(monkeypatch)
    train(_cfg("train.epochs=1"), prepared_dir, tmp_path / "clean")
    clean = list(calls)
    calls.clear()
    train(_cfg("train.epochs=1", override), prepared_dir, tmp_path / "noisy")
    noisy = list(calls)
    train_clean, train_noisy = _split(clean, True), _split(noisy, True)
    eval_clean, eval_noisy = _split(clean, False), _split(noisy, False)
    assert len(train_noisy) == len(train_clean) > 1 and len(eval_noisy) == len(eval_clean) > 1
    # the same rows in the same order (the data order is seeded by the epoch), perturbed
    gaussian = "gaussian" in override
    for (c0, n0), (c1, n1) in zip(train_clean, train_noisy, strict=True):
        if gaussian:
            assert torch.equal(c0, c1)
            finite = n0.isfinite()
            assert (n0[finite] != n1[finite]).float().mean() > 0.99
        else:
            assert torch.equal(n0.nan_to_num(7.0), n1.nan_to_num(7.0))
            assert 0.15 < (c0 != c1).float().mean() < 0.35
    # validation (every epoch) and test batches reach the model exactly as stored
    for (c0, n0), (c1, n1) in zip(eval_clean, eval_noisy, strict=True):
        assert torch.equal(c0, c1) and torch.equal(n0.nan_to_num(7.0), n1.nan_to_num(7.0))


# ---------------------------------------------------------------------------------------------
# Weight noise


def _masknet():
    from ctrcal.models.masknet import MaskNet

    torch.manual_seed(0)
    return MaskNet([50, 30], 3, 4, hidden_units=[64])


def _small_batch():
    g = torch.Generator().manual_seed(1)
    return Batch(
        torch.randint(0, 30, (256, 2), generator=g),
        torch.randn(256, 3, generator=g),
        (torch.rand(256, generator=g) < 0.3).float(),
    )


def test_weight_noise_perturbs_dense_weights_for_the_pass_and_restores_them_before_the_step():
    eta = 0.04
    model = _masknet()
    cfg = _cfg(f"train.weight_noise={eta}", "train.grad_clip=0")
    opt = step.make_optimizer(model, cfg.train)
    ctx = step.make_step_context(model, opt, cfg.train, torch.device("cpu"), None)
    table = model.embedding.table.weight
    assert all(p is not table for p in ctx.noisy) and len(ctx.noisy) == len(ctx.params) - 1
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    seen: dict[str, torch.Tensor] = {}
    model.register_forward_pre_hook(
        lambda m, a: seen.update({n: p.detach().clone() for n, p in m.named_parameters()})
    )
    at_step: dict[str, torch.Tensor] = {}
    real_step = opt.step

    def spy_step(*a, **k):
        at_step.update({n: p.detach().clone() for n, p in model.named_parameters()})
        at_step["grad"] = dict(model.named_parameters())["embedding.table.weight"].grad.clone()
        return real_step(*a, **k)

    opt.step = spy_step
    step.train_step(ctx, _small_batch())
    diffs = torch.cat(
        [(seen[n] - before[n]).flatten() for n in before if n != "embedding.table.weight"]
    )
    # the forward saw W + eps with eps ~ N(0, eta): std sqrt(eta), mean 0, every weight moved
    assert diffs.std().item() == pytest.approx(eta**0.5, rel=0.1)
    assert abs(diffs.mean().item()) < 0.01 and (diffs != 0).all()
    # the table is not perturbed, and the optimizer steps from exactly the clean weights
    assert torch.equal(seen["embedding.table.weight"], before["embedding.table.weight"])
    for n in before:
        assert torch.equal(at_step[n], before[n]), n


def test_weight_noise_gradient_is_the_gradient_at_the_perturbed_weights():
    model, ref = _masknet(), _masknet()
    cfg = _cfg("train.weight_noise=0.01", "train.grad_clip=0")
    opt = step.make_optimizer(model, cfg.train)
    ctx = step.make_step_context(
        model, opt, cfg.train, torch.device("cpu"), None, sparse_tables=False
    )
    grads = {}
    opt.step = lambda *a, **k: grads.update(
        {n: p.grad.clone() for n, p in model.named_parameters()}
    )
    batch = _small_batch()
    torch.manual_seed(5)
    step.train_step(ctx, batch)
    # the same draws, by hand: same generator state, same parameter order
    torch.manual_seed(5)
    with torch.no_grad():
        for p in ref.parameters():
            if p is not ref.embedding.table.weight:
                p.add_(torch.randn_like(p), alpha=0.1)  # std sqrt(0.01)
    ref.train()
    loss = torch.nn.functional.binary_cross_entropy_with_logits(ref(batch.inputs()), batch.label)
    loss.backward()
    for n, p in ref.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, rtol=1e-5, atol=1e-7)


def test_no_weight_noise_draws_nothing_from_the_generator():
    # existing configs (weight_noise 0, no train_shift) train exactly as before
    model = _masknet()
    cfg = _cfg()
    opt = step.make_optimizer(model, cfg.train)
    ctx = step.make_step_context(model, opt, cfg.train, torch.device("cpu"), None)
    assert ctx.weight_noise_std == 0.0
    state = torch.get_rng_state()
    step.train_step(ctx, _small_batch())  # no dropout, no MC-LayerNorm in this model
    assert torch.equal(state, torch.get_rng_state())


# ---------------------------------------------------------------------------------------------
# Whole runs: deterministic by seed, resumable


def _weights(run_dir):
    return torch.load(run_dir / "checkpoints/best.pt", weights_only=True)["model"]


def _strip(history):
    return [{k: v for k, v in h.items() if k not in ("rows_per_s", "seconds")} for h in history]


BOTH = (GAUSS, "train.weight_noise=1e-3")


def test_runs_with_noise_are_bit_identical_by_seed_and_differ_across_seeds(prepared_dir, tmp_path):
    a = train(_cfg(*BOTH), prepared_dir, tmp_path / "a")
    b = train(_cfg(*BOTH), prepared_dir, tmp_path / "b")
    assert _strip(a.history) == _strip(b.history) and a.test == b.test
    wa, wb = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # the noise changes training, and another seed draws other noise
    plain = train(_cfg(), prepared_dir, tmp_path / "plain")
    assert plain.history[0]["train_loss"] != a.history[0]["train_loss"]
    c = train(_cfg(*BOTH, "train.seed=1"), prepared_dir, tmp_path / "c")
    assert c.history[0]["train_loss"] != a.history[0]["train_loss"]


def test_resumed_noisy_run_continues_the_same_noise_sequence(prepared_dir, tmp_path, monkeypatch):
    cfg = _cfg(*BOTH, "train.epochs=3", "train.patience=5")
    full = train(cfg, prepared_dir, tmp_path / "full")
    # step 12: in the middle of the second epoch (8 steps per epoch)
    interrupt_training_at_step(monkeypatch, 12, lambda: train(cfg, prepared_dir, tmp_path / "cut"))
    resumed = train(cfg, prepared_dir, tmp_path / "cut", resume=True)
    assert _strip(resumed.history) == _strip(full.history)
    assert resumed.test == full.test
    wa, wb = _weights(tmp_path / "full"), _weights(tmp_path / "cut")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_original_space_codec_copies_its_parameters_to_a_device_once():
    # an original-space training shift maps every batch through the codec: a fresh copy of
    # its parameters per batch would be a host-to-device transfer at every step on a GPU
    from ctrcal.data.numeric import NumericTransform

    codec = NumericTransform("log_standardize", (1.0, -2.0), (2.0, 0.5))
    x = torch.randn(8, 2)
    first, again = codec._params(x), codec._params(codec.to_original(x))
    assert all(a is b for a, b in zip(first, again, strict=True))
    torch.testing.assert_close(codec.to_model(codec.to_original(x)), x)


def test_original_space_shift_on_data_without_original_stats_fails_before_the_run_starts(
    prepared_dir, tmp_path
):
    import json
    import shutil

    from ctrcal.core.errors import DataError

    data = tmp_path / "data"
    shutil.copytree(prepared_dir, data)
    fmap = json.loads((data / "feature_map.json").read_text())
    for f in fmap["features"]:
        f.pop("original_std", None)
    (data / "feature_map.json").write_text(json.dumps(fmap))
    with pytest.raises(DataError, match="space: model"):
        train(
            _cfg("train.train_shift={name: gaussian_numeric, intensity: 0.1}"),
            data,
            tmp_path / "run",
        )
    assert not (tmp_path / "run" / "config.yaml").exists()
