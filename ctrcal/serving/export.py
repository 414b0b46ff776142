"""``ctrcal export``: a run's model as a file a server can load (ONNX, a ``torch.export``
program, or an AOTInductor package), and what the server needs to encode raw rows;
``ctrcal.export`` (:func:`export_module`) for any model.

The exported graph (:class:`ServedModel`) takes the prepared encoding::

    categorical  int64   [B, Fc]   ids, as ``vocab.parquet`` numbers them
    numeric      float32 [B, Fn]   model-space values (NaN = missing)
    ->  probability float32 [B]    click probability (calibrated when a calibrator is folded in)

with a dynamic batch dimension; an id outside its field's vocabulary is served as the field's
OOV id. The model is exported in eval mode: MC-LayerNorm exports in its one-shot (deterministic)
form, which is LayerNorm with the learned affine. MC integration is a serving-time choice (see
docs/serving.md). The fused C kernels of ``ctrcal.layers`` are never traced: they step aside
while a tracer runs and the pure-torch path is recorded.

Beside ``FILE`` the export writes ``FILE.encoding/``: ``feature_map.json`` and
``vocab.parquet`` of the run's data (the vocabulary and the numeric transform) and
``serving.json`` (the inputs, their fields in order, the calibrator and its parameters: an
isotonic table is there as its two arrays too).
:class:`~ctrcal.serving.encoding.RawRowEncoder` reads that folder, without torch.

A calibrator fitted on the run's clean validation predictions (``calibrator``: the
``calibration-report`` / shift-report recipe) is folded into the graph: temperature and Platt
as one or two scalars on the logit, isotonic as its table of steps, interpolated in the graph.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ctrcal.core.batch import Batch
from ctrcal.core.errors import ConfigError, CtrcalError
from ctrcal.serving.formats import check_format, check_precision

__all__ = [
    "CalibrationHead",
    "ExportResult",
    "ServedModel",
    "export_model",
    "export_module",
    "export_run",
]

EXPORT_CALIBRATORS = ("temperature", "platt", "isotonic")
ENCODING_SUFFIX = ".encoding"
SERVING_FILE = "serving.json"


class CalibrationHead(nn.Module):
    """A fitted calibrator as graph ops: logits [B] -> click probabilities [B].

    ``temperature``: ``sigmoid(z / T)``; ``platt``: ``sigmoid(a z + b)``; ``isotonic``: the
    step table ``(x_k, y_k)`` interpolated linearly and clipped at its ends, computed with
    comparisons and gathers (ONNX has no ``searchsorted``).
    """

    def __init__(self, calibrator: Any) -> None:
        super().__init__()
        name = type(calibrator).__name__
        self.kind = {
            "TemperatureScaling": "temperature",
            "PlattScaling": "platt",
            "IsotonicCalibration": "isotonic",
        }.get(name)
        if self.kind is None:
            raise ConfigError(
                f"calibrator {name} cannot be folded into an exported model (valid: "
                f"{', '.join(EXPORT_CALIBRATORS)}); a field-aware or MCGrad calibrator needs "
                "its own serving code"
            )
        if self.kind == "temperature":
            scale, shift = 1.0 / calibrator.temperature_, 0.0
        elif self.kind == "platt":
            scale, shift = float(calibrator.coef_), float(calibrator.intercept_)
        else:
            scale, shift = 1.0, 0.0
            xs = np.asarray(calibrator.x_thresholds_, dtype=np.float64)
            ys = np.asarray(calibrator.y_thresholds_, dtype=np.float64)
            # float64: step ends a float32 apart would make a slope float32 cannot hold
            self.register_buffer("xs", torch.tensor(xs, dtype=torch.float64))
            self.register_buffer("ys", torch.tensor(ys, dtype=torch.float64))
        self.scale, self.shift = float(scale), float(shift)

    def params(self) -> dict[str, Any]:
        """The calibrator's parameters as ``serving.json`` records them."""
        if self.kind == "isotonic":
            return {"x_thresholds": self.xs.tolist(), "y_thresholds": self.ys.tolist()}
        return {"scale": self.scale, "shift": self.shift}

    def forward(self, logits: Tensor) -> Tensor:
        if self.kind != "isotonic":
            return torch.sigmoid(logits * self.scale + self.shift)
        xs, ys = self.xs, self.ys
        if xs.numel() == 1:
            return ys.float().expand_as(logits).clone()
        z = torch.clamp(logits.double(), xs[0], xs[-1])
        # numpy.interp's segment: the last step end at or below z starts it
        hi = (z.unsqueeze(1) >= xs.unsqueeze(0)).sum(dim=1).clamp(1, xs.numel() - 1)
        lo = hi - 1
        x0, x1, y0, y1 = xs[lo], xs[hi], ys[lo], ys[hi]
        span = x1 - x0
        t = torch.where(span > 0, (z - x0) / torch.where(span > 0, span, 1.0), 0.0)
        return (y0 + t * (y1 - y0)).float()


