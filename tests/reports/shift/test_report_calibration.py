"""The report's calibration helpers: field handling and the Field-RCE figure."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from ctrcal import metrics as M
from ctrcal.reports.shift.calibrate import SplitFields, evaluation_metrics
from ctrcal.reports.shift.figures import best_variant, plot_field_rce

REPORT = SimpleNamespace(field_metrics=True, ece_bins=15, field_min_count=20)


def _rows(n=6000, seed=0):
    rng = np.random.default_rng(seed)
    codes = np.stack(
        [rng.integers(0, 5, n), rng.integers(0, 30, n), np.zeros(n, dtype=np.int64)], axis=1
    ).astype(np.int32)
    z = rng.normal(-1.5, 1.0, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(z + 0.6 * (codes[:, 0] == 2))))).astype(float)
    return z, y, SplitFields(codes, ["C1", "C2", "I1"])


def test_constant_fields_are_left_out_of_the_field_metrics():
    z, y, fields = _rows()
    assert fields.usable().names == ["C1", "C2"]
    p = 1 / (1 + np.exp(-z))
    out = evaluation_metrics(p, y, fields, REPORT)
    assert {"field_rce:C1", "field_rce:C2"} <= set(out) and "field_rce:I1" not in out
    assert out["field_rce:C1"] == pytest.approx(M.field_rce(p, y, fields.column("C1"), 20))
    rows = np.arange(len(p)) < 3000
    sub = evaluation_metrics(p, y, fields, REPORT, rows=rows)
    assert sub["ecce"] == pytest.approx(M.ecce(p[rows], y[rows]))
    off = evaluation_metrics(
        p, y, fields, SimpleNamespace(**{**vars(REPORT), "field_metrics": False})
    )
    assert "field_rce_mean" not in off and "ecce" in off


def test_best_variant_and_field_rce_figure(tmp_path):
    rows = []
    for v, scale in (("base", 1.0), ("a", 0.5), ("b", 0.8)):
        for s in (0.0, 0.25, 0.5):
            for f in ("C1", "C2"):
                rows.append((v, "gaussian", s, f"field_rce:{f}", scale * (0.1 + s), 0.01, 3))
            rows.append((v, "gaussian", s, "field_rce_mean", scale * (0.1 + s), 0.01, 3))
    summary = pd.DataFrame(
        rows, columns=["variant", "shift", "intensity", "metric", "mean", "se", "n"]
    )
    assert best_variant(summary, "base") == "a"
    assert best_variant(summary[summary["variant"] == "base"], "base") is None
    path = plot_field_rce(summary, ["base", "a"], tmp_path / "field_rce.png")
    assert path is not None and path.stat().st_size > 1000
    assert plot_field_rce(summary[summary["metric"] == "ece"], ["base"], tmp_path / "x.png") is None
