"""Encoded parquet -> contiguous batches.

A :class:`Batch` is three tensors; models read ``categorical`` and ``numeric``.
:class:`ParquetCTRData` reads one split of a prepared directory (see
:mod:`ctrcal.preparation.prepare`) in one of three modes:

* ``memory`` (default): the split is loaded once into contiguous CPU tensors (categoricals kept
  as int32 to halve memory, widened to int64 per batch); batches are slices, or with
  ``shuffle`` one gather per batch through a seeded ``torch.randperm``.
* ``device``: the same tensors live on ``device`` (e.g. the whole split on the GPU); the
  permutation is drawn there too, so no host work happens per batch.
* ``stream``: for data larger than memory. A background thread reads parquet row groups
  (pyarrow) into blocks of about ``buffer_rows`` rows, ahead of the consumer (``prefetch``
  blocks); with ``shuffle`` the row groups come in a seeded random order and the rows of each
  block are permuted, so every batch is a contiguous slice of a block. Memory is a few blocks,
  not the split.

Missing numerics are NaN in ``Batch.numeric``; there is no per-row collation anywhere.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from ctrcal.core.batch import Batch
from ctrcal.core.errors import DataError

# arrow type name -> numpy dtype of its values buffer (the types prepare writes)
_ARROW_DTYPES = {"int32": np.int32, "int64": np.int64, "float": np.float32, "double": np.float64}


def copy_column(column, dst: np.ndarray) -> None:
    """Copy an int / float arrow column into ``dst`` (a numpy view), nulls as NaN.

    Reads arrow's buffers directly (DLPack where a chunk has no nulls) instead of pyarrow's
    ``to_numpy``, whose conversion path imports pandas on first use: half a second of every
    process that reads a split, for nothing.

    Raises:
        DataError: a column type other than int32/int64/float/double, or nulls in an
            integer column.
    """
    pos = 0
    for chunk in column.chunks:
        m = len(chunk)
        if chunk.null_count == 0:
            dst[pos : pos + m] = np.from_dlpack(chunk)
        else:
            dtype = _ARROW_DTYPES.get(str(chunk.type))
            if dtype is None or not np.issubdtype(dtype, np.floating):
                raise DataError(f"a {chunk.type} column with missing values; expected floats")
            validity, values = chunk.buffers()[:2]
            start = chunk.offset
            part = dst[pos : pos + m]
            part[:] = np.frombuffer(values, dtype=dtype, count=start + m)[start:]
            valid = np.unpackbits(
                np.frombuffer(validity, dtype=np.uint8), count=start + m, bitorder="little"
            )[start:]
            part[valid == 0] = np.nan
        pos += m


MODES = ("memory", "device", "stream")


def open_parquet(path: Path):
    """``pyarrow.parquet.ParquetFile(path)``; DataError naming the file when it is unreadable
    (truncated, not parquet)."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types
        raise DataError(f"{path}: unreadable parquet: {exc}") from None


def _split_files(data_dir: Path, split: str) -> list[Path]:
    directory = data_dir / split
    if not directory.is_dir():
        raise DataError(
            f"{data_dir}: no '{split}' split (expected {directory}/*.parquet; "
            "prepare the data with 'ctrcal prepare')"
        )
    files = sorted(directory.glob("*.parquet"))
    if not files:
        raise DataError(f"{directory}: no parquet files")
    return files


