"""The engines ``ctrcal predict --engine`` scores with: the eager model (``torch``), its ONNX
export in ONNX Runtime (``onnxruntime``) or its AOTInductor package (``aoti``).

An exported engine scores the graph ``ctrcal export`` writes (:class:`ServedModel`, without a
calibrator), exported to a temporary folder when predict starts, on the same batches as the
eager model; it computes the one-shot probability (no MC passes).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctrcal.core.batch import Batch
from ctrcal.core.errors import ConfigError
from ctrcal.serving.export import ServedModel, example_inputs, export_model
from ctrcal.serving.formats import ENGINES

__all__ = ["exported_engine"]

Scorer = Callable[[Batch], np.ndarray]


@contextmanager
def exported_engine(
    engine: str, model: torch.nn.Module, feature_map: Any, precision: str = "fp32"
) -> Iterator[Scorer]:
    """``score(batch) -> probabilities [B] float64`` of ``model`` exported for ``engine``
    (``onnxruntime`` or ``aoti``) in ``precision`` (as ``ctrcal export --precision``); the
    export is removed on exit.

    Raises:
        ConfigError: an engine that is not an exported one.
        NotAvailableError: the engine's tools are missing (``ctrcal[export]``, a compiler).
    """
    if engine not in ENGINES[1:]:
        raise ConfigError(
            f"--engine: {engine!r} is not an exported engine (valid: {', '.join(ENGINES)})"
        )
    served = ServedModel(model, feature_map).eval()
    example = example_inputs(feature_map.vocab_sizes, feature_map.num_numeric, rows=2)
    with tempfile.TemporaryDirectory(prefix="ctrcal-engine-") as tmp:
        if engine == "onnxruntime":
            path = Path(tmp) / "model.onnx"
            export_model(served, path, "onnx", example, f"--engine {engine}", precision)
            yield _onnxruntime(path)
        else:
            path = Path(tmp) / "model.pt2"
            export_model(served, path, "aoti", example, f"--engine {engine}", precision)
            yield _aoti(path)


def _onnxruntime(path: Path) -> Scorer:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def score(batch: Batch) -> np.ndarray:
        feed = {
            "categorical": batch.categorical.numpy().astype(np.int64, copy=False),
            "numeric": batch.numeric.numpy().astype(np.float32, copy=False),
        }
        return session.run(None, feed)[0].astype(np.float64)

    return score


def _aoti(path: Path) -> Scorer:
    compiled = torch._inductor.aoti_load_package(str(path))

    def score(batch: Batch) -> np.ndarray:
        with torch.no_grad():
            out = compiled(batch.categorical.long(), batch.numeric.float())
        return out.double().numpy()

    return score
