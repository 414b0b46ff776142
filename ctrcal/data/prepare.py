"""Raw Criteo file(s) -> a prepared directory the loader reads.

A prepared directory holds::

    DIR/feature_map.json   schema version, per-feature stats, source hash (human-readable)
    DIR/vocab.parquet      kept categorical values and their ids
    DIR/train/part-*.parquet, DIR/valid/..., DIR/test/...
                           label float32, I1..I13 float32 (null = missing), C1..C26 int32
                           (+ true_prob float32 when the sources are synthetic)

There is no Python loop over rows or values, and two ways to get there that write the same
data (the same feature map, vocabulary and rows in the same order, bit for bit):

* **in memory** (inputs up to :data:`IN_MEMORY_BYTES` of text, and at most a quarter of the
  memory available): every source is parsed into
  one typed frame (bad rows flagged, split assigned), the
  :class:`~ctrcal.data.features.FeaturePipeline` is fitted on its train rows, and each split
  is encoded and written by a streaming sink -- fastest;
* **chunked** (larger inputs, or ``in_memory_bytes=0`` / ``CTRCAL_PREPARE_IN_MEMORY_BYTES=0``):
  each source is read in chunks of whole lines (:data:`CHUNK_BYTES`; gzip decompressed on the
  fly); each chunk is parsed, checked and split, its train rows are counted into exact
  :class:`~ctrcal.data.features.FitStats` (per-value counts merged across chunks, so
  ``min_count`` applies to the whole split), and the typed chunk waits on disk (lz4 parquet);
  after the fit from the merged counts the chunks are encoded one by one into each split's
  ``part-NNNNN.parquet`` files (row groups of :data:`ROW_GROUP_ROWS`). Memory is a few chunks
  plus the counts, which grow with the number of distinct values, not with rows.

Everything is written into a temporary sibling directory (``.DIR.XXXX.tmp``, recording its
owner's pid) that is renamed onto ``DIR`` only when complete, so an interrupted run leaves
nothing a later run trusts; the next run deletes such leftovers once their owner is gone (see
:func:`clean_stale_temporaries`).

The ``source_hash`` in the feature map covers each source file's identity (resolved path, size,
modification time), the layout, the split and the pipeline config; a later call with the same
hash reuses ``DIR`` instead of preparing again, any change prepares afresh.

Splits: a single input (or several, concatenated) is split seeded-randomly (``split``
fractions, ``split_seed``; default 8:1:1, the Criteo_x4 convention) by a 32-bit integer hash of
(file index, row, seed) -- stable across polars versions; or ``train``/``valid``/``test``
files are given explicitly.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from ctrcal.data import criteo
from ctrcal.data.criteo import LABEL, CriteoFormat
from ctrcal.data.features import (
    FEATURE_MAP_FILE,
    SCHEMA_VERSION,
    FeaturePipeline,
    resolve_numeric_transform,
)
from ctrcal.data.splits import (
    SPLIT_COL,
    SPLITS,
    SplitPlan,
    check_fractions,
    plan_splits,
    read_order,
    text_bytes,
)
from ctrcal.errors import DataError

PREPARE_VERSION = 2  # 2: original-space numeric statistics, data.split_order
PROB_COL = "true_prob"
ROW_GROUP_ROWS = 131_072
PART_ROWS = 128 * ROW_GROUP_ROWS
"""Rows per parquet part written by the chunked path (16.8M, ~1 GB of encoded data)."""
IN_MEMORY_BYTES = 1 << 30
"""Text up to this size in all is parsed into memory (~1 GiB of text is ~4.5M Criteo rows and
about as much memory once typed); larger inputs take the chunked path, whose memory does not
grow with the number of rows."""
CHUNK_BYTES = 16 << 20
"""Text bytes per chunk of the chunked path (~70k Criteo rows). Measured on 1M rows: 16, 32
and 64 MiB chunks prepare at the same speed, with peak RSS ~310, ~400 and ~530 MiB."""
OWNER_FILE = "_owner.json"
STALE_SECONDS = 3600
"""A temporary directory whose owner cannot be asked (another host, no record) is deleted
after this long without a change."""


@dataclass
class PrepareResult:
    """What :func:`prepare_dataset` did."""

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

    def describe(self) -> str:
        """A few lines for the CLI."""
        if self.reused:
            return (
                f"reused {self.out_dir} (inputs and config unchanged, "
                f"hash {self.source_hash[:12]}): "
                + ", ".join(f"{k} {v:,}" for k, v in self.rows.items())
            )
        rate = self.summary.get("read_rows", self.total_rows) / max(self.seconds, 1e-9)
        how = self.layout or ""
        if self.summary.get("path") == "chunked":
            how += f", {self.summary['chunks']} chunks"
        lines = [
            f"prepared {self.total_rows:,} rows ({how}) in {self.seconds:.1f} s "
            f"({rate:,.0f} rows/s) -> {self.out_dir}"
        ]
        for k in self.rows:
            lines.append(
                f"  {k:5s} {self.rows[k]:>12,} rows, {100 * self.positive_rate[k]:.2f}% positive"
            )
        fm = self.summary
        if fm:
            lines.append(
                f"  {fm['num_categorical']} categorical fields (vocab total {fm['vocab_total']:,}, "
                f"min_count {fm['min_count']}), {fm['num_numeric']} numeric "
                f"({fm['numeric_transform']})"
            )
        if self.bad_rows:
            lines.append(f"  skipped {self.bad_rows:,} malformed rows")
        if "oracle" in fm:
            o = fm["oracle"].get("test") or next(iter(fm["oracle"].values()))
            lines.append(f"  oracle (true probabilities): AUC {o['auc']:.4f}, logloss "
                         f"{o['logloss']:.4f}")  # fmt: skip
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Sources and identity


@dataclass
class _Source:
    path: Path  # as given
    split: int | None  # None: random split
    fmt: CriteoFormat | None = None
    read_path: Path | None = None  # decompressed copy for .gz
    prob: Path | None = None


def _resolve_sources(
    inputs: Sequence[str | Path] | Mapping[str, Sequence[str | Path]],
) -> list[_Source]:
    if isinstance(inputs, Mapping):
        unknown = set(inputs) - set(SPLITS)
        if unknown:
            raise DataError(f"unknown split(s) {sorted(unknown)} (valid: {', '.join(SPLITS)})")
        missing = [s for s in SPLITS if not inputs.get(s)]
        if missing:
            raise DataError(
                f"explicit splits need train, valid and test files; missing: {', '.join(missing)}"
            )
        sources = [
            _Source(Path(p), SPLITS.index(s)) for s in SPLITS for p in _as_list(inputs[s])
        ]
    else:
        sources = [_Source(Path(p), None) for p in _as_list(inputs)]
    if not sources:
        raise DataError("no input files given")
    for s in sources:
        if not s.path.exists():
            raise DataError(f"{s.path}: no such file")
        if s.path.is_dir():
            raise DataError(f"{s.path}: is a directory, expected a raw Criteo file")
    return sources


def _as_list(x: Any) -> list[Any]:
    return [x] if isinstance(x, (str, Path)) else list(x)


def _file_identity(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def source_hash(identity: Any, params: Mapping[str, Any]) -> str:
    """sha256 of the sources' identity and the pipeline/split parameters."""
    blob = json.dumps(
        {"prepare_version": PREPARE_VERSION, "schema_version": SCHEMA_VERSION,
         "sources": identity, "params": params},
        sort_keys=True, default=str,
    )  # fmt: skip
    return hashlib.sha256(blob.encode()).hexdigest()


