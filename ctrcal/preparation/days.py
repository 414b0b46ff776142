"""Criteo 1TB ``day_N`` files split by time: which day goes to which split.

With ``data.split_order: time``, day files are assigned whole, in day order. Whole-number
``data.split`` proportions count days (``[22, 1, 1]``: the first 22 days train, the next
valid, the last test), and must add up to the number of days given; fractions assign each day
to the split its middle byte falls in. Either way the days must run without a gap: a missing
``day_N`` between the first and the last would silently move a split across it, so it is an
error naming that day.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from ctrcal.core.errors import DataError

_DAY_FILE = re.compile(r"day_(\d+)(\.gz|\.txt|\.tsv)?$")


def day_number(path: Path) -> int | None:
    """N of a Criteo 1TB ``day_N`` file (``day_N``, ``day_N.gz``), else None."""
    m = _DAY_FILE.fullmatch(path.name)
    return int(m.group(1)) if m else None


def whole_numbers(fractions: Sequence[float]) -> bool:
    """Whether ``data.split`` is whole-number proportions (days, for day files)."""
    return all(float(f).is_integer() for f in fractions)


def check_days(paths: Sequence[Path]) -> None:
    """Refuse day files (in day order) that name one day twice or leave one out."""
    days = [day_number(p) for p in paths]
    for prev, (day, path) in zip(days, zip(days[1:], paths[1:], strict=True), strict=False):
        if day == prev:
            raise DataError(
                f"{path}: day_{day} is given twice ({paths[days.index(day)].name} and {path.name})"
            )
        if day != prev + 1:
            missing = path.parent / f"day_{prev + 1}"
            raise DataError(
                f"{missing}: missing; the day files given run from day_{days[0]} to "
                f"day_{days[-1]}, and data.split_order: time splits whole days in order (give "
                f"day_{prev + 1}, or leave out the days after it)"
            )


def days_by_count(paths: Sequence[Path], fractions: Sequence[float]) -> list[int]:
    """Per day file (in day order) its split, whole-number ``fractions`` counting days."""
    counts = [int(f) for f in fractions]
    if sum(counts) != len(paths):
        raise DataError(
            f"data.split {[int(f) for f in fractions]} counts days (whole numbers): "
            f"{sum(counts)} days, but {len(paths)} day files are given "
            f"(day_{day_number(paths[0])} to day_{day_number(paths[-1])})"
        )
    return [k for k, c in enumerate(counts) for _ in range(c)]


def describe_days(
    paths: Sequence[Path], file_split: Sequence[int | None], names: Sequence[str]
) -> dict[str, str]:
    """``{split: "day_0-day_21"}`` of whole day files (contiguous, in day order)."""
    out = {}
    for k, name in enumerate(names):
        days = [day_number(p) for p, s in zip(paths, file_split, strict=True) if s == k]
        if days:
            out[name] = f"day_{days[0]}" + (f"-day_{days[-1]}" if len(days) > 1 else "")
    return out


__all__ = ["check_days", "day_number", "days_by_count", "describe_days", "whole_numbers"]
