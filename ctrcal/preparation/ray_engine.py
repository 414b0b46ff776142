"""The Ray engine (``data.engine: ray``): the streaming pipeline of
:mod:`ctrcal.preparation.encode`, one Ray task per input file, the same bytes out.

1. A task per input file (:func:`_fit_file`) parses it, gives each row its split and codes its
   columns (:func:`~ctrcal.preparation.encode.read_source`, as the local engine does), writes
   its coded blocks and distinct values to ``TMP/_work/fNNNNN/``, and returns its partial fit
   statistics as bytes (:meth:`FitStats.to_bytes <ctrcal.preparation.fit_stats.FitStats.to_bytes>`)
   with what it read (:class:`~ctrcal.preparation.encode.Tally`).
2. The driver merges the partials as the tasks finish (any order: the merge is integer
   addition) and fits the :class:`~ctrcal.preparation.features.FeaturePipeline` once, on the merged
   counts: thresholds apply to the global counts only.
3. A task per input file (:func:`_encode_file`) answers its own distinct values by the fitted
   pipeline, encodes its blocks by gather and cuts its rows of each split at the local engine's
   part boundaries (every :data:`~ctrcal.preparation.write.PART_ROWS` rows of the split, files
   in reading order): a part that lies within the file it writes itself, the pieces of a part
   that straddles files it leaves in ``TMP/_work`` for the driver, which joins them in order
   and writes those parts. Every part is the local engine's, byte for byte.

The prepared directory is published by the caller as the local engine's is (whole, or not at
all). Tasks are retried :data:`TASK_RETRIES` times when their worker dies; a retried task
starts its file afresh and rewrites the same files. On a cluster ``TMP`` (beside the output
directory) must be on storage every node reads and writes, and ctrcal installed on every node.
"""

from __future__ import annotations

import shutil
import socket
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctrcal.core.errors import DataError
from ctrcal.preparation import write
from ctrcal.preparation.coder import Answers, ColumnCoder
from ctrcal.preparation.encode import (
    Clock,
    Source,
    Tally,
    _Blocks,
    answer_tables,
    check_rows,
    coder_stats,
    read_source,
)
from ctrcal.preparation.engines import missing_package
from ctrcal.preparation.features import FeaturePipeline
from ctrcal.preparation.fit_stats import FitStats
from ctrcal.preparation.splits import SPLITS, SplitPlan

TASK_RETRIES = 2
"""Times a task is run again when its worker process dies (Ray's ``max_retries``)."""
CONNECT_TIMEOUT_S = 10.0
"""Seconds to wait for a Ray cluster at ``data.ray_address`` to accept a connection."""


@dataclass
class _Read:
    """What a fit task hands back: its partial statistics and where its blocks wait."""

    stats: bytes
    tally: Tally
    store: _Blocks
    values: Path


def _fit_file(
    i: int,
    source: Source,
    on_bad_row: str,
    plan: SplitPlan,
    nums: list[str],
    cats: list[str],
    chunk_bytes: int,
    with_prob: bool,
    work: Path,
) -> _Read:
    """Parse and code input ``i`` into ``work/fNNNNN`` (see the module docstring, step 1)."""
    mine = work / f"f{i:05d}"
    shutil.rmtree(mine, ignore_errors=True)  # a retried task starts afresh
    mine.mkdir(parents=True)
    coders = [ColumnCoder() for _ in (*nums, *cats)]
    tally = Tally(with_prob=with_prob)
    store = _Blocks(mine, 1 + len(coders) + int(with_prob), len(coders), budget=0)
    with ThreadPoolExecutor(1) as pool:
        read_source(i, source, on_bad_row, plan, chunk_bytes, coders, store, tally, pool, 1)
    stats, values = coder_stats(nums, cats, coders, tally.rows[0])
    store.spill()
    np.savez(mine / "values.npz", *values)
    return _Read(stats.to_bytes(), tally, store, mine / "values.npz")


