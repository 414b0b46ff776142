"""``ctrcal predict``: a run's click probabilities for a split, a prepared directory or raw
files, streamed into one parquet file.

The output has a row per input row, in input order::

    prob        float64  click probability (with mc_samples: the mean of the passes)
    prob_std    float64  with mc_samples only: the std of the passes
    label       float64  the click, where the input has labels (null for an unlabelled row)
    <time>      int64    the schema's time column, for raw files of a schema that has one
    <numeric>   float64  with_features: each numeric input in the original space (the
                         values as the input file holds them; NaN: missing)
    <category>  int64    with_features: each categorical input as the model reads it (its
                         id in the run's vocabulary, as prepared)

so it goes straight into ``ctrcal calibration-report FILE --prob prob --label label``, and
with features into ``ctrcal calibration-report FILE --reference REF`` (drift against
another such file, e.g. the test split's).

Memory stays flat: prepared splits are read in ``stream`` mode, raw files chunk by chunk by
the parser of ``prepare`` (:func:`ctrcal.preparation.parse.iter_chunks`) and encoded with the run's
feature map (:func:`ctrcal.serving.encoding.encode_columns`); every batch of probabilities is
appended to the output as it comes. The file is written to a temporary sibling and renamed
at the end, so a failed or interrupted run leaves no half-written output.

The probabilities are those of :func:`ctrcal.train.evaluate.evaluate_run` on the same split,
batch size and seed (the same loop, the same MC draws): ``calibration-report`` on the output
gives ``evaluate``'s numbers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from ctrcal.core.batch import Batch
from ctrcal.core.errors import ConfigError, DataError

__all__ = ["PredictResult", "predict_run"]

PROB, STD, LABEL = "prob", "prob_std", "label"


@dataclass
class PredictResult:
    """What :func:`predict_run` wrote."""

    path: Path
    rows: int
    columns: list[str]

    def describe(self) -> str:
        return f"wrote {self.rows:,} rows ({', '.join(self.columns)}) to {self.path}"


def predict_run(
    run_dir: str | Path,
    out: str | Path,
    split: str | None = None,
    data_dir: str | Path | None = None,
    raw_files: Sequence[str | Path] = (),
    mc_samples: int = 0,
    seed: int = 0,
    batch_size: int | None = None,
    device: str = "auto",
    on_bad_row: str = "error",
    with_features: bool = False,
    engine: str = "torch",
    precision: str | None = None,
) -> PredictResult:
    """Score ``run_dir``'s best model and write the probabilities to ``out`` (parquet).

    Args:
        run_dir: a run directory with a best checkpoint.
        out: the output parquet file (replaced atomically).
        split: a split of the prepared directory (default ``test`` unless ``raw_files``).
        data_dir: the prepared directory (default: the run's own); its feature identity must
            be the run's.
        raw_files: raw files to encode with the run's feature map instead of a split.
        mc_samples: > 0 writes the mean and std of that many MC-LayerNorm passes.
        seed: seeds the MC passes (as ``evaluate --seed``).
        batch_size: rows per forward pass (default: the run's ``train.eval_batch_size``).
        device: ``auto``, ``cpu``, ``cuda``, ...
        on_bad_row: for raw files, ``error`` or ``skip`` a malformed row.
        with_features: also write the model's input columns (module docstring).
        engine: ``torch`` (the eager model), ``onnxruntime`` or ``aoti``: the exported graph
            (:mod:`ctrcal.serving.engines`; one-shot, on the CPU).
        precision: ``fp32``; ``bf16`` (``torch``: autocast, one-shot; ``aoti``) or ``int8``
            (``onnxruntime``), as ``ctrcal export --precision`` makes them. None: with
            ``torch``, the precision the run was trained in, one-shot and MC passes alike
            (:func:`~ctrcal.train.results.run_precision`, as ``evaluate`` scores it); fp32
            with an exported engine.

    Raises:
        CtrcalError: no such run or no checkpoint, data of another feature map, a model
            without MC layers with ``mc_samples``, an unreadable input or an unwritable output.
    """
    from ctrcal.core.utils import atomic_path
    from ctrcal.train.results import open_run

    if raw_files and split is not None:
        raise ConfigError("give either raw files or --split, not both")
    if engine != "torch" and mc_samples > 0:
        raise ConfigError(
            f"--engine {engine} scores the exported one-shot graph: MC passes need --engine torch"
        )
    if precision is not None:
        _check_precision(engine, precision, mc_samples)
    split = split or "test"

    def inputs(data_dir: Path, feature_map: Any) -> None:
        if not raw_files:
            rows = int(((feature_map.splits or {}).get(split) or {}).get("rows", 0) or 0)
            if rows == 0:
                raise DataError(f"{data_dir}: the {split} split is empty or missing")
        for path in raw_files:
            if not Path(path).is_file():
                raise DataError(f"{path}: no such file")

    run = open_run(run_dir, "predict", data_dir, device=device, mc_samples=mc_samples, check=inputs)
    model, cfg, dev, data_dir, feature_map = (
        run.model,
        run.config,
        run.device,
        run.data_dir,
        run.data,
    )
    if precision is None:  # the run's own arithmetic, as evaluate scores it
        dtype = run.precision if engine == "torch" else None
    else:
        dtype = torch.bfloat16 if precision == "bf16" else None
    # the MC passes are seeded: the caller's RNG is left as it was
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        batch_size = batch_size or cfg.train.eval_batch_size
        if raw_files:
            formats = _raw_formats(cfg, raw_files)
            batches = _raw_batches(data_dir, formats, on_bad_row, batch_size)
            time_name = _time_column(feature_map)
            labelled = any(fmt.labelled for _, fmt in formats)
        else:
            batches = _split_batches(data_dir, split, batch_size)
            time_name = None
            labelled = (feature_map.splits.get(split) or {}).get("positive_rate") is not None
        schema = _schema(mc_samples > 0, labelled, time_name)
        features = _feature_columns(feature_map, schema) if with_features else None
        if features is not None:
            schema = features[1]
        torch.manual_seed(seed)
        total = 0
        with (
            _engine(engine, model, feature_map, precision or "fp32") as scorer,
            atomic_path(out) as tmp,
            pq.ParquetWriter(tmp, schema) as writer,
        ):
            for batch, time in batches:
                if scorer is None:
                    mean, std = _score(model, batch, batch_size, dev, mc_samples, dtype)
                else:
                    mean, std = scorer(batch), None
                columns = [mean]
                if mc_samples > 0:
                    columns.append(std)
                if labelled:
                    columns.append(batch.label.double().numpy())
                if time_name is not None:
                    columns.append(time)
                if features is not None:
                    columns += _features(batch, features)
                writer.write_table(
                    pa.Table.from_arrays(
                        [pa.array(c, from_pandas=True) for c in columns], schema=schema
                    )
                )
                total += len(batch)
    return PredictResult(Path(out), total, schema.names)


def _check_precision(engine: str, precision: str, mc_samples: int) -> None:
    from ctrcal.serving.formats import ENGINE_FORMATS, check_precision

    if engine != "torch":
        check_precision(ENGINE_FORMATS[engine], precision)
    elif precision not in ("fp32", "bf16") or (precision == "bf16" and mc_samples > 0):
        raise ConfigError(
            f"--precision {precision}: --engine torch scores in fp32, or one-shot in bf16"
        )


def _engine(engine: str, model: Any, feature_map: Any, precision: str) -> Any:
    """A context giving the exported engine's scorer, or None for the eager model."""
    if engine == "torch":
        return contextlib.nullcontext(None)
    from ctrcal.serving.engines import exported_engine

    return exported_engine(engine, model.cpu(), feature_map, precision)


def _schema(mc: bool, labelled: bool, time_name: str | None) -> pa.Schema:
    fields = [pa.field(PROB, pa.float64())]
    if mc:
        fields.append(pa.field(STD, pa.float64()))
    if labelled:
        fields.append(pa.field(LABEL, pa.float64()))
    if time_name is not None:
        fields.append(pa.field(time_name, pa.int64()))
    return pa.schema(fields)


def _feature_columns(feature_map: Any, schema: pa.Schema) -> tuple[Any, pa.Schema]:
    """(the numeric codec, ``schema`` with a column per input: the numerics' original values
    as float64, then the categorical ids as int64); ConfigError where an input's name is
    taken by an output column."""
    taken = set(schema.names)
    names = [*feature_map.numeric_fields, *feature_map.categorical_fields]
    clash = [n for n in names if n in taken]
    if clash:
        raise ConfigError(
            f"--with-features: the input column {clash[0]!r} has the name of an output column"
        )
    fields = [pa.field(n, pa.float64()) for n in feature_map.numeric_fields]
    fields += [pa.field(n, pa.int64()) for n in feature_map.categorical_fields]
    return feature_map.numeric_codec(), pa.schema([*schema, *fields])


def _features(batch: Batch, features: tuple[Any, pa.Schema]) -> list[np.ndarray]:
    """A batch's inputs as written by ``with_features``: original-space numerics, then ids."""
    codec = features[0]
    numeric = codec.to_original(batch.numeric.double()).numpy() if batch.numeric.numel() else None
    out = [] if numeric is None else [numeric[:, j] for j in range(numeric.shape[1])]
    ids = batch.categorical.numpy().astype(np.int64)
    return out + [ids[:, j] for j in range(ids.shape[1])]


def _score(
    model: Any,
    batch: Batch,
    batch_size: int,
    device: torch.device,
    mc_samples: int,
    precision: torch.dtype | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(probabilities [B], MC std [B] or None) of one batch, through the prediction loop, in
    ``precision`` (an autocast dtype, or None for float32)."""
    if mc_samples > 0:
        from ctrcal.layers.mc_layernorm.predict import mc_predict
        from ctrcal.train.precision import compute_precision

        with torch.no_grad(), compute_precision(precision, device.type):
            mean, std = mc_predict(
                model, batch.inputs().to(device), n_samples=mc_samples, max_rows=batch_size
            )
        return mean.double().cpu().numpy(), std.double().cpu().numpy()
    from ctrcal.train.predict import predict_probs

    probs, _ = predict_probs(model, batch, batch_size, device, precision=precision)
    return probs.double().numpy(), None


def _split_batches(data_dir: Path, split: str, batch_size: int) -> Iterator[tuple[Batch, None]]:
    from ctrcal.train.splits import open_split

    data = open_split(data_dir, split, "stream", torch.device("cpu"))
    for batch in data.batches(batch_size, shuffle=False):
        yield batch, None


def _time_column(feature_map: Any) -> str | None:
    return ((feature_map.extra or {}).get("schema") or {}).get("time")


def _raw_formats(cfg: Any, raw_files: Sequence[str | Path]) -> list[tuple[Path, Any]]:
    """Each raw file with its detected layout, as ``prepare`` detects it (the run's
    ``data.schema``, else a Criteo layout)."""
    from ctrcal.preparation.parse import detect_format
    from ctrcal.preparation.prepare import data_schema

    schema = data_schema(cfg)
    return [(path, detect_format(path, schema, cfg.data.layout)) for path in map(Path, raw_files)]


def _raw_batches(
    data_dir: Path, formats: list[tuple[Path, Any]], on_bad_row: str, batch_size: int
) -> Iterator[tuple[Batch, np.ndarray | None]]:
    """Raw files parsed chunk by chunk as ``prepare`` parses them, each chunk encoded with
    the run's fitted pipeline and cut into batches."""
    from ctrcal.preparation import parse
    from ctrcal.preparation.features import FeaturePipeline
    from ctrcal.serving.encoding import encode_columns

    pipe = FeaturePipeline.load(data_dir)
    for path, fmt in formats:
        for chunk in parse.iter_chunks(path, fmt, on_bad_row):
            cat, num = encode_columns(
                pipe, chunk.numeric, chunk.numeric_valid, chunk.categorical, chunk.categorical_valid
            )
            label = torch.from_numpy(chunk.label.astype(np.float32))
            cat_t, num_t = torch.from_numpy(cat), torch.from_numpy(num)
            for lo in range(0, len(chunk), batch_size):
                hi = min(lo + batch_size, len(chunk))
                time = None if chunk.time is None else chunk.time[lo:hi].astype(np.int64)
                yield Batch(cat_t[lo:hi], num_t[lo:hi], label[lo:hi]), time
