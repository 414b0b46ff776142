"""A shift report with MLflow: one parent run holding the report's tables and figures, one
child run per variant and seed, read back with MLflow's own client."""

from __future__ import annotations

import pytest

from ctrcal.cli import main

TINY = """
data:
  synthetic: {rows: 3000, seed: 0}
features: {min_count: 2}
model: {embedding_dim: 4, hidden_units: [16]}
train:
  epochs: 1
  batch_size: 512
  eval_batch_size: 2048
  progress: false
  num_threads: 1
  loggers: [mlflow]
  experiment: tiny_report
report:
  seeds: 2
  figures: true
  shifts:
    - {name: gaussian_numeric, intensities: [0.5]}
  variants:
    - {name: layernorm, net_norm: layernorm}
    - {name: mclayernorm, net_norm: mclayernorm}
"""


@pytest.mark.slow
def test_report_is_a_parent_run_with_a_child_per_variant_and_seed(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY)
    out = tmp_path / "report"
    assert main(["run", str(cfg), "--out", str(out)]) == 0
    client = MlflowClient((out / "mlruns").resolve().as_uri())
    exp = client.get_experiment_by_name("tiny_report")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0].info.run_id
    children = sorted(
        r.info.run_name for r in runs if r.data.tags.get("mlflow.parentRunId") == parent
    )
    assert children == [
        "layernorm/seed0",
        "layernorm/seed1",
        "mclayernorm/seed0",
        "mclayernorm/seed1",
    ]
    artifacts = {a.path for a in client.list_artifacts(parent)}
    assert {"report.md", "results.csv", "summary.json"} <= artifacts
    assert any(a.endswith(".png") for a in artifacts)
