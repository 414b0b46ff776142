"""What both reports write the same way: markdown tables and the metric definitions."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["definition_lines", "markdown_table", "metric_list"]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub markdown table: the header row, a ``|---|`` rule, one line per row (cells as
    given, already formatted)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def definition_lines(keys: Iterable[str]) -> list[str]:
    """``- **name**: definition`` of every declared metric among ``keys`` (a result's keys:
    ``field_rce:C14`` counts for ``field_rce:<field>``), in the listing order of
    :func:`~ctrcal.metrics.metrics_in`; undeclared keys are left out."""
    from ctrcal.metrics import metric_of, metrics_in

    found = {m.name for m in map(metric_of, keys) if m is not None}
    return [f"- **{m.name}**: {m.definition}" for m in metrics_in() if m.name in found]


_WHERE = {
    "calibration": "calibration-report, --gate",
    "shift": "shift report",
    "compared": "paired test",
}


def metric_list() -> str:
    """Every declared metric as one markdown table (name, which way is better, the tables
    that list it, definition): the metric list of ``docs/calibration.md``, written there by
    ``scripts/metric_docs.py``."""
    from ctrcal.metrics import metrics_in

    rows = [
        [
            f"`{m.name}`",
            m.better or "–",
            ", ".join(_WHERE[t] for t in m.tables) or "–",
            m.definition.replace("|", "\\|"),
        ]
        for m in metrics_in()
    ]
    return markdown_table(["metric", "better", "listed in", "definition"], rows)
