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
import polars as pl

from ctrcal.core.errors import DataError
from ctrcal.data import parse
from ctrcal.data.coder import Answers, ColumnCoder
from ctrcal.data.features import MISSING_ID, FeaturePipeline
from ctrcal.data.fit_stats import FitStats
from ctrcal.data.parsed import ParsedChunk
from ctrcal.data.prepare import stages
from ctrcal.data.prepare.write import PartWriter, encoded_columns
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
        answers = Answers(_fit(pipe, coders, tally.rows[0]))
        del coders
        clock("fit")
        columns = encoded_columns(nums, cats, tally.with_prob)
        with ThreadPoolExecutor(workers) as writing:
            writers = [
                PartWriter(tmp / name, columns, tally.rows[k], writing)
                for k, name in enumerate(SPLITS)
            ]
            for coded in store:
                offset = 0
                for k, size in enumerate(coded.sizes):
                    if size:
                        _encode_rows(coded, offset, offset + size, answers, writers[k])
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
    """Code every column of a chunk, its rows grouped by split (in order within a split): each
    coder writes a row's code straight to its place in the split's group."""
    sizes = np.bincount(split, minlength=len(SPLITS)).tolist()
    at = None
    if max(sizes) != len(split):
        at = np.empty(len(split), dtype=np.int64)
        start = 0
        for k, size in enumerate(sizes):
            at[split == k] = np.arange(start, start + size)
            start += size
    fn = chunk.numeric.shape[0]
    train = (split == 0).view(np.uint8)
    codes = np.empty((len(coders), len(split)), dtype=np.int32)

    def code(j: int) -> None:
        if j < fn:
            values, valid = chunk.numeric[j], chunk.numeric_valid[j]
        else:
            values, valid = chunk.categorical[j - fn], chunk.categorical_valid[j - fn]
        coders[j].code(values, valid, train, codes[j], at)

    list(pool.map(code, range(len(coders))))
    label = chunk.label.astype(np.float32)
    if at is not None:
        label[at] = label.copy()
        if prob is not None:
            prob[at] = prob.copy()
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


def _encode_rows(coded: _Coded, lo: int, hi: int, answers: Answers, writer: PartWriter) -> None:
    """Rows ``[lo, hi)`` of a coded chunk encoded into ``writer``'s part (the columns of
    :func:`~ctrcal.data.prepare.write.encoded_columns`): the label, one gather per column (a
    missing numeric's answer is NaN), the true probabilities."""
    f = len(answers.tables)
    while lo < hi:
        out = writer.reserve(hi - lo)
        n = out.shape[1]
        out[0] = coded.label[lo : lo + n]
        answers.gather(coded.codes[:, lo : lo + n], out[1 : 1 + f])
        if len(out) > 1 + f:
            out[1 + f] = coded.prob[lo : lo + n]
        lo += n


__all__ = ["Clock", "Source", "Tally", "check_rows", "encode_sources"]
