"""The temporal shift: the same inputs split in time, every variant trained again, reported
beside the clean point of the random split (the session's ``shift_report``)."""

from __future__ import annotations

import json

import pandas as pd
from shift_report import SEEDS, TRAINED, VARIANTS


def test_temporal_shift_trains_on_the_past_and_reports_beside_the_others(shift_report):
    _, out = shift_report
    fm = json.loads((out / "data_temporal" / "feature_map.json").read_text())
    assert "time" in json.dumps(fm)  # prepared in time order
    for variant in TRAINED:
        for k in range(SEEDS):
            assert (out / "runs_temporal" / variant / f"seed{k}" / "result.json").exists()
    df = pd.read_csv(out / "results.csv")
    auc = df[df.metric == "auc"]
    assert set(auc["shift"]) == {"clean", "gaussian_numeric", "categorical_corruption", "temporal"}
    temporal = auc[auc["shift"] == "temporal"]
    assert set(temporal["intensity"]) == {1.0} and len(temporal) == len(VARIANTS) * SEEDS
    clean = auc[auc["shift"] == "clean"].set_index(["variant", "seed"])["value"]
    later = temporal.set_index(["variant", "seed"])["value"]
    assert (later != clean.loc[later.index]).all()  # other models, other rows
    summary = json.loads((out / "summary.json").read_text())
    primary = {(r["shift"], r["metric"]) for r in summary["paired"] if r["primary"]}
    assert ("temporal", "auc") in primary and ("temporal", "ece") in primary
    text = (out / "report.md").read_text()
    assert "## Shift: temporal" in text and "natural" in text
