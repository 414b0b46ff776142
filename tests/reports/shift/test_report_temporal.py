"""The temporal shift: the same inputs split in time, every variant trained again, reported
beside the clean point of the random split."""

from __future__ import annotations

import json

import pandas as pd
import pytest

pytest.importorskip("ctrcal.train.trainer")

from ctrcal.cli import main  # noqa: E402

TINY = """
data:
  synthetic: {rows: 3000, seed: 0, drift: 2.0}
features: {min_count: 2}
model:
  embedding_dim: 4
  hidden_units: [16]
train:
  epochs: 1
  batch_size: 256
  eval_batch_size: 1024
  progress: false
report:
  seeds: 2
  figures: false
  shifts:
    - {name: categorical_corruption, intensities: [0.4]}
    - {name: temporal}
  variants:
    - {name: layernorm, net_norm: layernorm}
    - {name: mclayernorm, net_norm: {name: mclayernorm, fraction: 0.8}}
    - {name: mclayernorm_mc, mc_samples: 3, from_variant: mclayernorm}
"""


def test_temporal_shift_trains_on_the_past_and_reports_beside_the_others(tmp_path):
    cfg = tmp_path / "t.yaml"
    cfg.write_text(TINY)
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out)]) == 0
    fm = json.loads((out / "data_temporal" / "feature_map.json").read_text())
    assert "time" in json.dumps(fm)  # prepared in time order
    for variant in ("layernorm", "mclayernorm"):
        for k in (0, 1):
            assert (out / "runs_temporal" / variant / f"seed{k}" / "result.json").exists()
    df = pd.read_csv(out / "results.csv")
    auc = df[df.metric == "auc"]
    assert set(auc["shift"]) == {"clean", "categorical_corruption", "temporal"}
    temporal = auc[auc["shift"] == "temporal"]
    assert set(temporal["intensity"]) == {1.0} and len(temporal) == 3 * 2
    clean = auc[auc["shift"] == "clean"].set_index(["variant", "seed"])["value"]
    later = temporal.set_index(["variant", "seed"])["value"]
    assert (later != clean.loc[later.index]).all()  # other models, other rows
    summary = json.loads((out / "summary.json").read_text())
    primary = {(r["shift"], r["metric"]) for r in summary["paired"] if r["primary"]}
    assert ("temporal", "auc") in primary and ("temporal", "ece") in primary
    text = (out / "report.md").read_text()
    assert "## Shift: temporal" in text and "natural" in text
