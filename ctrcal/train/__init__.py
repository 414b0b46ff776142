"""The training loop; ``ctrcal.train(cfg, data_dir, run_dir)`` trains a run.

``ctrcal.train`` names both this package and the training job: importing any
``ctrcal.train.*`` module binds the package to that name on ``ctrcal``, so the package itself
is callable and calls :func:`ctrcal.train.trainer.train`.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


class _TrainPackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """:func:`ctrcal.train.trainer.train` (same arguments, same result)."""
        return importlib.import_module("ctrcal.train.trainer").train(*args, **kwargs)


sys.modules[__name__].__class__ = _TrainPackage
