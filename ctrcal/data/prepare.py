"""Raw Criteo file(s) -> a prepared directory the loader reads.

A prepared directory holds::

    DIR/feature_map.json   schema version, per-feature stats, source hash (human-readable)
    DIR/vocab.parquet      kept categorical values and their ids
    DIR/train/part-0.parquet, DIR/valid/..., DIR/test/...
                           label float32, I1..I13 float32 (null = missing), C1..C26 int32
                           (+ true_prob float32 when the sources are synthetic)

The work is three polars passes, with no Python loop over rows or values: (1) parse every
source into a typed frame (bad rows flagged, split assigned) -- kept in memory for inputs up to
:data:`IN_MEMORY_BYTES`, streamed through a typed intermediate parquet beyond that, so memory
stays bounded; (2) fit the :class:`~ctrcal.data.features.FeaturePipeline` on the train rows;
(3) encode and write each split (streaming sinks). Everything is written into a temporary
sibling directory that is renamed onto ``DIR`` only when complete, so an interrupted run leaves
nothing a later run trusts.

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
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ctrcal.data import criteo
from ctrcal.data.criteo import LABEL, CriteoFormat
from ctrcal.data.features import (
    FEATURE_MAP_FILE,
    SCHEMA_VERSION,
    FeaturePipeline,
    resolve_numeric_transform,
)
from ctrcal.errors import DataError

PREPARE_VERSION = 1
SPLITS: tuple[str, ...] = ("train", "valid", "test")
SPLIT_COL = "_split"
PROB_COL = "true_prob"
ROW_GROUP_ROWS = 131_072
IN_MEMORY_BYTES = 1 << 30
"""Raw text up to this size is parsed into memory (~1 GiB of text is ~4.5M Criteo rows and
about as much memory once typed); larger inputs stream through an intermediate parquet."""


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
        lines = [
            f"prepared {self.total_rows:,} rows ({self.layout}) in {self.seconds:.1f} s "
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


def _split_expr(fractions: Sequence[float], seed: int) -> pl.Expr:
    """Split code 0/1/2 from a 32-bit integer hash (lowbias32) of (file, row, seed)."""
    m = 2**32
    key = (pl.col(criteo.ROW_COL).cast(pl.UInt64) + pl.col(criteo.FILE_COL).cast(pl.UInt64)
           * 0x9E3779B1 + (seed % m) * 0x85EBCA77) % m  # fmt: skip
    x = key.xor(key // 65536)
    x = (x * 0x7FEB352D) % m
    x = x.xor(x // 32768)
    x = (x * 0x846CA68B) % m
    x = x.xor(x // 65536)
    u = x.cast(pl.Float64) / m
    f0, f1 = fractions[0], fractions[0] + fractions[1]
    return (
        pl.when(u < f0).then(pl.lit(0, pl.UInt8))
        .when(u < f1).then(pl.lit(1, pl.UInt8))
        .otherwise(pl.lit(2, pl.UInt8))
    )  # fmt: skip


def _check_split(fractions: Sequence[float]) -> list[float]:
    fr = [float(f) for f in fractions]
    if len(fr) != 3 or any(f < 0 for f in fr) or fr[0] <= 0 or sum(fr) <= 0:
        raise DataError(f"data.split must be three non-negative fractions, got {list(fractions)}")
    total = sum(fr)
    return [f / total for f in fr]


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
        in_memory_bytes: sources up to this many bytes (uncompressed) are parsed into memory;
            larger ones stream through a typed intermediate parquet (default
            :data:`IN_MEMORY_BYTES`).

    Raises:
        DataError: unreadable or malformed input, unusable output directory.
    """
    from ctrcal.config import Config

    start = time.perf_counter()
    in_memory_bytes = IN_MEMORY_BYTES if in_memory_bytes is None else in_memory_bytes
    cfg = cfg if cfg is not None else Config()
    on_bad_row = on_bad_row or cfg.data.on_bad_row
    if on_bad_row not in ("error", "skip"):
        raise DataError(f"on_bad_row must be 'error' or 'skip', got {on_bad_row!r}")
    out_dir = Path(out_dir)
    sources = _resolve_sources(inputs)
    random_split = sources[0].split is None
    fractions = _check_split(cfg.data.split) if random_split else None
    if identity is None:
        identity = [{**_file_identity(s.path), "split": s.split} for s in sources]
    params = _params(cfg, on_bad_row, random_split)
    key = source_hash(identity, params)
    if not force and is_prepared(out_dir, key):
        return _reuse(out_dir, key)
    _check_out_dir(out_dir)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would make the result private
    try:
        result = _prepare_into(
            tmp, sources, cfg, on_bad_row, fractions, key, synthetic_info or {}, in_memory_bytes
        )
        shutil.rmtree(tmp / "_work", ignore_errors=True)
        _publish(tmp, out_dir, key)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    result.out_dir = out_dir
    result.seconds = time.perf_counter() - start
    return result


