"""Field-RCE / Field-ECE / PCOC per value against hand computations and a per-value loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ctrcal import metrics as M


def _loop_reference(p, y, v, min_count):
    """Field-RCE and Field-ECE by an explicit loop over values (the slow, obvious way)."""
    n = len(p)
    groups = {}
    rare = []
    for val in np.unique(v):
        rows = v == val
        (groups.__setitem__(val, rows) if rows.sum() >= min_count else rare.append(rows))
    if rare:
        groups["pooled"] = np.any(rare, axis=0)
    rce = ece = 0.0
    for rows in groups.values():
        d = (y[rows] - p[rows]).sum()
        if y[rows].sum() > 0:
            rce += rows.sum() * abs(d) / y[rows].sum()
        ece += abs(d)
    return rce / n, ece / n


def test_hand_computed_two_values():
    # value 0: p = .2,.2, y = 1,0 -> D = 0.6, Y = 1; value 1: p = .5,.5, y = 0,0 -> D = -1, Y = 0
    p = np.array([0.2, 0.2, 0.5, 0.5])
    y = np.array([1.0, 0.0, 0.0, 0.0])
    v = np.array([0, 0, 1, 1])
    # RCE: only value 0 has a click: (1/4)·2·0.6/1 = 0.3; ECE: (0.6 + 1.0)/4 = 0.4
    assert M.field_rce(p, y, v, min_count=1) == pytest.approx(0.3)
    assert M.field_ece(p, y, v, min_count=1) == pytest.approx(0.4)


def test_calibrated_per_value_is_zero_even_when_values_differ():
    v = np.repeat([0, 1, 2], 4)
    y = np.array([1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0], dtype=float)
    p = np.repeat([0.25, 0.5, 0.75], 4)
    assert M.field_rce(p, y, v, min_count=1) == pytest.approx(0.0, abs=1e-12)
    assert M.field_ece(p, y, v, min_count=1) == pytest.approx(0.0, abs=1e-12)
    # a global constant is calibrated on average but not per value
    flat = np.full(12, y.mean())
    assert M.pcoc(flat, y) == pytest.approx(1.0)
    assert M.field_ece(flat, y, v, min_count=1) > 0.15


@pytest.mark.parametrize("min_count", [1, 30, 200])
def test_matches_loop_reference_with_pooling(min_count):
    rng = np.random.default_rng(min_count)
    n = 5000
    v = (rng.zipf(1.6, n) % 300).astype(np.int64)
    p = rng.beta(1, 12, n)
    y = (rng.random(n) < np.clip(p * (1 + (v % 3 == 0)), 0, 1)).astype(float)
    rce, ece = _loop_reference(p, y, v, min_count)
    got = M.field_calibration(p, y, {"v": v}, min_count=min_count).fields["v"]
    assert got.rce == pytest.approx(rce, rel=1e-10)
    assert got.ece == pytest.approx(ece, rel=1e-10)
    counts = np.bincount(v)
    assert got.n_values == int((counts >= min_count).sum())
    assert got.pooled_rows == int(counts[(counts > 0) & (counts < min_count)].sum())


def test_pcoc_per_top_value_and_order():
    v = np.array([5] * 6 + [9] * 4 + [2] * 4 + [7] * 1)
    p = np.array([0.5] * 6 + [0.25] * 4 + [0.1] * 4 + [0.9])
    y = np.array([1, 1, 0, 0, 0, 0] + [1, 0, 0, 0] + [0] * 4 + [1], dtype=float)
    s = M.field_calibration(p, y, {"v": v}, min_count=1, top_k=3).fields["v"]
    # most frequent first; the tie 9 vs 2 (4 rows each) goes to the smaller code
    assert s.top_values.tolist() == [5, 2, 9]
    assert s.top_counts.tolist() == [6, 4, 4]
    assert s.top_pcoc[0] == pytest.approx(3.0 / 2.0)
    assert np.isnan(s.top_pcoc[1])  # no click
    assert s.top_pcoc[2] == pytest.approx(1.0)


def test_many_fields_summary_names_the_worst_and_torch_matches_numpy():
    rng = np.random.default_rng(0)
    n = 4000
    fields = rng.integers(0, 20, size=(n, 3)).astype(np.int32)
    p = rng.beta(2, 10, n)
    # field 1 carries a miscalibration the model ignores
    y = (rng.random(n) < np.clip(p * np.where(fields[:, 1] < 10, 0.5, 1.5), 0, 1)).astype(float)
    fc = M.field_calibration(p, y, fields, names=["a", "b", "c"], min_count=20)
    s = fc.summary()
    assert s["field_rce_worst"] == "b" and s["field_ece_worst"] == "b"
    assert s["field_rce_max"] == fc.fields["b"].rce
    assert s["field_rce_mean"] == pytest.approx(np.mean([f.rce for f in fc.fields.values()]))
    ft = M.field_calibration(
        torch.from_numpy(p).float(),
        torch.from_numpy(y),
        torch.from_numpy(fields),
        names=["a", "b", "c"],
        min_count=20,
    )
    assert ft.fields["b"].rce == pytest.approx(fc.fields["b"].rce, rel=1e-5)


def test_large_or_negative_codes_go_through_unique():
    rng = np.random.default_rng(1)
    v = rng.integers(0, 6, 1000)
    p = rng.random(1000) * 0.3
    y = (rng.random(1000) < p).astype(float)
    big = (v * 10**12 - 7).astype(np.int64)
    assert M.field_rce(p, y, big, min_count=5) == pytest.approx(
        M.field_rce(p, y, v, min_count=5), rel=1e-12
    )


def test_bucketize_equal_mass_and_nan_bucket():
    x = np.concatenate([np.arange(100, dtype=float), [np.nan, np.inf]])
    b = M.bucketize(x, n_buckets=4)
    assert np.bincount(b[:100]).tolist() == [25, 25, 25, 25]
    assert b[100] == b[101] == 4
    assert M.bucketize(np.array([1.0, 1.0, 2.0, 2.0]), 10).max() == 1  # few distinct values


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"probs": [0.1, np.nan, 0.3]}, "probs contains NaN"),
        ({"probs": [0.1, np.inf, 0.3]}, "probs contains NaN or infinite"),
        ({"probs": [0.1, 1.2, 0.3]}, r"probs must lie in \[0, 1\]"),
        ({"labels": [0, 2, 1]}, "labels must be 0 or 1"),
        ({"fields": {"C1": [1, 2]}}, r"fields\['C1'\]: expected 3 values"),
        ({"fields": {"C1": [4, 4, 4]}}, r"fields\['C1'\]: a single value"),
        ({"fields": {"C1": [0.5, 1.5, 2.5]}}, r"fields\['C1'\]: expected integer codes"),
        ({"probs": [], "labels": [], "fields": {"C1": []}}, "probs is empty"),
        ({"min_count": 0}, "min_count"),
    ],
)
def test_bad_input_names_the_argument(kwargs, match):
    args = {"probs": [0.1, 0.2, 0.3], "labels": [0, 1, 0], "fields": {"C1": [1, 2, 1]}}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        M.field_calibration(**args)
    if "min_count" not in kwargs:
        with pytest.raises(ValueError, match=match):
            M.multicalibration_error(**args)


def test_bad_field_matrix_and_names():
    p, y = np.array([0.1, 0.2, 0.3]), np.array([0.0, 1.0, 0.0])
    with pytest.raises(ValueError, match=r"fields\['a'\]: expected 3 values"):
        M.field_calibration(p, y, np.zeros((2, 2), dtype=int) + [[0, 1]], names=["a", "b"])
    with pytest.raises(ValueError, match="names: 1 names for 2 fields"):
        M.field_calibration(p, y, np.array([[0, 1], [1, 0], [0, 0]]), names=["a"])
