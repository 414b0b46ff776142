"""Arrow columns -> numpy without pyarrow's pandas-backed conversion."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from ctrcal.core.errors import DataError
from ctrcal.data.loader import copy_column


def test_copy_column_matches_to_numpy_with_nulls_offsets_and_chunks():
    rng = np.random.default_rng(0)
    values = rng.normal(size=300).astype(np.float32)
    mask = rng.random(300) < 0.2
    floats = pa.array(values, mask=mask, type=pa.float32())
    # several chunks, one of them a slice starting inside a validity byte
    column = pa.chunked_array([floats.slice(3, 100), floats.slice(150, 77), floats[:5]])
    dst = np.full((len(column), 3), -1.0, dtype=np.float32)
    copy_column(column, dst[:, 1])  # a strided view, as the loader writes it
    expected = column.to_numpy(zero_copy_only=False)
    np.testing.assert_array_equal(dst[:, 1], expected)  # NaN where null
    assert np.isnan(dst[:, 1]).sum() == column.null_count > 0
    assert (dst[:, [0, 2]] == -1).all()

    ints = pa.chunked_array(
        [
            pa.array(np.arange(10, dtype=np.int32)).slice(2, 5),
            pa.array(np.arange(4, dtype=np.int32)),
        ]
    )
    out = np.empty(9, dtype=np.int32)
    copy_column(ints, out)
    assert out.tolist() == [2, 3, 4, 5, 6, 0, 1, 2, 3]


def test_copy_column_refuses_missing_values_in_an_integer_column():
    column = pa.chunked_array([pa.array([1, None, 3], type=pa.int32())])
    with pytest.raises(DataError, match="missing values"):
        copy_column(column, np.empty(3, dtype=np.int32))
