"""The Criteo schema as plain constants: column names, field counts, layout names, and the
rule on a configured layout.

Every fact about the Criteo columns is named here once. This module imports nothing but
ctrcal's errors, so a config check, a model, a training run or a test can name Criteo's
columns and check a layout without loading the data stack (polars);
:mod:`ctrcal.preparation.criteo` reads the files and re-exports these names.
"""

from __future__ import annotations

from ctrcal.core.errors import DataError

__all__ = [
    "CATEGORICAL_COLUMNS",
    "COLUMNS",
    "FEATURE_COLUMNS",
    "LABEL",
    "LAYOUTS",
    "NUMERIC_COLUMNS",
    "NUM_CATEGORICAL",
    "NUM_NUMERIC",
    "check_layout",
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

_READ_AS = {("dac", "dac_test")}
"""(configured, found): the dac layout reads a file of its columns without the label."""
_LOOK_ALIKE = {("x4", "x1"), ("x1", "x4")}
"""(configured, found) layouts a file's first lines cannot tell apart for certain (Criteo_x1 is
guessed from its values): a configured layout overrules the guess."""


def check_layout(configured: str, found: str, where: str, guessed: bool = True) -> None:
    """The one rule on ``data.layout``: ``auto``, or the layout the data has (or one that
    reads it). Asked of each raw file by
    :func:`~ctrcal.preparation.criteo.detect_format` (``found``: what its first
    lines look like, ``guessed``) and, at train time, of each source of the prepared data
    (``found``: the layout it was read as, exact), so that a run is trained only on data its
    config reads again when it scores raw files.

    Raises:
        DataError: ``WHERE: configured layout 'x1' but the file looks like 'dac'``.
    """
    if configured in ("auto", found) or (configured, found) in _READ_AS:
        return
    if guessed and (configured, found) in _LOOK_ALIKE:
        return
    seen = "looks like" if guessed else "was read as"
    raise DataError(f"{where}: configured layout {configured!r} but the file {seen} {found!r}")
