"""The shift report with field-level metrics and isotonic / field-aware calibration variants
(the session's ``shift_report``), and the config keys that ask for them."""

from __future__ import annotations

import json

import pandas as pd
import pytest

pytest.importorskip("ctrcal.train.trainer")

from ctrcal.cli import main  # noqa: E402

KEY = ["variant", "shift", "seed", "noise_seed", "intensity"]


def test_report_has_field_metrics_calibrators_and_oracle(shift_report):
    _, out = shift_report
    res = pd.read_csv(out / "results.csv")
    metrics = set(res["metric"])
    for key in ("ecce", "ecce_sigmas", "ecce_pvalue", "field_rce_mean", "field_rce_max", "mce"):
        assert key in metrics, key
    # per-field values of categoricals and bucketised numerics, for every variant and point
    points = set(map(tuple, res[res["metric"] == "auc"][KEY].to_numpy()))
    per_field = res[res["metric"] == "field_rce:C1"]
    assert set(map(tuple, per_field[KEY].to_numpy())) == points
    assert len(per_field) == len(points)
    assert "field_rce:I1" in metrics
    worst = res[res["metric"] == "field_rce_max"].set_index(KEY)["value"]
    fields = res[res["metric"].str.startswith("field_rce:")]
    top = fields.groupby(KEY)["value"].max()
    pd.testing.assert_series_equal(top.sort_index(), worst.sort_index(), check_names=False)
    # Brier terms sum to the Brier score; label-free errors are estimate − measured
    wide = res.pivot_table(index=["variant", "intensity"], columns="metric", values="value")
    terms = wide["brier_reliability"] - wide["brier_resolution"] + wide["brier_uncertainty"]
    pd.testing.assert_series_equal(
        terms + wide["brier_remainder"], wide["brier"], check_names=False, rtol=1e-9
    )
    pd.testing.assert_series_equal(
        wide["auc_est"] - wide["auc"], wide["auc_est_err"], check_names=False, rtol=1e-9
    )
    assert (wide["segments_flagged"] >= 0).all() and (wide["segment_sigma_max"] >= 0).all()
    text = (out / "report.md").read_text()
    assert "### Field-RCE, mean over fields" in text and "### Multicalibration error" in text
    assert "## Label-free estimates under shift" in text and "| isotonic | 50 % |" in text
    assert "### Brier reliability" in text and "## Worst segments" in text
    assert "calibration floor" in text  # the oracle's Field-RCE / ECCE on synthetic data
    summary = json.loads((out / "summary.json").read_text())
    described = " ".join(summary["variant_descriptions"])
    assert "isotonic regression on clean validation" in described
    assert "field-aware platt calibration on C1 (shrinkage 50)" in described
    listed = summary["row_level"]["segments"]["layernorm"]
    # clean and each shift's strongest point
    assert set(listed) == {"clean", "gaussian_numeric @ 0.5", "categorical_corruption @ 0.6"}
    assert listed["clean"]["adjustment"] == "holm" and listed["clean"]["tested"] > 0
    oracle = summary["oracle_calibration"]
    assert 0 <= oracle["field_rce_mean"] <= oracle["field_rce_max"]


@pytest.mark.parametrize(
    "variant, message",
    [
        ("{name: x, field_calibration: C99, from_variant: ln}", "field_calibration: unknown"),
        (
            "{name: x, isotonic_calibration: true, platt_scaling: true, from_variant: ln}",
            "choose one calibration",
        ),
        (
            "{name: x, field_calibration: C1, field_calibration_method: beta, from_variant: ln}",
            "field_calibration_method",
        ),
        ("{name: x, calibration: betacal, from_variant: ln}", "unknown calibrator 'betacal'"),
        (
            "{name: x, calibration: {name: platt, bins: 3}, from_variant: ln}",
            "calibration: calibration platt: ",
        ),
        (
            "{name: x, calibration: {name: field_aware, field: C99}, from_variant: ln}",
            "calibration: unknown field 'C99'",
        ),
        (
            "{name: x, calibration: {name: field_aware, field: C1, method: beta}, "
            "from_variant: ln}",
            "method: expected 'platt' or 'isotonic'",
        ),
        ("{name: x, calibration: field_aware, from_variant: ln}", "needs field:"),
        (
            "{name: x, calibration: isotonic, temperature_scaling: true, from_variant: ln}",
            "temperature_scaling and calibration: choose one calibration",
        ),
    ],
)
def test_validate_names_the_calibration_key(tmp_path, capsys, variant, message):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(
        "report:\n  variants:\n    - {name: ln, net_norm: layernorm}\n    - " + variant + "\n"
    )
    assert main(["validate", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "report.variants[1]" in err and message in err


def test_validate_checks_the_report_field_keys(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("report:\n  field_numeric_buckets: 1\n")
    assert main(["validate", str(cfg)]) == 2
    assert "report.field_numeric_buckets" in capsys.readouterr().err


def test_the_old_calibration_keys_translate_to_one_spec():
    from ctrcal.config import VariantConfig
    from ctrcal.reports.shift.calibration_keys import calibration_spec

    spec = calibration_spec
    assert spec(VariantConfig("v")) is None
    assert spec(VariantConfig("v", temperature_scaling=True)) == {"name": "temperature"}
    assert spec(VariantConfig("v", platt_scaling=True)) == {"name": "platt"}
    assert spec(VariantConfig("v", isotonic_calibration=True)) == {"name": "isotonic"}
    old = VariantConfig(
        "v",
        field_calibration="C14",
        field_calibration_method="isotonic",
        field_calibration_shrinkage=50.0,
    )
    new = {"name": "field_aware", "field": "C14", "method": "isotonic", "shrinkage": 50.0}
    assert spec(old) == new and spec(VariantConfig("v", calibration=new)) == new
    assert spec(VariantConfig("v", calibration="isotonic")) == {"name": "isotonic"}
    # the spec builds the same calibrator the old keys chose
    from ctrcal.calibration.base import create_calibrator
    from ctrcal.calibration.field_aware import FieldAwareCalibration

    built = create_calibrator(spec(old))
    assert isinstance(built, FieldAwareCalibration)
    assert (built.field, built.method, built.shrinkage) == ("C14", "isotonic", 50.0)
