"""`ctrcal evaluate` loads what scoring a run needs (torch, pyarrow, numpy) and nothing more."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ctrcal.config import load_config
from ctrcal.train.trainer import train

ROOT = Path(__file__).resolve().parents[2]
# what preparing data, reports and figures use; scoring a run uses none of it
NOT_NEEDED = {"polars", "pandas", "sklearn", "scipy", "matplotlib"}


def test_evaluate_imports_no_preparation_or_report_stack(prepared_dir, tmp_path):
    cfg = load_config(None, ["model.embedding_dim=4", "model.hidden_units=[8]",
                             "model.net_norm=mclayernorm", "train.epochs=1",
                             "train.batch_size=4096", "train.progress=false"])  # fmt: skip
    run = tmp_path / "run"
    train(cfg, prepared_dir, run)
    code = (
        "import sys\nfrom ctrcal.cli import main\n"
        f"assert main(['evaluate', {str(run)!r}, '--split', 'valid', '--mc-samples', '2']) == 0\n"
        f"loaded = {sorted(NOT_NEEDED)!r}\n"
        "loaded = [m for m in loaded if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "assert 'torch' in sys.modules  # it did evaluate\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "AUC" in res.stdout and "MC average of 2" in res.stdout
