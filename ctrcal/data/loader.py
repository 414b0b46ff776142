"""Encoded parquet -> contiguous batches.

A :class:`Batch` is three tensors; models read ``categorical`` and ``numeric``.
:class:`ParquetCTRData` reads one split of a prepared directory (see
:mod:`ctrcal.data.prepare`) in one of three modes:

* ``memory`` (default): the split is loaded once into contiguous CPU tensors (categoricals kept
  as int32 to halve memory, widened to int64 per batch); batches are slices, or with
  ``shuffle`` one gather per batch through a seeded ``torch.randperm``.
* ``device``: the same tensors live on ``device`` (e.g. the whole split on the GPU); the
  permutation is drawn there too, so no host work happens per batch.
* ``stream``: parquet row groups are read one at a time (pyarrow); with ``shuffle`` the row
  groups are visited in a random order and rows are shuffled within a bounded buffer of
  ``buffer_rows`` -- for data larger than memory.

Missing numerics are NaN in ``Batch.numeric``; there is no per-row collation anywhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ctrcal.errors import DataError


@dataclass
class Batch:
    """One mini-batch of encoded Criteo rows.

    Attributes:
        categorical: int64 [B, Fc] ids into each field's vocabulary (field-local ids).
        numeric: float32 [B, Fn] continuous values in model-input space (NaN = missing).
        label: float32 [B] clicks (0/1).
    """

    categorical: torch.Tensor
    numeric: torch.Tensor
    label: torch.Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(
            self.categorical.to(device, non_blocking=non_blocking),
            self.numeric.to(device, non_blocking=non_blocking),
            self.label.to(device, non_blocking=non_blocking),
        )

    def __len__(self) -> int:
        return self.label.shape[0]


MODES = ("memory", "device", "stream")


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
        data_dir: a directory written by :func:`ctrcal.data.prepare.prepare`.
        split: ``train``, ``valid`` or ``test``.
        mode: ``memory``, ``device`` or ``stream`` (see the module docstring).
        device: where ``device`` mode keeps the tensors (default: CUDA if available).
        buffer_rows: ``stream`` mode shuffle buffer size in rows.

    Example::

        data = ParquetCTRData("prepared/", "train")
        for batch in data.batches(4096, shuffle=True, seed=0):
            logits = model(batch.categorical, batch.numeric)
    """

    def __init__(
        self,
        data_dir: str | Path,
        split: str = "train",
        mode: str = "memory",
        device: torch.device | str | None = None,
        buffer_rows: int = 1 << 20,
    ) -> None:
        from ctrcal.data.features import FeatureMap

        if mode not in MODES:
            raise DataError(f"unknown data mode {mode!r} (valid: {', '.join(MODES)})")
        self.data_dir = Path(data_dir)
        self.split = split
        self.mode = mode
        self.feature_map = FeatureMap.load(self.data_dir)
        self.files = _split_files(self.data_dir, split)
        self.buffer_rows = int(buffer_rows)
        self._cat_cols = list(self.feature_map.categorical_fields)
        self._num_cols = list(self.feature_map.numeric_fields)
        if mode == "device":
            from ctrcal.utils import resolve_device

            self.device = torch.device(device) if device is not None else resolve_device("auto")
        else:
            self.device = torch.device("cpu")
        self._num_rows = self._count_rows()
        self._tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        if mode != "stream":
            self._load()

    # -- reading --------------------------------------------------------------------------

    def _count_rows(self) -> int:
        import pyarrow.parquet as pq

        try:
            return sum(pq.ParquetFile(f).metadata.num_rows for f in self.files)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types
            raise DataError(f"{self.data_dir / self.split}: unreadable parquet: {exc}") from None

    def _arrays(self, table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """pyarrow table -> (int32 [N, Fc], float32 [N, Fn] NaN = missing, float32 [N])."""
        n = table.num_rows
        cat = np.empty((n, len(self._cat_cols)), dtype=np.int32)
        for j, name in enumerate(self._cat_cols):
            cat[:, j] = table.column(name).to_numpy()
        num = np.empty((n, len(self._num_cols)), dtype=np.float32)
        for j, name in enumerate(self._num_cols):
            # nulls come back as NaN for floating columns
            num[:, j] = table.column(name).to_numpy()
        label = np.array(table.column("label").to_numpy(), dtype=np.float32)  # writable copy
        return cat, num, label

    def _read_table(self, files: list[Path] | None = None):
        import pyarrow as pa
        import pyarrow.parquet as pq

        columns = ["label", *self._cat_cols, *self._num_cols]
        try:
            tables = [pq.read_table(f, columns=columns) for f in (files or self.files)]
        except Exception as exc:  # noqa: BLE001
            raise DataError(f"{self.data_dir / self.split}: unreadable parquet: {exc}") from None
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]

    def _load(self) -> None:
        cat, num, label = self._arrays(self._read_table())
        tensors = (torch.from_numpy(cat), torch.from_numpy(num), torch.from_numpy(label))
        if self.device.type != "cpu":
            tensors = tuple(t.to(self.device) for t in tensors)
        self._tensors = tensors  # type: ignore[assignment]

    # -- public ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._num_rows

    def all(self) -> Batch:
        """The whole split as one :class:`Batch` (memory and device modes)."""
        if self._tensors is None:
            cat, num, label = self._arrays(self._read_table())
            return Batch(torch.from_numpy(cat).long(), torch.from_numpy(num),
                         torch.from_numpy(label))  # fmt: skip
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
            yield Batch(cat.index_select(0, idx).long(), num.index_select(0, idx),
                        label.index_select(0, idx))  # fmt: skip

    def _stream(
        self, batch_size: int, shuffle: bool, seed: int | None, drop_last: bool
    ) -> Iterator[Batch]:
        import pyarrow.parquet as pq

        columns = ["label", *self._cat_cols, *self._num_cols]
        groups = [(f, g) for f in self.files for g in range(pq.ParquetFile(f).num_row_groups)]
        rng = np.random.default_rng(seed) if shuffle else None
        if rng is not None:
            groups = [groups[i] for i in rng.permutation(len(groups))]
        handles: dict[Path, pq.ParquetFile] = {}
        buffer: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        buffered = 0

        def drain(final: bool) -> Iterator[Batch]:
            nonlocal buffer, buffered
            cat = np.concatenate([b[0] for b in buffer])
            num = np.concatenate([b[1] for b in buffer])
            lab = np.concatenate([b[2] for b in buffer])
            if rng is not None:
                order = rng.permutation(len(lab))
                cat, num, lab = cat[order], num[order], lab[order]
            n = len(lab)
            full = n - n % batch_size
            for i in range(0, full, batch_size):
                yield _batch(cat[i : i + batch_size], num[i : i + batch_size],
                             lab[i : i + batch_size])  # fmt: skip
            rest = (cat[full:], num[full:], lab[full:])
            buffer, buffered = ([rest], n - full) if n > full else ([], 0)
            if final and buffered and not drop_last:
                yield _batch(*rest)
                buffer, buffered = [], 0

        for f, g in groups:
            pf = handles.get(f) or handles.setdefault(f, pq.ParquetFile(f))
            buffer.append(self._arrays(pf.read_row_group(g, columns=columns)))
            buffered += len(buffer[-1][2])
            if buffered >= max(self.buffer_rows if shuffle else batch_size, batch_size):
                yield from drain(final=False)
        if buffered:
            yield from drain(final=True)


def _batch(cat: np.ndarray, num: np.ndarray, label: np.ndarray) -> Batch:
    return Batch(torch.from_numpy(np.ascontiguousarray(cat)).long(),
                 torch.from_numpy(np.ascontiguousarray(num)),
                 torch.from_numpy(np.ascontiguousarray(label)))  # fmt: skip
