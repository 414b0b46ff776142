"""Which split each part of the shift report learns from: calibrators from clean validation,
the Gaussian shift's stds from train, whatever the evaluated split looks like."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from ctrcal import metrics as M
from ctrcal.api import prepare
from ctrcal.calibration.isotonic import IsotonicCalibration
from ctrcal.calibration.scaling import PlattScaling, TemperatureScaling
from ctrcal.config import Config
from ctrcal.data.feature_map import FeatureMap
from ctrcal.data.loader import ParquetCTRData
from ctrcal.preparation.synthetic import generate_frame, write_criteo
from ctrcal.train.predict import predict_logits
from ctrcal.validate import load_config

# a shift report on its own splits, made once: the module runs on one worker (--dist loadgroup)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("report_splits")]

INTENSITY = 0.5
TEST_SCALE = 1000  # half of the test rows have their numerics multiplied by this
CONFIG = f"""
model: {{embedding_dim: 4, hidden_units: [16]}}
train: {{epochs: 1, batch_size: 256, eval_batch_size: 1024, num_threads: 1, progress: false}}
report:
  seeds: 1
  figures: false
  field_metrics: false
  shifts:
    - {{name: gaussian_numeric, intensities: [{INTENSITY}]}}
  variants:
    - {{name: layernorm, net_norm: layernorm}}
    - {{name: temperature, temperature_scaling: true, from_variant: layernorm}}
    - {{name: platt, platt_scaling: true, from_variant: layernorm}}
    - {{name: isotonic, calibration: {{name: isotonic}}, from_variant: layernorm}}
