"""Input checks shared by the metric modules: one place that says what a valid input is.

``probs`` are click probabilities in [0, 1], ``labels`` clicks in {0, 1}, both 1-D of one
length n; ``fields`` are integer codes of categorical fields, one column of n codes per
field. Numpy arrays and torch tensors (any device, moved to the host) are accepted; a bad
input raises ``ValueError`` naming the argument (``probs``, ``labels``, ``fields['C3']``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = ["CheckedFields", "as_numpy", "check_fields", "check_probs_labels", "dense_codes"]


class CheckedFields(NamedTuple):
    """Validated fields: names, contiguous integer columns and each column's (min, max).

    Passing one back to :func:`check_fields` (e.g. to several metrics of the same rows) skips
    the checks and the copy.
    """

    names: list[str]
    columns: list[np.ndarray]
    ranges: list[tuple[int, int]]


def as_numpy(x: Any, name: str, ndim: int = 1) -> np.ndarray:
    """``x`` as a numpy array with ``ndim`` dimensions (a [n, 1] column counts as 1-D)."""
    if hasattr(x, "detach"):  # a torch tensor, on any device
        x = x.detach().to("cpu")
        if x.dtype.is_floating_point and x.element_size() == 2:
            x = x.float()  # bf16 has no numpy twin; widening is exact
        x = x.numpy()
    arr = np.asarray(x)
    if ndim == 1 and arr.ndim == 2 and arr.shape[1] == 1:  # a [n, 1] column
        arr = arr[:, 0]
    if arr.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array, got shape {arr.shape}")
    return arr


def check_probs_labels(probs: Any, labels: Any, unit: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Validated (probs, labels) as 1-D numpy arrays; probs keep their float dtype.

    ``unit=False`` accepts any finite scores (for AUC) instead of probabilities in [0, 1].
    Labels come back as float64.
    """
    p = as_numpy(probs, "probs")
    y = as_numpy(labels, "labels")
    if p.shape != y.shape:
        raise ValueError(f"probs and labels differ in length: {p.shape[0]} vs {y.shape[0]}")
    if p.size == 0:
        raise ValueError("probs is empty (no rows to evaluate)")
    if not np.issubdtype(p.dtype, np.floating):
        p = p.astype(np.float64)
    if not np.isfinite(p).all():
        raise ValueError("probs contains NaN or infinite values")
    if unit and (p.min() < 0.0 or p.max() > 1.0):
        raise ValueError(
            f"probs must lie in [0, 1] (got min {p.min():.4g}, max {p.max():.4g}); "
            "pass sigmoid(logits)"
        )
    y = y.astype(np.float64, copy=False)
    if not ((y == 0.0) | (y == 1.0)).all():
        bad = y[(y != 0.0) & (y != 1.0)][0]
        raise ValueError(f"labels must be 0 or 1 (found {bad!r})")
    return p, y


def check_fields(fields: Any, n: int, names: Sequence[str] | None = None) -> CheckedFields:
    """Split ``fields`` into named, contiguous 1-D integer columns of length ``n``.

    Args:
        fields: a [n, F] array or tensor of integer codes (one column per field), a [n]
            array (one field), a mapping ``name -> [n] codes`` or a sequence of [n] arrays.
        n: the number of rows (``len(probs)``).
        names: field names for an array or sequence (default ``field0``, ``field1``, ...);
            a mapping brings its own.

    Returns:
        :class:`CheckedFields` ``(names, columns, ranges)``; ``ranges[j]`` is (min, max) of
        column j.

    Raises:
        ValueError: naming ``fields[...]`` for a wrong length, non-integer codes, a field
            with a single value, or ``names`` of the wrong length.
    """
    if isinstance(fields, CheckedFields):
        if fields.columns and fields.columns[0].shape[0] != n:
            raise ValueError(
                f"fields: expected {n} values per field, got {fields.columns[0].shape[0]}"
            )
        return fields
    if isinstance(fields, Mapping):
        if names is not None:
            raise ValueError("names: leave it out when fields is a mapping (its keys name them)")
        keys = [str(k) for k in fields]
        cols = [as_numpy(v, f"fields[{k!r}]") for k, v in zip(keys, fields.values(), strict=True)]
    elif isinstance(fields, (list, tuple)):
        cols = [as_numpy(v, f"fields[{i}]") for i, v in enumerate(fields)]
        keys = None
    else:
        arr = (
            as_numpy(fields, "fields", ndim=2) if _ndim(fields) == 2 else as_numpy(fields, "fields")
        )
        if arr.ndim == 1:
            cols = [arr]
        elif arr.flags.f_contiguous:  # column-major: every field is already contiguous
            cols = list(arr.T)
        else:
            # one transposing copy makes every field contiguous; reading strided columns
            # one at a time would read the whole matrix once per field
            cols = list(np.ascontiguousarray(arr.T))
        keys = None
    if keys is None:
        if names is None:
            keys = [f"field{j}" for j in range(len(cols))]
        else:
            keys = [str(k) for k in names]
            if len(keys) != len(cols):
                raise ValueError(f"names: {len(keys)} names for {len(cols)} fields")
    if not cols:
        raise ValueError("fields: no fields given")
    if len(set(keys)) != len(keys):
        raise ValueError(f"names: field names must be unique, got {keys}")
    ranges: list[tuple[int, int]] = []
    for key, col in zip(keys, cols, strict=True):
        where = f"fields[{key!r}]"
        if col.shape[0] != n:
            raise ValueError(
                f"{where}: expected {n} values (one per row of probs), got {col.shape[0]}"
            )
        if not (np.issubdtype(col.dtype, np.integer) or col.dtype == np.bool_):
            raise ValueError(
                f"{where}: expected integer codes, got dtype {col.dtype}; bucketise numeric "
                "columns first (ctrcal.metrics.bucketize)"
            )
        lo, hi = int(col.min()), int(col.max())
        if lo == hi:
            raise ValueError(
                f"{where}: a single value ({lo}) in all {n} rows; a field needs at "
                "least two values to say anything beyond the global calibration"
            )
        ranges.append((lo, hi))
    return CheckedFields(keys, cols, ranges)


def _ndim(x: Any) -> int:
    shape = getattr(x, "shape", None)
    return len(shape) if shape is not None else np.ndim(x)


def dense_codes(
    col: np.ndarray, lo: int | None = None, hi: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Codes ``0..V-1`` for the values of ``col`` and the value of each code.

    Small non-negative integers (the usual vocabulary ids) are used as they are: O(n), no
    sort; codes of values that do not occur are simply empty. Anything else goes through
    ``np.unique`` (O(n log n)).

    Args:
        col: [n] integer codes.
        lo, hi: ``col.min()``, ``col.max()`` when already known.

    Returns:
        ``(codes [n] intp, values [V])``.
    """
    n = col.shape[0]
    if col.dtype == np.bool_:
        col = col.astype(np.intp)
    if lo is None or hi is None:
        lo, hi = int(col.min()), int(col.max())
    if lo >= 0 and hi < max(4 * n, 1 << 16):
        return col.astype(np.intp, copy=False), np.arange(hi + 1)
    values, codes = np.unique(col, return_inverse=True)
    return codes.reshape(-1).astype(np.intp, copy=False), values
