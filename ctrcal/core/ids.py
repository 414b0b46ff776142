"""The id layout of every categorical field, the one fact the pipeline writes and the layers read.

    0 = PAD_ID        padding, never produced by the data (free for sequence models)
    1 = MISSING_ID    the value was missing
    2 = OOV_ID        seen fewer than ``features.min_count`` times in train, or never seen
    3 ... = kept values, by train frequency (NUM_RESERVED is the first)

:mod:`ctrcal.preparation.features` writes ids in this layout, :mod:`ctrcal.data.feature_map`
records vocabulary sizes that include the reserved ids, and layers that treat reserved ids
apart (:mod:`ctrcal.layers.context`) read it here, below both.
"""

from __future__ import annotations

__all__ = ["MISSING_ID", "NUM_RESERVED", "OOV_ID", "PAD_ID"]

PAD_ID = 0
MISSING_ID = 1
OOV_ID = 2
NUM_RESERVED = 3
