"""Reading the sources and writing the encoded splits: in memory, or chunk by chunk.

There is no Python loop over rows or values, and the two ways write the same data (the same
fitted state and rows in the same order, bit for bit):

* **in memory** (:func:`encode_in_memory`): every source is parsed into one typed frame (bad
  rows flagged, split assigned), cut into its three splits once, the
  :class:`~ctrcal.data.features.FeaturePipeline` is fitted on the train rows, and each split is
  encoded and written in one go -- fastest; well-formed Criteo input takes the faster way of
  :mod:`ctrcal.data.fastpath` (integer parsing and keys), which writes the same data;
* **chunked** (:func:`encode_chunked`): each source is read in chunks of whole lines (gzip
  decompressed on the fly); each chunk is parsed, checked and split, its train rows are counted
  into exact :class:`~ctrcal.data.features.FitStats` (per-value counts merged across chunks, so
  ``min_count`` applies to the whole split), and the typed chunk waits on disk (lz4 parquet);
  after the fit from the merged counts the chunks are encoded one by one into each split's
  ``part-NNNNN.parquet`` files (row groups of :data:`ROW_GROUP_ROWS`). Memory is a few chunks
  plus the counts, which grow with the number of distinct values, not with rows.

Both write into the temporary directory they are given (see :mod:`ctrcal.data.publish`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from ctrcal.data import criteo
from ctrcal.data.criteo import LABEL, CriteoFormat
from ctrcal.data.features import FeaturePipeline
from ctrcal.data.splits import SPLIT_COL, SPLITS, SplitPlan
from ctrcal.errors import DataError

PROB_COL = "true_prob"
ROW_GROUP_ROWS = 131_072
PART_ROWS = 128 * ROW_GROUP_ROWS
"""Rows per parquet part written by the chunked path (16.8M, ~1 GB of encoded data)."""
CHUNK_BYTES = 16 << 20
"""Text bytes per chunk of the chunked path (~70k Criteo rows). Measured on 1M rows: 16, 32
and 64 MiB chunks prepare at the same speed, with peak RSS ~310, ~400 and ~530 MiB."""


@dataclass
class Source:
    """One input file and what is known about it."""

    path: Path  # as given
    split: int | None  # None: split by the plan
    fmt: CriteoFormat | None = None
    read_path: Path | None = None  # decompressed copy for .gz
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

    def add(self, name: str) -> None:
        """Seconds since the last lap are added to phase ``name`` (a phase in pieces)."""
        now = time.perf_counter()
        self.laps[name] = round(self.laps.get(name, 0.0) + now - self._last, 3)
        self._last = now


@dataclass
class Tally:
    """What reading the sources found (both paths fill it the same way)."""

    rows: list[int] = field(default_factory=lambda: [0, 0, 0])
    label_sum: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    labelled: list[int] = field(default_factory=lambda: [0, 0, 0])
    bad: int = 0
    with_prob: bool = False
    chunks: int = 0
    fast: bool = False  # prepared by :mod:`ctrcal.data.fastpath`

    def add(self, good: pl.DataFrame | pl.LazyFrame) -> None:
        counts = (
            good.lazy().group_by(SPLIT_COL)
            .agg(pl.len().alias("rows"), pl.col(LABEL).cast(pl.Float64).sum().alias("sum"),
                 pl.col(LABEL).count().alias("labelled"))
            .collect()
        )  # fmt: skip
        for r in counts.iter_rows(named=True):
            k = int(r[SPLIT_COL])
            self.rows[k] += int(r["rows"])
            self.label_sum[k] += float(r["sum"] or 0.0)
            self.labelled[k] += int(r["labelled"])

    def rate(self, k: int) -> float:
        # label sums are exact integers, so this is the same whichever path added them up
        return self.label_sum[k] / self.labelled[k] if self.labelled[k] else float("nan")


def check_rows(tally: Tally, sources: list[Source]) -> None:
    if sum(tally.rows) + tally.bad == 0:
        names = ", ".join(str(s.path) for s in sources)
        raise DataError(f"{names}: no rows")
    if tally.rows[0] == 0:
        raise DataError("the train split is empty (all rows malformed, or data.split gives 0)")


def _with_split(df: pl.DataFrame, plan: SplitPlan) -> pl.DataFrame:
    """``df`` (typed rows with ``_file`` and ``_row``) with each row's split code."""
    codes = plan.codes(df[criteo.FILE_COL].to_numpy(), df[criteo.ROW_COL].to_numpy())
    return df.with_columns(pl.Series(SPLIT_COL, codes))