class ParquetCTRData:
    """One split of a prepared directory as batches.

    Args:
        data_dir: a directory written by :func:`ctrcal.preparation.prepare.prepare`.
        split: ``train``, ``valid`` or ``test``.
        mode: ``memory``, ``device`` or ``stream`` (see the module docstring).
        device: where ``device`` mode keeps the tensors (default: CUDA if available).
        buffer_rows: ``stream`` mode shuffle buffer size in rows (rows are shuffled within
            blocks of this many rows drawn from randomly ordered row groups).
        prefetch: ``stream`` mode: blocks read ahead by the background thread.

    Example::

        data = ParquetCTRData("prepared/", "train")
        for batch in data.batches(4096, shuffle=True, seed=0):
            logits = model(batch.inputs())
    """

    def __init__(
        self,
        data_dir: str | Path,
        split: str = "train",
        mode: str = "memory",
        device: torch.device | str | None = None,
        buffer_rows: int = 1 << 20,
        prefetch: int = 2,
    ) -> None:
        from ctrcal.data.feature_map import FeatureMap

        if mode not in MODES:
            raise DataError(f"unknown data mode {mode!r} (valid: {', '.join(MODES)})")
        self.data_dir = Path(data_dir)
        self.split = split
        self.mode = mode
        self.feature_map = FeatureMap.load(self.data_dir)
        self.files = _split_files(self.data_dir, split)
        self.buffer_rows = int(buffer_rows)
        self.prefetch = int(prefetch)
        if self.buffer_rows < 1 or self.prefetch < 1:
            raise DataError(
                f"buffer_rows and prefetch must be >= 1, got {buffer_rows} and {prefetch}"
            )
        self._cat_cols = list(self.feature_map.categorical_fields)
        self._num_cols = list(self.feature_map.numeric_fields)
        if mode == "device":
            from ctrcal.core.devices import resolve_device

            self.device = torch.device(device) if device is not None else resolve_device("auto")
        else:
            self.device = torch.device("cpu")
        self._num_rows = self._count_rows()
        self._tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        if mode != "stream":
            self._load()

    # -- reading --------------------------------------------------------------------------

    def _count_rows(self) -> int:
        return sum(open_parquet(f).metadata.num_rows for f in self.files)

    def _arrays_of(
        self, table, out: tuple[np.ndarray, ...] | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """pyarrow table -> (int32 [N, Fc], float32 [N, Fn] NaN = missing, float32 [N]).

        Each column is copied once, from arrow's buffer (a zero-copy numpy view where it has
        no nulls) into its place in a contiguous row-major array (``out``'s, if given: row
        slices of larger arrays).
        """
        n = table.num_rows
        if out is None:
            out = (
                np.empty((n, len(self._cat_cols)), dtype=np.int32),
                np.empty((n, len(self._num_cols)), dtype=np.float32),
                np.empty(n, dtype=np.float32),
            )
        cat, num, label = out
        for j, name in enumerate(self._cat_cols):
            copy_column(table.column(name), cat[:, j])
        for j, name in enumerate(self._num_cols):
            copy_column(table.column(name), num[:, j])  # null -> NaN
        copy_column(table.column("label"), label)
        return cat, num, label

    def _read_all(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The whole split as (int32 [N, Fc], float32 [N, Fn], float32 [N]) CPU tensors.

        Read row group by row group straight into the result, so the peak is the split's
        tensors plus one row group (not twice the split, as a whole arrow table first would).
        """
        n = self._num_rows
        out = (
            np.empty((n, len(self._cat_cols)), dtype=np.int32),
            np.empty((n, len(self._num_cols)), dtype=np.float32),
            np.empty(n, dtype=np.float32),
        )
        columns = ["label", *self._cat_cols, *self._num_cols]
        pos = 0
        for f in self.files:
            pf = open_parquet(f)
            try:
                for g in range(pf.num_row_groups):
                    table = pf.read_row_group(g, columns=columns)
                    m = table.num_rows
                    self._arrays_of(table, out=tuple(a[pos : pos + m] for a in out))
                    pos += m
            except DataError:
                raise
            except Exception as exc:  # noqa: BLE001 - pyarrow raises several types
                raise DataError(f"{f}: unreadable parquet: {exc}") from None
        if pos != n:
            raise DataError(f"{self.data_dir / self.split}: changed while being read")
        return tuple(torch.from_numpy(a) for a in out)  # type: ignore[return-value]

    def _load(self) -> None:
        tensors = self._read_all()
        if self.device.type != "cpu":
            tensors = tuple(t.to(self.device) for t in tensors)
        self._tensors = tensors  # type: ignore[assignment]

    # -- public ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._num_rows

    def all(self) -> Batch:
        """The whole split as one :class:`Batch` (memory and device modes)."""
        if self._tensors is None:
            cat, num, label = self._read_all()
            return Batch(cat.long(), num, label)
        cat, num, label = self._tensors
        return Batch(cat.long(), num, label)

    def batches(
        self,
        batch_size: int,
        shuffle: bool = False,
        seed: int | None = None,
        drop_last: bool = False,
    ) -> Iterator[Batch]:
        """Yield batches of ``batch_size`` rows (the last one smaller unless ``drop_last``).

        Args:
            batch_size: rows per batch.
            shuffle: visit rows in a random order (a fresh permutation per call).
            seed: seeds that permutation (None: torch's global generator).
            drop_last: drop a final partial batch.
        """
        if batch_size <= 0:
            raise DataError(f"batch_size must be positive, got {batch_size}")
        if self.mode == "stream":
            yield from self._stream(batch_size, shuffle, seed, drop_last)
            return
        if self._tensors is None:
            self._load()
        cat, num, label = self._tensors  # type: ignore[misc]
        n = label.shape[0]
        stop = n - n % batch_size if drop_last else n
        if not shuffle:
            for i in range(0, stop, batch_size):
                j = min(i + batch_size, n)
                yield Batch(cat[i:j].long(), num[i:j], label[i:j])
            return
        gen = None
        if seed is not None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(seed)
        perm = torch.randperm(n, generator=gen, device=self.device)
        for i in range(0, stop, batch_size):
            idx = perm[i : i + batch_size]
            yield Batch(
                cat.index_select(0, idx).long(),
                num.index_select(0, idx),
                label.index_select(0, idx),
            )

    def _stream(
        self, batch_size: int, shuffle: bool, seed: int | None, drop_last: bool
    ) -> Iterator[Batch]:
        if shuffle and seed is None:
            # like the other modes, an unseeded shuffle follows torch's global generator
            seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
        blocks = _BlockReader(self, batch_size, shuffle, seed, self.prefetch)
        try:
            for cat, num, label in blocks:
                # every block but the last holds a multiple of batch_size rows
                n = label.shape[0]
                stop = n - n % batch_size if drop_last else n
                for i in range(0, stop, batch_size):
                    yield Batch(
                        cat[i : i + batch_size].long(),
                        num[i : i + batch_size],
                        label[i : i + batch_size],
                    )
        finally:
            blocks.close()


_DONE = object()


class _BlockReader:
    """Background reading for ``stream`` mode: parquet row groups -> shuffled tensor blocks.

    A thread plans blocks of whole row groups (in file order, or with ``shuffle`` in a seeded
    random order) of at least ``buffer_rows`` rows, allocates each block's arrays once
    (categoricals int32 [N, Fc], numerics float32 [N, Fn] with NaN for null, labels float32
    [N]) and fills them: pyarrow decodes a group (without holding the GIL), its columns are
    copied from zero-copy numpy views of arrow's buffers -- in order straight into the
    block's rows, or with ``shuffle`` into a group array scattered to its rows of a random
    permutation of the block (numpy, GIL released). The block minus the rows after its last
    whole batch is queued as tensors (no copy); those rows are carried into the next block.
    Up to ``prefetch`` blocks wait in the queue, so reading and shuffling overlap with the
    training step on one extra thread, and memory holds about ``prefetch + 2`` blocks
    whatever the size of the split.
    """

    def __init__(
        self,
        data: ParquetCTRData,
        batch_size: int,
        shuffle: bool,
        seed: int | None,
        prefetch: int,
    ) -> None:
        self._data = data
        self._batch = batch_size
        self._shuffle = shuffle
        self._seed = seed
        self._target = max(data.buffer_rows if shuffle else batch_size, batch_size)
        self._columns = ["label", *data._cat_cols, *data._num_cols]
        handles = [open_parquet(f) for f in data.files]
        self._groups = [
            (pf, g, pf.metadata.row_group(g).num_rows)
            for pf in handles
            for g in range(pf.num_row_groups)
        ]
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ctrcal-stream", daemon=True)
        self._thread.start()

    # -- consumer side --------------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        while True:
            item = self._queue.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        """Stop the thread (also when the consumer stops early) and drop queued blocks."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(timeout=0.05)

    # -- producer side --------------------------------------------------------------------

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            self._produce()
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            if isinstance(exc, Exception) and not isinstance(exc, DataError):
                where = self._data.data_dir / self._data.split
                exc = DataError(f"{where}: reading parquet failed: {exc}")
            self._put(exc)
            return
        self._put(_DONE)

    def _produce(self) -> None:
        # numpy only, on this one thread: torch ops here would start a second intra-op
        # thread team competing with the training step's (and spinning while idle)
        groups = self._groups
        rng = np.random.default_rng(self._seed) if self._shuffle else None
        if rng is not None:
            groups = [groups[i] for i in rng.permutation(len(groups))]
        carry: tuple[np.ndarray, ...] | None = None
        i = 0
        while i < len(groups) or carry is not None:
            # the block: the rows carried over plus whole row groups up to the target size,
            # allocated once; each group is written straight to its (permuted) rows
            rows = 0 if carry is None else len(carry[2])
            take = []
            while i < len(groups) and (rows < self._target or not take):
                take.append(groups[i])
                rows += groups[i][2]
                i += 1
            final = i == len(groups)
            block = (
                np.empty((rows, len(self._data._cat_cols)), dtype=np.int32),
                np.empty((rows, len(self._data._num_cols)), dtype=np.float32),
                np.empty(rows, dtype=np.float32),
            )
            dest = rng.permutation(rows) if rng is not None else None
            pos = 0
            if carry is not None:
                pos = _place(block, carry, pos, dest)
            for pf, g, n in take:
                if self._stop.is_set():
                    return
                table = pf.read_row_group(g, columns=self._columns, use_threads=False)
                if dest is None:  # in order: arrow columns straight into the block
                    self._data._arrays_of(table, out=tuple(a[pos : pos + n] for a in block))
                    pos += n
                else:
                    pos = _place(block, self._data._arrays_of(table), pos, dest)
            full = rows if final else rows - rows % self._batch
            if full and not self._put(tuple(torch.from_numpy(a[:full]) for a in block)):
                return
            carry = tuple(a[full:].copy() for a in block) if full < rows else None
            if final:
                return


def _place(
    block: tuple[np.ndarray, ...],
    part: tuple[np.ndarray, ...],
    pos: int,
    dest: np.ndarray | None,
) -> int:
    """Copy ``part``'s rows to rows ``pos..`` of ``block`` -- or, with a permutation ``dest``
    of the block's rows, to rows ``dest[pos..]`` (one scatter per array). Returns the next pos."""
    n = len(part[2])
    for a, x in zip(block, part, strict=True):
        if dest is None:
            a[pos : pos + n] = x
        else:
            a[dest[pos : pos + n]] = x
    return pos + n
