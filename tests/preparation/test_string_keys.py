"""String categoricals are keyed by XXH64 (seed 0) of their UTF-8 bytes: the published values
of xxHash's 64-bit function, whatever path a string takes through the coder."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from ctrcal.preparation.coder import STRING_HASH, string_keys

# XXH64 with seed 0: the reference values of xxHash (its specification and sanity test, the
# empty input), of python-xxhash's README and of Go's cespare/xxhash tests. Together they pass
# through every branch: under 4 bytes, the 4- and 8-byte tails, one and more 32-byte stripes.
VECTORS = {
    "": 0xEF46DB3751D8E999,
    "a": 0xD24EC4F1A98C6E5B,
    "as": 0x1C330FB2D66BE179,
    "asd": 0x631C37CE72A97393,
    "abc": 0x44BC2CF5AD770999,
    "asdf": 0x415872F599CEA71E,
    "xxhash": 0x32DD38952C4BC720,
    "Call me Ishmael.": 0x6D04390FC9D61A90,
    "abcdefghijklmnopqrstuvwxyz": 0xCFE1F278FA89835C,
    "0123456789abcdef0123456789abcdef": 0x642A94958E71E6C5,
    "Nobody inspects the spammish repetition": 0xFBCEA83C8A378BF1,
    "Call me Ishmael. Some years ago--never mind how long precisely-": 0x02A2E85470D6FD96,
}


def test_the_name_recorded_is_the_function():
    assert STRING_HASH == "xxh64"


def test_keys_are_the_published_xxh64_values():
    keys = string_keys(list(VECTORS))
    assert keys.dtype == np.uint64
    assert [int(k) for k in keys] == list(VECTORS.values())


@pytest.mark.parametrize(
    "layout", ["chunked", "sliced", "arrow string", "arrow large_string", "arrow string_view"]
)
def test_any_layout_of_the_same_texts_gets_the_same_keys(layout):
    texts = [*VECTORS, None] * 3  # a null: key 0, read through each validity bitmap
    want = [*VECTORS.values(), 0] * 3
    if layout == "chunked":  # several Arrow chunks, strings inline and in data buffers
        series = pl.concat([pl.Series(texts[:5]), pl.Series(texts[5:])], rechunk=False)
        assert series.n_chunks() == 2
    elif layout == "sliced":  # a view that starts inside its buffers
        series = pl.Series(["pad", "padding past twelve bytes", *texts]).slice(2)
    else:  # Arrow's three string layouts, in chunks that start inside their buffers
        import pyarrow as pa

        kind = getattr(pa, layout.split()[1])()
        whole = pa.array(["pad", *texts], type=kind)
        series = pa.chunked_array([whole.slice(1, 6), whole.slice(7)], type=kind)
    assert [int(k) for k in string_keys(series)] == want


def test_values_that_are_not_strings_are_refused():
    with pytest.raises(ValueError, match="not all strings"):
        string_keys(pl.Series([1, 2]))


def test_a_missing_value_is_key_0():
    keys = string_keys(["caf\u00e9", None, "caf\u00e9", ""])
    assert keys[1] == 0 and keys[0] == keys[2] != 0
    assert keys[3] == VECTORS[""]  # empty text is a value, not missing
