"""The streaming pipeline: sources -> coded blocks -> fit -> encode in place -> parts.

:func:`encode_sources` is the one route from raw files to encoded splits, whatever their size
(a small file is one chunk):

1. each source is parsed chunk by chunk (:func:`ctrcal.preparation.parse.iter_chunks`: the C reader
   first, polars for a chunk it refuses), each row is given its split
   (:class:`~ctrcal.preparation.splits.SplitPlan`), and every column of the chunk is coded by its
   :class:`~ctrcal.preparation.coder.ColumnCoder` (the columns shared among the threads), which
   keeps the distinct values and their train counts across chunks; the chunk's rows, grouped by
   split, are appended to their split's blocks (:class:`_Blocks`: one per part to be written,
   in memory, then on disk);
2. the :class:`~ctrcal.preparation.features.FeaturePipeline` is fitted on the distinct values and
   their exact train counts (:class:`~ctrcal.preparation.fit_stats.FitStats`: any chunking gives the
   same state, bit for bit), the fields side by side;
3. each column's answer per distinct value (its id, its model value) is computed once, and
   every block is encoded in place by one gather per column
   (:class:`~ctrcal.preparation.coder.Answers`) and written as its split's next part
   (:func:`~ctrcal.preparation.write.write_part`), parts side by side.

Memory is a few chunks, the blocks up to :data:`MEMORY_BYTES` and the coders (which grow with
the number of distinct values, not rows); the output does not depend on the chunk size.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ctrcal.core.errors import DataError
from ctrcal.core.ids import MISSING_ID
from ctrcal.preparation import parse, stages, write
from ctrcal.preparation.coder import Answers, ColumnCoder
from ctrcal.preparation.features import FeaturePipeline
from ctrcal.preparation.fit_stats import FitStats
from ctrcal.preparation.parsed import ParsedChunk
from ctrcal.preparation.splits import SPLITS, SplitPlan

MEMORY_BYTES = 1 << 30
"""Blocks of coded rows are kept in memory up to this many bytes (about 6.5M Criteo rows),
later ones wait on disk: writing a block out and reading it back costs more than the fresh
memory it would take, so the budget is large, and the peak stays flat beyond it."""
CODE_DTYPES = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.int32))
"""The widths a column's codes wait on disk in, the narrowest that holds the block's largest
code: most of Criteo's columns have fewer than 65,536 distinct values, and on this kind of
machine writing a page to disk costs more than narrowing it (a block of generated rows takes
about half the bytes)."""
FIRST_BLOCK_ROWS = 8_192
"""Rows of a split's first block before it grows (doubling) to a part's rows: a small split
never holds a part's worth of memory."""


@dataclass
class Source:
    """One input file and what is known about it."""

    path: Path  # as given
    split: int | None  # None: split by the plan
    fmt: Any = None  # CriteoFormat, or SchemaFormat for data described by a schema
    prob: Path | None = None  # true probabilities of generated data


class Clock:
    """Seconds per phase (reported by the benchmark)."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def __call__(self, name: str) -> None:
        """Seconds since the last lap are phase ``name``'s."""
        now = time.perf_counter()
        self.laps[name] = round(now - self._last, 3)
        self._last = now


