"""The streaming pipeline: sources -> coded chunks -> fit -> encode by gather -> one writer.

:func:`encode_sources` is the one route from raw files to encoded splits, whatever their size
(a small file is one chunk):

1. each source is parsed chunk by chunk (:func:`ctrcal.data.parse.iter_chunks`: the C reader
   first, polars for a chunk it refuses), each row is given its split
   (:class:`~ctrcal.data.splits.SplitPlan`), and every column of the chunk is coded by its
   :class:`~ctrcal.data.coder.ColumnCoder` (a column per thread), which keeps the distinct
   values and their train counts across chunks; the chunk's codes, grouped by split, wait in
   a :class:`_CodeStore` (memory, then disk);
2. the :class:`~ctrcal.data.features.FeaturePipeline` is fitted on the distinct values and
   their exact train counts (:class:`~ctrcal.data.fit_stats.FitStats`: any chunking gives the
   same state, bit for bit);
3. each column's answer per distinct value (its id, its model value) is computed once, and
   every chunk is encoded by one gather per column and handed to the split's
   :class:`~ctrcal.data.prepare.write.PartWriter`.

Memory is a few chunks plus the coders (which grow with the number of distinct values, not
rows); the output does not depend on the chunk size.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ctrcal.core.errors import DataError
from ctrcal.data import parse
from ctrcal.data.coder import ColumnCoder, gather, numeric_bits
from ctrcal.data.features import MISSING_ID, FeaturePipeline
from ctrcal.data.fit_stats import FitStats
from ctrcal.data.parsed import ParsedChunk
from ctrcal.data.prepare import stages
from ctrcal.data.prepare.write import PROB_COL, PartWriter, encoded_schema
from ctrcal.data.splits import SPLITS, SplitPlan

MEMORY_BYTES = 256 << 20
"""Coded chunks are kept in memory up to this many bytes, later ones wait on disk."""


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

    def add(self, split: np.ndarray, label: np.ndarray) -> None:
        known = ~np.isnan(label)
        for k, n in enumerate(np.bincount(split, minlength=len(SPLITS)).tolist()):
            self.rows[k] += n
        sums = np.bincount(split, weights=np.where(known, label, 0.0), minlength=len(SPLITS))
        for k, s in enumerate(sums.tolist()):
            self.label_sum[k] += s  # exact: sums of 0/1 below 2^53
        for k, n in enumerate(np.bincount(split[known], minlength=len(SPLITS)).tolist()):
            self.labelled[k] += n

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
        self.file = pq.ParquetFile(path)
        self.rows = self.file.metadata.num_rows
        self._batches = self.file.iter_batches(batch_size=1 << 16, columns=["prob"])
        self._held: list[Any] = []
        self._held_rows = 0

    def take(self, n: int) -> np.ndarray | None:
        """The next ``n`` probabilities (float32), or None when the file has fewer left."""
        while self._held_rows < n:
            try:
                batch = next(self._batches)
            except StopIteration:
                return None
            self._held.append(batch.column(0))
            self._held_rows += len(batch)
        joined = pa.concat_arrays(self._held) if self._held else pa.array([], pa.float64())
        out, rest = joined.slice(0, n), joined.slice(n)
        self._held, self._held_rows = ([rest] if len(rest) else []), len(rest)
        if out.null_count:
            out = out.fill_null(float("nan"))
        # DLPack, not pyarrow's to_numpy: that one imports pandas (seconds, for nothing)
        return np.from_dlpack(out).astype(np.float32)


@dataclass
class _Coded:
    """One chunk's rows grouped by split: codes [F, N] int32, label [N] float32 (NaN =
    unlabelled), per split its number of rows, true probabilities [N] float32 (or None)."""

    codes: np.ndarray
    label: np.ndarray
    sizes: list[int]
    prob: np.ndarray | None


class _CodeStore:
    """Coded chunks in order: in memory up to :data:`MEMORY_BYTES`, then raw files in ``work``."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.items: list[_Coded | tuple[Path, int, int, list[int], bool]] = []
        self.held = 0

    def add(self, c: _Coded) -> None:
        size = c.codes.nbytes + c.label.nbytes
        if self.held + size <= MEMORY_BYTES:
            self.items.append(c)
            self.held += size
            return
        path = self.work / f"coded-{len(self.items):07d}.bin"
        with open(path, "wb") as fh:
            for a in (c.codes, c.label, c.prob):
                if a is not None:
                    a.tofile(fh)
        self.items.append((path, *c.codes.shape, c.sizes, c.prob is not None))

    def __iter__(self):
        for i, item in enumerate(self.items):
            if isinstance(item, _Coded):
                self.items[i] = None  # type: ignore[call-overload]  # memory goes as it is used
                yield item
                continue
            path, f, n, sizes, with_prob = item
            raw = np.fromfile(path, dtype=np.uint8)
            path.unlink()
            codes = raw[: 4 * f * n].view(np.int32).reshape(f, n)
            label = raw[4 * f * n : 4 * (f + 1) * n].view(np.float32)
            prob = raw[4 * (f + 1) * n :].view(np.float32) if with_prob else None
            yield _Coded(codes, label, sizes, prob)


