"""Raw values -> the prepared encoding a model takes, without torch.

Two routes share :func:`encode_columns`, the per-value answers of the fitted
:class:`~ctrcal.data.features.FeaturePipeline` (a categorical value's id, a numeric value's
model-space value), so a row is encoded exactly as ``ctrcal prepare`` encoded it:

* ``ctrcal predict RUN RAW_FILE``: the file is parsed chunk by chunk by the parser of
  ``prepare`` (:func:`ctrcal.data.parse.iter_chunks`) and each chunk is encoded here;
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
        pipe: a fitted :class:`~ctrcal.data.features.FeaturePipeline`.
        numeric: [Fn, N] float64 raw values; numeric_valid: [Fn, N], 0 = missing.
        categorical: [Fc, N] uint64 keys (as the parsers give them);
            categorical_valid: [Fc, N], 0 = missing.

    Returns:
        ids (reserved ids for missing and unseen values) and model-space numerics (NaN =
        missing), as the prepared parquet holds them.
    """
    from ctrcal.data.features import MISSING_ID

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
    categorical fields (Criteo: 8 hex digits; Criteo_x1: the decimal id; a schema with
    ``categorical_spelling: string``: any text). Columns the model does not read are ignored.
    """

    def __init__(self, directory: str | Path) -> None:
        from ctrcal.data.features import FeaturePipeline

        self.directory = Path(directory)
        self.pipe_ = FeaturePipeline.load(self.directory)
        saved = json.loads((self.directory / FEATURE_MAP_FILE).read_text())
        schema = saved.get("schema")
        if schema is not None:
            self.spelling = schema.get("categorical_spelling", "string")
        else:
            self.spelling = "decimal" if saved.get("layout") == "x1" else "hex"
        # a schema whose time column is also a feature: that field's key is the time value
        feature = (schema or {}).get("time_feature", "none")
        self.time_field = (schema or {}).get("time") if feature != "none" else None
        self.hour_of_day = feature == "hour_of_day"

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
            DataError: a row lacks a column, or a value cannot be read (row and column named).
        """
        nums, cats = self.numeric_fields, self.categorical_fields
        b = len(rows)
        numeric = np.zeros((len(nums), b), dtype=np.float64)
        numeric_valid = np.zeros((len(nums), b), dtype=np.uint8)
        categorical = np.zeros((len(cats), b), dtype=np.uint64)
        categorical_valid = np.zeros((len(cats), b), dtype=np.uint8)
        for i, row in enumerate(rows):
            for j, name in enumerate(nums):
                value = self._value(row, name, i)
                if value is None:
                    continue
                try:
                    x = float(value)
                except ValueError:
                    raise DataError(
                        f"row {i}: column {name}: expected a number, got {value!r}"
                    ) from None
                if not np.isfinite(x):
                    raise DataError(
                        f"row {i}: column {name}: expected a finite number, got {value!r}"
                    )
                numeric[j, i], numeric_valid[j, i] = x, 1
            for j, name in enumerate(cats):
                value = self._value(row, name, i)
                if name == self.time_field:
                    key = (
                        None
                        if value is None
                        else int(value) % 100
                        if self.hour_of_day
                        else int(value)
                    )
                else:
                    key = self._key(value, name, i)
                if key is not None:
                    categorical[j, i], categorical_valid[j, i] = key, 1
        return encode_columns(self.pipe_, numeric, numeric_valid, categorical, categorical_valid)

    def _value(self, row: Mapping[str, Any], name: str, i: int) -> Any:
        if name not in row:
            wanted = ", ".join([*self.numeric_fields, *self.categorical_fields])
            raise DataError(f"row {i}: no column {name!r} (the model reads {wanted})")
        value = row[name]
        # missing as prepare reads an empty field; blanks are a string categorical's value and
        # a malformed number or id, as there
        return None if value is None or (isinstance(value, str) and not value) else value

    def _key(self, value: Any, name: str, i: int) -> int | None:
        """The uint64 key the parsers give ``value`` (None = missing)."""
        if value is None:
            return None
        if self.spelling == "string":
            from ctrcal.data.coder import string_keys

            return int(string_keys([str(value)])[0])
        text = str(value).strip()
        try:
            key = (
                int(text, 16)
                if self.spelling == "hex" and not isinstance(value, int)
                else int(text)
            )
        except ValueError:
            what = "hex digits" if self.spelling == "hex" else "an integer id"
            raise DataError(f"row {i}: column {name}: expected {what}, got {value!r}") from None
        if not 0 <= key < 1 << 32:
            raise DataError(f"row {i}: column {name}: {value!r} is outside 32 bits")
        return key