class ServedModel(nn.Module):
    """The exported graph: ``(categorical [B, Fc] int64, numeric [B, Fn] float32)`` ->
    click probabilities [B] float32.

    An id outside its field's vocabulary (below 0, or at or above the field's vocabulary
    size) is served as that field's OOV id, the id of a value never seen in training: the
    model's fields share one embedding table, where such an id would read another field's row
    (or fail, as the runtime decides). The clamp is part of the served graph only; training
    and ``ctrcal predict`` build their ids in range.

    Args:
        model: a ctrcal model (``model(batch) -> logits [B]``), in eval mode.
        feature_map: the run's feature map (each field's vocabulary size and OOV id).
        head: a :class:`CalibrationHead`, or None for ``sigmoid``.
    """

    def __init__(
        self, model: nn.Module, feature_map: Any, head: CalibrationHead | None = None
    ) -> None:
        super().__init__()
        self.model = model
        self.head = head
        sizes = torch.tensor(feature_map.vocab_sizes, dtype=torch.int64)
        self.register_buffer("vocab_sizes", sizes, persistent=False)
        oov = torch.tensor(feature_map.oov_ids, dtype=torch.int64)
        self.register_buffer("oov_ids", oov, persistent=False)

    def forward(self, categorical: Tensor, numeric: Tensor) -> Tensor:
        known = (categorical >= 0) & (categorical < self.vocab_sizes)
        categorical = torch.where(known, categorical, self.oov_ids)
        logits = self.model(Batch(categorical, numeric, None)).reshape(-1).float()
        if self.head is None:
            return torch.sigmoid(logits)
        return self.head(logits)


@dataclass
class ExportResult:
    """What :func:`export_run` wrote."""

    path: Path
    encoding: Path
    fmt: str
    calibrator: str | None
    precision: str = "fp32"

    def describe(self) -> str:
        cal = f" with {self.calibrator} calibration folded in" if self.calibrator else ""
        fmt = self.fmt if self.precision == "fp32" else f"{self.fmt}, {self.precision}"
        return (
            f"wrote {self.path} ({fmt}{cal}); raw-row encoding (feature map, "
            f"vocabulary, numeric transform) in {self.encoding}"
        )


def _operator(exc: BaseException) -> str | None:
    """The operator an exporter's error is about (``aten::histc``), if it names one."""
    text = " ".join(str(e) for e in (exc, exc.__cause__, exc.__context__) if e is not None)
    m = re.search(r"\b(aten|prims|prim)(?:::|\.)([A-Za-z_0-9]+)", text)
    return f"{m.group(1)}::{m.group(2)}" if m else None


def export_model(
    served: ServedModel,
    out: str | Path,
    fmt: str,
    example: tuple[Tensor, Tensor],
    what: str = "model",
    precision: str = "fp32",
) -> None:
    """Export ``served`` (traced on ``example`` inputs) to ``out`` atomically, the inputs
    named ``categorical`` and ``numeric`` and the output ``probability``; ``precision`` as in
    :func:`export_module`.

    Raises:
        CtrcalError: torch cannot export the model (the operator named when the exporter
            names one).
    """
    export_module(
        served,
        example,
        out,
        fmt,
        what=what,
        input_names=["categorical", "numeric"],
        output_names=["probability"],
        precision=precision,
    )


