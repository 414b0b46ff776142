"""Raw Criteo file(s) -> a prepared directory the loader reads: the one entry point.

:func:`prepare` is the single way to prepare data (the CLI's ``ctrcal prepare``, ``ctrcal
train`` / ``run`` / ``shift-report`` without ``--data``, and the API all call it). It prepares

* ``inputs`` given as a list of raw files: pooled and split by ``data.split`` /
  ``split_seed`` / ``split_order`` (see :mod:`ctrcal.preparation.splits`). Several files whose names
  say they already are splits (``train.csv valid.csv test.csv``) are refused unless
  ``resplit=True``: re-splitting would move test rows into training;
* ``inputs`` given as ``{"train": [...], "valid": [...], "test": [...]}``: kept as given;
* ``inputs=None``: what ``cfg.data`` names -- ``inputs``, or ``train``/``valid``/``test``, or
  (naming neither) generated ``synthetic`` data with known click probabilities.

A prepared directory holds::

    DIR/feature_map.json   schema version, per-feature stats, source hash (human-readable)
    DIR/vocab.parquet      kept categorical values and their ids
    DIR/train/part-*.parquet, DIR/valid/..., DIR/test/...
                           label float32, I1..I13 float32 (null = missing), C1..C26 int32
                           (+ true_prob float32 when the sources are synthetic)

The jobs live in their own modules: :mod:`ctrcal.preparation.splits` (which row goes where),
:mod:`ctrcal.preparation.encode` (the streaming pipeline: parse and code chunk by chunk, fit on the
train rows' distinct values, encode by gather, write; memory does not grow with the rows),
:mod:`ctrcal.preparation.publish` (owned temporary directory, atomic
publication, a lock so that concurrent runs into one directory take turns, cleanup after
killed runs). A run killed at any moment leaves ``DIR`` as it was (or absent); the same
command again gives the output of an uninterrupted run.

``data.engine`` chooses who runs the pipeline: ``local`` (threads of this process) or ``ray``
(a task per input file, :mod:`ctrcal.preparation.ray_engine`). Both write the same bytes, so
the engine is not part of what identifies the directory.

The ``source_hash`` in the feature map covers each source file's identity (resolved path, size,
modification time), the layout, the split and the pipeline config; a later call with the same
hash reuses ``DIR`` instead of preparing again, any change prepares afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from ctrcal.core.criteo_schema import LABEL
from ctrcal.core.errors import DataError
from ctrcal.data.feature_map import FEATURE_MAP_FILE, SCHEMA_VERSION
from ctrcal.data.schema import DatasetSchema, resolve_schema
from ctrcal.preparation import schema_reader
from ctrcal.preparation.coder import STRING_HASH
from ctrcal.preparation.days import describe_days
from ctrcal.preparation.encode import Clock, Source, encode_sources
from ctrcal.preparation.features import FeaturePipeline, resolve_numeric_transform
from ctrcal.preparation.inputs import expand_inputs
from ctrcal.preparation.parse import check_on_bad_row, detect_format
from ctrcal.preparation.parse import threads as parse_threads
from ctrcal.preparation.publish import (
    OWNER_FILE,
    check_out_dir,
    clean_stale_temporaries,
    is_prepared,
    owned_temp_dir,
    publish,
    publish_lock,
)
from ctrcal.preparation.result import PrepareResult
from ctrcal.preparation.splits import (
    SPLITS,
    SplitPlan,
    check_fractions,
    check_split_sources,
    plan_splits,
    plan_time_column,
    read_order,
)
from ctrcal.preparation.stages import chunk_bytes_for
from ctrcal.preparation.write import PROB_COL

PREPARE_VERSION = 4  # 2: original-space statistics, split_order; 3: numpy; 4: one pipeline
_SPLIT_WORDS = {
    "train": 0,
    "training": 0,
    "tr": 0,
    "valid": 1,
    "validation": 1,
    "val": 1,
    "dev": 1,
    "test": 2,
    "testing": 2,
    "te": 2,
}


# ---------------------------------------------------------------------------------------------
# Sources and identity


def _resolve_sources(
    inputs: Sequence[str | Path] | Mapping[str, Sequence[str | Path]],
    where: str = "",
) -> list[Source]:
    """The sources of ``inputs`` (globs expanded, each file once); ``where`` prefixes the key
    that names a pattern matching nothing (``data.`` for a config's data section)."""
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
            Source(p, SPLITS.index(s))
            for s in SPLITS
            for p in expand_inputs(_as_list(inputs[s]), f"{where}{s}")
        ]
        held: dict[str, str] = {}
        for src in sources:
            other = held.setdefault(os.path.realpath(src.path), SPLITS[src.split])
            if other != SPLITS[src.split]:
                raise DataError(
                    f"{src.path}: given as both {where}{other} and {where}{SPLITS[src.split]}; "
                    "a file belongs to one split"
                )
    else:
        sources = [Source(p, None) for p in expand_inputs(_as_list(inputs), f"{where}inputs")]
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