def _params(cfg: Any, on_bad_row: str, random_split: bool) -> dict[str, Any]:
    data, feats = cfg.data, cfg.features
    out = {
        "layout": data.layout,
        "on_bad_row": on_bad_row,
        "min_count": feats.min_count,
        "numeric_transform": feats.numeric_transform,
        "numeric_buckets": feats.numeric_buckets,
    }
    if random_split:
        out["split"] = list(data.split)
        out["split_order"] = data.split_order
        if data.split_order == "random":
            out["split_seed"] = data.split_seed
    return out


def is_prepared(out_dir: str | Path, expected_hash: str | None = None) -> bool:
    """True when ``out_dir`` is a complete prepared directory (with that hash, if given)."""
    out_dir = Path(out_dir)
    try:
        data = json.loads((out_dir / FEATURE_MAP_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    if data.get("schema_version") != SCHEMA_VERSION or not data.get("complete"):
        return False
    if expected_hash is not None and data.get("source_hash") != expected_hash:
        return False
    return all((out_dir / s).is_dir() for s in SPLITS)


def _check_out_dir(out_dir: Path) -> None:
    # atomic replacement deletes the old directory: never do that to something that is not
    # a prepared directory (a typo like --out . must not wipe a project)
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise DataError(f"{out_dir}: exists and is not a directory")
    if any(out_dir.iterdir()) and not (out_dir / FEATURE_MAP_FILE).exists():
        raise DataError(
            f"{out_dir}: exists, is not empty and is not a prepared data directory "
            "(no feature_map.json); choose another --out"
        )


# ---------------------------------------------------------------------------------------------
# The work


def prepare_dataset(
    inputs: Sequence[str | Path] | Mapping[str, Sequence[str | Path]],
    out_dir: str | Path,
    cfg: Any = None,
    on_bad_row: str | None = None,
    *,
    force: bool = False,
    identity: Any = None,
    synthetic_info: Mapping[str, Any] | None = None,
    in_memory_bytes: int | None = None,
    chunk_bytes: int | None = None,
) -> PrepareResult:
    """Prepare ``inputs`` into ``out_dir`` (or reuse it); see the module docstring.

    Args:
        inputs: raw files (split randomly) or ``{"train": [...], "valid": [...], "test": [...]}``.
        out_dir: the prepared directory to write.
        cfg: a :class:`~ctrcal.config.Config` (its ``data`` and ``features``); defaults if None.
        on_bad_row: ``error`` or ``skip``; None takes ``cfg.data.on_bad_row``.
        force: prepare even if an up-to-date ``out_dir`` exists.
        identity: replaces the file identity in the hash (used for generated data).
        synthetic_info: recorded in the feature map (generated data).
        in_memory_bytes: inputs up to this many bytes of text in all are parsed into memory;
            larger ones take the chunked, bounded-memory path (default: the environment
            variable ``CTRCAL_PREPARE_IN_MEMORY_BYTES``, else :data:`IN_MEMORY_BYTES` or a
            quarter of the available memory, whichever is less; 0 forces the chunked path).
            Both paths write the same data.
        chunk_bytes: text bytes per chunk of the chunked path (default:
            ``CTRCAL_PREPARE_CHUNK_BYTES``, else :data:`CHUNK_BYTES`).

    Raises:
        DataError: unreadable or malformed input, unusable output directory.
    """
    from ctrcal.config import Config

    start = time.perf_counter()
    in_memory_bytes = _size_setting(in_memory_bytes, "CTRCAL_PREPARE_IN_MEMORY_BYTES",
                                    _auto_in_memory_bytes(), 0)  # fmt: skip
    chunk_bytes = _size_setting(chunk_bytes, "CTRCAL_PREPARE_CHUNK_BYTES", CHUNK_BYTES, 1)
    cfg = cfg if cfg is not None else Config()
    on_bad_row = on_bad_row or cfg.data.on_bad_row
    if on_bad_row not in ("error", "skip"):
        raise DataError(f"on_bad_row must be 'error' or 'skip', got {on_bad_row!r}")
    out_dir = Path(out_dir)
    sources = _resolve_sources(inputs)
    random_split = sources[0].split is None
    if random_split:
        check_fractions(cfg.data.split)
        sources = [sources[i] for i in read_order([s.path for s in sources],
                                                  cfg.data.split_order)]  # fmt: skip
    if identity is None:
        identity = [{**_file_identity(s.path), "split": s.split} for s in sources]
    params = _params(cfg, on_bad_row, random_split)
    key = source_hash(identity, params)
    if not force and is_prepared(out_dir, key):
        return _reuse(out_dir, key)
    _check_out_dir(out_dir)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temporaries(out_dir)
    tmp = _owned_temp_dir(out_dir)
    try:
        result = _prepare_into(
            tmp, sources, cfg, on_bad_row, key, synthetic_info or {},
            in_memory_bytes, chunk_bytes,
        )  # fmt: skip
        shutil.rmtree(tmp / "_work", ignore_errors=True)
        (tmp / OWNER_FILE).unlink(missing_ok=True)
        _publish(tmp, out_dir, key)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    result.out_dir = out_dir
    result.seconds = time.perf_counter() - start
    return result


def _auto_in_memory_bytes() -> int:
    """:data:`IN_MEMORY_BYTES`, or less on a small machine: the in-memory path peaks at about
    three times the text's size, so allow a quarter of the memory available (Linux)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return min(IN_MEMORY_BYTES, int(line.split()[1]) * 1024 // 4)
    except (OSError, ValueError, IndexError):
        pass
    return IN_MEMORY_BYTES


def _size_setting(value: int | None, env: str, default: int, minimum: int) -> int:
    if value is None:
        text = os.environ.get(env)
        if text is None or not text.strip():
            return default
        try:
            value = int(float(text))
        except ValueError:
            raise DataError(f"{env}={text!r}: expected a number of bytes") from None
    if value < minimum:
        raise DataError(f"{env.removeprefix('CTRCAL_PREPARE_').lower()} must be >= {minimum}, "
                        f"got {value}")  # fmt: skip
    return int(value)


# ---------------------------------------------------------------------------------------------
# Temporary directories: owned, and cleaned up after a killed run


def _owned_temp_dir(out_dir: Path, kind: str = "") -> Path:
    """A fresh ``.<name>.[kind-]XXXX.tmp`` sibling of ``out_dir`` recording who owns it."""
    prefix = f".{out_dir.name}.{kind + '-' if kind else ''}"
    tmp = Path(tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=out_dir.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would make the result private
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "start": _process_start(os.getpid())}
    (tmp / OWNER_FILE).write_text(json.dumps(owner))
    return tmp


def _process_start(pid: int) -> int | None:
    """The start time of a process in clock ticks since boot (Linux), to tell a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _owner_alive(pid: int, start: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    except OSError:
        return True
    now = _process_start(pid)
    return start is None or now is None or now == start


def _last_activity(path: Path) -> float:
    """Newest modification time of a directory, its entries and theirs (two levels)."""
    newest = 0.0
    try:
        newest = path.stat().st_mtime
        for child in path.iterdir():
            newest = max(newest, child.stat().st_mtime)
            if child.is_dir():
                for grandchild in child.iterdir():
                    newest = max(newest, grandchild.stat().st_mtime)
    except OSError:
        pass
    return newest


def _is_stale(path: Path, now: float) -> bool:
    name = path.name
    if ".old-" in name:
        # a previous result moved aside by _publish, normally deleted right away
        try:
            pid = int(name.rsplit(".old-", 1)[1].split("-")[0])
        except ValueError:
            pid = None
        if pid is not None and not _owner_alive(pid, None):
            return True
        return now - _last_activity(path) > STALE_SECONDS
    try:
        owner = json.loads((path / OWNER_FILE).read_text())
    except (OSError, ValueError):
        owner = None
    if isinstance(owner, dict) and owner.get("host") == socket.gethostname():
        try:
            return not _owner_alive(int(owner["pid"]), owner.get("start"))
        except (KeyError, TypeError, ValueError):
            pass
    # no owner on this host to ask (another machine sharing the folder, or no record):
    # only long inactivity tells
    return now - _last_activity(path) > STALE_SECONDS


def clean_stale_temporaries(out_dir: str | Path) -> list[Path]:
    """Delete what killed runs left next to ``out_dir``; returns what was deleted.

    Candidates are ``.<name>.*.tmp`` (a run's work in progress) and ``.<name>.old-*`` (a
    previous result being replaced). One is deleted when the process that made it is gone
    (same host: its pid is dead or was reused), or, without such an owner to ask, when
    nothing in it changed for :data:`STALE_SECONDS`. A concurrent run's directory is left
    alone.
    """
    out_dir = Path(out_dir)
    prefix = f".{out_dir.name}."
    removed = []
    now = time.time()
    try:
        entries = list(out_dir.parent.iterdir())
    except OSError:
        return removed
    for path in entries:
        name = path.name
        if not name.startswith(prefix) or not path.is_dir() or path.is_symlink():
            continue
        if not (name.endswith(".tmp") or name[len(prefix) :].startswith("old-")):
            continue
        if _is_stale(path, now):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _publish(tmp: Path, out_dir: Path, key: str) -> None:
    """Move the finished ``tmp`` onto ``out_dir`` by renames only."""
    try:
        if out_dir.exists():
            # move the old directory aside first so the new one appears in one rename
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}-{time.time_ns()}")
            out_dir.rename(old)
            tmp.rename(out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out_dir)
    except OSError:
        # another process published the same result meanwhile: keep theirs
        if not is_prepared(out_dir, key):
            raise


# ---------------------------------------------------------------------------------------------
# The work


@dataclass
class _Tally:
    """What reading the sources found (both paths fill it the same way)."""

    rows: list[int] = field(default_factory=lambda: [0, 0, 0])
    label_sum: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    labelled: list[int] = field(default_factory=lambda: [0, 0, 0])
    bad: int = 0
    with_prob: bool = False
    chunks: int = 0

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


def _prepare_into(
    tmp: Path,
    sources: list[_Source],
    cfg: Any,
    on_bad_row: str,
    key: str,
    synthetic_info: Mapping[str, Any],
    in_memory_bytes: int,
    chunk_bytes: int,
) -> PrepareResult:
    from ctrcal.data.synthetic import prob_path

    work = tmp / "_work"
    work.mkdir()
    clock = _Clock()
    # -- detect every source ----------------------------------------------------------------
    for s in sources:
        s.fmt = criteo.detect_format(s.path, cfg.data.layout)
        if not s.fmt.labelled and (s.split is None or s.split < 2):
            raise DataError(
                f"{s.path}: has no labels ({s.fmt.layout} layout); training and validation "
                "need labelled rows (an unlabelled file can only be the explicit test split)"
            )
        p = prob_path(s.path)
        s.prob = p if p.exists() else None
    layouts = sorted({s.fmt.layout for s in sources if s.fmt})
    families = {"x1" if lay == "x1" else "raw" for lay in layouts}
    if len(families) > 1:
        raise DataError(
            "cannot mix Criteo_x1 (already encoded) with raw layouts: " + ", ".join(layouts)
        )
    layout = layouts[0] if len(layouts) == 1 else "+".join(layouts)
    transform = resolve_numeric_transform(
        cfg.features.numeric_transform, "x1" if families == {"x1"} else layout
    )
    pipe = FeaturePipeline(
        min_count=cfg.features.min_count,
        numeric_transform=transform,
        numeric_buckets=cfg.features.numeric_buckets,
    )
    plan = plan_splits(
        [s.path for s in sources], [s.split for s in sources], cfg.data.split,
        cfg.data.split_seed, cfg.data.split_order, [s.fmt.header_lines for s in sources],
    )  # fmt: skip
    clock("detect")
    chunked = sum(text_bytes(s.path) for s in sources) > in_memory_bytes
    if chunked:
        tally = _chunked(tmp, sources, on_bad_row, plan, pipe, clock, chunk_bytes)
    else:
        tally = _in_memory(tmp, sources, on_bad_row, plan, pipe, clock)
    rows = {name: tally.rows[k] for k, name in enumerate(SPLITS)}
    rates = {name: tally.rate(k) for k, name in enumerate(SPLITS)}
    bad = tally.bad

    oracle = _oracle(tmp) if tally.with_prob else None
    extra: dict[str, Any] = {
        "source_hash": key,
        "layout": layout,
        "sources": [
            {"path": str(s.path), "layout": s.fmt.layout,
             "split": SPLITS[s.split] if s.split is not None else "random"}
            for s in sources
        ],  # fmt: skip
        "split": plan.describe(),
        "splits": {
            n: {"rows": rows[n], "positive_rate": _nan_to_none(rates[n])} for n in SPLITS
        },
        "bad_rows_skipped": bad,
    }
    if synthetic_info:
        extra["synthetic"] = dict(synthetic_info)
    if oracle:
        extra["oracle"] = oracle
    extra["complete"] = True
    pipe.save(tmp, extra=extra)
    clock("save")
    summary = {
        "num_categorical": len(pipe.categorical_fields),
        "num_numeric": len(pipe.numeric_fields),
        "vocab_total": sum(pipe.vocab_sizes_),
        "min_count": pipe.min_count,
        "numeric_transform": transform,
        "read_rows": sum(rows.values()) + bad,
        "path": "chunked" if chunked else "memory",
        "chunks": tally.chunks,
        "timings": clock.laps,
    }
    if oracle:
        summary["oracle"] = oracle
    return PrepareResult(
        tmp, False, key, rows=rows, positive_rate=rates, bad_rows=bad, layout=layout,
        summary=summary,
    )  # fmt: skip


def _check_rows(tally: _Tally, sources: list[_Source]) -> None:
    if sum(tally.rows) + tally.bad == 0:
        names = ", ".join(str(s.path) for s in sources)
        raise DataError(f"{names}: no rows")
    if tally.rows[0] == 0:
        raise DataError("the train split is empty (all rows malformed, or data.split gives 0)")


def _with_split(lf: pl.LazyFrame, plan: SplitPlan, index: int) -> pl.LazyFrame:
    return lf.with_columns(plan.expr(index).alias(SPLIT_COL))


def _in_memory(
    tmp: Path,
    sources: list[_Source],
    on_bad_row: str,
    plan: SplitPlan,
    pipe: FeaturePipeline,
    clock: _Clock,
) -> _Tally:
    """Parse everything into one typed frame in memory, fit, encode each split."""
    work = tmp / "_work"
    for s in sources:
        s.read_path = criteo.decompress(s.path, work) if criteo.is_gzip(s.path) else s.path

    def typed_frame(numbers: bool) -> pl.LazyFrame:
        frames = [
            _with_split(criteo.scan_typed(s.read_path, s.fmt, i, numbers), plan, i)
            for i, s in enumerate(sources)
        ]
        return pl.concat(frames, how="vertical")

    try:
        try:
            # parsed columns take less memory than the text
            typed = typed_frame(numbers=True).collect(engine="streaming").lazy()
        except pl.exceptions.ComputeError:
            # a non-numeric label or I value: the string path flags it row by row
            typed = typed_frame(numbers=False).collect(engine="streaming").lazy()
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise criteo.read_error([s.path for s in sources], exc) from None
    clock("parse")
    tally = _Tally(with_prob=all(s.prob is not None for s in sources), chunks=1)
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
    _check_rows(tally, sources)
    clock("check")
    pipe.fit(good.filter(pl.col(SPLIT_COL) == 0))
    clock("fit")
    keep = (PROB_COL,) if tally.with_prob else ()
    sinks = []
    for k, name in enumerate(SPLITS):
        (tmp / name).mkdir()
        enc = pipe.transform(good.filter(pl.col(SPLIT_COL) == k), keep=keep)
        sinks.append(
            enc.sink_parquet(
                tmp / name / "part-0.parquet",
                row_group_size=ROW_GROUP_ROWS,
                compression="snappy",
                statistics=False,
                lazy=True,
                engine="streaming",
            )
        )
    try:
        pl.collect_all(sinks, engine="streaming")
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise criteo.read_error([s.path for s in sources], exc) from None
    clock("encode")
    return tally


def _parse_chunk(
    chunk: bytes, s: _Source, index: int, offset: int, plan: SplitPlan
) -> pl.DataFrame:
    """One chunk of a source's lines -> typed rows with ``_split`` (the in-memory columns)."""
    try:
        try:
            lf = criteo.scan_typed(chunk, s.fmt, index, True, row_offset=offset, skip_header=False)
            return _with_split(lf, plan, index).collect()
        except pl.exceptions.ComputeError:
            # a non-numeric label or I value in this chunk: flag it row by row
            lf = criteo.scan_typed(chunk, s.fmt, index, False, row_offset=offset,
                                   skip_header=False)  # fmt: skip
            return _with_split(lf, plan, index).collect()
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise criteo.read_error([s.path], exc) from None


class _ProbReader:
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


def _chunked(
    tmp: Path,
    sources: list[_Source],
    on_bad_row: str,
    plan: SplitPlan,
    pipe: FeaturePipeline,
    clock: _Clock,
    chunk_bytes: int,
) -> _Tally:
    """Bounded memory: (1) read each source chunk by chunk -- parse, check, split, count the
    train rows into exact :class:`~ctrcal.data.features.FitStats`, keep the typed chunk on
    disk (lz4 parquet); (2) fit from the merged counts; (3) encode the kept chunks one by one
    into each split's parquet parts. Memory is a few chunks plus the counts (which grow with
    the number of distinct values, not rows); the output equals the in-memory path's."""
    work = tmp / "_work"
    tally = _Tally(with_prob=all(s.prob is not None for s in sources))
    stats = pipe.new_stats()
    typed_parts: list[Path] = []
    columns = [*criteo.COLUMNS, SPLIT_COL]
    for i, s in enumerate(sources):
        probs = _ProbReader(s.prob) if tally.with_prob else None
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
    _check_rows(tally, sources)
    clock("parse")
    pipe.fit_stats(stats)
    del stats
    clock("fit")
    keep = (PROB_COL, SPLIT_COL) if tally.with_prob else (SPLIT_COL,)
    writers = [_PartWriter(tmp / name) for name in SPLITS]
    schema = None
    for part in typed_parts:
        enc = pipe.transform(pl.read_parquet(part), keep=keep).collect()
        part.unlink()
        for k, sub in enc.partition_by(SPLIT_COL, as_dict=True, include_key=False).items():
            table = sub.to_arrow()
            schema = table.schema
            writers[int(k[0])].write(table)
    for w in writers:
        w.close(schema)
    clock("encode")
    return tally


class _PartWriter:
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


class _Clock:
    """Seconds per phase (reported by the benchmark)."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self._last, 3)
        self._last = now


def _nan_to_none(x: float) -> float | None:
    return None if x != x else x


def _oracle(directory: Path) -> dict[str, dict[str, float]]:
    from ctrcal.data.synthetic import oracle_metrics

    out = {}
    for name in SPLITS[1:]:  # the held-out splits are what models are measured on
        df = pl.read_parquet(directory / name, columns=[LABEL, PROB_COL])
        if df.height and df[LABEL].null_count() == 0:
            auc, ll = oracle_metrics(df[PROB_COL].to_numpy().astype("float64"),
                                     df[LABEL].to_numpy())  # fmt: skip
            out[name] = {"auc": auc, "logloss": ll}
    return out


def prepare(
    inputs: Sequence[str | Path] | Mapping[str, Sequence[str | Path]],
    out_dir: str | Path,
    cfg: Any = None,
    on_bad_row: str | None = None,
    *,
    force: bool = False,
) -> Path:
    """Prepare raw Criteo ``inputs`` into ``out_dir`` (reusing it when unchanged).

    See :func:`prepare_dataset` for the arguments; returns ``out_dir``.
    """
    return prepare_dataset(inputs, out_dir, cfg, on_bad_row, force=force).out_dir


def prepare_from_config(cfg: Any, out_dir: str | Path, *, force: bool = False) -> Path:
    """Prepare what ``cfg.data`` names into ``out_dir``; see :func:`prepare_config_dataset`."""
    return prepare_config_dataset(cfg, out_dir, force=force).out_dir


def prepare_config_dataset(cfg: Any, out_dir: str | Path, *, force: bool = False) -> PrepareResult:
    """Prepare ``cfg.data.inputs``, or its explicit ``train/valid/test`` files, or -- when it
    names neither -- ``cfg.data.synthetic`` generated data (rows, seed) into ``out_dir``."""
    data = cfg.data
    if data.inputs and (data.train or data.valid or data.test):
        raise DataError("data: give either 'inputs' or 'train'/'valid'/'test', not both")
    if data.inputs:
        return prepare_dataset(list(data.inputs), out_dir, cfg, force=force)
    if data.train or data.valid or data.test:
        splits = {"train": data.train, "valid": data.valid, "test": data.test}
        return prepare_dataset(splits, out_dir, cfg, force=force)
    return _prepare_synthetic(cfg, out_dir, force=force)


def _prepare_synthetic(cfg: Any, out_dir: str | Path, *, force: bool) -> PrepareResult:
    from ctrcal.data.synthetic import GENERATOR_VERSION, generate

    syn = cfg.data.synthetic
    info = {"rows": syn.rows, "seed": syn.seed, "drift": syn.drift,
            "generator_version": GENERATOR_VERSION}  # fmt: skip
    identity = [{"synthetic": info}]
    params = _params(cfg, cfg.data.on_bad_row, True)
    key = source_hash(identity, params)
    if not force and is_prepared(out_dir, key):
        return _reuse(out_dir, key)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temporaries(out_dir)
    td = _owned_temp_dir(out_dir, "synthetic")
    try:
        raw = td / "synthetic.tsv"
        res = generate(raw, syn.rows, syn.seed, drift=syn.drift)
        info = {**info, "oracle_auc": res.oracle_auc, "oracle_logloss": res.oracle_logloss,
                "positive_rate": res.positive_rate}  # fmt: skip
        return prepare_dataset(
            [raw], out_dir, cfg, force=True, identity=identity, synthetic_info=info
        )
    finally:
        shutil.rmtree(td, ignore_errors=True)


def _reuse(out_dir: str | Path, key: str) -> PrepareResult:
    out_dir = Path(out_dir)
    fm = json.loads((out_dir / FEATURE_MAP_FILE).read_text())
    return PrepareResult(
        out_dir, True, key,
        rows={k: v["rows"] for k, v in fm["splits"].items()},
        positive_rate={k: v["positive_rate"] for k, v in fm["splits"].items()},
        layout=fm.get("layout"),
        summary={"oracle": fm["oracle"]} if fm.get("oracle") else {},
    )  # fmt: skip


__all__ = [
    "PrepareResult",
    "clean_stale_temporaries",
    "is_prepared",
    "prepare",
    "prepare_config_dataset",
    "prepare_dataset",
    "prepare_from_config",
    "source_hash",
]