def export_module(
    model: nn.Module,
    example_inputs: Any,
    path: str | Path,
    format: str = "onnx",
    what: str = "model",
    input_names: list[str] | None = None,
    output_names: list[str] | None = None,
    precision: str = "fp32",
) -> Path:
    """Export any model (yours or ctrcal's) for serving: ``ctrcal.export``.

    The graph computes ``model(*example_inputs)`` in eval mode, whatever it returns (a
    model that returns logits exports logits; one that returns probabilities exports those).
    MC-LayerNorm layers run in their one-shot form (LayerNorm with the learned affine) while
    exporting, and are left in the mode they had. Dimension 0 of every input tensor is the
    batch, dynamic in the graph.

    Args:
        model: a ``torch.nn.Module``.
        example_inputs: the model's inputs for one batch of at least 2 rows: a tensor, a dict
            of tensors (passed as the one argument, as FuxiCTR models take it), or a tuple
            of the positional arguments (tensors, dicts of tensors, ...).
        path: the output file (replaced atomically).
        format: ``onnx`` (``ctrcal[export]``), ``pt2`` (``torch.export``; load with
            ``torch.export.load``) or ``aoti`` (an AOTInductor package; load with
            ``torch._inductor.aoti_load_package`` or from C++).
        what: how an error names the model.
        input_names, output_names: ONNX graph names (default: the exporter's).
        precision: ``fp32``; ``bf16`` (pt2, aoti): the model runs under bf16 autocast with its
            linear layers' weights stored in bf16 (the model itself is not changed); ``int8``
            (onnx): the graph's matrix products get int8 weights, activations quantized per
            batch (``onnxruntime.quantization.quantize_dynamic``).

    Returns:
        ``path``.

    Raises:
        ConfigError: an unknown format, or inputs whose batch is not at least 2 rows in
            every tensor.
        NotAvailableError: the format's tools are missing.
        CtrcalError: torch cannot export the model (the operator named when the exporter
            names one).
    """
    from ctrcal.core.utils import atomic_path
    from ctrcal.layers.mc_layernorm.module import mc_mode

    check_format(format)
    check_precision(format, precision)
    args = _as_args(example_inputs)
    dynamic = _batch_dims(args, what)
    was_training = model.training
    model.eval()
    try:
        with mc_mode(model, enabled=False), atomic_path(path) as tmp, _quiet_exporters():
            try:
                with torch.no_grad():
                    # one trace for every format: the ONNX exporter and AOTInductor start
                    # from torch.export's program too
                    traced, shapes = model, dynamic
                    if precision == "bf16":  # forward(*args): its one parameter holds them all
                        traced, shapes = _Bf16(model), (dynamic,)
                    program = torch.export.export(traced, args, dynamic_shapes=shapes)
                    if format == "onnx":
                        _onnx(program, tmp, input_names, output_names, precision == "int8")
                    else:
                        with open(tmp, "wb") as f:
                            if format == "pt2":
                                torch.export.save(program, f)
                            else:
                                torch._inductor.aoti_compile_and_package(program, package_path=f)
            except CtrcalError:
                raise
            except Exception as exc:  # any exporter failure: one line naming the operator
                op = _operator(exc)
                where = f"operator {op}" if op else str(exc).strip().splitlines()[0][:200]
                raise CtrcalError(
                    f"{what}: torch cannot export it to {format} ({where}); export a model "
                    "built of exportable operators, or serve it with torch"
                ) from exc
    finally:
        model.train(was_training)
    return Path(path)


def _as_args(example_inputs: Any) -> tuple[Any, ...]:
    """The model's positional arguments: a tensor or a dict is the one argument."""
    if isinstance(example_inputs, (Tensor, dict)):
        return (example_inputs,)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs)
    raise ConfigError(
        "example_inputs: expected a tensor, a dict of tensors or a tuple of the model's "
        f"arguments, got {type(example_inputs).__name__}"
    )


