"""Byte chunks of whole lines of a (possibly gzipped) text file: the pipeline's unit of work.

:func:`iter_text_chunks` reads a file into one reused buffer, about ``chunk_bytes`` at a time,
and hands out each chunk up to its last newline; the partial line after it starts the next
chunk. Parsing the chunks one after the other gives the records of parsing the file at once,
a small file is one chunk, and a gzip file is decompressed as it is read (nothing is written
to disk). Reusing the buffer spares the kernel a fresh mapping (and its page faults) per
chunk: a chunk is valid until the next one is asked for.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ctrcal.core.errors import DataError

BOM = b"\xef\xbb\xbf"
"""The UTF-8 byte order mark that Excel and many exporters write before a CSV's text."""


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def _last_newline(view: np.ndarray) -> int:
    """Index of the last ``\\n`` in ``view`` ([N] uint8), -1 if none (searched from the end)."""
    end = len(view)
    step = 1 << 16
    while end > 0:
        start = max(0, end - step)
        hits = np.flatnonzero(view[start:end] == 10)
        if len(hits):
            return start + int(hits[-1])
        end = start
        step *= 4
    return -1


def iter_text_chunks(
    path: str | Path, chunk_bytes: int, skip_lines: int = 0
) -> Iterator[memoryview]:
    """Whole lines of a text file, about ``chunk_bytes`` bytes at a time (see the module
    docstring). The first ``skip_lines`` lines (a header) are skipped, and so is a UTF-8 byte
    order mark at the start of a file without a header. The last chunk may end without a
    newline; a line longer than ``chunk_bytes`` makes a longer chunk.

    Yields:
        memoryview of the chunk's bytes (valid until the next chunk is asked for).

    Raises:
        DataError: unreadable file, corrupt or truncated gzip.
    """
    path = Path(path)
    try:
        fh = gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")  # noqa: SIM115
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        with fh:
            for _ in range(skip_lines):
                fh.readline()
            buf = bytearray(max(64, chunk_bytes))  # room for a byte order mark
            size = 0  # bytes in buf: a partial line carried over, then what was read
            first = skip_lines == 0
            while True:
                while size < len(buf):
                    got = fh.readinto(memoryview(buf)[size:])
                    if not got:
                        break
                    size += got
                end = size < len(buf)
                if first:
                    first = False
                    if bytes(buf[:3]) == BOM:
                        buf[: size - 3] = buf[3:size]
                        size -= 3
                if end:
                    if size:
                        yield memoryview(buf)[:size]
                    return
                cut = _last_newline(np.frombuffer(buf, np.uint8, size)) + 1
                if cut == 0:  # a line longer than the buffer: grow it
                    bigger = bytearray(2 * len(buf))
                    bigger[:size] = buf
                    buf = bigger
                    continue
                yield memoryview(buf)[:cut]
                buf[: size - cut] = buf[cut:size]
                size -= cut
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise DataError(f"{path}: corrupt or truncated gzip file ({exc})") from None


__all__ = ["BOM", "is_gzip", "iter_text_chunks"]
