"""The Criteo schema as plain constants: column names, field counts, layout names.

Every fact about the Criteo columns is named here once. This module imports nothing, so a
config check, a model or a test can name Criteo's columns without loading the data stack
(polars); :mod:`ctrcal.preparation.criteo` reads the files and re-exports these names.
"""

from __future__ import annotations

__all__ = [
    "CATEGORICAL_COLUMNS",
    "COLUMNS",
    "FEATURE_COLUMNS",
    "LABEL",
    "LAYOUTS",
    "NUMERIC_COLUMNS",
    "NUM_CATEGORICAL",
    "NUM_NUMERIC",
]

NUM_NUMERIC = 13
NUM_CATEGORICAL = 26
LABEL = "label"
NUMERIC_COLUMNS: tuple[str, ...] = tuple(f"I{i}" for i in range(1, NUM_NUMERIC + 1))
CATEGORICAL_COLUMNS: tuple[str, ...] = tuple(f"C{i}" for i in range(1, NUM_CATEGORICAL + 1))
FEATURE_COLUMNS: tuple[str, ...] = NUMERIC_COLUMNS + CATEGORICAL_COLUMNS
COLUMNS: tuple[str, ...] = (LABEL, *FEATURE_COLUMNS)

LAYOUTS: tuple[str, ...] = ("dac", "dac_test", "kaggle_csv", "x4", "x1", "torchrec")
"""Layout names accepted by :func:`ctrcal.preparation.criteo.detect_format` (plus ``auto``)."""