def _encode_file(
    read: _Read,
    pipe: FeaturePipeline,
    offsets: list[int],
    totals: list[int],
    columns: list[write.Column],
    compression: str,
    tmp: Path,
) -> list[tuple[int, int, int, Path]]:
    """Encode one file's blocks and write the parts that lie within it (module docstring,
    step 3; its blocks stay on disk until it ends, for a retry); returns the pieces of the
    other parts ``(split, part, first row, path)``."""
    with np.load(read.values) as held:
        values = [held[f"arr_{j}"] for j in range(len(held.files))]
    answers = Answers(answer_tables(pipe, values))
    f, part = len(answers.tables), write.PART_ROWS
    pieces = []
    for k, name in enumerate(SPLITS):
        n, o, total = read.tally.rows[k], offsets[k], totals[k]
        if n == 0:
            continue
        # the file's rows of split k are rows [o, o + n) of the split: cut at its parts
        cuts, at = [], o
        while at < o + n:
            end = min((at // part + 1) * part, o + n)
            cuts.append((at, end))
            at = end
        held_rows: list[np.ndarray] = []
        have, c = 0, 0
        for _, block in read.store.take(k, [], remove=False):
            answers.gather(block[1 : 1 + f].view(np.int32), block[1 : 1 + f])
            block, pos = block[: len(columns)], 0
            while pos < block.shape[1]:
                start, end = cuts[c]
                take = min(end - start - have, block.shape[1] - pos)
                held_rows.append(block[:, pos : pos + take])
                have, pos = have + take, pos + take
                if have < end - start:
                    continue
                rows = held_rows[0] if len(held_rows) == 1 else np.concatenate(held_rows, axis=1)
                p = start // part
                if start == p * part and end == min((p + 1) * part, total):
                    write.write_part(
                        tmp / name / f"part-{p:05d}.parquet", columns, rows, compression
                    )
                else:
                    path = tmp / "_work" / f"piece-{name}-{p:05d}-{start:012d}.npy"
                    np.save(path, np.ascontiguousarray(rows))
                    pieces.append((k, p, start, path))
                held_rows, have, c = [], 0, c + 1
    shutil.rmtree(read.values.parent, ignore_errors=True)
    return pieces


def encode_sources_ray(
    tmp: Path,
    sources: list[Source],
    on_bad_row: str,
    plan: SplitPlan,
    pipe: FeaturePipeline,
    clock: Clock,
    chunk_bytes: int,
    *,
    compression: str,
    address: str | None,
) -> Tally:
    """:func:`~ctrcal.preparation.encode.encode_sources` on Ray (module docstring): the same
    parts in ``tmp/{train,valid,test}``, the same fitted ``pipe``; returns what was read.

    ``address``: ``data.ray_address`` (None: a Ray started here, on this machine's cores; or
    the Ray this process already joined).

    Raises:
        DataError: Ray missing, no cluster at ``address`` (within :data:`CONNECT_TIMEOUT_S`),
            a task whose worker died more than :data:`TASK_RETRIES` times, or what the local
            engine raises for the same input.
    """
    missing = missing_package()
    if missing:
        raise DataError(f"data.engine: {missing}")
    import ray

    started = _connect(ray, address)
    try:
        nums, cats = pipe.numeric_fields, pipe.categorical_fields
        with_prob = all(s.prob is not None for s in sources)
        options = {"num_cpus": 1, "max_retries": TASK_RETRIES}
        fit = ray.remote(**options)(_fit_file)
        refs = {
            fit.remote(i, s, on_bad_row, plan, nums, cats, chunk_bytes, with_prob, tmp / "_work"): i
            for i, s in enumerate(sources)
        }
        reads: list[_Read | None] = [None] * len(sources)
        stats = FitStats(cats, nums)
        tally = Tally(with_prob=with_prob)
        for ref, read in _as_done(ray, refs, sources):
            reads[refs[ref]] = read
            stats.merge(FitStats.from_bytes(read.stats))
            tally.merge(read.tally)
        check_rows(tally, sources)
        clock("parse")
        pipe.fit_stats(stats)
        del stats
        clock("fit")
        columns = write.encoded_columns(nums, cats, tally.with_prob)
        totals = tally.rows
        offsets, at = [], [0] * len(SPLITS)
        for read in reads:
            offsets.append(list(at))
            at = [a + r for a, r in zip(at, read.tally.rows, strict=True)]
        for name in SPLITS:
            (tmp / name).mkdir()
        encode = ray.remote(**options)(_encode_file)
        shared = ray.put(pipe)
        refs = {
            encode.remote(read, shared, offsets[i], totals, columns, compression, tmp): i
            for i, read in enumerate(reads)
        }
        pieces = [p for _, got in _as_done(ray, refs, sources) for p in got]
        _join_pieces(tmp, pieces, totals, columns, compression)
        clock("encode")
        return tally
    finally:
        if started:
            ray.shutdown()


def _join_pieces(
    tmp: Path,
    pieces: list[tuple[int, int, int, Path]],
    totals: list[int],
    columns: list[write.Column],
    compression: str,
) -> None:
    """Write the parts that straddle files from their pieces (in row order), and a split
    without rows as one empty part, as the local engine does."""
    by_part: dict[tuple[int, int], list[tuple[int, Path]]] = defaultdict(list)
    for k, p, start, path in pieces:
        by_part[(k, p)].append((start, path))
    for (k, p), got in sorted(by_part.items()):
        got.sort()
        rows = np.concatenate([np.load(path) for _, path in got], axis=1)
        write.write_part(tmp / SPLITS[k] / f"part-{p:05d}.parquet", columns, rows, compression)
        for _, path in got:
            path.unlink()
    for k, name in enumerate(SPLITS):
        if totals[k] == 0:
            write.write_part(tmp / name / "part-00000.parquet", columns, None, compression)


def _as_done(ray: Any, refs: dict[Any, int], sources: list[Source]) -> Any:
    """``(ref, result)`` of the tasks ``refs`` (ref -> input index) as they finish. A task's
    own error is raised as it is (a :class:`DataError` names its file as the local engine
    does); a worker that died beyond its retries, or any other Ray failure, is a one-line
    :class:`DataError` naming the file."""
    pending = list(refs)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            ref = done[0]
            try:
                yield ref, ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, (DataError, OSError)):
                    raise cause from None
                raise DataError(
                    f"{sources[refs[ref]].path}: a ray task failed: {_one_line(cause or exc)}"
                ) from None
            except ray.exceptions.RayError as exc:
                raise DataError(
                    f"{sources[refs[ref]].path}: the ray worker preparing it died "
                    f"{TASK_RETRIES + 1} times ({type(exc).__name__}); nothing was published"
                ) from None
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _connect(ray: Any, address: str | None) -> bool:
    """Join the Ray at ``address`` (None: start one on this machine), unless this process
    already joined one; True when this call started or joined it (and should shut it down)."""
    if ray.is_initialized():
        return False
    quiet = {"logging_level": "ERROR", "log_to_driver": False}
    if address is None:
        ray.init(include_dashboard=False, **quiet)
        return True
    if address != "auto":
        _probe(address)
    try:
        ray.init(address=address, **quiet)
    except (ConnectionError, TimeoutError, RuntimeError, ValueError) as exc:
        raise DataError(
            f"data.ray_address {address!r}: cannot join the Ray cluster: {_one_line(exc)}"
        ) from None
    return True


_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""A gRPC client's first bytes (HTTP/2's preface and an empty SETTINGS frame): a Ray head
(its GCS, or the Ray Client server of ``ray://``) answers with a SETTINGS frame of its own."""


def _probe(address: str) -> None:
    """Raise a one-line DataError naming ``address`` unless a gRPC server there answers within
    :data:`CONNECT_TIMEOUT_S`: Ray's own connection retries take minutes, against nothing or
    against a port that accepts and stays silent."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise DataError(
            f"data.ray_address {address!r}: expected HOST:PORT, ray://HOST:PORT or auto"
        )
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    answer = b""
    try:
        with socket.create_connection(
            (host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S
        ) as sock:
            sock.sendall(_HTTP2_PREFACE)
            while len(answer) < 9 and time.monotonic() < deadline:
                sock.settimeout(max(deadline - time.monotonic(), 0.01))
                got = sock.recv(9 - len(answer))
                if not got:
                    break
                answer += got
    except OSError as exc:
        if not isinstance(exc, TimeoutError):
            reason = exc.strerror or str(exc) or type(exc).__name__
            raise DataError(
                f"data.ray_address {address!r}: no Ray cluster answers there ({reason})"
            ) from None
    if len(answer) < 9 or answer[3] != 4:  # byte 3 of a frame header: its type (4: SETTINGS)
        raise DataError(
            f"data.ray_address {address!r}: no Ray cluster answers there (no gRPC answer "
            f"within {CONNECT_TIMEOUT_S:g} s)"
        )


__all__ = ["CONNECT_TIMEOUT_S", "TASK_RETRIES", "encode_sources_ray"]
