"""Which split (train 0 / valid 1 / test 2) each input row goes to.

Three ways, decided once per preparation by :func:`plan_splits` into a :class:`SplitPlan`:

* **explicit** -- files given as ``train`` / ``valid`` / ``test`` keep their rows in that split,
  as given (nothing is pooled or re-drawn);
* **random** (``data.split_order: random``) -- each row of the inputs is assigned by a 32-bit
  integer hash (lowbias32) of (file index, row, ``split_seed``) against the ``split``
  fractions: stable across polars versions and machines, independent of chunking;
* **time** (``data.split_order: time``) -- Criteo rows are in time order, so the train split is
  the first rows and valid / test the last ones: rows are numbered across the inputs in the
  order given and cut at ``floor(f_train·N)`` and ``floor((f_train + f_valid)·N)`` (N records,
  malformed ones included, so skipping them does not move the cuts). When the inputs are
  Criteo 1TB ``day_N`` files (at least three, or any number with whole-number proportions),
  whole days are assigned instead, in day order and without a gap (:mod:`ctrcal.preparation.days`):
  whole numbers count days (``split: [22, 1, 1]`` on 24 days gives days 0-21 / 22 / 23),
  fractions give a day to the split its middle byte falls in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ctrcal.core.errors import DataError
from ctrcal.preparation.chunks import is_gzip, iter_text_chunks
from ctrcal.preparation.days import check_days, day_number, days_by_count, whole_numbers

if TYPE_CHECKING:
    import polars as pl

SPLITS: tuple[str, ...] = ("train", "valid", "test")
SPLIT_COL = "_split"
SPLIT_ORDERS: tuple[str, ...] = ("random", "time")


# the fractions of data.split sum to 1 within this (0.7 + 0.2 + 0.1 is 0.9999999999999999)
_SPLIT_TOLERANCE = 1e-6


def check_fractions(fractions: Sequence[float]) -> list[float]:
    """``data.split`` normalised to sum 1: the one rule on the split fractions.

    Three numbers ``>= 0`` with a positive train share (train, valid, test), either fractions
    that sum to 1 (``[0.8, 0.1, 0.1]``) or whole-number proportions (``[22, 1, 1]``: 22 days
    to one and one). Any other triple is refused rather than rescaled: ``[0.8, 0.3, 0.1]`` is
    more likely a typo than a wish for 73 % of the rows in train.

    Raises:
        DataError: ``data.split: expected ...`` (the rule book reports it at that key).
    """
    try:
        fr = [float(f) for f in fractions]
    except (TypeError, ValueError):
        fr = []
    if len(fr) != 3 or any(not f >= 0 or math.isinf(f) for f in fr) or fr[0] <= 0:
        raise DataError(
            "data.split: expected three fractions >= 0 with train > 0 (train, valid, test), "
            f"got {list(fractions)}"
        )
    total = sum(fr)
    summed = math.isclose(total, 1.0, rel_tol=0.0, abs_tol=_SPLIT_TOLERANCE)
    if not summed and not whole_numbers(fr):
        raise DataError(
            f"data.split: the fractions (train, valid, test) must sum to 1, got "
            f"{list(fractions)} (sum {total:g}); or give whole-number proportions such as "
            "[8, 1, 1]"
        )
    return [f / total for f in fr]


def check_split_sources(data: Any) -> list[tuple[str, str]]:
    """``(key, message)`` of every problem with how ``data`` (a config's ``data`` section)
    names its files: either ``inputs`` (split by ``data.split``) or explicit
    ``train``/``valid``/``test`` files."""
    explicit = bool(data.train or data.valid or data.test)
    out: list[tuple[str, str]] = []
    if data.split_order == "time" and explicit:
        message = (
            "'time' splits data.inputs (or synthetic data); data.train/valid/test are "
            "explicit splits and are kept as given"
        )
        out.append(("data.split_order", message))
    if explicit and data.inputs:
        message = "give either inputs (split by data.split) or train/valid/test files, not both"
        out.append(("data.inputs", message))
    if explicit and not data.train:
        out.append(("data.train", "train files are needed when valid or test files are given"))
    return out


@dataclass
class SplitPlan:
    """How rows are assigned to splits (see the module docstring).

    Attributes:
        mode: ``explicit``, ``random``, ``time`` (rows) or ``time_files`` (whole day files).
        fractions: normalised split fractions (random / time modes).
        seed: ``split_seed`` (random mode).
        file_split: per input file, its split (explicit / whole-file modes), else None.
        offsets: per input file, the global index of its first record (time mode).
        total: number of records over all inputs (time mode).
        time_values: the first time of valid and of test (time_column mode).
    """

    mode: str
    fractions: list[float] | None = None
    seed: int = 0
    file_split: list[int | None] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    total: int = 0
    time_values: tuple[int, int] = (0, 0)

    def describe(self) -> dict | str:
        """What the feature map records about the split."""
        if self.mode == "explicit":
            return "explicit"
        out: dict = {
            "order": "random" if self.mode == "random" else "time",
            "fractions": self.fractions,
        }
        if self.mode == "random":
            out["seed"] = self.seed
        if self.mode == "time_files":
            out["whole_files"] = True
        if self.mode == "time_column":
            out["first_time"] = {"valid": self.time_values[0], "test": self.time_values[1]}
        return out

    def codes(
        self, file: np.ndarray, row: np.ndarray, time: np.ndarray | None = None
    ) -> np.ndarray:
        """[N] split codes (uint8) of records ``row`` (0-based index within its file) of the
        inputs ``file`` (their index), both [N]; ``time`` [N] their time column's values
        (``time_column`` mode)."""
        if self.file_split:
            if any(s is None for s in self.file_split):
                raise DataError(f"{self.mode} split: an input without a split")  # unreachable
            return np.asarray(self.file_split, dtype=np.uint8)[file]
        if self.mode == "random":
            return _hash_split(file, row, self.fractions, self.seed)
        if self.mode == "time":
            cut1, cut2 = self.time_cuts()
            g = row.astype(np.int64) + np.asarray(self.offsets, dtype=np.int64)[file]
            return (g >= cut1).astype(np.uint8) + (g >= cut2)
        if self.mode == "time_column":
            cut1, cut2 = self.time_values
            return (time >= cut1).astype(np.uint8) + (time >= cut2)
        raise DataError(f"no split in {self.mode} mode")  # unreachable

    def time_cuts(self) -> tuple[int, int]:
        f0, f1 = self.fractions[0], self.fractions[0] + self.fractions[1]
        return int(f0 * self.total), int(f1 * self.total)


def read_order(paths: Sequence[Path], order: str) -> list[int]:
    """The order to read the inputs in: Criteo ``day_N`` files in day order for a time split
    (a shell glob puts ``day_10`` before ``day_2``), else as given."""
    days = [day_number(p) for p in paths]
    if order == "time" and all(d is not None for d in days):
        return sorted(range(len(paths)), key=lambda i: days[i])
    return list(range(len(paths)))


def plan_splits(
    paths: Sequence[Path],
    explicit: Sequence[int | None],
    fractions: Sequence[float],
    seed: int,
    order: str,
    header_lines: Sequence[int],
) -> SplitPlan:
    """Decide the split of every input.

    Args:
        paths: the input files, in reading order (see :func:`read_order`).
        explicit: per input, its split when given explicitly (0/1/2), else None (all or none).
        fractions: ``data.split``; seed: ``data.split_seed``; order: ``data.split_order``.
        header_lines: per input, lines before the first record.
    """
    n = len(paths)
    if order not in SPLIT_ORDERS:
        raise DataError(f"data.split_order must be one of {', '.join(SPLIT_ORDERS)}, got {order!r}")
    if all(s is not None for s in explicit):
        return SplitPlan("explicit", file_split=list(explicit))
    fr = check_fractions(fractions)
    if order == "random":
        return SplitPlan("random", fractions=fr, seed=int(seed))
    by_count = whole_numbers(fractions)
    if (n >= 3 or by_count) and all(day_number(p) is not None for p in paths):
        check_days(paths)
        if by_count:
            return SplitPlan("time_files", fractions=fr, file_split=days_by_count(paths, fractions))
        sizes = [text_bytes(p) for p in paths]
        total, done, split = sum(sizes), 0, []
        for size in sizes:
            middle = (done + size / 2) / total
            split.append(0 if middle < fr[0] else (1 if middle < fr[0] + fr[1] else 2))
            done += size
        for k, name in enumerate(SPLITS):
            if fr[k] > 0 and k not in split:
                # a truncated gzip's trailer gives no size: name that file, not the split
                for p in paths:
                    if is_gzip(p):
                        count_records(p)
                raise DataError(
                    f"data.split_order: time assigns whole day files; data.split "
                    f"{list(fractions)} leaves the {name} split without a day out of {n} "
                    f"(e.g. use [{n - 2}, 1, 1])"
                )
        return SplitPlan("time_files", fractions=fr, file_split=split)
    counts = [count_records(p, h) for p, h in zip(paths, header_lines, strict=True)]
    offsets = [sum(counts[:i]) for i in range(n)]
    return SplitPlan("time", fractions=fr, offsets=offsets, total=sum(counts))


def plan_time_column(counts: pl.DataFrame, fractions: Sequence[float]) -> SplitPlan:
    """Splits cut by a time column's value: ``counts`` (``time``, ``count`` over all inputs)
    in time order, each time value to the split its middle row falls in (all rows of one time
    in one split), as whole day files are assigned."""
    fr = check_fractions(fractions)
    # polars here only: the rule book asks this module's split rules without loading it
    import polars as pl

    counts = counts.group_by("time").agg(pl.col("count").sum()).sort("time")
    times, c = counts["time"].to_numpy(), counts["count"].to_numpy().astype(np.float64)
    total = c.sum()
    if total == 0:
        raise DataError("data.split_order: time: the time column holds no integer values")
    middle = (np.cumsum(c) - c / 2) / total
    split = (middle >= fr[0]).astype(np.int64) + (middle >= fr[0] + fr[1])
    for k, name in enumerate(SPLITS):
        if fr[k] > 0 and not (split == k).any():
            raise DataError(
                f"data.split_order: time: data.split {list(fractions)} leaves the "
                f"{name} split without a time value out of {len(times)}"
            )
    big = int(times.max()) + 1
    first = [int(times[split >= k][0]) if (split >= k).any() else big for k in (1, 2)]
    return SplitPlan("time_column", fractions=fr, time_values=(first[0], first[1]))


def count_records(path: Path, header_lines: int = 0) -> int:
    """Records of a (possibly gzipped) text file as the CSV reader numbers them: lines, an
    unterminated last line included, minus the header."""
    lines, last = 0, b"\n"
    for block in iter_text_chunks(path, 16 << 20):
        lines += int(np.count_nonzero(np.frombuffer(block, np.uint8) == 10))
        last = bytes(block[-1:]) or last
    if last != b"\n":
        lines += 1
    return max(lines - header_lines, 0)


def text_bytes(path: Path) -> int:
    """Size of a file's text: its size, or for gzip the larger of the trailer's (mod 2**32)
    size and three times the compressed size (Criteo text compresses about 4:1)."""
    size = path.stat().st_size
    if not is_gzip(path):
        return size
    with open(path, "rb") as fh:
        fh.seek(max(size - 4, 0))
        isize = int.from_bytes(fh.read(4), "little")
    return max(isize, 3 * size)


def _hash_split(
    file: np.ndarray, row: np.ndarray, fractions: Sequence[float], seed: int
) -> np.ndarray:
    """Split code 0/1/2 from a 32-bit integer hash (lowbias32) of (file, row, seed): uint32
    arithmetic wraps modulo 2^32, which is the hash's arithmetic."""
    m = 2**32
    with np.errstate(over="ignore"):
        x = row.astype(np.uint32) + file.astype(np.uint32) * np.uint32(0x9E3779B1)
        x += np.uint32((seed % m) * 0x85EBCA77 % m)
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x7FEB352D)
        x ^= x >> np.uint32(15)
        x *= np.uint32(0x846CA68B)
        x ^= x >> np.uint32(16)
    u = x.astype(np.float64) / m
    f0, f1 = fractions[0], fractions[0] + fractions[1]
    return (u >= f0).astype(np.uint8) + (u >= f1)