"""
CALIBRATORS = {
    "temperature": TemperatureScaling,
    "platt": PlattScaling,
    "isotonic": IsotonicCalibration,
}
NUMERIC = [f"I{j}" for j in range(1, 14)]


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    """Raw frames and their prepared directory: train and valid alike; test differs from both
    (numerics of half its rows ``TEST_SCALE`` times larger, which widens them in original and
    in log space; a third of its labels set to 1)."""
    root = tmp_path_factory.mktemp("report_splits")
    frame, _ = generate_frame(3_600, seed=4)
    train, valid, test = frame[:2400], frame[2400:3000], frame[3000:]
    rng = np.random.default_rng(0)
    scale = pl.Series(np.where(rng.random(600) < 0.5, 1, TEST_SCALE))
    test = test.with_columns(
        [(pl.col(c) * scale).alias(c) for c in NUMERIC]
        + [
            pl.Series("label", np.maximum(test["label"].to_numpy(), rng.random(600) < 0.33)).cast(
                test["label"].dtype
            )
        ]
    )
    frames = {"train": train, "valid": valid, "test": test}
    files = {k: [write_criteo(f, root / f"{k}.txt")] for k, f in frames.items()}
    cfg = Config()
    cfg.features.min_count = 2
    return frames, prepare(files, root / "data", cfg).out_dir


@pytest.fixture(scope="module")
def report(splits, tmp_path_factory):
    """The report run on those splits, recording every calibrator fit and every shift made."""
    from ctrcal.calibration import base as calibration_registry
    from ctrcal.reports.shift.report import run_shift_report
    from ctrcal.shifts import registry as shift_registry

    _, data = splits
    root = tmp_path_factory.mktemp("report_splits_out")
    (root / "c.yaml").write_text(CONFIG)
    cfg = load_config(root / "c.yaml")
    fits, made = [], []
    real_calibrator = calibration_registry.create_calibrator
    real_create = shift_registry.create_shift

    def recording_calibrator(spec):
        calibrator = real_calibrator(spec)
        real_fit = calibrator.fit

        def recording_fit(logits, labels, segments=None):
            kind = calibration_registry.calibration_name(spec)
            fits.append((kind, calibrator, np.array(logits, np.float64), np.array(labels)))
            return real_fit(logits, labels, segments)

        calibrator.fit = recording_fit
        return calibrator

    def recording_create(*args, **kwargs):
        shift = real_create(*args, **kwargs)
        made.append(shift)
        return shift

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(calibration_registry, "create_calibrator", recording_calibrator)
        mp.setattr(shift_registry, "create_shift", recording_create)
        run_shift_report(cfg, root / "out", data, progress=False, log=lambda m: None)
    return root / "out", fits, made


def _logits_and_labels(run, data, split):
    from ctrcal.train.results import load_run

    model = load_run(run)[0]
    part = ParquetCTRData(data, split)
    logits = predict_logits(model, part, 1024, "cpu").double().numpy()
    return logits, part.all().label.double().numpy()


def test_calibrators_are_fitted_on_clean_validation_only(splits, report):
    import pandas as pd

    _, data = splits
    out, fits, _ = report
    z_valid, y_valid = _logits_and_labels(out / "runs" / "layernorm" / "seed0", data, "valid")
    z_test, y_test = _logits_and_labels(out / "runs" / "layernorm" / "seed0", data, "test")
    assert y_test.mean() > y_valid.mean() + 0.15  # the splits really differ
    assert sorted(f[0] for f in fits) == sorted(CALIBRATORS)
    results = pd.read_csv(out / "results.csv")
    clean = results[(results["shift"] == "clean") & (results["metric"] == "logloss")]
    clean = clean.set_index("variant")["value"]
    for kind, ours, logits, labels in fits:
        np.testing.assert_array_equal(labels, y_valid)  # validation rows, in order, clean
        np.testing.assert_allclose(logits, z_valid, rtol=1e-6, atol=1e-6)
        on_valid = CALIBRATORS[kind]().fit(z_valid, y_valid)
        on_test = CALIBRATORS[kind]().fit(z_test, y_test)
        assert type(ours) is CALIBRATORS[kind]
        if kind == "temperature":
            assert ours.temperature_ == pytest.approx(on_valid.temperature_, rel=1e-6)
        elif kind == "platt":
            assert (ours.coef_, ours.intercept_) == pytest.approx(
                (on_valid.coef_, on_valid.intercept_), rel=1e-6, abs=1e-9
            )
        # the report's clean test numbers are those of the validation fit, not of a test fit
        expected = M.logloss(on_valid.predict_proba(z_test), y_test)
        leaked = M.logloss(on_test.predict_proba(z_test), y_test)
        assert clean[kind] == pytest.approx(expected, rel=1e-6)
        assert abs(leaked - expected) > 100 * 1e-6 * expected, kind


def test_the_gaussian_shift_uses_train_split_stds(splits, report):
    from ctrcal.core.batch import Batch
    from ctrcal.shifts.registry import create_shift

    frames, data = splits
    _, _, made = report
    fm = FeatureMap.load(data)
    train_std = np.array([np.std(frames["train"][c].drop_nulls().to_numpy()) for c in NUMERIC])
    test_std = np.array([np.std(frames["test"][c].drop_nulls().to_numpy()) for c in NUMERIC])
    live = train_std > 0
    assert (test_std[live] > 5 * train_std[live]).all()
    # the feature map's original-space stds are the train rows' ones
    np.testing.assert_allclose(fm.numeric_original_std, train_std, rtol=1e-9)
    # every shift the report applied carried them
    assert made and all(s.intensity in (0.0, INTENSITY) for s in made)
    for shift in made:
        assert shift.describe()["space"] == "original"
        np.testing.assert_allclose(shift.std, train_std, rtol=1e-6)
    # and the noise the evaluated (test) rows get is s * train std in original space
    parts = list(ParquetCTRData(data, "test").batches(100_000))
    batch = Batch(*(torch.cat([getattr(b, k) for b in parts]) for k in Batch.__annotations__))
    codec = fm.numeric_codec()
    shifted = create_shift("gaussian_numeric", fm, intensity=INTENSITY, seed=0)(batch)
    noise = codec.to_original(shifted.numeric).double() - codec.to_original(batch.numeric).double()
    checked = 0
    for j in np.flatnonzero(live):
        col = noise[:, j][torch.isfinite(noise[:, j])]
        if col.numel() < 300:
            continue
        # 300+ draws: the sample std is within ~4 % (1 se) of the true one, and far from the
        # test split's own std (5+ times larger)
        assert float(col.std()) == pytest.approx(INTENSITY * train_std[j], rel=0.25), NUMERIC[j]
        checked += 1
    assert checked >= 5
    # in model space the std is the train rows' std of the transformed values (not test's)
    model_shift = create_shift(
        {"name": "gaussian_numeric", "space": "model"}, fm, intensity=INTENSITY, seed=0
    )
    train_z = torch.cat([b.numeric for b in ParquetCTRData(data, "train").batches(100_000)])
    test_z = batch.numeric
    for j in np.flatnonzero(live):
        tr = train_z[:, j][torch.isfinite(train_z[:, j])].double()
        te = test_z[:, j][torch.isfinite(test_z[:, j])].double()
        assert model_shift.std[j] == pytest.approx(float(tr.std(correction=0)), rel=1e-4)
        if te.numel() > 300:
            assert float(te.std()) > 1.5 * model_shift.std[j], NUMERIC[j]
