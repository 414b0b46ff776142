"""Criteo's 8-hex-digit categoricals as integer keys, without parsing the text.

polars stores a string of at most 12 bytes inline in its 16-byte view. :func:`key_expr`
reinterprets the 8 bytes of every 8-byte value as one little-endian ``uint64`` key (null for
a missing value and for any value of another length), inside polars and a column per
thread, so counting and looking up the values happens on integers. Two 8-byte strings have
equal keys exactly when they are equal.

The key is not the value the feature map stores: that is the hash read base 16 (``uint32``,
what :func:`polars.Expr.str.to_integer` gives). :func:`hex8_to_u32` turns keys into those
values and says which keys are hex at all and which are in Criteo's lowercase form (the only
form whose key is the key of its value); :func:`u32_to_hex8` is its inverse. Only the
distinct keys of a column, or a few rows, need converting. Both work on all 8 bytes of a key
at once (SWAR: SIMD within a register) with numpy ``uint64`` arithmetic.

Byte ``i`` of a key (``i = 0`` the lowest) is character ``i`` of the string.
"""

from __future__ import annotations

import numpy as np
import polars as pl

KEY_BYTES = 8

_U = np.uint64
_LOW_NIBBLES = _U(0x0F0F0F0F0F0F0F0F)
_ONES = _U(0x0101010101010101)
_HIGH_BITS = _U(0x8080808080808080)


def key_expr(name: str) -> pl.Expr:
    """``uint64`` key of each 8-byte value of string column ``name`` (null for a missing value
    or a value of another byte length), named ``name``."""
    binary = pl.col(name).cast(pl.Binary)
    return binary.bin.reinterpret(dtype=pl.UInt64, endianness="little").alias(name)


def hex8_to_u32(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Keys of 8-character strings read as base-16 numbers.

    Args:
        keys: [K] uint64 keys of 8-byte values (see :func:`key_expr`).

    Returns:
        ``(values, valid, canonical)``: [K] uint32 values; [K] bool, True where all 8
        characters are hex digits (either case; elsewhere the value is meaningless); [K]
        bool, True where they are lowercase hex digits, Criteo's form (the form
        :func:`u32_to_hex8` writes, so that a canonical key is the key of its value).
    """
    x = np.asarray(keys, dtype=np.uint64)
    with np.errstate(over="ignore"):
        # per byte: a digit 0x30-0x39, a letter 0x41-0x46 or 0x61-0x66; adding (0x80 - bound)
        # to a 7-bit byte sets its top bit exactly when the byte is >= bound (no carry out)
        seven = x & ~_HIGH_BITS

        def at_least(bound: int) -> np.ndarray:
            return seven + _ONES * _U(0x80 - bound)

        digit = at_least(0x30) & ~at_least(0x3A)
        upper = at_least(0x41) & ~at_least(0x47)
        lower = at_least(0x61) & ~at_least(0x67)
        ascii_ = ~x & _HIGH_BITS
        valid = ((digit | upper | lower) & ascii_) == _HIGH_BITS
        canonical = ((digit | lower) & ascii_) == _HIGH_BITS
        # the nibble of a digit is its low 4 bits, of a letter its low 4 bits + 9
        letter = (upper | lower) & _HIGH_BITS
        nib = (x & _LOW_NIBBLES) + (letter >> _U(7)) * _U(9)
    # character 0 is the most significant nibble: pair bytes, then 16-bit, then 32-bit lanes
    lanes16, lanes32 = _U(0x000F000F000F000F), _U(0x000000FF000000FF)
    pairs = ((nib & lanes16) << _U(4)) | ((nib >> _U(8)) & lanes16)
    quads = ((pairs & lanes32) << _U(8)) | ((pairs >> _U(16)) & lanes32)
    values = ((quads & _U(0xFFFF)) << _U(16)) | ((quads >> _U(32)) & _U(0xFFFF))
    return values.astype(np.uint32), valid, canonical


def u32_to_hex8(values: np.ndarray) -> np.ndarray:
    """[K] uint32 -> [K] uint64 keys of their 8-digit lowercase hex strings (zero-padded
    left, as Criteo writes them); the inverse of :func:`hex8_to_u32`."""
    v = np.asarray(values, dtype=np.uint64)
    out = np.zeros(v.shape, dtype=np.uint64)
    for i in range(KEY_BYTES):
        nib = (v >> _U(4 * (KEY_BYTES - 1 - i))) & _U(0xF)
        char = nib + _U(0x30) + (nib > _U(9)).astype(np.uint64) * _U(0x61 - 0x3A)
        out |= char << _U(8 * i)
    return out


__all__ = ["KEY_BYTES", "hex8_to_u32", "key_expr", "u32_to_hex8"]
