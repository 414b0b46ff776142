"""Criteo schema constants, layout detection and readers (-> polars LazyFrame).

Every fact about the Criteo layout is named here once; other modules and tests import it.
"""

from __future__ import annotations

NUM_NUMERIC = 13
NUM_CATEGORICAL = 26
LABEL = "label"
NUMERIC_COLUMNS: tuple[str, ...] = tuple(f"I{i}" for i in range(1, NUM_NUMERIC + 1))
CATEGORICAL_COLUMNS: tuple[str, ...] = tuple(f"C{i}" for i in range(1, NUM_CATEGORICAL + 1))
FEATURE_COLUMNS: tuple[str, ...] = NUMERIC_COLUMNS + CATEGORICAL_COLUMNS
COLUMNS: tuple[str, ...] = (LABEL, *FEATURE_COLUMNS)