def split_role(path: Path) -> int | None:
    """0/1/2 when a file's name says it is a train / valid / test split (``train.csv``,
    ``x4_valid.csv``, ``criteo-test.txt.gz``), else None."""
    words = re.split(r"[^a-z]+", path.name.lower())
    roles = {_SPLIT_WORDS[w] for w in words if w in _SPLIT_WORDS}
    return roles.pop() if len(roles) == 1 else None


def _refuse_pre_split(sources: list[Source]) -> None:
    """Several files named as different splits are not pooled and re-split silently."""
    roles = {split_role(s.path) for s in sources} - {None}
    if len(sources) > 1 and len(roles) > 1:
        names = " ".join(str(s.path) for s in sources)
        raise DataError(
            f"{names}: these files look like train/valid/test splits already; keep them as "
            "given with --train/--valid/--test (data.train/valid/test in a config), or pass "
            "--resplit (resplit=True) to pool and split them again"
        )


def _file_identity(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def source_hash(identity: Any, params: Mapping[str, Any]) -> str:
    """sha256 of the sources' identity and the pipeline/split parameters."""
    blob = json.dumps(
        {
            "prepare_version": PREPARE_VERSION,
            "schema_version": SCHEMA_VERSION,
            "sources": identity,
            "params": params,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def data_schema(cfg: Any) -> DatasetSchema | None:
    """The config's ``data.schema`` (None: Criteo files, their layout detected per file)."""
    from ctrcal.data.schema import CRITEO

    schema = resolve_schema(getattr(cfg.data, "schema", None))
    return None if schema is CRITEO else schema


def _string_hash(schema: DatasetSchema | None) -> str | None:
    """The function that keys the schema's string categoricals (None: it has none)."""
    spelled = schema is not None and schema.categorical_spelling == "string"
    return STRING_HASH if spelled and schema.categorical else None


def _params(cfg: Any, on_bad_row: str, random_split: bool) -> dict[str, Any]:
    data, feats = cfg.data, cfg.features
    schema = data_schema(cfg)
    out = {
        "schema": None if schema is None else schema.to_dict(),
        "layout": data.layout,
        "on_bad_row": on_bad_row,
        "parquet_compression": data.parquet_compression,
        "min_count": feats.min_count,
        "numeric_transform": feats.numeric_transform,
        "numeric_buckets": feats.numeric_buckets,
        "max_vocab": feats.max_vocab,
        "hash_buckets": feats.hash_buckets,
    }
    if _string_hash(schema):
        # a directory whose strings another function keyed is prepared again, not reused
        out["string_hash"] = _string_hash(schema)
    if random_split:
        out["split"] = list(data.split)
        out["split_order"] = data.split_order
        if data.split_order == "random":
            out["split_seed"] = data.split_seed
    return out


@dataclass(frozen=True)
class _Sections:
    """The config sections that decide a prepared directory: ``data`` and ``features``."""

    data: Any
    features: Any


# ---------------------------------------------------------------------------------------------
# The entry point


def prepare(
    inputs: Sequence[str | Path] | Mapping[str, Sequence[str | Path]] | None,
    out_dir: str | Path,
    data: Any,
    features: Any,
    on_bad_row: str | None = None,
    *,
    resplit: bool = False,
    force: bool = False,
    chunk_bytes: int | None = None,
    threads: int | None = None,
) -> PrepareResult:
    """Prepare raw Criteo data into ``out_dir``, or reuse it when inputs and config are unchanged.

    Args:
        inputs: raw files to split by ``cfg.data`` (``split``, ``split_seed``,
            ``split_order``); or ``{"train": [...], "valid": [...], "test": [...]}`` kept as
            given; or None for what ``cfg.data`` names (its ``inputs``, its
            ``train``/``valid``/``test``, else generated ``synthetic`` data).
        out_dir: the prepared directory to write.
        data: the config's ``data`` section (:class:`~ctrcal.config.DataConfig`).
        features: the config's ``features`` section (:class:`~ctrcal.config.FeaturesConfig`).
        on_bad_row: ``error`` or ``skip``; None takes ``data.on_bad_row``.
        resplit: allow pooling and re-splitting files whose names say they are splits.
        force: prepare even if an up-to-date ``out_dir`` exists.
        chunk_bytes: text bytes per chunk (default: ``CTRCAL_PREPARE_CHUNK_BYTES``, else
            chosen from the inputs' size and the threads by
            :func:`ctrcal.preparation.stages.chunk_bytes_for`); the output does not depend on it.
        threads: threads that parse, code, encode and write (default:
            ``CTRCAL_PREPARE_THREADS``, else :func:`ctrcal.preparation.parse.threads`, at most the
            cores); the output does not depend on it.

    Returns:
        :class:`PrepareResult` (``.out_dir``, rows per split, ``.describe()`` for people).

    Raises:
        DataError: unreadable or malformed input, unusable output directory, files that look
            pre-split given to be split again without ``resplit``.
    """
    # the two sections travel together through the helpers below
    cfg = _Sections(data, features)
    if inputs is None:
        explicit = data.train or data.valid or data.test
        for key, message in check_split_sources(data):
            raise DataError(f"{key}: {message}")
        if explicit:
            inputs = {"train": data.train, "valid": data.valid, "test": data.test}
        elif data.inputs:
            inputs = list(data.inputs)
        else:
            return _prepare_synthetic(cfg, Path(out_dir), force=force)
        where = "data."
    else:
        where = ""
    return _prepare_files(
        inputs,
        Path(out_dir),
        cfg,
        on_bad_row,
        resplit=resplit,
        force=force,
        chunk_bytes=chunk_bytes,
        where=where,
        threads=threads,
    )


def _prepare_files(
    inputs: Sequence[str | Path] | Mapping[str, Sequence[str | Path]],
    out_dir: Path,
    cfg: Any,
    on_bad_row: str | None,
    *,
    resplit: bool = False,
    force: bool = False,
    identity: Any = None,
    synthetic_info: Mapping[str, Any] | None = None,
    chunk_bytes: int | None = None,
    where: str = "",
    threads: int | None = None,
) -> PrepareResult:
    start = time.perf_counter()
    threads = _size_setting(threads, "CTRCAL_PREPARE_THREADS", parse_threads(), 1)
    on_bad_row = check_on_bad_row(on_bad_row or cfg.data.on_bad_row)
    sources = _resolve_sources(inputs, where)
    total = sum(s.path.stat().st_size for s in sources)
    auto = chunk_bytes_for(total, threads)
    chunk_bytes = _size_setting(chunk_bytes, "CTRCAL_PREPARE_CHUNK_BYTES", auto, 1)
    random_split = sources[0].split is None
    if random_split:
        if not resplit and identity is None:
            _refuse_pre_split(sources)
        check_fractions(cfg.data.split)
        sources = [sources[i] for i in read_order([s.path for s in sources], cfg.data.split_order)]
    if identity is None:
        identity = [{**_file_identity(s.path), "split": s.split} for s in sources]
    key = source_hash(identity, _params(cfg, on_bad_row, random_split))
    if not force and is_prepared(out_dir, key):
        return _reuse(out_dir, key)
    check_out_dir(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with publish_lock(out_dir):
        # a concurrent run may have finished the same work while this one waited
        if not force and is_prepared(out_dir, key):
            return _reuse(out_dir, key)
        clean_stale_temporaries(out_dir)
        tmp = owned_temp_dir(out_dir)
        try:
            result = _prepare_into(
                tmp, sources, cfg, on_bad_row, key, synthetic_info or {}, chunk_bytes, threads
            )
            shutil.rmtree(tmp / "_work", ignore_errors=True)
            (tmp / OWNER_FILE).unlink(missing_ok=True)
            publish(tmp, out_dir, key)
        except OSError as exc:
            # the inputs are named by the readers; what is left is the output's trouble (a
            # full disk, a read-only or foreign folder): name the path and the cause
            where = f" ({exc.filename})" if exc.filename else ""
            raise DataError(
                f"{out_dir}: cannot write the prepared data: {exc.strerror or exc}{where}"
            ) from None
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    result.out_dir = out_dir
    result.seconds = time.perf_counter() - start
    return result


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
        raise DataError(
            f"{env.removeprefix('CTRCAL_PREPARE_').lower()} must be >= {minimum}, got {value}"
        )
    return int(value)


def _prepare_into(
    tmp: Path,
    sources: list[Source],
    cfg: Any,
    on_bad_row: str,
    key: str,
    synthetic_info: Mapping[str, Any],
    chunk_bytes: int,
    threads: int,
) -> PrepareResult:
    """One preparation into ``tmp``: detect the sources, plan the splits, encode, save."""
    (tmp / "_work").mkdir()
    clock = Clock()
    schema = data_schema(cfg)
    layout = _detect(sources, schema, cfg.data.layout)
    pipe = _pipeline(cfg.features, schema, layout)
    plan = _plan(sources, schema, cfg.data)
    clock("detect")
    if cfg.data.engine == "ray":
        # imported here: the local engine never imports Ray
        from ctrcal.preparation.ray_engine import encode_sources_ray

        tally = encode_sources_ray(
            tmp,
            sources,
            on_bad_row,
            plan,
            pipe,
            clock,
            chunk_bytes,
            compression=cfg.data.parquet_compression,
            address=cfg.data.ray_address,
        )
    else:
        tally = encode_sources(
            tmp,
            sources,
            on_bad_row,
            plan,
            pipe,
            clock,
            chunk_bytes,
            threads,
            compression=cfg.data.parquet_compression,
        )
    rows = {name: tally.rows[k] for k, name in enumerate(SPLITS)}
    rates = {name: tally.rate(k) for k, name in enumerate(SPLITS)}
    oracle = _oracle(tmp) if tally.with_prob else None
    extra: dict[str, Any] = {
        "source_hash": key,
        "layout": layout,
        "sources": [
            # generated data lives in a temporary file: record what made it, not that path,
            # so two identical preparations write identical feature maps
            {
                "path": "<synthetic>" if synthetic_info else str(s.path),
                "layout": s.fmt.layout,
                "split": SPLITS[s.split] if s.split is not None else "split",
            }
            for s in sources
        ],
        "split": plan.describe(),
        "splits": {n: {"rows": rows[n], "positive_rate": _nan_to_none(rates[n])} for n in SPLITS},
        "bad_rows_skipped": tally.bad,
    }
    if schema is not None:
        extra["schema"] = schema.to_dict()
        if _string_hash(schema):
            extra["string_hash"] = _string_hash(schema)
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
        "numeric_transform": pipe.numeric_transform,
        "read_rows": sum(rows.values()) + tally.bad,
        "chunks": tally.chunks,
        "native_chunks": tally.native_chunks,
        "timings": clock.laps,
        "tables": dict(zip(pipe.categorical_fields, pipe.vocab_sizes_, strict=True)),
        "hashed": [n for n in pipe.categorical_fields if pipe.hashed_[n]],
        "max_vocab": pipe.max_vocab,
    }
    if plan.mode == "time_files":
        summary["days"] = describe_days([s.path for s in sources], plan.file_split, SPLITS)
    if oracle:
        summary["oracle"] = oracle
    return PrepareResult(
        tmp,
        False,
        key,
        rows=rows,
        positive_rate=rates,
        bad_rows=tally.bad,
        layout=layout,
        summary=summary,
    )


def _detect(sources: list[Source], schema: DatasetSchema | None, configured: str) -> str:
    """Detect each source's format (``s.fmt``; Criteo files also their true probabilities'
    file, ``s.prob``) and return the layout the feature map records (``configured``: the
    config's ``data.layout``, for Criteo files).

    Raises:
        DataError: a file that does not match, an unlabelled file outside the test split, or
            Criteo_x1 (already encoded) mixed with raw layouts.
    """
    from ctrcal.preparation.synthetic import prob_path

    for s in sources:
        s.fmt = detect_format(s.path, schema, configured)
        if schema is None:
            p = prob_path(s.path)
            s.prob = p if p.exists() else None
        if not s.fmt.labelled and (s.split is None or s.split < 2):
            raise DataError(
                f"{s.path}: has no labels ({s.fmt.layout} layout); training and validation "
                "need labelled rows (an unlabelled file can only be the explicit test split)"
            )
    layouts = sorted({s.fmt.layout for s in sources if s.fmt})
    if len({"x1" if lay == "x1" else "raw" for lay in layouts}) > 1:
        raise DataError(
            "cannot mix Criteo_x1 (already encoded) with raw layouts: " + ", ".join(layouts)
        )
    return layouts[0] if len(layouts) == 1 else "+".join(layouts)


def _pipeline(features: Any, schema: DatasetSchema | None, layout: str) -> FeaturePipeline:
    """The unfitted feature pipeline of the config's ``features`` for these fields (the
    schema's; Criteo's without one) and layout (``auto`` transforms resolve by it)."""
    fields = (
        {}
        if schema is None
        else {"categorical_fields": schema.categorical_fields, "numeric_fields": schema.numeric}
    )
    return FeaturePipeline(
        min_count=features.min_count,
        numeric_transform=resolve_numeric_transform(features.numeric_transform, layout),
        numeric_buckets=features.numeric_buckets,
        max_vocab=features.max_vocab,
        hash_buckets=features.hash_buckets,
        **fields,
    )


def _plan(sources: list[Source], schema: DatasetSchema | None, data: Any) -> SplitPlan:
    """Which row goes to which split: by the time column's values where a schema has one and
    ``split_order`` is ``time`` over pooled files, else by :func:`plan_splits`."""
    if (
        schema is not None
        and schema.time
        and sources[0].split is None
        and (data.split_order == "time")
    ):
        counts = pl.concat([schema_reader.time_counts(s.path, s.fmt) for s in sources])
        return plan_time_column(counts, data.split)
    return plan_splits(
        [s.path for s in sources],
        [s.split for s in sources],
        data.split,
        data.split_seed,
        data.split_order,
        [s.fmt.header_lines for s in sources],
    )


def _nan_to_none(x: float) -> float | None:
    return None if x != x else x


def _oracle(directory: Path) -> dict[str, dict[str, float]]:
    from ctrcal.preparation.synthetic import oracle_metrics

    out = {}
    for name in SPLITS[1:]:  # the held-out splits are what models are measured on
        df = pl.read_parquet(directory / name, columns=[LABEL, PROB_COL])
        if df.height and df[LABEL].null_count() == 0:
            auc, ll = oracle_metrics(
                df[PROB_COL].to_numpy().astype("float64"), df[LABEL].to_numpy()
            )
            out[name] = {"auc": auc, "logloss": ll}
    return out


def _prepare_synthetic(cfg: Any, out_dir: Path, *, force: bool) -> PrepareResult:
    from ctrcal.preparation.synthetic import GENERATOR_VERSION, generate

    syn = cfg.data.synthetic
    info = {
        "rows": syn.rows,
        "seed": syn.seed,
        "drift": syn.drift,
        "generator_version": GENERATOR_VERSION,
    }
    identity = [{"synthetic": info}]
    key = source_hash(identity, _params(cfg, cfg.data.on_bad_row, True))
    if not force and is_prepared(out_dir, key):
        return _reuse(out_dir, key)
    check_out_dir(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temporaries(out_dir)
    td = owned_temp_dir(out_dir, "synthetic")
    try:
        raw = td / "synthetic.tsv"
        res = generate(raw, syn.rows, syn.seed, drift=syn.drift)
        info = {
            **info,
            "oracle_auc": res.oracle_auc,
            "oracle_logloss": res.oracle_logloss,
            "positive_rate": res.positive_rate,
        }
        return _prepare_files(
            [raw], out_dir, cfg, None, force=force, identity=identity, synthetic_info=info
        )
    finally:
        shutil.rmtree(td, ignore_errors=True)


def _reuse(out_dir: str | Path, key: str) -> PrepareResult:
    out_dir = Path(out_dir)
    # a run killed after publishing but before removing its own temporaries (the synthetic
    # source's, say) left them behind: reusing the result is when they are found next
    clean_stale_temporaries(out_dir)
    fm = json.loads((out_dir / FEATURE_MAP_FILE).read_text())
    return PrepareResult(
        out_dir,
        True,
        key,
        rows={k: v["rows"] for k, v in fm["splits"].items()},
        positive_rate={k: v["positive_rate"] for k, v in fm["splits"].items()},
        layout=fm.get("layout"),
        summary={"oracle": fm["oracle"]} if fm.get("oracle") else {},
    )


__all__ = [
    "prepare",
    "source_hash",
]
