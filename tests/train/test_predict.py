"""Batched prediction (with the per-batch numeric transform) and checkpoint helpers."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from ctrcal.data.loader import Batch, ParquetCTRData
from ctrcal.errors import CtrcalError
from ctrcal.models.masknet import MaskNet
from ctrcal.train.checkpoint import (
    capture_rng_state,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from ctrcal.train.predict import predict_logits, predict_probs


@pytest.fixture(scope="module")
def valid(prepared_dir):
    return ParquetCTRData(prepared_dir, "valid")


@pytest.fixture(scope="module")
def model(valid):
    torch.manual_seed(0)
    fm = valid.feature_map
    return MaskNet(fm.vocab_sizes, fm.num_numeric, 4, hidden_units=[8],
                   net_norm="mclayernorm")  # fmt: skip


def test_split_and_batch_give_the_same_logits_in_row_order(model, valid):
    whole = valid.all()
    a = predict_logits(model, valid, 700, "cpu")
    b = predict_logits(model, whole, 10_000, "cpu")
    assert a.shape == (len(valid),) and a.dtype == torch.float32
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a[:5], model.eval()(whole.categorical[:5], whole.numeric[:5]))


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


def test_predict_probs_one_shot_and_mc(model, valid):
    probs, labels = predict_probs(model, valid, 4096, "cpu")
    torch.testing.assert_close(probs, torch.sigmoid(predict_logits(model, valid, 4096, "cpu")))
    torch.testing.assert_close(labels, valid.all().label)
    torch.manual_seed(0)
    mc, _ = predict_probs(model, valid, 4096, "cpu", mc_samples=4)
    assert mc.shape == probs.shape and ((mc >= 0) & (mc <= 1)).all()
    assert not torch.equal(mc, probs)  # the MC layers sampled


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