def encode_sources(
    tmp: Path,
    sources: list[Source],
    on_bad_row: str,
    plan: SplitPlan,
    pipe: FeaturePipeline,
    clock: Clock,
    chunk_bytes: int = parse.CHUNK_BYTES,
    threads: int | None = None,
) -> Tally:
    """Parse, code, fit and encode ``sources`` into ``tmp/{train,valid,test}`` (see the module
    docstring) on ``threads`` threads (default :func:`ctrcal.data.parse.threads`; more than
    one also parses a chunk while the one before it is coded: :mod:`ctrcal.data.prepare.stages`);
    returns what was read."""
    workers = threads or parse.threads()
    nums, cats = pipe.numeric_fields, pipe.categorical_fields
    coders = [ColumnCoder() for _ in (*nums, *cats)]
    store = _CodeStore(tmp / "_work")
    tally = Tally(with_prob=all(s.prob is not None for s in sources))
    with ThreadPoolExecutor(workers) as pool:
        for i, s in enumerate(sources):
            probs = ProbReader(s.prob) if tally.with_prob else None
            records = 0
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
                store.add(_code_chunk(chunk, split, prob, coders, pool))
                tally.add(split, chunk.label)
                tally.bad += chunk.bad
                tally.chunks += 1
                tally.native_chunks += chunk.native
            if tally.with_prob and probs.rows != records:
                tally.with_prob = False
        check_rows(tally, sources)
        clock("parse")
        tables = _fit(pipe, coders, tally.rows[0])
        del coders
        clock("fit")
        schema = encoded_schema(nums, cats, tally.with_prob)
        with ThreadPoolExecutor(workers) as writing:
            writers = [PartWriter(tmp / name, schema, writing) for name in SPLITS]
            for coded in store:
                offset = 0
                for k, size in enumerate(coded.sizes):
                    if size:
                        rows = _encode_rows(coded, offset, offset + size, tables, schema, pool)
                        writers[k].write(rows)
                    offset += size
            for w in writers:
                w.close()
        clock("encode")
    return tally


def _code_chunk(
    chunk: ParsedChunk,
    split: np.ndarray,
    prob: np.ndarray | None,
    coders: list[ColumnCoder],
    pool: ThreadPoolExecutor,
) -> _Coded:
    """Code every column of a chunk, its rows grouped by split (in order within a split)."""
    sizes = np.bincount(split, minlength=len(SPLITS)).tolist()
    order = None if max(sizes) == len(split) else np.argsort(split, kind="stable")
    fn = chunk.numeric.shape[0]
    train = (split == 0).view(np.uint8)
    codes = np.empty((len(coders), len(split)), dtype=np.int32)

    def code(j: int) -> None:
        if j < fn:
            values, valid = numeric_bits(chunk.numeric[j]), chunk.numeric_valid[j]
        else:
            values, valid = chunk.categorical[j - fn], chunk.categorical_valid[j - fn]
        c = coders[j].code(values, valid, train)
        codes[j] = c if order is None else c.take(order)

    list(pool.map(code, range(len(coders))))
    label = chunk.label.astype(np.float32)
    if order is not None:
        label = label.take(order)
        prob = prob.take(order) if prob is not None else None
    return _Coded(codes, label, sizes, prob)


