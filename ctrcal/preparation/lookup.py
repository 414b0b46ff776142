"""Vectorised integer -> id lookup: the hash table behind the categorical encoding, in numpy.

Encoding a split maps every categorical value to its vocabulary id: one hash probe per value,
13M probes for 500k Criteo rows. :class:`ValueIndex` is an open-addressing table (linear
probing, a quarter to half full) built once per field from the kept values. A lookup runs whole
probe rounds as numpy array operations (hash, gather, compare) over the values still
unresolved, so there is no Python loop over values; values are inserted most frequent first,
so nearly every lookup resolves in the first round. About four times faster than
``polars.Expr.replace_strict`` on Criteo-like columns (uint32 hashes, Zipf-distributed).

Slots come from Fibonacci hashing (multiply by 2^w/phi modulo 2^w, keep the top bits), which
spreads hashes and consecutive ids alike. Values of unsigned dtypes up to 32 bits (Criteo's
hashes) are keyed as uint32; any other integer dtype as uint64 (two's complement for
negatives, so -1 and 2^64 - 1 share a key: both are never in one vocabulary of a typed
column).
"""

from __future__ import annotations

import numpy as np

_EMPTY = np.int32(-1)
_MIN_BITS = 10
_SPARSE_UP_TO = 1 << 18
_GOLDEN = {
    np.dtype(np.uint32): np.uint32(0x9E3779B1),
    np.dtype(np.uint64): np.uint64(0x9E3779B97F4A7C15),
}


def _key_dtype(dtype: np.dtype) -> np.dtype:
    if dtype.kind not in "iu":
        raise TypeError(f"ValueIndex keys must be integers, got {dtype}")
    narrow = dtype.kind == "u" and dtype.itemsize <= 4
    return np.dtype(np.uint32) if narrow else np.dtype(np.uint64)


class ValueIndex:
    """Maps a fixed set of distinct integer values to int32 ids.

    Args:
        values: [K] distinct integers (any integer dtype), most frequent first for the fastest
            lookups (any order gives the same ids).
        ids: [K] the id of each value (non-negative int32).

    Example::

        index = ValueIndex(np.array([7, 5, 3]), np.array([3, 4, 5]))
        index.lookup(np.array([5, 8, 7]), default=2)  # -> [4, 2, 3]
    """

    def __init__(self, values: np.ndarray, ids: np.ndarray) -> None:
        values = np.asarray(values)
        ids = np.asarray(ids, dtype=np.int32)
        if values.ndim != 1 or values.shape != ids.shape:
            raise ValueError(f"values {values.shape} and ids {ids.shape}: expected equal 1-d")
        if ids.size and ids.min() < 0:
            raise ValueError("ValueIndex ids must be non-negative")
        self.dtype = _key_dtype(values.dtype)
        keys = values.astype(self.dtype, copy=False)
        # at most 1/4 full (1/2 for large vocabularies, whose tables would outgrow the caches);
        # small tables cost nothing and keep a few hot values from sharing a slot
        spare = 4 if len(keys) <= _SPARSE_UP_TO else 2
        self.bits = max(_MIN_BITS, int(spare * len(keys) - 1).bit_length())
        self.mask = (1 << self.bits) - 1
        # an empty slot holds a key that is in no slot, so that a lookup needs one comparison
        # per value to tell a hit from anything else (a value in [0, K] is always free)
        # (the smallest such value, by a mask: np.setdiff1d would sort, and import numpy.ma)
        taken = np.zeros(len(keys) + 1, dtype=bool)
        taken[keys[keys <= len(keys)].astype(np.intp)] = True
        free_key = self.dtype.type(np.flatnonzero(~taken)[0])
        self.keys = np.full(1 << self.bits, free_key, dtype=self.dtype)
        self.ids = np.full(1 << self.bits, _EMPTY, dtype=np.int32)
        # insert a probe round at a time: of the values that aim at one free slot the first
        # in ``values`` wins (the last write of the reversed order), the others probe on with
        # those that met an occupied slot. Give the most frequent values first, as a
        # vocabulary ordered by count does: they then sit where a lookup looks first.
        owner = np.full(1 << self.bits, -1, dtype=np.intp)
        pending = np.arange(len(keys))[::-1]
        slot = self._slot(keys[pending])
        while pending.size:
            free = owner[slot] == -1
            owner[slot[free]] = pending[free]
            won = owner[slot] == pending
            self.keys[slot[won]] = keys[pending[won]]
            self.ids[slot[won]] = ids[pending[won]]
            pending, slot = pending[~won], (slot[~won] + 1) & self.mask

    def _slot(self, keys: np.ndarray) -> np.ndarray:
        width = 8 * self.dtype.itemsize
        shift = self.dtype.type(width - self.bits)
        slot = np.multiply(keys, _GOLDEN[self.dtype])
        slot >>= shift
        # 64-bit slots below 2^bits are valid intp as they are: no conversion pass
        return slot.view(np.intp) if slot.itemsize == np.dtype(np.intp).itemsize else slot

    def lookup(
        self, values: np.ndarray, default: int, skip: np.ndarray | None = None
    ) -> np.ndarray:
        """[N] int32 ids of ``values`` ([N] integers); ``default`` where a value is absent.

        ``skip`` ([N] bool, optional) marks placeholders (e.g. missing values) whose result
        does not matter: they are not probed beyond their first slot."""
        values = np.asarray(values)
        if self.dtype == np.uint32 and _key_dtype(values.dtype) != np.uint32:
            # wider queries against 32-bit keys: only values in [0, 2^32) can be present
            inside = (values >= 0) & (values <= np.iinfo(np.uint32).max)
            if skip is not None:
                inside &= ~skip
            out = np.full(values.shape, default, dtype=np.int32)
            out[inside] = self.lookup(values[inside].astype(np.uint32), default)
            return out
        keys = values.astype(self.dtype, copy=False)
        with np.errstate(over="ignore"):
            slot = self._slot(keys)
        # First round over every value: a hit is an equal key (an empty slot's key is in no
        # slot, so it never equals a stored value; a value equal to it is absent anyway).
        # Empty slots answer ``default`` straight away.
        out = np.where(self.ids == _EMPTY, np.int32(default), self.ids).take(slot)
        miss = np.flatnonzero(self.keys.take(slot) != keys)
        if skip is not None and miss.size:
            miss = miss[~skip[miss]]
        # a miss on an occupied slot probes on; a miss on an empty slot is an absent value
        miss = miss[self.ids.take(slot[miss]) != _EMPTY]
        out[miss] = default
        rows, keys, slot = miss, keys[miss], slot[miss]
        while rows.size:
            slot = (slot + 1) & self.mask
            found = self.ids.take(slot)
            occupied = found != _EMPTY
            hit = (self.keys.take(slot) == keys) & occupied
            out[rows[hit]] = found[hit]
            more = occupied & ~hit
            rows, keys, slot = rows[more], keys[more], slot[more]
        return out

    def __len__(self) -> int:
        return int((self.ids != _EMPTY).sum())
