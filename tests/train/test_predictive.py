"""The report's predictions: MC passes average probabilities (not logits), members and passes
pool into one mean and std, and one-shot prediction returns the logits."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ctrcal.core.batch import Batch
from ctrcal.train.predict import predict_split

NOISE = 2.0  # logit noise of a pass: large, so a mean of logits would be far off


class _NoisyLogit(nn.Module):
    """An MC layer in the protocol's sense (an ``mc_sampling`` flag): N(0, NOISE²) per row."""

    def __init__(self) -> None:
        super().__init__()
        self.mc_sampling = False

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z + NOISE * torch.randn_like(z) if self.mc_sampling else z


class _Model(nn.Module):
    def __init__(self, shift: float) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 1)
        with torch.no_grad():
            self.lin.weight.copy_(torch.tensor([[1.5, -1.0, 0.5]]))
            self.lin.bias.fill_(shift)
        self.noise = _NoisyLogit()

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.noise(self.lin(batch.numeric).squeeze(1))


def _batch(rows: int = 100) -> Batch:
    g = torch.Generator().manual_seed(0)
    num = torch.randn(rows, 3, generator=g) * 1.5
    return Batch(torch.zeros(rows, 1, dtype=torch.long), num, torch.zeros(rows))


def _reference(models, batch: Batch, passes: int):
    """(mean, population std) over ``passes`` explicit noisy passes of every model."""
    with torch.no_grad():
        z = torch.cat([m.lin(batch.numeric).squeeze(1).expand(passes, -1) for m in models])
        p = torch.sigmoid(z + NOISE * torch.randn_like(z)).double()
    std, mean = torch.std_mean(p, dim=0, correction=0)
    return mean, std, ((p - mean) ** 4).mean(0)


def _assert_std_close(std, ref_std, m4, n):
    # the sampling error of a std from n samples (delta method), with the reference's fourth
    # central moment m4: a skewed row's std scatters by far more than sqrt(1 / (2n)); the
    # row average is much closer
    se = ((m4 - ref_std**4) / (4 * n * ref_std**2)).sqrt()
    assert ((std - ref_std).abs() < 6 * se).all()
    assert abs(float(std.mean() / ref_std.mean()) - 1) < 0.03


def test_mc_passes_average_probabilities_with_their_std():
    model, batch, n = _Model(0.0), _batch(), 400
    one = predict_split([model], batch, batch_size=32, device="cpu")
    with torch.no_grad():
        z = model.lin(batch.numeric).squeeze(1).double()
    torch.testing.assert_close(torch.from_numpy(one.logits), z, rtol=1e-6, atol=1e-6)
    assert one.std is None
    torch.manual_seed(1)
    mc = predict_split([model], batch, batch_size=32, device="cpu", mc_samples=n)
    assert mc.logits is None and not model.noise.mc_sampling  # switched off again
    mean, std = torch.from_numpy(mc.probs), torch.from_numpy(mc.std)
    torch.manual_seed(2)
    ref_mean, ref_std, m4 = _reference([model], batch, 4000)
    se = ref_std / n**0.5
    assert ((mean - ref_mean).abs() < 5 * se + 1e-9).all()
    # the mean of probabilities, not the probability of the mean logit: they differ by about
    # 0.08 where |z| > 1.5 (Jensen's gap), against standard errors of about 0.01
    far = z.abs() > 1.5
    assert far.sum() > 20
    assert (mean - torch.sigmoid(z)).abs()[far].mean() > 5 * se[far].mean()
    _assert_std_close(std, ref_std, m4, n)