@dataclass
class Tally:
    """What reading the sources found."""

    rows: list[int] = field(default_factory=lambda: [0, 0, 0])
    label_sum: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    labelled: list[int] = field(default_factory=lambda: [0, 0, 0])
    bad: int = 0
    with_prob: bool = False
    chunks: int = 0
    native_chunks: int = 0  # parsed by the C reader

    def add(self, split: np.ndarray, sizes: list[int], label: np.ndarray) -> None:
        """Count a chunk's rows: their splits [N], the splits' sizes, their labels [N]."""
        unknown = np.isnan(label)
        if unknown.any():
            labelled = np.bincount(split[~unknown], minlength=len(SPLITS)).tolist()
            label = np.where(unknown, 0.0, label)
        else:
            labelled = sizes
        sums = np.bincount(split, weights=label, minlength=len(SPLITS)).tolist()
        for k in range(len(SPLITS)):
            self.rows[k] += sizes[k]
            self.label_sum[k] += sums[k]  # exact: sums of 0/1 below 2^53
            self.labelled[k] += labelled[k]

    def merge(self, other: Tally) -> Tally:
        """Add what reading other sources found (the counts add, exactly); returns ``self``."""
        for k in range(len(SPLITS)):
            self.rows[k] += other.rows[k]
            self.label_sum[k] += other.label_sum[k]
            self.labelled[k] += other.labelled[k]
        self.bad += other.bad
        self.with_prob = self.with_prob and other.with_prob
        self.chunks += other.chunks
        self.native_chunks += other.native_chunks
        return self

    def rate(self, k: int) -> float:
        return self.label_sum[k] / self.labelled[k] if self.labelled[k] else float("nan")


def check_rows(tally: Tally, sources: list[Source]) -> None:
    if sum(tally.rows) + tally.bad == 0:
        names = ", ".join(str(s.path) for s in sources)
        raise DataError(f"{names}: no rows")
    if tally.rows[0] == 0:
        raise DataError("the train split is empty (all rows malformed, or data.split gives 0)")


