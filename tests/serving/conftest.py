"""A tiny finished run trained on raw Criteo files prepared with explicit splits, so its
test split can be scored both prepared and raw (``raw_run``)."""

from __future__ import annotations

from pathlib import Path

import pytest

RAW_ROWS = {"train": 6000, "valid": 1500, "test": 1500}


@pytest.fixture(scope="session")
def raw_run(tmp_path_factory) -> dict[str, Path]:
    """``{"run": RUN, "data": PREPARED, "train"/"valid"/"test": raw dac files}``: a one-epoch
    serial MaskNet with MC-LayerNorm."""
    from ctrcal.api import prepare
    from ctrcal.config import Config
    from ctrcal.preparation.synthetic import generate_frame, write_criteo
    from ctrcal.train.trainer import train
    from ctrcal.validate import load_config

    root = tmp_path_factory.mktemp("raw_run")
    frame, _ = generate_frame(sum(RAW_ROWS.values()), seed=1)
    files, start = {}, 0
    for name, rows in RAW_ROWS.items():
        files[name] = write_criteo(frame[start : start + rows], root / f"{name}.txt", "dac")
        start += rows
    cfg = Config()
    cfg.features.min_count = 2
    data = prepare({k: [v] for k, v in files.items()}, root / "data", cfg).out_dir
    run_cfg = load_config(
        None,
        [
            "model.embedding_dim=4",
            "model.hidden_units=[16]",
            "model.net_norm=mclayernorm",
            "train.epochs=1",
            "train.batch_size=2048",
            "train.progress=false",
            "train.num_threads=1",
        ],
    )
    train(run_cfg, data, root / "run")
    return {"run": root / "run", "data": data, **files}
