"""`ctrcal train --data` and `ctrcal evaluate` load what training and scoring need (torch,
pyarrow, numpy) and not the preparation or report stack, nor torch's compiler (which torch's
optimizers import, see ctrcal.train.step): the training side's smoke test of
tests/test_import_graph.py's static checks, which cannot see an import made by name at run
time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# what preparing data, reports and figures use; training and scoring a run use none of it
NOT_NEEDED = ("polars", "pandas", "sklearn", "scipy", "matplotlib", "torch._dynamo")


@pytest.mark.slow
def test_train_and_evaluate_import_no_preparation_or_report_stack(prepared_dir, tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(
        "model: {embedding_dim: 4, hidden_units: [8], net_norm: mclayernorm, "
        "emb_norm: mclayernorm}\n"
        "train: {epochs: 1, batch_size: 4096, progress: false}\n"
    )
    run = tmp_path / "run"
    train = ["train", str(config), "--data", str(prepared_dir), "--out", str(run)]
    evaluate = ["evaluate", str(run), "--split", "valid", "--mc-samples", "2"]
    code = (
        "import sys\nfrom ctrcal.cli import main\n"
        f"assert main({train!r}) == 0\n"
        f"assert main({evaluate!r}) == 0\n"
        f"loaded = [m for m in {NOT_NEEDED!r} if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "MC average of 2" in res.stdout and "AUC" in res.stdout
