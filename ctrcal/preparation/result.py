"""What :func:`ctrcal.preparation.prepare.prepare` did, and how it is told to people."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctrcal.data.table_size import embedding_bytes, embedding_rows


@dataclass
class PrepareResult:
    """What :func:`prepare` did (``out_dir`` is the prepared directory)."""

    out_dir: Path
    reused: bool
    source_hash: str
    rows: dict[str, int] = field(default_factory=dict)
    positive_rate: dict[str, float] = field(default_factory=dict)
    bad_rows: int = 0
    layout: str | None = None
    seconds: float = 0.0
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())

    def describe(self, embedding_dim: int | None = None) -> str:
        """A few lines for the CLI; with ``embedding_dim``, also the embedding tables' memory
        at that dimension (float32)."""
        if self.reused:
            return (
                f"reused {self.out_dir} (inputs and config unchanged, "
                f"hash {self.source_hash[:12]}): "
                + ", ".join(f"{k} {v:,}" for k, v in self.rows.items())
            )
        rate = self.summary.get("read_rows", self.total_rows) / max(self.seconds, 1e-9)
        how = self.layout or ""
        chunks = self.summary.get("chunks")
        if chunks:
            how += f", {chunks} chunk{'s' if chunks > 1 else ''}"
        lines = [
            f"prepared {self.total_rows:,} rows ({how}) in {self.seconds:.1f} s "
            f"({rate:,.0f} rows/s) -> {self.out_dir}"
        ]
        for k in self.rows:
            rate = self.positive_rate[k]
            if self.rows[k] == 0:
                what = "empty"
            elif rate is None or math.isnan(rate):
                what = "no labels (not scored; training needs labelled train and valid)"
            else:
                what = f"{100 * rate:.2f}% positive"
            lines.append(f"  {k:5s} {self.rows[k]:>12,} rows, {what}")
        fm = self.summary
        if fm:
            lines.append(
                f"  {fm['num_categorical']} categorical fields (vocab total {fm['vocab_total']:,}, "
                f"min_count {fm['min_count']}), {fm['num_numeric']} numeric "
                f"({fm['numeric_transform']})"
            )
        if fm.get("days"):
            lines.append("  whole days: " + ", ".join(f"{k} {v}" for k, v in fm["days"].items()))
        if fm.get("tables"):
            lines.extend(_describe_tables(fm, embedding_dim))
        if self.bad_rows:
            lines.append(f"  skipped {self.bad_rows:,} malformed rows")
        if "oracle" in fm:
            o = fm["oracle"].get("test") or next(iter(fm["oracle"].values()))
            lines.append(
                f"  oracle (true probabilities): AUC {o['auc']:.4f}, logloss {o['logloss']:.4f}"
            )
        return "\n".join(lines)


def _describe_tables(fm: Mapping[str, Any], dim: int | None) -> list[str]:
    """Each categorical field's embedding table size, and their memory at embedding dimension
    ``dim`` (float32) when it is given."""
    tables = fm["tables"]
    sizes = ", ".join(f"{n} {v:,}" for n, v in tables.items())
    lines = [f"  embedding table rows: {sizes}"]
    if fm.get("hashed"):
        lines.append(
            f"  capped at max_vocab {fm['max_vocab']:,} (+ hashed ids): " + ", ".join(fm["hashed"])
        )
    total = embedding_rows(tables.values())
    if dim:
        lines.append(
            f"  embedding memory at dim {dim}: {total:,} rows x {dim} x 4 B = "
            f"{embedding_bytes(total, dim) / 2**20:,.1f} MiB"
        )
    else:
        lines.append(
            f"  embedding memory: {total:,} rows x 4 B = "
            f"{embedding_bytes(total, 1) / 2**20:,.2f} MiB per unit of embedding dimension"
        )
    return lines


__all__ = ["PrepareResult"]
