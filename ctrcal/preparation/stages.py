"""How preparing data keeps the cores busy: the chunk size, the threads, a stage run ahead.

Preparing is parse -> code -> (fit) -> encode -> write. Parsing a chunk (reading its text, the
C reader) and coding the one before it (the column coders) run side by side: :func:`ahead`
runs the parser one chunk ahead of the coder in a thread of its own, through a bounded queue,
so memory stays a few chunks whatever the file's size. Both stages spend their time in C
(the reader, the coders, numpy), which releases the GIL, so two threads use two cores. The
fit needs every chunk's values, so encoding starts after the last chunk is coded; it fits the
fields side by side, then encodes each part's block while the parts before it are written
(:func:`ctrcal.preparation.encode.encode_sources`).

:func:`chunk_bytes_for` picks the chunk size from the input's size and the threads: a small
file is cut into enough chunks to overlap the stages, a big one into chunks of
:data:`~ctrcal.preparation.parse.CHUNK_BYTES`. Neither the chunk size nor the number of threads
changes the output bytes (tested): codes are given in record order, whatever thread parsed
the record.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

from ctrcal.preparation.parse import CHUNK_BYTES

T = TypeVar("T")

MIN_CHUNK_BYTES = 4 << 20
"""Smallest automatic chunk (~17k Criteo rows): below it each chunk's fixed costs show."""
CHUNKS_PER_THREAD = 4
"""Chunks per thread of a file the automatic size cuts finer than :data:`CHUNK_BYTES`."""
AHEAD = 1
"""Chunks the parser may have finished before the coder takes them (the queue's bound)."""


def chunk_bytes_for(total_bytes: int, threads: int) -> int:
    """The automatic chunk size of ``total_bytes`` of input on ``threads`` threads: about
    :data:`CHUNKS_PER_THREAD` chunks per thread, within ``[MIN_CHUNK_BYTES, CHUNK_BYTES]``."""
    share = total_bytes // max(1, CHUNKS_PER_THREAD * threads)
    return int(min(CHUNK_BYTES, max(MIN_CHUNK_BYTES, share)))


class _Failed:
    """An exception raised by the producer, carried to the consumer."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_DONE = object()


def ahead(items: Iterator[T], depth: int = AHEAD) -> Iterator[T]:
    """``items`` as they are, produced by a thread of their own up to ``depth`` items ahead.

    The producer's exception is raised here, where the consumer asks for the item it failed
    on. A consumer that stops early (an error of its own, a break) stops the producer before
    its next item, and waits for it: nothing runs on after the generator is closed. An item
    the producer makes may reuse the memory of the item ``depth + 2`` places before it
    (one being consumed, ``depth`` queued, one being made).
    """
    out: queue.Queue = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            put(_Failed(exc))
            return
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()
        put(_DONE)

    worker = threading.Thread(target=produce, name="ctrcal-parse", daemon=True)
    worker.start()
    try:
        while True:
            item = out.get()
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.exc
            yield item
    finally:
        stop.set()
        worker.join()


__all__ = ["AHEAD", "CHUNKS_PER_THREAD", "MIN_CHUNK_BYTES", "ahead", "chunk_bytes_for"]
