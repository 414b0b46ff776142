"""The shift report's monitor: drift per point from batches, estimates per evaluation, and the
grid's misses and false alarms from a results table whose truth is set by hand."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch

from ctrcal.core.batch import Batch
from ctrcal.reports.shift.monitoring import ShiftMonitor, monitor_lines, monitor_summary
from ctrcal.reports.shift.stats import CLEAN, summarize


def _batches(rng, n: int, noise: float = 0.0):
    """Three numerics and two categoricals in batches of 1000 rows (as ShiftedBatches)."""
    num = rng.normal(0, 1, (n, 3)).astype(np.float32)
    num += rng.normal(0, noise, (n, 3)).astype(np.float32)
    cat = np.stack([rng.integers(0, 20, n), rng.integers(0, 5, n)], 1).astype(np.int32)
    label = torch.zeros(n)
    batches = [
        Batch(
            torch.from_numpy(cat[i : i + 1000]),
            torch.from_numpy(num[i : i + 1000]),
            label[i : i + 1000],
        )
        for i in range(0, n, 1000)
    ]
    return SimpleNamespace(batches=batches), num


def test_the_monitor_alarms_on_noise_and_records_every_estimator():
    rng = np.random.default_rng(0)
    fmap = SimpleNamespace(numeric_fields=["I1", "I2", "I3"], categorical_fields=["C1", "C2"])
    monitor = ShiftMonitor.of(fmap, valid_rows=10_000, test_rows=6000)
    assert monitor.chunk_rows == 300  # the evaluated split in 20 chunks
    assert ShiftMonitor.of(fmap, valid_rows=2000, test_rows=2000) is None  # too small
    valid, vnum = _batches(rng, 10_000)
    monitor.fit(valid)
    ref_p = 1 / (1 + np.exp(-vnum.sum(1)))
    ref_y = (rng.random(10_000) < ref_p).astype(float)
    for noise, alarmed in ((0.0, False), (2.0, True)):
        test, num = _batches(rng, 6000, noise)
        chunks = monitor.chunks(("test", "x", 0, noise), test)
        assert monitor.chunks(("test", "x", 0, noise), None) is chunks  # once per point
        p = 1 / (1 + np.exp(-num.sum(1)))
        values = monitor.values(chunks, p, (rng.random(6000) < p).astype(float), ref_p, ref_y)
        assert set(values) == {
            "drift_alarm",
            "drift_features",
            "domain_classifier",
            "unseen_rate",
            "auc_est_iw_cbpe",
            "auc_est_doc",
            "auc_est_iw_cbpe_err",
            "auc_est_doc_err",
            "auc_est_chunk_err",
        }
        assert (values["drift_alarm"] > 0.9) == alarmed
        assert (values["drift_alarm"] <= 0.1) == (not alarmed)
        if alarmed:
            assert values["drift_features"] == 3.0  # the three numerics, not the categoricals


def _table() -> pd.DataFrame:
    """Three seeds: at 0.5 every estimator misses by 0.05 but the alarm fires; at 0.1 CBPE is
    off by 0.02 with no alarm while DoC is within 0.005 (no miss); at 0.2 all are off by 0.02
    and no alarm fires (a miss)."""
    rows = []
    points = {
        (CLEAN, 0.0): (0.05, {"cbpe": 0.001, "iw_cbpe": 0.002, "doc": 0.001}),
        ("noise", 0.1): (0.0, {"cbpe": 0.02, "iw_cbpe": 0.02, "doc": 0.004}),
        ("noise", 0.2): (0.1, {"cbpe": 0.02, "iw_cbpe": 0.03, "doc": -0.02}),
        ("noise", 0.5): (1.0, {"cbpe": 0.05, "iw_cbpe": 0.05, "doc": 0.05}),
    }
    keys = {"cbpe": "auc_est_chunk_err", "iw_cbpe": "auc_est_iw_cbpe_err", "doc": "auc_est_doc_err"}
    for k in range(3):
        for (shift, s), (alarm, errors) in points.items():
            values = {"drift_alarm": alarm, "drift_features": 2 * alarm, "domain_classifier": 0.5}
            values.update({keys[e]: v + 0.001 * k for e, v in errors.items()})
            for metric, value in values.items():
                rows.append(
                    {
                        "variant": "ln",
                        "shift": shift,
                        "seed": k,
                        "noise_seed": 0,
                        "intensity": s,
                        "metric": metric,
                        "value": value,
                    }
                )
    return pd.DataFrame(rows)


def test_misses_and_false_alarms_of_the_grid():
    results = _table()
    table = summarize(results)
    summary = monitor_summary(table).set_index(["shift", "intensity"])
    assert summary.loc[("noise", 0.1), "best"] == "doc" and not summary.loc[("noise", 0.1), "miss"]
    assert summary.loc[("noise", 0.2), "miss"]
    assert not summary.loc[("noise", 0.5), "miss"]  # wrong, but the alarm says so
    text = "\n".join(monitor_lines(table, ["ln"], [{"label": "noise", "unit": "std"}]))
    assert "False alarms: 1 of 20 clean chunks" in text
    assert "Misses: 1 of 3 shifted points" in text and "ln noise @ 0.2" in text
    assert monitor_lines(table[table["metric"] != "drift_alarm"], ["ln"], []) == []
    # at 0.5 every estimator is off by the same 0.05 (+0.001 per seed): CBPE is closest
    text = "\n".join(monitor_lines(table, ["ln"], [{"label": "noise"}], results))
    assert "Closest estimator at noise @ 0.5" in text and "**cbpe** is closest" in text


def test_report_monitor_false_scores_no_monitor():
    from ctrcal.reports.shift.grid import EvalGrid

    def grid(monitor_on: bool):
        return SimpleNamespace(
            valid=SimpleNamespace(labels=np.zeros(50_000)),
            test=SimpleNamespace(labels=np.zeros(50_000)),
            natural=None,
            monitor=None,
            cfg=SimpleNamespace(report=SimpleNamespace(monitor=monitor_on)),
            feature_map=SimpleNamespace(numeric_fields=["I1"], categorical_fields=["C1"]),
            batches=lambda point: (_ for _ in ()).throw(AssertionError("fitted a monitor")),
        )

    off = grid(False)
    assert EvalGrid.monitor_reference(off, [], None, 0, None) is None
    assert off.monitor is None  # nothing fitted, nothing read
    on = grid(True)
    try:
        EvalGrid.monitor_reference(on, [], None, 0, None)
    except AssertionError as reached:  # on: it goes on to fit the monitor on validation
        assert "fitted a monitor" in str(reached)
    else:
        raise AssertionError("report.monitor: true skipped the monitor")
