"""Checkpoints and RNG state: plain tensors and Python values, loadable with ``weights_only``.

Every checkpoint is written to a temporary file and renamed, so an interrupted save never leaves
a truncated file that a resumed run would trust. Everything in one is a tensor, a number, a
string, or a list/tuple/dict of those, so ``torch.load(path, weights_only=True)`` reads it
without executing pickled code (a file replaced by a pickle that would run code is refused).

A run's two checkpoints are written in an order that survives a kill at any instant:

1. an improved epoch writes ``best.pt`` (:func:`save_best`), keeping the previous best as
   ``best.prev.pt`` until step 2 is done;
2. every epoch then writes ``last.pt``, which records the best epoch, its score and the bad
   epoch count itself; after it, ``best.prev.pt`` is dropped (:func:`commit_best`).

A resumed run takes the schedule from ``last.pt`` alone and the best weights from whichever
of the two best files holds the epoch ``last.pt`` names (:func:`load_best`), so it goes on
exactly as the uninterrupted run would, wherever the kill landed.

Model weights are stored under the model's own ``state_dict`` keys, and every checkpoint says
so (``"model_keys": "own"``). Checkpoints without that mark were written when a user model
(``forward(batch)``) ran inside an adapter module, which put ``model.`` in front of each of its
keys; built-in models never had the prefix. :func:`load_checkpoint` is the one place that
reads such an old checkpoint's keys back without it, so ``--resume``, ``evaluate`` and
``train.finetune_from`` all take runs written either way.
"""

from __future__ import annotations

import os
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctrcal.core.errors import CtrcalError
from ctrcal.core.utils import atomic_path, writing
from ctrcal.train.runs import BEST, BEST_PREV

# the mark of a checkpoint whose model weights are under the model's own state_dict keys
MODEL_KEYS = "model_keys"
OWN_KEYS = "own"
# what the adapter of user models put in front of every key before checkpoints were marked
ADAPTER_PREFIX = "model."

__all__ = [
    "capture_rng_state",
    "commit_best",
    "load_best",
    "load_checkpoint",
    "restore_rng_state",
    "save_best",
    "save_checkpoint",
]


def save_best(run_dir: str | Path, payload: dict[str, Any]) -> None:
    """Write a new ``best.pt``, keeping the old one as ``best.prev.pt`` (see module doc)."""
    best = Path(run_dir) / BEST
    nxt = best.with_name(".next-" + best.name)
    save_checkpoint(nxt, payload)
    with writing(best):
        if best.exists():
            os.replace(best, Path(run_dir) / BEST_PREV)
        os.replace(nxt, best)


def commit_best(run_dir: str | Path) -> None:
    """Drop ``best.prev.pt`` once ``last.pt`` names the new best epoch."""
    (Path(run_dir) / BEST_PREV).unlink(missing_ok=True)


def load_best(run_dir: str | Path, epoch: int | None = None) -> dict[str, Any] | None:
    """The best checkpoint of ``epoch`` (None: whichever there is), or None.

    ``best.pt`` may hold an epoch newer than the last finished one (a kill between the two
    writes); the best of ``epoch`` is then still in ``best.prev.pt``, which is moved back onto
    ``best.pt`` so the files are as the last finished epoch left them.
    """
    best = Path(run_dir) / BEST
    for path in (best, Path(run_dir) / BEST_PREV):
        if path.exists():
            state = load_checkpoint(path)
            if epoch is None or int(state.get("epoch", -1)) == int(epoch):
                if path != best and epoch is not None:
                    os.replace(path, best)  # back to the committed state before going on
                return state
    return None


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> None:
    """``torch.save`` through a temporary file and a rename.

    A failed write (a full disk) leaves the previous file at ``path`` intact and is one
    :class:`~ctrcal.core.errors.OutputError` line naming ``path`` and the cause. The data go
    through a Python file object, whose failures carry their errno (``torch.save`` given a
    file name reports a full disk as ``unexpected pos``).
    """
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        torch.save({**payload, MODEL_KEYS: OWN_KEYS}, fh)


def load_checkpoint(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """``torch.load(path, weights_only=True)``; a missing or corrupt file is a CtrcalError.

    The model weights come back under the model's own keys, whenever the file was written
    (see the module doc).
    """
    path = Path(path)
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise CtrcalError(f"{path}: no such checkpoint") from None
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CtrcalError(f"{path}: unreadable checkpoint ({first})") from None
    return _own_model_keys(payload)


def _own_model_keys(payload: Any) -> Any:
    """An unmarked checkpoint's user-model weights without the adapter's ``model.`` prefix.

    Only a checkpoint without the mark whose every key has the prefix was written through the
    adapter (no built-in model has a top-level ``model`` submodule); a marked one is as
    written, so a user model that keeps everything under its own ``self.model`` is left alone.
    """
    if not isinstance(payload, dict) or payload.get(MODEL_KEYS) == OWN_KEYS:
        return payload
    state = payload.get("model")
    if not isinstance(state, dict) or not state:
        return payload
    if not all(isinstance(k, str) and k.startswith(ADAPTER_PREFIX) for k in state):
        return payload
    cut = len(ADAPTER_PREFIX)
    own = type(state)((k[cut:], v) for k, v in state.items())
    metadata = getattr(state, "_metadata", None)
    if isinstance(metadata, dict):  # per-module versions, keyed by module path
        own._metadata = type(
            metadata
        )(  # type: ignore[attr-defined]
            ("" if k == ADAPTER_PREFIX[:-1] else k[cut:], v)
            for k, v in metadata.items()
            if k == ADAPTER_PREFIX[:-1] or k.startswith(ADAPTER_PREFIX)
        )
    return {**payload, "model": own}


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
