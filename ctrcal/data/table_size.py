"""How big a model's embedding tables are, from the feature map and the config alone (nothing
is built), and the limit they are held to.

The categorical fields share one float32 table of ``sum(vocab_sizes)`` rows (plus, with
``numeric_embedding: bucket``, each numeric field's buckets and its missing bucket) of
``model.embedding_dim`` columns. ``prepare`` prints its size; ``validate --data`` and ``train``
refuse a table above ``train.max_embedding_gib`` (default: a quarter of this machine's memory,
since training holds the table's gradient and the optimizer's two moments beside it) before
anything is allocated (:func:`ctrcal.train.table_limit.check_table_size`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

BYTES_PER_VALUE = 4  # float32 weights
MEMORY_FRACTION = 0.25
"""The default limit's share of the machine's memory."""

__all__ = [
    "BYTES_PER_VALUE",
    "MEMORY_FRACTION",
    "embedding_bytes",
    "embedding_rows",
    "machine_memory_bytes",
]


def embedding_rows(
    vocab_sizes: Sequence[int], bucket_boundaries: Sequence[Sequence[float]] | None = None
) -> int:
    """Rows of the fused table: every categorical id, and with ``bucket_boundaries`` (bucket
    mode) each numeric field's ``len(b) + 1`` buckets and its missing bucket."""
    rows = sum(int(v) for v in vocab_sizes)
    return rows + sum(len(b) + 2 for b in bucket_boundaries or ())


def embedding_bytes(rows: int, dim: int) -> int:
    """Bytes of a float32 table of ``rows`` x ``dim``."""
    return int(rows) * int(dim) * BYTES_PER_VALUE


def machine_memory_bytes() -> int | None:
    """This machine's physical memory, or None where the system does not say."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return None