def _batch_dims(args: tuple[Any, ...], what: str) -> Any:
    """``dynamic_shapes`` for ``args``: dimension 0 of every tensor is the one batch."""
    batch = torch.export.Dim("batch", min=1)
    rows: set[int] = set()

    def dims(x: Any) -> Any:
        if isinstance(x, Tensor):
            if x.dim() == 0:
                return None
            rows.add(int(x.shape[0]))
            return {0: batch}
        if isinstance(x, dict):
            return {k: dims(v) for k, v in x.items()}
        if isinstance(x, (tuple, list)):
            return type(x)(dims(v) for v in x)
        return None

    shapes = tuple(dims(a) for a in args)
    if len(rows) != 1 or min(rows) < 2:
        found = ", ".join(map(str, sorted(rows))) or "no tensor"
        raise ConfigError(
            f"{what}: example_inputs must be one batch of at least 2 rows in every tensor "
            f"(dimension 0 is the batch; found {found})"
        )
    return shapes


class _DropTorchvision(logging.Filter):
    """The ONNX exporter's notes about torchvision's operators, which no CTR model uses, and
    the quantizer's advice to pre-process image models."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return "torchvision" not in text and "pre-processing before quantization" not in text


@contextlib.contextmanager
def _quiet_exporters() -> Iterator[None]:
    """Exporters without the warnings that say nothing about this model."""
    loggers = [
        logging.getLogger("torch.onnx._internal.exporter._registration"),
        logging.getLogger(),
    ]
    drop = _DropTorchvision()
    for logger in loggers:
        logger.addFilter(drop)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger in loggers:
            logger.removeFilter(drop)


def _onnx(
    program: Any,
    path: Path,
    input_names: list[str] | None,
    output_names: list[str] | None,
    int8: bool = False,
) -> None:
    onnx_program = torch.onnx.export(
        program,
        (),
        dynamo=True,
        input_names=input_names,
        output_names=output_names,
        verbose=False,
    )
    if onnx_program is None:
        raise CtrcalError("the ONNX exporter returned no program")
    if not int8:
        onnx_program.save(str(path))
        return
    from onnxruntime.quantization import QuantType, quantize_dynamic

    full = path.with_name(path.name + ".fp32.onnx")
    try:
        onnx_program.save(str(full))
        quantize_dynamic(
            str(full),
            str(path),
            op_types_to_quantize=["MatMul", "Gemm"],
            weight_type=QuantType.QInt8,
        )
    finally:
        full.unlink(missing_ok=True)


class _Bf16(nn.Module):
    """``model`` under bf16 autocast, its linear layers' weights stored in bf16 (cast once
    here, not at every call); floating outputs come back as float32. A copy: ``model`` keeps
    its own float32 weights."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        import copy

        self.model = copy.deepcopy(model)
        for module in self.model.modules():
            if isinstance(module, nn.Linear):
                module.to(torch.bfloat16)

    def forward(self, *args: Any) -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = self.model(*args)
        return torch.utils._pytree.tree_map(
            lambda t: t.float() if isinstance(t, Tensor) and t.is_floating_point() else t, out
        )


def fit_export_calibrator(model: nn.Module, name: str, data_dir: Path, batch_size: int) -> Any:
    """``name`` fitted on the run's clean validation logits (what the reports fit on)."""
    from ctrcal.calibration.base import create_calibrator
    from ctrcal.train.predict import predict_split
    from ctrcal.train.splits import open_split

    if name not in EXPORT_CALIBRATORS:
        raise ConfigError(
            f"--calibrator: {name!r} cannot be folded into an exported model "
            f"(valid: {', '.join(EXPORT_CALIBRATORS)})"
        )
    valid = open_split(data_dir, "valid", "stream", torch.device("cpu"))
    pred = predict_split([model], valid, batch_size=batch_size, device=torch.device("cpu"))
    return create_calibrator(name).fit(pred.logits, pred.labels)