def _publish(tmp: Path, out_dir: Path, key: str) -> None:
    """Move the finished ``tmp`` onto ``out_dir`` by renames only."""
    try:
        if out_dir.exists():
            # move the old directory aside first so the new one appears in one rename
            old = out_dir.with_name(f".{out_dir.name}.old-{time.time_ns()}")
            out_dir.rename(old)
            tmp.rename(out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out_dir)
    except OSError:
        # another process published the same result meanwhile: keep theirs
        if not is_prepared(out_dir, key):
            raise


def _prepare_into(
    tmp: Path,
    sources: list[_Source],
    cfg: Any,
    on_bad_row: str,
    fractions: list[float] | None,
    key: str,
    synthetic_info: Mapping[str, Any],
    in_memory_bytes: int,
) -> PrepareResult:
    from ctrcal.data.synthetic import prob_path

    work = tmp / "_work"
    work.mkdir()
    clock = _Clock()
    # -- detect and scan every source -------------------------------------------------------
    for s in sources:
        s.fmt = criteo.detect_format(s.path, cfg.data.layout)
        s.read_path = criteo.decompress(s.path, work) if criteo.is_gzip(s.path) else s.path
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
    with_prob = all(s.prob is not None for s in sources)

    def typed_frame(numbers: bool) -> pl.LazyFrame:
        frames = []
        for i, s in enumerate(sources):
            lf = criteo.scan_typed(s.read_path, s.fmt, i, numbers)
            if s.split is None:
                lf = lf.with_columns(_split_expr(fractions, cfg.data.split_seed).alias(SPLIT_COL))
            else:
                lf = lf.with_columns(pl.lit(s.split, pl.UInt8).alias(SPLIT_COL))
            frames.append(lf)
        return pl.concat(frames, how="vertical")

    clock("detect")
    raw_bytes = sum(s.read_path.stat().st_size for s in sources)
    typed_path = work / "typed.parquet"

    def materialise(numbers: bool) -> pl.LazyFrame:
        if raw_bytes <= in_memory_bytes:
            # parsed columns take less memory than the text: keep them in memory
            return typed_frame(numbers).collect(engine="streaming").lazy()
        # larger than that: stream through a typed intermediate parquet, bounded memory
        typed_frame(numbers).sink_parquet(
            typed_path, compression="lz4", engine="streaming"
        )
        return pl.scan_parquet(typed_path)

    try:
        try:
            typed = materialise(numbers=True)
        except pl.exceptions.ComputeError:
            # a non-numeric label or I value: the string path flags it row by row
            typed = materialise(numbers=False)
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise criteo.read_error([s.path for s in sources], exc) from None
    clock("parse")
    if with_prob:
        # true probabilities of generated data, row-aligned with their data files; a file
        # edited since it was generated no longer matches and its probabilities are dropped
        per_file = typed.group_by(criteo.FILE_COL).agg(pl.len()).collect()
        counts_by_file = dict(zip(*per_file.get_columns(), strict=True))
        with_prob = all(
            pl.scan_parquet(s.prob).select(pl.len()).collect().item() == counts_by_file.get(i, 0)
            for i, s in enumerate(sources)
        )
    if with_prob:
        probs = pl.concat([pl.scan_parquet(s.prob).select("prob") for s in sources])
        typed = pl.concat(
            [typed, probs.select(pl.col("prob").cast(pl.Float32).alias(PROB_COL))],
            how="horizontal",
        )
    bad, _ = criteo.first_bad(
        typed, [s.path for s in sources], [s.fmt for s in sources], on_bad_row == "error"
    )
    good = typed.filter(pl.col(criteo.BAD_COL) == 0) if bad else typed
    counts = (
        good.group_by(SPLIT_COL)
        .agg(pl.len().alias("rows"), pl.col(LABEL).mean().alias("rate"))
        .collect()
    )
    rows = {SPLITS[int(r[SPLIT_COL])]: int(r["rows"]) for r in counts.iter_rows(named=True)}
    rates = {
        SPLITS[int(r[SPLIT_COL])]: float(r["rate"]) if r["rate"] is not None else float("nan")
        for r in counts.iter_rows(named=True)
    }
    read_rows = sum(rows.values()) + bad
    if read_rows == 0:
        names = ", ".join(str(s.path) for s in sources)
        raise DataError(f"{names}: no rows")
    if rows.get("train", 0) == 0:
        raise DataError("the train split is empty (all rows malformed, or data.split gives 0)")

    clock("check")
    # -- fit on train ------------------------------------------------------------------------
    transform = resolve_numeric_transform(
        cfg.features.numeric_transform, "x1" if families == {"x1"} else layout
    )
    pipe = FeaturePipeline(
        min_count=cfg.features.min_count,
        numeric_transform=transform,
        numeric_buckets=cfg.features.numeric_buckets,
    )
    pipe.fit(good.filter(pl.col(SPLIT_COL) == 0))
    clock("fit")

    # -- encode and write each split ---------------------------------------------------------
    keep = (PROB_COL,) if with_prob else ()
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
    for name in SPLITS:
        rows.setdefault(name, 0)
        rates.setdefault(name, float("nan"))

    clock("encode")
    oracle = _oracle(tmp) if with_prob else None
    extra: dict[str, Any] = {
        "source_hash": key,
        "layout": layout,
        "sources": [
            {"path": str(s.path), "layout": s.fmt.layout,
             "split": SPLITS[s.split] if s.split is not None else "random"}
            for s in sources
        ],  # fmt: skip
        "split": {"fractions": fractions, "seed": cfg.data.split_seed}
        if fractions is not None
        else "explicit",
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
        "read_rows": read_rows,
        "timings": clock.laps,
    }
    if oracle:
        summary["oracle"] = oracle
    return PrepareResult(
        tmp, False, key, rows={n: rows[n] for n in SPLITS},
        positive_rate={n: rates[n] for n in SPLITS}, bad_rows=bad, layout=layout,
        summary=summary,
    )  # fmt: skip


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
    info = {"rows": syn.rows, "seed": syn.seed, "generator_version": GENERATOR_VERSION}
    identity = [{"synthetic": info}]
    params = _params(cfg, cfg.data.on_bad_row, True)
    key = source_hash(identity, params)
    if not force and is_prepared(out_dir, key):
        return _reuse(out_dir, key)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".synthetic-", dir=out_dir.parent) as td:
        raw = Path(td) / "synthetic.tsv"
        res = generate(raw, syn.rows, syn.seed)
        info = {**info, "oracle_auc": res.oracle_auc, "oracle_logloss": res.oracle_logloss,
                "positive_rate": res.positive_rate}  # fmt: skip
        return prepare_dataset(
            [raw], out_dir, cfg, force=True, identity=identity, synthetic_info=info
        )


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
    "is_prepared",
    "prepare",
    "prepare_config_dataset",
    "prepare_dataset",
    "prepare_from_config",
    "source_hash",
]