def encode_in_memory(
    tmp: Path,
    sources: list[Source],
    on_bad_row: str,
    plan: SplitPlan,
    pipe: FeaturePipeline,
    clock: Clock,
) -> Tally:
    """Parse everything into one typed frame in memory, fit, encode each split: the fast way
    of :mod:`ctrcal.data.fastpath` when the input allows it, else strictly (bad rows flagged
    with file, line and column)."""
    from ctrcal.data.fastpath import encode_fast

    work = tmp / "_work"
    for s in sources:
        s.read_path = criteo.decompress(s.path, work) if criteo.is_gzip(s.path) else s.path
    tally = Tally(with_prob=all(s.prob is not None for s in sources))
    try:
        if encode_fast(tmp, sources, plan, pipe, clock, tally, write_split):
            return tally
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise criteo.read_error([s.path for s in sources], exc) from None

    def typed_frame(numbers: bool) -> pl.DataFrame:
        frames = [criteo.scan_typed(s.read_path, s.fmt, i, numbers) for i, s in enumerate(sources)]
        return pl.concat(frames, how="vertical").collect(engine="streaming")

    try:
        try:
            # parsed columns take less memory than the text
            typed = _with_split(typed_frame(numbers=True), plan).lazy()
        except pl.exceptions.ComputeError:
            # a non-numeric label or I value: the string path flags it row by row
            typed = _with_split(typed_frame(numbers=False), plan).lazy()
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise criteo.read_error([s.path for s in sources], exc) from None
    clock("parse")
    tally = Tally(with_prob=all(s.prob is not None for s in sources), chunks=1)
    if tally.with_prob:
        # true probabilities of generated data, row-aligned with their data files; a file
        # edited since it was generated no longer matches and its probabilities are dropped
        per_file = typed.group_by(criteo.FILE_COL).agg(pl.len()).collect()
        counts_by_file = dict(zip(*per_file.get_columns(), strict=True))
        tally.with_prob = all(
            pq.ParquetFile(s.prob).metadata.num_rows == counts_by_file.get(i, 0)
            for i, s in enumerate(sources)
        )
    if tally.with_prob:
        probs = pl.concat([pl.scan_parquet(s.prob).select("prob") for s in sources])
        typed = pl.concat(
            [typed, probs.select(pl.col("prob").cast(pl.Float32).alias(PROB_COL))],
            how="horizontal",
        )
    bad, _ = criteo.first_bad(
        typed, [s.path for s in sources], [s.fmt for s in sources], on_bad_row == "error"
    )
    good = typed.filter(pl.col(criteo.BAD_COL) == 0) if bad else typed
    tally.bad = bad
    tally.add(good)
    check_rows(tally, sources)
    clock("check")
    try:
        # each split once in memory: the fit and the encoding read it without filtering again
        needed = [*criteo.COLUMNS, *((PROB_COL,) if tally.with_prob else ())]
        parts = [good.filter(pl.col(SPLIT_COL) == k).select(needed).collect()
                 for k in range(len(SPLITS))]  # fmt: skip
        del good, typed
        clock("split")
        pipe.fit(parts[0].lazy())
        clock("fit")
        keep = (PROB_COL,) if tally.with_prob else ()
        for k, name in enumerate(SPLITS):
            (tmp / name).mkdir()
            enc = pipe.encode(parts[k], keep=keep)
            parts[k] = None  # type: ignore[call-overload]
            clock.add("encode")
            write_split(enc, tmp / name / "part-00000.parquet")
            del enc
            clock.add("write")
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise criteo.read_error([s.path for s in sources], exc) from None
    return tally


def write_split(enc: pl.DataFrame, path: Path) -> None:
    """One split's encoded rows as one parquet file (the in-memory paths)."""
    enc.write_parquet(path, compression="snappy", statistics=False, row_group_size=ROW_GROUP_ROWS)


def _parse_chunk(
    chunk: bytes, s: Source, index: int, offset: int, plan: SplitPlan
) -> pl.DataFrame:
    """One chunk of a source's lines -> typed rows with ``_split`` (the in-memory columns)."""
    try:
        try:
            lf = criteo.scan_typed(chunk, s.fmt, index, True, row_offset=offset, skip_header=False)
            return _with_split(lf.collect(), plan)
        except pl.exceptions.ComputeError:
            # a non-numeric label or I value in this chunk: flag it row by row
            lf = criteo.scan_typed(chunk, s.fmt, index, False, row_offset=offset,
                                   skip_header=False)  # fmt: skip
            return _with_split(lf.collect(), plan)
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise criteo.read_error([s.path], exc) from None


class ProbReader:
    """The true probabilities of a generated file, handed out in row order chunk by chunk."""

    def __init__(self, path: Path) -> None:
        self.file = pq.ParquetFile(path)
        self.rows = self.file.metadata.num_rows
        self._batches = self.file.iter_batches(batch_size=1 << 16, columns=["prob"])
        self._held: list[Any] = []
        self._held_rows = 0

    def take(self, n: int) -> pl.Series | None:
        """The next ``n`` probabilities (float32), or None when the file has fewer left."""
        import pyarrow as pa

        while self._held_rows < n:
            try:
                batch = next(self._batches)
            except StopIteration:
                return None
            self._held.append(batch.column(0))
            self._held_rows += len(batch)
        joined = pa.concat_arrays(self._held)
        out, rest = joined.slice(0, n), joined.slice(n)
        self._held, self._held_rows = ([rest] if len(rest) else []), len(rest)
        return pl.Series(PROB_COL, out).cast(pl.Float32)


