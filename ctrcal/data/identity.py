"""What identifies prepared data: what its ids and numbers mean, and which rows it holds.

A model trained on one prepared directory reads its ids through that directory's
vocabularies: id 17 of field C3 is one hashed value there and another one elsewhere, even when
both vocabularies have the same size. Two identities say when data may meet a run:

* :func:`feature_identity`: a hash of the feature map's content, i.e. the schema (fields,
  kinds, dtypes, label, id layout), the transforms (pipeline settings, per-field centres,
  scales, statistics and bucket boundaries) and every vocabulary (each value and its id,
  from ``vocab.parquet``). Equal feature identities mean a model reads both directories the
  same way: what ``evaluate --data`` and fine-tuning ask.
* :func:`data_identity`: the feature identity plus the sources' hash and the splits' sizes:
  the same rows, as a resumed or reused run needs.

A run records both in its ``data.json`` when it starts (:mod:`ctrcal.train.runs` compares them), so
a run directory needs no copy of the vocabularies. Reading needs pyarrow only (no polars).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from ctrcal.core.errors import DataError
from ctrcal.data.feature_map import FEATURE_MAP_FILE

__all__ = ["IDENTITY_VERSION", "data_identity", "feature_identity", "short"]

IDENTITY_VERSION = 1
VOCAB_FILE = "vocab.parquet"  # written by FeaturePipeline.save beside the feature map
# feature-map keys that say where the rows came from and how many there are, not what the
# ids and numbers mean; every other key is part of the feature identity
PROVENANCE_KEYS = frozenset(
    {
        "source_hash",
        "layout",
        "sources",
        "split",
        "splits",
        "bad_rows_skipped",
        "synthetic",
        "oracle",
        "complete",
    }
)
_cache: dict[tuple[Any, ...], str] = {}


def short(identity: str | None) -> str:
    """The first 12 hex digits of an identity, for messages (``"none recorded"`` for None)."""
    return identity[:12] if identity else "none recorded"


def _read_feature_map(directory: Path) -> dict[str, Any]:
    path = directory / FEATURE_MAP_FILE
    try:
        fm = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{path}: no feature map; not a prepared data directory") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable feature map: {exc}") from None
    if not isinstance(fm, dict):
        raise DataError(f"{path}: unreadable feature map (not a JSON object)")
    return fm


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def feature_identity(directory: str | Path) -> str:
    """SHA-256 (hex) of a prepared directory's feature map and vocabularies (module doc).

    Cached per directory while neither file changes, so a report asking once per run reads
    the vocabularies once.

    Raises:
        DataError: no readable feature map or vocabulary there.
    """
    directory = Path(directory)
    fm_path, vocab_path = directory / FEATURE_MAP_FILE, directory / VOCAB_FILE
    key = (str(directory.resolve()), _stamp(fm_path), _stamp(vocab_path))
    if key in _cache:
        return _cache[key]
    fm = _read_feature_map(directory)
    h = hashlib.sha256(f"ctrcal feature identity v{IDENTITY_VERSION}\n".encode())
    body = {k: v for k, v in fm.items() if k not in PROVENANCE_KEYS}
    h.update(json.dumps(body, sort_keys=True, default=str).encode())
    if any(f.get("kind") == "categorical" for f in fm.get("features", [])):
        _hash_vocabulary(vocab_path, h)  # without categorical fields there is none to read
    _cache[key] = h.hexdigest()
    return _cache[key]


def data_identity(directory: str | Path) -> str:
    """SHA-256 (hex) of :func:`feature_identity` plus the sources' hash and the splits' sizes.

    Raises:
        DataError: no readable feature map or vocabulary there.
    """
    directory = Path(directory)
    fm = _read_feature_map(directory)
    rows = {"source_hash": fm.get("source_hash"), "splits": fm.get("splits")}
    text = feature_identity(directory) + json.dumps(rows, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _hash_vocabulary(path: Path, h: Any) -> None:
    """Feed every (field, value, id) of ``vocab.parquet`` into ``h`` in a canonical form:
    the column's type, then its values' bytes (strings as lengths + concatenated UTF-8), so
    equal contents hash equally whatever the file's row groups or writer."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        # ParquetFile, not read_table: that one imports pandas, which scoring never needs
        table = pq.ParquetFile(path).read(columns=["field", "value", "id"])
    except FileNotFoundError:
        raise DataError(f"{path}: missing; the prepared directory is incomplete") from None
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise DataError(f"{path}: unreadable vocabulary: {exc}") from None
    for name in ("field", "value", "id"):
        col = table.column(name).combine_chunks()
        h.update(f"\n{name}:{col.type}:{len(col)}:{col.null_count}\n".encode())
        valid = None
        if col.null_count:
            valid = _values(pc.is_valid(col).cast(pa.uint8())).astype(bool)
            h.update(valid.tobytes())
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            text = col.cast(pa.large_string())
            h.update(_values(pc.binary_length(text).cast(pa.int64()), valid).tobytes())
            offsets = np.frombuffer(text.buffers()[1], dtype=np.int64)[
                text.offset : text.offset + len(text) + 1
            ]
            data = text.buffers()[2]
            if data is not None and len(text):
                h.update(memoryview(data)[int(offsets[0]) : int(offsets[-1])])
        else:
            h.update(_values(col, valid).tobytes())


def _values(col: Any, valid: np.ndarray | None = None) -> np.ndarray:
    """A fixed-width arrow array's values as NumPy, nulls (``valid`` False) as 0.

    Read from the buffer because pyarrow's ``to_numpy`` and scalars import pandas, which
    scoring never needs.
    """
    dtype = np.dtype(str(col.type))  # int32, uint32, int64, float64, ...: NumPy's names
    out = np.frombuffer(col.buffers()[1], dtype=dtype)[col.offset : col.offset + len(col)]
    if valid is not None:
        out = np.where(valid, out, np.zeros((), dtype))
    return out
