"""Checkpoints and RNG state: plain tensors and Python values, loadable with ``weights_only``.

Every checkpoint is written to a temporary file and renamed, so an interrupted save never leaves
a truncated file that a resumed run would trust. Everything in one is a tensor, a number, a
string, or a list/tuple/dict of those, so ``torch.load(path, weights_only=True)`` reads it
without executing pickled code.
"""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctrcal.errors import CtrcalError
from ctrcal.utils import atomic_path

__all__ = ["capture_rng_state", "load_checkpoint", "restore_rng_state", "save_checkpoint"]


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> None:
    """``torch.save`` through a temporary file and a rename."""
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


def load_checkpoint(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """``torch.load(path, weights_only=True)``; a missing or corrupt file is a CtrcalError."""
    path = Path(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise CtrcalError(f"{path}: no such checkpoint") from None
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CtrcalError(f"{path}: unreadable checkpoint ({first})") from None


def capture_rng_state() -> dict[str, Any]:
    """Python, NumPy and torch (CPU and every CUDA device) generator states."""
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()  # noqa: NPY002
    state: dict[str, Any] = {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [
            np_name,
            torch.from_numpy(np_keys.astype(np.int64)),
            int(np_pos),
            int(np_has_gauss),
            float(np_gauss),
        ],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state` (CUDA states only where CUDA is present)."""
    version, py_state, gauss = state["python"]
    random.setstate((int(version), tuple(int(v) for v in py_state), gauss))
    name, keys, pos, has_gauss, np_gauss = state["numpy"]
    np.random.set_state(  # noqa: NPY002 - the legacy global generator some code uses
        (name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(np_gauss))
    )
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = [s.cpu() for s in state["cuda"]]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