def test_an_ensemble_pools_members_and_passes():
    members, batch, n = [_Model(-1.0), _Model(1.0)], _batch(), 300
    torch.manual_seed(3)
    mc = predict_split(members, batch, batch_size=50, device="cpu", mc_samples=n)
    torch.manual_seed(4)
    ref_mean, ref_std, m4 = _reference(members, batch, 3000)
    mean, std = torch.from_numpy(mc.probs), torch.from_numpy(mc.std)
    se = ref_std / (2 * n) ** 0.5
    assert ((mean - ref_mean).abs() < 5 * se + 1e-9).all()
    _assert_std_close(std, ref_std, m4, 2 * n)
    # without MC passes: the plain mean of the members' probabilities, and their spread
    plain = predict_split(members, batch, batch_size=50, device="cpu")
    with torch.no_grad():
        p = torch.stack([torch.sigmoid(m.lin(batch.numeric).squeeze(1)) for m in members])
    torch.testing.assert_close(torch.from_numpy(plain.probs).float(), p.mean(0))
    torch.testing.assert_close(torch.from_numpy(plain.std).float(), p.std(0, correction=0))


def test_report_and_mc_predict_draw_the_same_passes():
    """The report's MC passes and ``mc_predict`` are one loop: from one RNG state a batch
    gives the same probabilities both ways (a second copy of the loop would drift)."""
    from ctrcal.layers.mc_layernorm.module import MCLayerNorm
    from ctrcal.layers.mc_layernorm.predict import mc_predict

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 16)
            self.norm = MCLayerNorm(16, fraction=0.5)
            self.out = nn.Linear(16, 1)

        def forward(self, batch: Batch) -> torch.Tensor:
            return self.out(self.norm(self.lin(batch.numeric))).squeeze(1)

    torch.manual_seed(5)
    model, batch = Net(), _batch(40)
    torch.manual_seed(6)
    report = predict_split([model], batch, batch_size=64, device="cpu", mc_samples=3)
    torch.manual_seed(6)
    mean, std = mc_predict(model, batch, n_samples=3)
    assert float(std.mean()) > 1e-3  # the passes differ
    torch.testing.assert_close(torch.from_numpy(report.probs).float(), mean, rtol=0, atol=1e-7)
    torch.testing.assert_close(torch.from_numpy(report.std).float(), std, rtol=0, atol=1e-6)


class _RowShift:
    """A seeded shift with its own stream (as the built-in shifts): noise on every other row."""

    def __init__(self, seed: int) -> None:
        self.gen = torch.Generator().manual_seed(seed)

    def apply(self, batch: Batch) -> tuple[Batch, torch.Tensor]:
        rows = torch.arange(len(batch)) % 2 == 0
        noise = torch.randn(batch.numeric.shape, generator=self.gen) * rows[:, None]
        return Batch(batch.categorical, batch.numeric + noise, batch.label), rows


def test_kept_shifted_batches_predict_as_the_shift_drawn_anew():
    from ctrcal.train.predict import ShiftedBatches

    members, batch = [_Model(-1.0), _Model(1.0)], _batch(90)
    kept = ShiftedBatches.of(batch, 32, _RowShift(7))
    assert [len(b) for b in kept.batches] == [32, 32, 26]
    for kw in ({}, {"mc_samples": 4}):
        torch.manual_seed(8)
        drawn = predict_split(members, batch, batch_size=32, shift=_RowShift(7), **kw)
        torch.manual_seed(8)
        again = predict_split(members, kept, batch_size=32, **kw)
        assert (drawn.probs == again.probs).all() and (drawn.std == again.std).all()
        assert (drawn.rows == again.rows).all() and drawn.rows.sum() == 45
    with pytest.raises(ValueError, match="already shifted"):
        predict_split(members, kept, batch_size=16)


def test_an_ensemble_from_its_members_predictions_is_bit_identical():
    from ctrcal.train.predict import ensemble_prediction

    members, batch = [_Model(-1.0), _Model(0.3), _Model(1.0)], _batch(90)
    together = predict_split(members, batch, batch_size=32, shift=_RowShift(9))
    alone = [predict_split([m], batch, batch_size=32, shift=_RowShift(9)) for m in members]
    pooled = ensemble_prediction(alone, 32)
    assert pooled.logits is None
    assert (pooled.probs == together.probs).all() and (pooled.std == together.std).all()
    assert (pooled.rows == together.rows).all()
    with pytest.raises(ValueError, match="2\\+ single models"):
        ensemble_prediction(alone[:1], 32)