def export_run(
    run_dir: str | Path,
    out: str | Path,
    fmt: str,
    calibrator: str | None = None,
    data_dir: str | Path | None = None,
    precision: str = "fp32",
) -> ExportResult:
    """Export ``run_dir``'s best model to ``out`` and its raw-row encoding beside it.

    Args:
        run_dir: a run directory with a best checkpoint.
        out: the model file (``.onnx`` or ``.pt2``).
        fmt: ``onnx``, ``pt2`` or ``aoti``.
        calibrator: ``temperature``, ``platt`` or ``isotonic``: fitted on the run's clean
            validation split and folded into the graph (None: the model's sigmoid).
        data_dir: the run's prepared directory, when it has moved (its vocabulary is copied).
        precision: ``fp32``, ``bf16`` (pt2, aoti) or ``int8`` (onnx), as in
            :func:`export_module`; docs/serving.md gives what each costs in AUC.

    Raises:
        CtrcalError: no run or checkpoint, an unknown format, ``ctrcal[export]`` missing for
            ONNX, an operator torch cannot export, or an output that cannot be written.
    """
    from ctrcal.core.utils import atomic_path, json_dumps, write_text_atomic
    from ctrcal.data.feature_map import FEATURE_MAP_FILE
    from ctrcal.preparation.features import VOCAB_FILE
    from ctrcal.train.results import open_run

    check_format(fmt)
    check_precision(fmt, precision)
    run = open_run(run_dir, "export", data_dir)
    run_dir, data_dir, model, cfg, fmap = run.run_dir, run.data_dir, run.model, run.config, run.data
    out = Path(out)
    head = None
    if calibrator is not None:
        fitted = fit_export_calibrator(model, calibrator, data_dir, cfg.train.eval_batch_size)
        head = CalibrationHead(fitted)
    served = ServedModel(model, fmap, head).eval()
    example = example_inputs(fmap.vocab_sizes, fmap.num_numeric, rows=2)
    export_model(
        served, out, fmt, example, what=f"{run_dir} ({cfg.model.describe()})", precision=precision
    )
    encoding = out.with_name(out.name + ENCODING_SUFFIX)
    manifest = {
        "model": out.name,
        "format": fmt,
        "precision": precision,
        "run": str(run_dir.resolve()),
        "inputs": {
            "categorical": {
                "dtype": "int64",
                "shape": ["batch", fmap.num_categorical],
                "fields": list(fmap.categorical_fields),
                # an id outside [0, vocab_size) is served as its field's OOV id
                "vocab_sizes": list(fmap.vocab_sizes),
                "oov_ids": fmap.oov_ids,
            },
            "numeric": {
                "dtype": "float32",
                "shape": ["batch", fmap.num_numeric],
                "fields": list(fmap.numeric_fields),
                "missing": "NaN",
            },
        },
        "output": {"name": "probability", "dtype": "float32", "shape": ["batch"]},
        "mc_layernorm": "one-shot (deterministic): LayerNorm with the learned affine",
        "calibrator": None if head is None else {"name": head.kind, **head.params()},
    }
    with atomic_path(encoding) as tmp:
        tmp.mkdir()
        shutil.copyfile(data_dir / FEATURE_MAP_FILE, tmp / FEATURE_MAP_FILE)
        shutil.copyfile(data_dir / VOCAB_FILE, tmp / VOCAB_FILE)
        write_text_atomic(tmp / SERVING_FILE, json_dumps(manifest, indent=2) + "\n")
    return ExportResult(out, encoding, fmt, calibrator, precision)


def example_inputs(vocab_sizes: list[int], num_numeric: int, rows: int) -> tuple[Tensor, Tensor]:
    """Valid inputs of ``rows`` rows (ids in range, one missing numeric) to trace with."""
    gen = torch.Generator().manual_seed(0)
    cat = (
        torch.stack([torch.randint(0, v, (rows,), generator=gen) for v in vocab_sizes], 1)
        if vocab_sizes
        else torch.zeros(rows, 0, dtype=torch.int64)
    )
    num = torch.randn(rows, num_numeric, generator=gen)
    if num_numeric:
        num[0, 0] = float("nan")
    return cat.long(), num.float()