class ProbReader:
    """The true probabilities of a generated file, handed out in record order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows = pl.scan_parquet(path).select(pl.len()).collect().item()
        self._offset = 0

    def take(self, n: int) -> np.ndarray | None:
        """The next ``n`` probabilities (float32), or None when the file has fewer left."""
        if self._offset + n > self.rows:
            return None
        prob = pl.col("prob").cast(pl.Float32).fill_null(float("nan"))
        out = pl.scan_parquet(self.path).select(prob).slice(self._offset, n).collect()
        self._offset += n
        return out.to_series().to_numpy()


@dataclass(frozen=True)
class _Waiting:
    """A full block waiting on disk: its rows one after the other, each in its dtype (the
    label and true probabilities float32, each column's codes in one of
    :data:`CODE_DTYPES`)."""

    path: Path
    dtypes: tuple[np.dtype, ...]


def _narrowest(top: int) -> np.dtype:
    """The first of :data:`CODE_DTYPES` that holds codes ``0..top``."""
    return next(d for d in CODE_DTYPES if top <= np.iinfo(d).max)


class _Blocks:
    """Each split's coded rows in blocks, one per part to be written, as the part will hold
    them: a [C, rows] float32 array whose row 0 is the label, rows ``1..F`` the columns' codes
    (the bits of int32; encoded in place after the fit) and row ``F + 1`` the true
    probabilities of generated data. A split's blocks hold :data:`~write.PART_ROWS` rows (its
    first one starts at what its file foresees, at least :data:`FIRST_BLOCK_ROWS`, and grows
    as it must), so the parts never depend on how the input was cut. Full blocks are kept in
    memory up to :data:`MEMORY_BYTES`; later ones are written to files in ``work``, each
    column's codes in the narrowest of :data:`CODE_DTYPES` (their memory then takes the next
    rows), and read back to be encoded. ``budget``: the bytes of blocks kept in memory
    (default :data:`MEMORY_BYTES`)."""

    def __init__(self, work: Path, columns: int, codes: int, budget: int | None = None) -> None:
        self.work = work
        self.budget = MEMORY_BYTES if budget is None else budget
        self.columns = columns
        self.codes = codes  # F: rows 1..F of a block are codes
        self.blocks: list[list[np.ndarray | _Waiting]] = [[] for _ in SPLITS]
        self.fill = [0 for _ in SPLITS]  # rows in each split's last block
        self.expected = [0.0 for _ in SPLITS]  # each split's rows, as far as foreseen
        self.held = 0
        self._spare: np.ndarray | None = None  # the memory of the last block written out
        self._closing: list[tuple[int, int]] = []  # blocks filled by the last reservations

    def expect(self, k: int, rows: float) -> None:
        """Foresee ``rows`` more rows of split ``k``: its first block starts at the size they
        need (a first block that grows is copied, and fresh memory costs as much to touch as
        to fill)."""
        self.expected[k] += rows

    def reserve(self, k: int, rows: int) -> list[tuple[np.ndarray, int, int]]:
        """Room for the next ``rows`` rows of split ``k``: ``(block, start, n)`` segments in
        order, for the caller to fill; blocks they fill are settled by :meth:`settle`."""
        blocks, part = self.blocks[k], write.PART_ROWS
        last = blocks[-1] if blocks else None
        fill = self.fill[k]
        if last is not None and fill + rows > last.shape[1] and last.shape[1] < part:
            # a first block too small for these rows grows once (at most to a part) before any
            # of them are placed: growing copies the rows it holds
            size = min(part, max(2 * fill, fill + rows, self._foreseen(k)))
            grown = np.empty((self.columns, size), dtype=np.float32)
            grown[:, :fill] = last[:, :fill]  # type: ignore[index]
            blocks[-1] = grown
            self.held += grown.nbytes - last.nbytes  # type: ignore[union-attr]
        segments = []
        while rows > 0:
            block = blocks[-1] if blocks else None
            if block is None or self.fill[k] == block.shape[1]:
                first = block is None
                size = min(part, max(FIRST_BLOCK_ROWS, rows, self._foreseen(k))) if first else part
                if self._spare is not None and self._spare.shape[1] == size:
                    block, self._spare = self._spare, None
                else:
                    block = np.empty((self.columns, size), dtype=np.float32)
                blocks.append(block)
                self.fill[k] = 0
                self.held += block.nbytes
            start = self.fill[k]
            n = min(block.shape[1] - start, rows)  # type: ignore[union-attr]
            segments.append((block, start, n))
            self.fill[k] += n
            rows -= n
            if self.fill[k] == part:
                self._closing.append((k, len(blocks) - 1))
        return segments  # type: ignore[return-value]

    def settle(self) -> None:
        """The reserved rows are in their blocks: full ones over the budget wait on disk, and
        their memory takes the next rows."""
        for k, i in self._closing:
            block = self.blocks[k][i]
            if self.held <= self.budget:
                continue
            self.blocks[k][i] = self._write(block, self.work / f"{SPLITS[k]}-{i:05d}.bin")
            self.held -= block.nbytes  # type: ignore[union-attr]
            self._spare = block  # type: ignore[assignment]
        self._closing = []

    def spill(self) -> None:
        """Write every block still in memory (a split's last one: its filled rows) to disk, so
        that another process can take the blocks (the store pickles without them)."""
        for k, blocks in enumerate(self.blocks):
            for i, block in enumerate(blocks):
                if isinstance(block, np.ndarray):
                    rows = self.fill[k] if i == len(blocks) - 1 else block.shape[1]
                    path = self.work / f"{SPLITS[k]}-{i:05d}.bin"
                    blocks[i] = self._write(block[:, :rows], path)
        self.held, self._spare = 0, None

    def _write(self, block: np.ndarray, path: Path) -> _Waiting:
        """Write the full ``block`` to ``path``, each column's codes narrowed."""
        f32 = np.dtype(np.float32)
        codes = block[1 : 1 + self.codes].view(np.int32)
        tops = codes.max(axis=1).tolist() if self.codes else []
        dtypes = (f32, *(_narrowest(t) for t in tops), *[f32] * (self.columns - 1 - self.codes))
        with open(path, "wb") as fh:
            for j, dtype in enumerate(dtypes):
                row = block[j]
                fh.write(row if dtype == f32 else row.view(np.int32).astype(dtype))
        return _Waiting(path, dtypes)

    def _read(self, waiting: _Waiting, block: np.ndarray) -> None:
        """Read a block written by :meth:`_write` into ``block`` (a part's rows)."""
        rows = block.shape[1]
        scratch = np.empty(rows, dtype=np.int32).view(np.uint8)  # the narrowed rows' bytes
        with open(waiting.path, "rb") as fh:
            for j, dtype in enumerate(waiting.dtypes):
                into = block[j] if dtype == np.float32 else scratch[: rows * dtype.itemsize]
                if fh.readinto(into) != into.nbytes:  # type: ignore[attr-defined]
                    raise OSError(f"{waiting.path}: shorter than the block written to it")
                if dtype != np.float32:
                    block[j].view(np.int32)[:] = into.view(dtype)

    def _foreseen(self, k: int) -> int:
        """Split ``k``'s foreseen rows, with a margin (0: none foreseen)."""
        return int(self.expected[k] * 1.05)

    def take(
        self, k: int, spare: list[np.ndarray], remove: bool = True
    ) -> Iterator[tuple[int, np.ndarray]]:
        """Split ``k``'s blocks in order, as they are taken ``(index, [C, rows] block)``: one
        read back from disk lands in the memory of a block in ``spare`` (written parts'), and
        its file is removed by a thread of its own (removing a file just written waits on the
        disk: about 12 ms a block); ``remove=False`` keeps the files."""
        blocks = self.blocks[k]
        with ThreadPoolExecutor(1, thread_name_prefix="ctrcal-remove") as removing:
            removed = []
            for i, item in enumerate(blocks):
                blocks[i] = None  # type: ignore[call-overload]  # memory goes as it is used
                rows = self.fill[k] if i == len(blocks) - 1 else write.PART_ROWS
                if isinstance(item, _Waiting):
                    block = spare.pop() if spare else None
                    if block is None or block.shape != (self.columns, write.PART_ROWS):
                        block = np.empty((self.columns, write.PART_ROWS), dtype=np.float32)
                    self._read(item, block[:, :rows])
                    if remove:
                        removed.append(removing.submit(item.path.unlink))
                    item = block
                yield i, item[:, :rows]
            for done in removed:
                done.result()


def encode_sources(
    tmp: Path,
    sources: list[Source],
    on_bad_row: str,
    plan: SplitPlan,
    pipe: FeaturePipeline,
    clock: Clock,
    chunk_bytes: int = parse.CHUNK_BYTES,
    threads: int | None = None,
    *,
    compression: str,
) -> Tally:
    """Parse, code, fit and encode ``sources`` into ``tmp/{train,valid,test}`` (see the module
    docstring) on ``threads`` threads (default :func:`ctrcal.preparation.parse.threads`; more than
    one also parses a chunk while the one before it is coded: :mod:`ctrcal.preparation.stages`),
    the parts in ``compression`` (``data.parquet_compression``); returns what was read."""
    workers = threads or parse.threads()
    nums, cats = pipe.numeric_fields, pipe.categorical_fields
    coders = [ColumnCoder() for _ in (*nums, *cats)]
    tally = Tally(with_prob=all(s.prob is not None for s in sources))
    store = _Blocks(tmp / "_work", 1 + len(coders) + int(tally.with_prob), len(coders))
    with ThreadPoolExecutor(workers) as pool:
        for i, s in enumerate(sources):
            read_source(i, s, on_bad_row, plan, chunk_bytes, coders, store, tally, pool, workers)
        check_rows(tally, sources)
        clock("parse")
        stats, values = coder_stats(nums, cats, coders, tally.rows[0], pool)
        del coders
        pipe.fit_stats(stats, pool)
        answers = Answers(answer_tables(pipe, values, pool))
        clock("fit")
        columns = write.encoded_columns(nums, cats, tally.with_prob)
        _encode(tmp, store, answers, columns, workers, compression)
        clock("encode")
    return tally


def read_source(
    i: int,
    s: Source,
    on_bad_row: str,
    plan: SplitPlan,
    chunk_bytes: int,
    coders: list[ColumnCoder],
    store: _Blocks,
    tally: Tally,
    pool: ThreadPoolExecutor,
    workers: int,
) -> None:
    """Parse source ``i`` chunk by chunk, give each row its split, code its columns into
    ``store``'s blocks and count what was read into ``tally`` (whose ``with_prob`` turns
    False when the source's true probabilities do not match its records)."""
    probs = ProbReader(s.prob) if tally.with_prob else None
    records = 0
    foresee = True  # from the first chunk: its splits' shares of the whole file
    chunks = parse.iter_chunks(
        s.path, s.fmt, on_bad_row, chunk_bytes, workers, ring=stages.AHEAD + 2
    )
    for chunk in stages.ahead(chunks) if workers > 1 else chunks:
        split = plan.codes(np.full(len(chunk), i, dtype=np.int64), chunk.rows, chunk.time)
        prob = None
        if tally.with_prob:
            prob = probs.take(chunk.records)
            if prob is None:  # the file was edited since it was generated
                tally.with_prob = False
            else:
                prob = prob[chunk.rows - records]
        records += chunk.records
        sizes = np.bincount(split, minlength=len(SPLITS)).tolist()
        if foresee:
            # chunks are about chunk_bytes of text (a gzip file's are more than its size
            # says: its blocks then grow)
            scale = max(1.0, s.path.stat().st_size / chunk_bytes)
            for k, size in enumerate(sizes):
                store.expect(k, size * scale)
            foresee = False
        _code_chunk(chunk, split, sizes, prob, coders, store, pool, workers)
        tally.add(split, sizes, chunk.label)
        tally.bad += chunk.bad
        tally.chunks += 1
        tally.native_chunks += chunk.native
    if tally.with_prob and probs.rows != records:
        tally.with_prob = False


def _code_chunk(
    chunk: ParsedChunk,
    split: np.ndarray,
    sizes: list[int],
    prob: np.ndarray | None,
    coders: list[ColumnCoder],
    store: _Blocks,
    pool: ThreadPoolExecutor,
    tasks: int,
) -> None:
    """Code every column of a chunk straight into its splits' blocks (each split's rows in
    order; ``sizes``: how many rows each split has), on ``tasks`` of ``pool``'s threads, with
    the label and true probabilities beside them."""
    segments: list[tuple[np.ndarray, int, int]] = []
    at = np.empty(len(split), dtype=np.int64)  # row i -> segment at[i] >> 32, its row at[i] & ...
    for k, size in enumerate(sizes):
        if not size:
            continue
        rows = np.flatnonzero(split == k) if size != len(split) else np.arange(size)
        done = 0
        for block, start, n in store.reserve(k, size):
            mine = rows[done : done + n]
            at[mine] = np.arange(n, dtype=np.int64) + (len(segments) << 32)
            block[0, start : start + n] = chunk.label[mine]
            if prob is not None:
                block[-1, start : start + n] = prob[mine]
            segments.append((block, start, n))
            done += n
    fn = chunk.numeric.shape[0]
    train = (split == 0).view(np.uint8)

    def code(first: int) -> None:
        for j in range(first, len(coders), tasks):
            if j < fn:
                values, valid = chunk.numeric[j], chunk.numeric_valid[j]
            else:
                values, valid = chunk.categorical[j - fn], chunk.categorical_valid[j - fn]
            out = [b[1 + j, s : s + n].view(np.int32) for b, s, n in segments]
            coders[j].code(values, valid, train, out, at)

    # a task per thread, each every tasks-th column: a task per column would wake a thread per
    # column of every chunk
    list(pool.map(code, range(tasks)))
    store.settle()


def _encode(
    tmp: Path,
    store: _Blocks,
    answers: Answers,
    columns: list[write.Column],
    workers: int,
    compression: str,
) -> None:
    """Encode every block in place (one gather per column through the answer tables: a
    missing numeric's answer is NaN) and write it as its split's next part, ``workers`` parts
    side by side (polars encodes a file's columns on threads of its own too)."""
    f = len(answers.tables)
    with ThreadPoolExecutor(workers) as writing:
        jobs: deque[tuple[Future, np.ndarray | None]] = deque()
        spare: list[np.ndarray] = []  # written parts' blocks, for blocks read back from disk

        def submit(path: Path, block: np.ndarray | None) -> None:
            while len(jobs) >= workers:
                job, done = jobs.popleft()
                job.result()
                if done is not None and len(spare) < workers:
                    spare.append(done.base if done.base is not None else done)
            jobs.append(
                (writing.submit(write.write_part, path, columns, block, compression), block)
            )

        for k, name in enumerate(SPLITS):
            directory = tmp / name
            directory.mkdir()
            parts = 0
            for i, block in store.take(k, spare):
                answers.gather(block[1 : 1 + f].view(np.int32), block[1 : 1 + f])
                submit(directory / f"part-{i:05d}.parquet", block[: len(columns)])
                parts += 1
            if parts == 0:  # a split that got no rows: one empty part
                submit(directory / "part-00000.parquet", None)
        for job, _ in jobs:
            job.result()


def coder_stats(
    nums: list[str],
    cats: list[str],
    coders: list[ColumnCoder],
    train_rows: int,
    pool: ThreadPoolExecutor | None = None,
) -> tuple[FitStats, list[np.ndarray]]:
    """The coders' fit statistics (their distinct values' train counts, ``train_rows`` rows),
    and per column its distinct values in code order (float64 numbers; categorical keys,
    see :func:`category_keys`), which :func:`answer_tables` answers."""
    stats = FitStats(cats, nums)
    stats.add_rows(train_rows)
    values = []
    states = (pool.map if pool is not None else map)(ColumnCoder.state, coders)
    for j, (distinct, counts, missing) in enumerate(states):
        v = distinct.view(np.float64) if j < len(nums) else category_keys(distinct)
        values.append(v)
        seen = counts > 0
        frame = pl.DataFrame({"value": v[seen], "count": counts[seen].astype(np.uint64)})
        stats.add_counts((*nums, *cats)[j], frame, missing)
    return stats, values


def answer_tables(
    pipe: FeaturePipeline, values: list[np.ndarray], pool: ThreadPoolExecutor | None = None
) -> list[np.ndarray]:
    """Per column the fitted ``pipe``'s answer to each of its distinct ``values`` (in code
    order), by code (entry 0: missing): float32 model values, int32 ids."""
    nums, cats = pipe.numeric_fields, pipe.categorical_fields

    def table(j: int) -> np.ndarray:
        v = values[j]
        if j < len(nums):
            answers, missing_answer = pipe._model_values(v, j), np.float32(np.nan)
        else:
            answers, missing_answer = pipe.categorical_ids(cats[j - len(nums)], v), MISSING_ID
        out = np.empty(len(v) + 1, dtype=answers.dtype)
        out[0] = missing_answer
        out[1:] = answers
        return out

    return list((pool.map if pool is not None else map)(table, range(len(values))))


def category_keys(distinct: np.ndarray) -> np.ndarray:
    """[D] uint64 keys of a categorical field -> the vocabulary's values: uint32 when every key
    fits (Criteo's hashes, hex spellings: the dtype their typed frames hold, so those
    vocabularies and identities do not change), else all 64 bits (hashed strings), so that
    two values never share a key by losing its high half."""
    if distinct.size and int(distinct.max()) > 0xFFFFFFFF:
        return distinct
    return distinct.astype(np.uint32)


__all__ = [
    "Clock",
    "Source",
    "Tally",
    "answer_tables",
    "category_keys",
    "check_rows",
    "coder_stats",
    "encode_sources",
    "read_source",
]
