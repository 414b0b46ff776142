"""The one markdown table writer of both reports."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["markdown_table"]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub markdown table: the header row, a ``|---|`` rule, one line per row (cells as
    given, already formatted)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)
