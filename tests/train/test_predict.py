"""Batched prediction (with the per-batch numeric transform) and checkpoint helpers."""

from __future__ import annotations

import functools
import itertools
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ctrcal.core.batch import Batch
from ctrcal.core.errors import CtrcalError
from ctrcal.data.loader import ParquetCTRData
from ctrcal.layers.mc_layernorm.module import MCLayerNorm, mc_mode
from ctrcal.layers.mc_layernorm.predict import mc_predict
from ctrcal.models.masknet import MaskNet
from ctrcal.train.checkpoint import (
    capture_rng_state,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from ctrcal.train.predict import iter_batches, predict_logits, predict_probs


@pytest.fixture(scope="module")
def valid(prepared_dir):
    return ParquetCTRData(prepared_dir, "valid")


@pytest.fixture(scope="module")
def model(valid):
    torch.manual_seed(0)
    fm = valid.feature_map
    return MaskNet(fm.vocab_sizes, fm.num_numeric, 4, hidden_units=[8], net_norm="mclayernorm")


def test_split_and_batch_give_the_same_logits_in_row_order(model, valid):
    whole = valid.all()
    a = predict_logits(model, valid, 700, "cpu")
    b = predict_logits(model, whole, 10_000, "cpu")
    assert a.shape == (len(valid),) and a.dtype == torch.float32
    torch.testing.assert_close(a, b)
    first = Batch(whole.categorical[:5], whole.numeric[:5], None)
    torch.testing.assert_close(a[:5], model.eval()(first))


def test_transform_is_applied_per_batch_and_training_flag_restored(model, valid):
    seen = []

    def shift(numeric):
        seen.append(numeric.shape[0])
        return numeric + 1.0

    model.train()
    base = predict_logits(model, valid, 1000, "cpu")
    moved = predict_logits(model, valid, 1000, "cpu", transform=shift)
    assert model.training  # restored
    assert sum(seen) == len(valid) and max(seen) == 1000
    assert not torch.allclose(base, moved)
    same = predict_logits(model, valid, 1000, "cpu", transform=lambda x: x.clone())
    torch.testing.assert_close(base, same)


@pytest.fixture(scope="module")
def trained(valid):
    """The MC-LayerNorm MaskNet after a few Adam steps (norm weights away from 1 and 0)."""
    torch.manual_seed(0)
    model = _masknet(valid.feature_map, "mclayernorm")
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    model.train()
    for batch in itertools.islice(valid.batches(256, shuffle=True, seed=0), 20):
        opt.zero_grad()
        logits = model(batch.inputs())
        F.binary_cross_entropy_with_logits(logits, batch.label).backward()
        opt.step()
    return model.eval()


def _masknet(fm, net_norm):
    return MaskNet(fm.vocab_sizes, fm.num_numeric, 4, hidden_units=[8], net_norm=net_norm)


def _twin(model, fm, net_norm):
    """The same weights under another norm (MC-LayerNorm and LayerNorm share a state dict)."""
    twin = _masknet(fm, net_norm)
    twin.load_state_dict(model.state_dict())
    return twin.eval()


def test_one_shot_prediction_is_the_plain_layernorm_model(trained, valid):
    probs, labels = predict_probs(trained, valid, 700, "cpu")
    torch.testing.assert_close(labels, valid.all().label)
    plain = _twin(trained, valid.feature_map, "layernorm")
    assert not any(hasattr(m, "mc_sampling") for m in plain.modules())
    assert torch.equal(probs, predict_probs(plain, valid, 700, "cpu")[0])
    torch.manual_seed(0)
    mc, _ = predict_probs(trained, valid, 700, "cpu", mc_samples=4)
    assert not torch.equal(mc, probs)  # the MC passes sampled
    assert not trained.training and not any(
        getattr(m, "mc_sampling", False) for m in trained.modules()
    )  # MC mode switched off again


def _explicit_passes(model, data, batch_size, n, together=False):
    """[n, rows]: n stochastic forward passes per batch, one after the other, or (``together``)
    as one forward of the batch's rows repeated n times."""
    out = []
    with torch.no_grad(), mc_mode(model):
        for batch in iter_batches(data, batch_size):
            x = batch.inputs()
            if together:
                rows = len(x)
                logits = model(x.map(lambda t: t.repeat(n, *([1] * (t.dim() - 1)))))
                out.append(torch.sigmoid(logits.reshape(n, rows)))
            else:
                out.append(torch.stack([torch.sigmoid(model(x)) for _ in range(n)]))
    return torch.cat(out, dim=1)


def test_mc_probs_are_the_mean_of_explicit_stochastic_passes(trained, valid):
    n = 6
    # three batches, each with its n passes in one forward (they fit the memory budget)
    batch_size = -(-len(valid) // 3)
    torch.manual_seed(5)
    mc, _ = predict_probs(trained, valid, batch_size, "cpu", mc_samples=n)
    torch.manual_seed(5)
    samples = _explicit_passes(trained, valid, batch_size, n, together=True)
    assert (samples.std(0) > 0).all()  # the passes differ for every row
    torch.testing.assert_close(mc, samples.double().mean(0).float())
    # the std is the population std over the same passes
    whole = valid.all()
    torch.manual_seed(6)
    mean, std = mc_predict(trained, whole, n_samples=n, max_rows=len(whole))
    torch.manual_seed(6)
    samples = _explicit_passes(trained, whole, len(whole), n)
    torch.testing.assert_close(mean, samples.mean(0))
    torch.testing.assert_close(std, samples.std(0, correction=0))
    assert (std > 0).all()


def test_mc_std_shrinks_as_the_subset_grows(trained, valid):
    # the subset noise scales like sqrt((N - k) / (k (N - 1))): none at f = 1
    whole = valid.all()
    spread = {}
    for fraction in (0.5, 0.8, 1.0):
        twin = _twin(trained, valid.feature_map, functools.partial(MCLayerNorm, fraction=fraction))
        torch.manual_seed(7)
        _, std = mc_predict(twin, whole, n_samples=8)
        spread[fraction] = float(std.mean())
    assert spread[0.5] > 1.3 * spread[0.8] > 0
    assert spread[1.0] < 1e-6


def test_report_predictions_agree_with_explicit_passes(trained, valid):
    from ctrcal.train.predict import predict_split

    whole = valid.all()
    whole = Batch(whole.categorical[:200], whole.numeric[:200], whole.label[:200])
    one = predict_split([trained], whole, batch_size=128, device="cpu")
    plain = _twin(trained, valid.feature_map, "layernorm")
    torch.testing.assert_close(
        torch.from_numpy(one.logits).float(), predict_logits(plain, whole, 128, "cpu")
    )
    assert one.std is None
    n = 100  # several passes per forward (the batch repeated): same law as one at a time
    torch.manual_seed(8)
    mc = predict_split([trained], whole, batch_size=128, device="cpu", mc_samples=n)
    torch.manual_seed(9)
    samples = _explicit_passes(trained, whole, len(whole), n).double()
    ref_std, ref_mean = torch.std_mean(samples, dim=0, correction=0)
    mean, std = torch.from_numpy(mc.probs), torch.from_numpy(mc.std)
    se = ref_std * (2 / n) ** 0.5
    assert ((mean - ref_mean).abs() <= 5.5 * se + 1e-12).all()
    assert (std > 0).all() and mc.logits is None
    # per-row stds from 100 samples each scatter by ~10 %; their average agrees closely
    assert float(std.mean() / ref_std.mean()) == pytest.approx(1.0, abs=0.05)


def test_empty_batch():
    model = MaskNet([3], 1, 2, hidden_units=[4])
    empty = Batch(torch.zeros(0, 1, dtype=torch.long), torch.zeros(0, 1), torch.zeros(0))
    assert predict_logits(model, empty, 8, "cpu").shape == (0,)


def test_checkpoint_roundtrip_and_errors(tmp_path):
    path = tmp_path / "c" / "x.pt"
    save_checkpoint(path, {"w": torch.arange(3), "epoch": 2, "rng": capture_rng_state()})
    got = load_checkpoint(path)
    assert torch.equal(got["w"], torch.arange(3)) and got["epoch"] == 2
    assert [p.name for p in path.parent.iterdir()] == ["x.pt"]  # no temporary left behind
    with pytest.raises(CtrcalError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "missing.pt")
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CtrcalError, match="unreadable"):
        load_checkpoint(tmp_path / "bad.pt")


def test_rng_state_roundtrip_through_weights_only(tmp_path):
    save_checkpoint(tmp_path / "rng.pt", {"rng": capture_rng_state()})
    expected = (random.random(), np.random.rand(), torch.rand(3))  # noqa: NPY002
    restore_rng_state(load_checkpoint(tmp_path / "rng.pt")["rng"])
    got = (random.random(), np.random.rand(), torch.rand(3))  # noqa: NPY002
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])
