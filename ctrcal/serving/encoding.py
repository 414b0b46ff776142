"""Raw values -> the prepared encoding a model takes, without torch.

Two routes share :func:`encode_columns`, the per-value answers of the fitted
:class:`~ctrcal.preparation.features.FeaturePipeline` (a categorical value's id, a numeric value's
model-space value), so a row is encoded exactly as ``ctrcal prepare`` encoded it:

* ``ctrcal predict RUN RAW_FILE``: the file is parsed chunk by chunk by the parser of
  ``prepare`` (:func:`ctrcal.preparation.parse.iter_chunks`) and each chunk is encoded here;
* a server: :class:`RawRowEncoder` reads what ``ctrcal export`` writes beside the model
  (``feature_map.json``, ``vocab.parquet``) and encodes rows given as ``{column: value}``
  dicts. It needs numpy, pyarrow and polars, never torch.

Example (a server, with the ONNX file of ``ctrcal export``)::

    import onnxruntime as ort
    from ctrcal.serving.encoding import RawRowEncoder

    enc = RawRowEncoder("served/")                    # the folder ctrcal export wrote into
    cat, num = enc.encode([{"I1": "3", "C1": "68fd1e64", ...}])
    sess = ort.InferenceSession("served/model.onnx")
    p = sess.run(None, {"categorical": cat, "numeric": num})[0]   # [B] click probabilities
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ctrcal.core.errors import DataError
from ctrcal.data.feature_map import FEATURE_MAP_FILE

__all__ = ["RawRowEncoder", "encode_columns"]


def encode_columns(
    pipe: Any,
    numeric: np.ndarray,
    numeric_valid: np.ndarray,
    categorical: np.ndarray,
    categorical_valid: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Typed raw columns -> ``(categorical int64 [N, Fc], numeric float32 [N, Fn])``.

    Args:
        pipe: a fitted :class:`~ctrcal.preparation.features.FeaturePipeline`.
        numeric: [Fn, N] float64 raw values; numeric_valid: [Fn, N], 0 = missing.
        categorical: [Fc, N] uint64 keys (as the parsers give them);
            categorical_valid: [Fc, N], 0 = missing.

    Returns:
        ids (reserved ids for missing and unseen values) and model-space numerics (NaN =
        missing), as the prepared parquet holds them.
    """
    from ctrcal.core.ids import MISSING_ID

    n = numeric.shape[1] if numeric.ndim == 2 and numeric.shape[0] else categorical.shape[1]
    num = np.empty((n, len(pipe.numeric_fields)), dtype=np.float32)
    for j in range(len(pipe.numeric_fields)):
        raw = np.where(numeric_valid[j] != 0, numeric[j], np.nan)
        num[:, j] = pipe._model_values(raw, j)
    cat = np.empty((n, len(pipe.categorical_fields)), dtype=np.int64)
    for j, name in enumerate(pipe.categorical_fields):
        # the whole key, as prepare's vocabulary holds it: 32-bit hashes and ids, 64-bit string
        # keys (a vocabulary of 32-bit values answers a wider key as absent)
        ids = pipe.categorical_ids(name, categorical[j])
        ids[categorical_valid[j] == 0] = MISSING_ID
        cat[:, j] = ids
    return cat, num


class RawRowEncoder:
    """Encode raw rows with an exported (or prepared) directory's feature map and vocabulary.

    Args:
        directory: a folder holding ``feature_map.json`` and ``vocab.parquet`` (what
            ``ctrcal export`` writes beside the model, or a prepared data directory).

    A row is a mapping from column name to its raw value as the input file spells it: a
    number or its text for numeric fields (``""`` or ``None`` = missing), the text for
    categorical fields (Criteo: 8 hex digits, or an integer as its value; Criteo_x1: the
    decimal id; a schema with ``categorical_spelling: string``: any text). Columns the model
    does not read are ignored. The rows are checked by ``prepare``'s own row checks
    (:func:`ctrcal.preparation.parse.row_check`, the rows as one chunk): a row ``prepare`` would
    refuse is refused here, with the same words.
    """

    def __init__(self, directory: str | Path) -> None:
        from ctrcal.preparation.features import FeaturePipeline

        self.directory = Path(directory)
        self.pipe_ = FeaturePipeline.load(self.directory)
        saved = json.loads((self.directory / FEATURE_MAP_FILE).read_text())
        self.check_ = _row_check(saved, self.directory / FEATURE_MAP_FILE)

    @property
    def categorical_fields(self) -> list[str]:
        return list(self.pipe_.categorical_fields)

    @property
    def numeric_fields(self) -> list[str]:
        return list(self.pipe_.numeric_fields)

    def encode(self, rows: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        """``rows`` -> ``(categorical int64 [B, Fc], numeric float32 [B, Fn])``, the inputs
        of an exported model.

        Raises:
            DataError: a row that is not a mapping, lacks a column, or has a value ``prepare``
                would refuse (row, column and value named, rows counted from 0).
        """
        import polars as pl

        if isinstance(rows, Mapping):
            raise DataError(
                f"{_ROWS}: expected a list of rows, got one row (a mapping); pass [row]"
            )
        columns = self.check_.columns
        text: dict[str, list[str | None]] = {c.name: [] for c in columns}
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise DataError(
                    f"{_ROWS}: row {i}: expected a mapping of column to value, got {_short(row)}"
                )
            for c in columns:
                text[c.name].append(self._text(row, c.name, c.kind, i))
        raw = pl.DataFrame(text, schema={c.name: pl.Utf8 for c in columns})
        chunk = self.check_.chunk(raw, 0)
        return encode_columns(
            self.pipe_,
            chunk.numeric,
            chunk.numeric_valid,
            chunk.categorical,
            chunk.categorical_valid,
        )

    def _text(self, row: Mapping[str, Any], name: str, kind: str, i: int) -> str | None:
        """A value as a file's reader gives it to the row checks: text, or None where missing
        (``None``, or empty as an empty field is); an integer given for a hex field is its
        value, as a parquet column's."""
        if name not in row:
            wanted = ", ".join(c.name for c in self.check_.columns)
            raise DataError(f"{_ROWS}: row {i}: no column {name!r} (the model reads {wanted})")
        value = row[name]
        if value is None or (isinstance(value, str) and not value):
            return None
        if kind == "hex" and isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return f"{int(value):x}"
        return value if isinstance(value, str) else str(value)


_ROWS = "rows"
"""What the encoder's messages call the rows it was given."""


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _row_check(saved: dict[str, Any], source: Path) -> Any:
    """``prepare``'s row checks for the data a feature map describes, on the columns the model
    reads: without the label, and without a time column that is not a feature."""
    from dataclasses import replace

    from ctrcal.core.criteo_schema import FEATURE_COLUMNS
    from ctrcal.data.schema import schema_from_mapping
    from ctrcal.preparation import parse
    from ctrcal.preparation.criteo import CriteoFormat
    from ctrcal.preparation.schema_reader import SchemaFormat

    if saved.get("schema") is not None:
        schema = schema_from_mapping(saved["schema"], str(source))
        fmt: Any = SchemaFormat(schema, False, schema.needed, labelled=False)
    else:
        fmt = CriteoFormat(saved.get("layout") or "dac", "\t", False, FEATURE_COLUMNS, False)
    check = parse.row_check(Path(_ROWS), fmt, "error")
    kept = tuple(c for c in check.columns if c.kind != "time" or c.feature != "none")
    return replace(
        check, columns=kept, fields=None, header_lines=0, unit="row", first_number=0, skip=None
    )