def _fit(pipe: FeaturePipeline, coders: list[ColumnCoder], train_rows: int) -> list[np.ndarray]:
    """Fit ``pipe`` on the coders' distinct values and train counts; per column the table of
    answers by code (entry 0: missing): float32 model values, int32 ids."""
    import polars as pl

    nums, cats = pipe.numeric_fields, pipe.categorical_fields
    stats = FitStats(cats, nums)
    stats.add_rows(train_rows)
    states = [c.state() for c in coders]
    values = []
    for j, (distinct, counts, missing) in enumerate(states):
        v = distinct.view(np.float64) if j < len(nums) else _category_keys(distinct)
        values.append(v)
        seen = counts > 0
        frame = pl.DataFrame({"value": v[seen], "count": counts[seen].astype(np.uint64)})
        stats.add_counts((*nums, *cats)[j], frame, missing)
    pipe.fit_stats(stats)
    tables = []
    for j, v in enumerate(values):
        if j < len(nums):
            answers, missing_answer = pipe._model_values(v, j), np.float32(np.nan)
        else:
            answers, missing_answer = pipe.categorical_ids(cats[j - len(nums)], v), MISSING_ID
        table = np.empty(len(v) + 1, dtype=answers.dtype)
        table[0] = missing_answer
        table[1:] = answers
        tables.append(table)
    return tables


def _category_keys(distinct: np.ndarray) -> np.ndarray:
    """[D] uint64 keys of a categorical field -> the vocabulary's values: uint32 when every key
    fits (Criteo's hashes, hex spellings: the dtype their typed frames hold, so those
    vocabularies and identities do not change), else all 64 bits (hashed strings), so that
    two values never share a key by losing its high half."""
    if distinct.size and int(distinct.max()) > 0xFFFFFFFF:
        return distinct
    return distinct.astype(np.uint32)


def _encode_rows(
    coded: _Coded,
    lo: int,
    hi: int,
    tables: list[np.ndarray],
    schema: pa.Schema,
    pool: ThreadPoolExecutor,
) -> pa.Table:
    """Rows ``[lo, hi)`` of a coded chunk encoded (the schema's columns) by one gather per
    column, in buffers of their own: a split's rows may wait for their part long after the
    chunk is gone, and must not keep it alive."""

    def column(j: int) -> pa.Array:
        codes = coded.codes[j, lo:hi]
        out = gather(tables[j], codes)
        if out.dtype == np.float32:
            return _nullable(out, codes != 0)
        return _nullable(out, None)

    label = coded.label[lo:hi].copy()
    columns = [_nullable(label, ~np.isnan(label))]
    columns += list(pool.map(column, range(len(tables))))
    if PROB_COL in schema.names:
        columns.append(_nullable(coded.prob[lo:hi].copy(), None))
    return pa.Table.from_arrays(columns, schema=schema)


def _nullable(values: np.ndarray, valid: np.ndarray | None) -> pa.Array:
    """``values`` as an Arrow array, null where ``valid`` is false (no copy of the values).
    Built from buffers: ``pa.array`` of a NumPy array imports pandas (seconds, for nothing)."""
    nulls = 0 if valid is None else len(valid) - int(np.count_nonzero(valid))
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    dtype = pa.from_numpy_dtype(values.dtype)
    return pa.Array.from_buffers(dtype, len(values), [bitmap, pa.py_buffer(values)], nulls)


__all__ = ["Clock", "Source", "Tally", "check_rows", "encode_sources"]
