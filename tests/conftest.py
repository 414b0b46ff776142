"""Shared fixtures: tiny generated Criteo files in every layout, a prepared directory and
the session's tiny shift report.

* ``criteo_frame``: 1,000 synthetic rows (dac columns as strings/ints) and their true probs.
* ``criteo_files``: that frame written once per layout (``dac``, ``dac_gz``, ``dac_test``,
  ``kaggle_csv``, ``x4``, ``x1``, ``torchrec``) -> ``{name: Path}``.
* ``prepared_dir``: a ~20k-row synthetic dataset prepared once per session -> its directory
  (``feature_map.json``, ``train/``, ``valid/``, ``test/``). Treat it as read-only.
* ``criteo_samples``: the shared directory of real Criteo sample rows (skips if absent).
* ``shift_report``: the tiny shift report of ``tests/shift_report.py`` (every variant kind),
  run once per session -> ``(config_path, out_dir)``. Treat it as read-only. Its tests are
  marked ``slow``.
"""

from __future__ import annotations

import os

# The Triton kernels are tested on CPU tensors through Triton's interpreter, which must be
# chosen before triton is imported (kernels are wrapped when their module loads). Only those
# kernels run differently; set TRITON_INTERPRET=0 to keep triton compiled.
os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from ctrcal.data.synthetic import generate_frame, write_criteo  # noqa: E402

SAMPLES = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "criteo_samples"
LAYOUT_FILES = {
    "dac": ("dac", "train.txt"),
    "dac_gz": ("dac", "day_0.gz"),
    "dac_test": ("dac_test", "test.txt"),
    "kaggle_csv": ("kaggle_csv", "train.csv"),
    "x4": ("x4", "x4_train.csv"),
    "x1": ("x1", "x1_train.csv"),
    "torchrec": ("torchrec", "torchrec.csv"),
}
PREPARED_ROWS = 20_000


@pytest.fixture(scope="session")
def criteo_frame():
    """(frame, true_prob): 1,000 synthetic rows with dac columns, seed 0."""
    return generate_frame(1_000, seed=0)


@pytest.fixture(scope="session")
def criteo_files(criteo_frame, tmp_path_factory) -> dict[str, Path]:
    """The same 1,000 rows written in every supported layout: ``{name: path}``."""
    root = tmp_path_factory.mktemp("criteo_layouts")
    frame, _ = criteo_frame
    return {
        name: write_criteo(frame, root / filename, layout)
        for name, (layout, filename) in LAYOUT_FILES.items()
    }


@pytest.fixture(scope="session")
def prepared_dir(tmp_path_factory) -> Path:
    """A prepared synthetic dataset (~20k rows, seed 0, min_count 5), made once per session."""
    from ctrcal.api import prepare
    from ctrcal.config import Config

    cfg = Config()
    cfg.data.synthetic.rows = PREPARED_ROWS
    cfg.data.synthetic.seed = 0
    cfg.features.min_count = 5
    return prepare(None, tmp_path_factory.mktemp("prepared") / "data", cfg).out_dir


@pytest.fixture(scope="session")
def criteo_samples() -> Path:
    """The shared real Criteo sample files (see SOURCES.md there); skip when absent."""
    if not SAMPLES.is_dir():
        pytest.skip(f"real Criteo samples not found at {SAMPLES}")
    return SAMPLES.resolve()


def pytest_collection_modifyitems(config, items):
    """Mark every test of the session's shift report ``slow`` (the first one trains it), so
    that ``make test-fast`` (``-m "not slow"``) never waits for it."""
    for item in items:
        if "shift_report" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def shift_report(tmp_path_factory):
    """The tiny shift report of ``tests/shift_report.py``, run once per session through the
    CLI -> ``(config_path, out_dir)``. Read-only: a test that reruns or edits it works on a copy.
    """
    from shift_report import CONFIG

    from ctrcal.cli import main

    root = tmp_path_factory.mktemp("shift_report")
    cfg = root / "tiny.yaml"
    cfg.write_text(CONFIG)
    out = root / "out"
    assert main(["run", str(cfg), "--out", str(out)]) == 0
    return cfg, out
