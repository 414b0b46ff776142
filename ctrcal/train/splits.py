"""Where a split lives while a model trains or predicts on it, and whether it can be scored.

The one data-mode policy (:func:`resolve_data_mode`), used by training, ``evaluate`` and the
shift report alike, and the one test of whether a split has labels (:func:`is_labelled`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ctrcal.core.errors import DataError

__all__ = ["check_ids", "is_labelled", "open_split", "require_labelled", "resolve_data_mode"]

SPLITS = ("train", "valid", "test")


def resolve_data_mode(mode: str, device: torch.device, feature_map: Any = None) -> str:
    """``train.data_mode`` made concrete for ``device``.

    ``auto``: the splits live on the GPU when all of them fit in half its free memory (as the
    loader keeps them: int32 ids, float32 numerics and label), else in host memory with
    batches copied over; on the CPU memory and device mode are the same (``memory``).
    Anything else is returned as it is.
    """
    if mode != "auto":
        return mode
    if device.type != "cuda":
        return "memory"
    splits = getattr(feature_map, "splits", None) or {}
    rows = sum(int((splits.get(k) or {}).get("rows", 0)) for k in SPLITS)
    fields = len(getattr(feature_map, "vocab_sizes", [])) + len(
        getattr(feature_map, "numeric_fields", [])
    )
    need = rows * 4 * (fields + 1)
    free, _ = torch.cuda.mem_get_info(device)
    return "device" if need < 0.5 * free else "memory"


def open_split(data_dir: str | Path, split: str, mode: str, device: torch.device) -> Any:
    """A :class:`~ctrcal.data.loader.ParquetCTRData` of ``split`` in a concrete data mode."""
    from ctrcal.data.loader import ParquetCTRData

    return ParquetCTRData(data_dir, split, mode=mode, device=device if mode == "device" else None)


def is_labelled(feature_map: Any, split: str) -> bool:
    """Whether ``split`` exists with rows and labels (the Kaggle ``test.txt`` has none).

    The feature map records each split's positive rate over its labelled rows; an unlabelled
    split has none.
    """
    info = (getattr(feature_map, "splits", None) or {}).get(split) or {}
    return int(info.get("rows", 0) or 0) > 0 and info.get("positive_rate") is not None


def require_labelled(feature_map: Any, split: str, data_dir: str | Path, what: str) -> None:
    """Raise a :class:`DataError` before any work when ``split`` cannot be scored.

    Args:
        what: what needs the labels, for the message (e.g. ``"evaluate"``).
    """
    info = (getattr(feature_map, "splits", None) or {}).get(split) or {}
    if int(info.get("rows", 0) or 0) == 0:
        raise DataError(f"{data_dir}: the {split} split is empty or missing; {what} needs it")
    if info.get("positive_rate") is None:
        raise DataError(
            f"{data_dir}: the {split} split has no labels (e.g. Criteo's unlabelled test.txt); "
            f"{what} needs labelled rows: use another split"
        )


def check_ids(data: Any, feature_map: Any, where: str) -> None:
    """Fail early, with the field's name, on ids outside a field's vocabulary."""
    tensors = getattr(data, "_tensors", None)
    if tensors is None:
        return  # streamed: the embedding lookup itself raises on a bad id
    cat = tensors[0]
    if cat.numel() == 0:
        return
    lo = cat.amin(dim=0).cpu()
    hi = cat.amax(dim=0).cpu()
    sizes = torch.tensor(feature_map.vocab_sizes)
    bad = ((lo < 0) | (hi >= sizes)).nonzero().flatten().tolist()
    if bad:
        j = bad[0]
        raise DataError(
            f"{where}: field {feature_map.categorical_fields[j]} has ids in "
            f"[{int(lo[j])}, {int(hi[j])}] but its vocabulary size is {int(sizes[j])} "
            "(was the data prepared with another feature map?)"
        )