def encode_chunked(
    tmp: Path,
    sources: list[Source],
    on_bad_row: str,
    plan: SplitPlan,
    pipe: FeaturePipeline,
    clock: Clock,
    chunk_bytes: int,
) -> Tally:
    """Bounded memory: (1) read each source chunk by chunk -- parse, check, split, count the
    train rows into exact :class:`~ctrcal.data.features.FitStats`, keep the typed chunk on
    disk (lz4 parquet); (2) fit from the merged counts; (3) encode the kept chunks one by one
    into each split's parquet parts. Memory is a few chunks plus the counts (which grow with
    the number of distinct values, not rows); the output equals the in-memory path's."""
    work = tmp / "_work"
    tally = Tally(with_prob=all(s.prob is not None for s in sources))
    stats = pipe.new_stats()
    typed_parts: list[Path] = []
    columns = [*criteo.COLUMNS, SPLIT_COL]
    for i, s in enumerate(sources):
        probs = ProbReader(s.prob) if tally.with_prob else None
        offset = 0
        for chunk in criteo.iter_text_chunks(s.path, chunk_bytes, s.fmt.header_lines):
            df = _parse_chunk(chunk, s, i, offset, plan)
            if tally.with_prob:
                prob = probs.take(df.height)
                if prob is None:  # the file was edited since it was generated
                    tally.with_prob = False
                else:
                    df = df.with_columns(prob)
            bad = int((df[criteo.BAD_COL] != 0).sum())
            if bad:
                if on_bad_row == "error":
                    row = int(df.filter(pl.col(criteo.BAD_COL) != 0)[criteo.ROW_COL][0])
                    message = criteo.describe_bad_row(s.path, s.fmt, row, chunk, offset)
                    more = (f"; {bad - 1} more malformed rows in the {offset + df.height:,} "
                            f"rows read so far" if bad > 1 else "")  # fmt: skip
                    raise DataError(f"{message}{more} (use on_bad_row=skip to drop them)")
                df = df.filter(pl.col(criteo.BAD_COL) == 0)
            tally.bad += bad
            offset += df.height + bad
            del chunk
            keep = [*columns, PROB_COL] if tally.with_prob else columns
            df = df.select(keep)
            tally.add(df)
            stats.update(df.filter(pl.col(SPLIT_COL) == 0))
            part = work / f"typed-{i:05d}-{tally.chunks:07d}.parquet"
            df.write_parquet(part, compression="lz4", statistics=False)
            typed_parts.append(part)
            tally.chunks += 1
            del df
        if tally.with_prob and probs.rows != offset:
            tally.with_prob = False
    check_rows(tally, sources)
    clock("parse")
    pipe.fit_stats(stats)
    del stats
    clock("fit")
    keep = (PROB_COL, SPLIT_COL) if tally.with_prob else (SPLIT_COL,)
    writers = [PartWriter(tmp / name) for name in SPLITS]
    schema = None
    for part in typed_parts:
        enc = pipe.encode(pl.read_parquet(part), keep=keep)
        part.unlink()
        for k, sub in enc.partition_by(SPLIT_COL, as_dict=True, include_key=False).items():
            table = sub.to_arrow()
            schema = table.schema
            writers[int(k[0])].write(table)
    for w in writers:
        w.close(schema)
    clock("encode")
    return tally


class PartWriter:
    """Encoded rows of one split -> ``part-NNNNN.parquet`` files of at most :data:`PART_ROWS`
    rows, in row groups of exactly :data:`ROW_GROUP_ROWS` rows (the last one of the split
    may be shorter) whatever the chunk sizes."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir()
        self._pending: list[Any] = []
        self._pending_rows = 0
        self._writer: Any = None
        self._parts = 0
        self._part_rows = 0

    def write(self, table: Any) -> None:
        self._pending.append(table)
        self._pending_rows += table.num_rows
        if self._pending_rows >= ROW_GROUP_ROWS:
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        import pyarrow as pa

        if not self._pending:
            return
        table = pa.concat_tables(self._pending)
        full = table.num_rows if final else table.num_rows - table.num_rows % ROW_GROUP_ROWS
        done = 0
        while done < full:
            if self._writer is None:
                path = self.directory / f"part-{self._parts:05d}.parquet"
                self._writer = pq.ParquetWriter(path, table.schema, compression="snappy",
                                                write_statistics=False)  # fmt: skip
                self._parts += 1
                self._part_rows = 0
            n = min(full - done, ROW_GROUP_ROWS, PART_ROWS - self._part_rows)
            self._writer.write_table(table.slice(done, n), row_group_size=n)
            done += n
            self._part_rows += n
            if self._part_rows >= PART_ROWS:
                self._writer.close()
                self._writer = None
        rest = table.slice(full)
        self._pending, self._pending_rows = ([rest] if rest.num_rows else []), rest.num_rows

    def close(self, schema: Any) -> None:
        """Write what is pending; a split that got no rows gets one empty part."""
        self._flush(final=True)
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._parts == 0:
            pq.write_table(schema.empty_table(), self.directory / "part-00000.parquet",
                           compression="snappy", write_statistics=False)  # fmt: skip
